"""SGLang's `/server_info` read beside its `/metrics` (issue 25, item 1): the bound its
scheduler derived when `--max-running-requests` was not given is the engine's
`max_num_seqs`, so the batch-slot verdict is reached; the answer's secrets reach no
output; and a server-info endpoint that hangs or fails costs only that configuration,
counted in `gpuledger_source_errors_total`. Scenario:
tests/fixtures/scenarios/sglang-server-info.yaml (the answer's shape follows
tests/fixtures/sglang/sglang-0.5.23-server_info.constructed.json)."""

from __future__ import annotations

import functools
import json

import pytest

from gpuledger.document.codec import to_json
from gpuledger.explain.chain import explain, render_text
from gpuledger.model.engines import EngineTarget
from gpuledger.sim import fake_sglang
from gpuledger.sim.fake_vllm import FakeEngine
from gpuledger.sim.scenario import load_scenario
from gpuledger.sources.engines.source import EngineScraper
from tests.conftest import REPO, pick, samples
from tests.mixin.stage_differential import Snapshot, python_judgements, take_snapshot

SCENARIO = REPO / "tests" / "fixtures" / "scenarios" / "sglang-server-info.yaml"
WORKLOAD = ("serve", "qwen-derived")
CANARY = "sk-canary-0c5e1b"


@functools.cache
def snapshot(phase: str | None) -> Snapshot:
    return take_snapshot(load_scenario(SCENARIO), phase, "gpuledger")


def _errors(snap: Snapshot) -> dict[str, float]:
    found = pick(samples(snap.exposition), "gpuledger_source_errors_total", source="vllm")
    return {labels["reason"]: v for _, labels, v in found}


def test_the_derived_bound_is_the_engine_max_num_seqs() -> None:
    snap = snapshot(None)
    (engine,) = snap.document.engines
    assert engine.config["max_num_seqs"] == "4"
    assert engine.config["mem_fraction_static"] == "0.81"
    assert python_judgements([snap])[WORKLOAD] == ("engine_queueing", "max_num_seqs")
    seqs = pick(samples(snap.exposition), "gpuledger_engine_max_num_seqs")
    assert [v for _, _, v in seqs] == [4.0]
    assert not any(r.startswith("server_info") for r in _errors(snap))


def test_its_secrets_reach_no_output() -> None:
    snap = snapshot(None)
    out = render_text(explain([snap.document], workload="serve/qwen-derived"))
    assert "max_num_seqs" in out or "--max-running-requests" in out
    for text in (snap.exposition, json.dumps(to_json(snap.document)), out):
        assert CANARY not in text
        assert "launch_server" not in text  # the launch command is not kept


@pytest.mark.parametrize(
    ("phase", "reason"),
    [
        ("server-info-hangs", "server_info_timeout"),
        ("server-info-fails", "server_info_http_500"),
    ],
)
def test_a_failing_server_info_costs_only_the_configuration(phase: str, reason: str) -> None:
    snap = snapshot(phase)
    (engine,) = snap.document.engines
    assert engine.up and (engine.requests_running, engine.requests_waiting) == (4.0, 40.0)
    assert "max_num_seqs" not in engine.config  # unknown: no flag, no answer, no guess
    assert _errors(snap).get(reason, 0) >= 1
    up = pick(samples(snap.exposition), "gpuledger_source_up", source="vllm")
    assert [v for _, _, v in up] == [1.0]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("huge", "too_large"),
        ("trickle", "timeout"),
        ("garbage", "garbage"),
        ("truncated", "truncated"),
    ],
)
def test_a_hostile_server_info_is_refused_and_the_metrics_kept(fault: str, reason: str) -> None:
    info = fake_sglang.FakeServerInfo(max_running_requests=4, fault=fault)  # type: ignore[arg-type]
    engines = [FakeEngine(model_name="qwen", running=4, waiting=40, style="0.5.23")]
    with fake_sglang.server(engines, server_info=info) as fake:
        fake.slow_seconds = 30.0  # a trickle outlasts the deadline
        target = EngineTarget(fake.url, kind="sglang")
        with EngineScraper(timeout_seconds=1.5) as scraper:
            (scrape,) = scraper.scrape([target]).scrapes
    assert scrape.up and [e.requests_waiting for e in scrape.engines] == [40.0]
    assert (scrape.server_info, scrape.server_info_error) == (None, reason)


def test_server_info_is_read_again_only_after_a_failed_scrape() -> None:
    info = fake_sglang.FakeServerInfo(max_running_requests=4)
    with fake_sglang.server([FakeEngine(style="0.5.23")], server_info=info) as fake:
        target = EngineTarget(fake.url, kind="sglang")
        with EngineScraper(timeout_seconds=2.0) as scraper:
            for _ in range(3):
                scraper.scrape([target])
            reads = fake.requests_served
            fake.set_fault("http_500")
            scraper.scrape([target])
            fake.set_fault("ok")
            (scrape,) = scraper.scrape([target]).scrapes
            after = fake.requests_served
    assert reads == 4  # three /metrics and one /server_info
    assert after - reads == 3  # a failed /metrics, then /metrics and /server_info again
    assert scrape.server_info is not None and scrape.server_info.config["max_num_seqs"] == "4"
