"""Honest states (issue 16, item 4): every HTTP output of `gpuledger demo` says the data is
simulated and `serve`'s does not; a source that is not configured is shown and exported as
not configured, apart from one that is down, and existing `gpuledger_source_up` queries keep
their meaning."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from gpuledger.document.codec import from_json
from gpuledger.explain.chain import explain, render_text
from tests.conftest import pick, samples, value
from tests.e2e.servers import Served, demo, serve_without_hardware

NOT_CONFIGURED = ("podresources", "kubernetes", "vllm", "ray", "serve")


@pytest.fixture(scope="module")
def simulated() -> Iterator[Served]:
    served = demo()
    yield served
    served.close()


@pytest.fixture(scope="module")
def plain() -> Iterator[Served]:
    served = serve_without_hardware()
    yield served
    served.close()


def _banner(page: str) -> bool:
    return 'id="simulated"' in page and "SIMULATED DATA" in page


def test_demo_marks_every_output_as_simulated(simulated: Served) -> None:
    assert _banner(simulated.text("/"))
    assert _banner(simulated.text("/ledger"))
    assert simulated.document()["simulated"] is True
    metrics = samples(simulated.text("/metrics"))
    [(_, labels, one)] = pick(metrics, "gpuledger_build_info")
    assert labels["simulated"] == "true" and one == 1


def test_serve_marks_none_of_its_outputs(plain: Served) -> None:
    for path in ("/", "/ledger"):
        page = plain.text(path)
        assert not _banner(page) and "SIMULATED" not in page, path
    assert plain.document()["simulated"] is False
    [(_, labels, _)] = pick(samples(plain.text("/metrics")), "gpuledger_build_info")
    assert labels["simulated"] == "false"


def test_a_source_not_configured_is_exported_apart_from_one_that_is_down(plain: Served) -> None:
    metrics = samples(plain.text("/metrics"))
    states = {
        labels["source"]: labels["state"]
        for _, labels, v in pick(metrics, "gpuledger_source_state")
        if v == 1
    }
    assert states == {
        "nvml": "down",
        "procfs": "up",
        **dict.fromkeys(NOT_CONFIGURED, "not_configured"),
    }
    # Exactly one state per source: a state set.
    assert len(pick(metrics, "gpuledger_source_state")) == 3 * len(states)
    # source_up keeps its meaning: 0 for both, so `gpuledger_source_up == 0` still selects them.
    for source in ("nvml", *NOT_CONFIGURED):
        assert value(metrics, "gpuledger_source_up", source=source) == 0
    # Only the failing source counts errors (what GpuLedgerSourceDown asks for).
    errors = {labels["source"] for _, labels, _ in pick(metrics, "gpuledger_source_errors_total")}
    assert errors == {"nvml"}


def test_ledger_json_and_page_say_not_configured_not_down(plain: Served) -> None:
    doc = plain.document()
    by_source = {s["source"]: s for s in doc["sources"]}
    assert by_source["nvml"]["state"] == "down"
    assert by_source["nvml"]["reason"] == "library_not_found"
    assert all(by_source[s]["state"] == "not_configured" for s in NOT_CONFIGURED)
    # What could not be known names the failure only.
    assert len(doc["unknowns"]) == 1 and "NVML" in doc["unknowns"][0]
    page = plain.text("/ledger")
    found = re.findall(r'<span class="(\w+)" data-source="(\w+)"', page)
    classes = {source: css for css, source in found}
    assert classes["nvml"] == "bad" and all(classes[s] == "muted" for s in NOT_CONFIGURED)
    assert "(down: library_not_found)</span>" in page
    assert page.count("(not configured)</span>") == len(NOT_CONFIGURED)


def test_explain_lists_no_unconfigured_source_as_a_failure(
    simulated: Served, plain: Served
) -> None:
    docs = [from_json(simulated.document()), from_json(plain.document())]
    result = explain(docs, workload="llm/llama-8b")
    text = render_text(result)
    unknown = [line for line in text.splitlines() if line.startswith("unknown: ")]
    assert unknown == [
        "unknown: " + plain.document()["node"] + ": no NVML: GPU list, memory and processes "
        "unknown (library_not_found)"
    ]
    assert "not configured on demo-gpu-node-1 (not a failure): ray" in text
    assert result["not_configured"][plain.document()["node"]] == list(NOT_CONFIGURED)
    assert result["simulated"] == ["demo-gpu-node-1"]
    assert text.startswith("SIMULATED: demo-gpu-node-1 served by gpuledger demo or simulate")
