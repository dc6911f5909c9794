"""Engines on a bare host are workloads (docs/design.md, identity rule 7), judged as a
pod's engine is: tests/fixtures/scenarios/bare-host-engines.yaml, two vLLM engines of one
host without Kubernetes, each a systemd unit scraped as a static target; A saturated at
--max-num-seqs 4 with 40 waiting, B idle. The recording rules and the alert on the same
snapshot: tests/mixin/test_bare_host_alerts.py."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from gpuledger.document.v1 import LedgerDocument
from gpuledger.explain.chain import EXIT_NOT_FOUND, ExplainError, explain, render_text
from gpuledger.export.document import ledger_document
from gpuledger.sim.harness import settled_document
from gpuledger.sim.scenario import load_scenario
from gpuledger.web.node_page import render_page
from tests.conftest import REPO, Run, value

SCENARIO = REPO / "tests" / "fixtures" / "scenarios" / "bare-host-engines.yaml"
GPU_A = "GPU-ba000000-0000-4000-8000-00000000000a"
GPU_B = "GPU-bb000000-0000-4000-8000-00000000000b"
MODEL_A = "meta-llama/Llama-3.1-8B-Instruct"


@cache
def doc() -> LedgerDocument:
    return settled_document(load_scenario(SCENARIO))


def judged(result: dict[str, Any]) -> list[tuple[str, str, str, str | None]]:
    return [
        (w["namespace"], w["workload"], w["verdict"]["stage"], w["verdict"]["reason"])
        for w in result["workloads"]
    ]


def test_each_engine_is_the_workload_of_its_systemd_unit() -> None:
    engines = {e.workload: e for e in doc().engines}
    assert sorted(engines) == ["vllm-a.service", "vllm-b.service"]
    a, b = engines["vllm-a.service"], engines["vllm-b.service"]
    assert (a.namespace, a.pod, a.model_name, a.api_server_pid) == ("", "", MODEL_A, 2000)
    assert (a.config["max_num_seqs"], b.config["max_num_seqs"]) == ("4", "4")
    assert [g.gpu_uuid for g in a.gpus] == [GPU_A]
    assert [g.gpu_uuid for g in b.gpus] == [GPU_B]


def test_explain_by_gpu_gives_the_saturated_engine_and_its_verdict() -> None:
    result = explain([doc()], gpu=GPU_A[:12])
    assert judged(result) == [("", "vllm-a.service", "engine_queueing", "max_num_seqs")]
    text = render_text(result)
    assert "host process 2001 VLLM::EngineCore (in no pod)" in text
    assert "workload vllm-a.service\n" in text
    assert f"engine vllm {MODEL_A}  DP rank 0  up  TP 1 x PP 1  max_num_seqs 4" in text
    assert "queue: 40 waiting, 4 running, KV cache 30%" in text
    assert f"engine core rank 0 holds {GPU_A}" in text
    assert "running = --max-num-seqs 4 with KV headroom" in text
    assert "Raise the batch-slot bound (vLLM --max-num-seqs, SGLang --max-running-requests)" in text
    assert judged(explain([doc()], gpu=GPU_B)) == [("", "vllm-b.service", "idle", None)]


@pytest.mark.parametrize(
    "query",
    [MODEL_A, "Llama-3.1-8B-Instruct", "vllm-a.service", "vllm-a.service:0", "target"],
)
def test_explain_by_engine_finds_it_by_model_target_or_unit(query: str) -> None:
    if query == "target":
        query = next(e.target for e in doc().engines if e.workload == "vllm-a.service")
    result = explain([doc()], engine=query)
    assert judged(result) == [("", "vllm-a.service", "engine_queueing", "max_num_seqs")]


def test_explain_by_workload_without_a_namespace() -> None:
    assert judged(explain([doc()], workload="vllm-b.service")) == [
        ("", "vllm-b.service", "idle", None)
    ]
    with pytest.raises(ExplainError) as raised:
        explain([doc()], engine="mistral")
    assert raised.value.code == EXIT_NOT_FOUND


def test_the_ledger_page_judges_both() -> None:
    page = render_page(doc())
    row_a = next(r for r in page.split("<tr>") if "<td>vllm-a.service</td>" in r)
    row_b = next(r for r in page.split("<tr>") if "<td>vllm-b.service</td>" in r)
    assert "engine_queueing (max_num_seqs)" in row_a
    assert "idle" in row_b and "engine_queueing" not in row_b


def test_an_engine_that_stops_keeps_its_workload(tmp_path: Path) -> None:
    """`systemctl stop vllm-a` (phase a-stopped): its API server is gone, so its unit is
    unknown this cycle; its series go to up=0 under the workload it had, which is
    `starting`, not a new workload."""
    run = Run(load_scenario(SCENARIO), tmp_path)
    try:
        run.settle()
        s = run.scrape("a-stopped")
        published = run.exporter.run_once()
    finally:
        run.close()
    assert value(s, "gpuledger_engine_up", workload="vllm-a.service", model_name=MODEL_A) == 0
    result = explain([ledger_document(published)], engine="vllm-a.service")
    assert judged(result) == [("", "vllm-a.service", "starting", "engine_not_up")]
