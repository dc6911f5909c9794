"""An SGLang engine and a vLLM engine on one simulated node (issue 25, item 1, "done when"):
each gets its queue, KV usage, configuration, GPUs, stage and evidence, and the kind is shown.
The recording rules agree with explain on every phase (tests/mixin/test_stage_differential.py
runs this scenario); the alerts on it are promtool cases (mixin/tests/engine.yaml)."""

from __future__ import annotations

import functools

import pytest

from gpuledger.document.v1 import EngineDoc
from gpuledger.explain.chain import explain, render_text
from gpuledger.sim.scenario import load_scenario
from tests.conftest import REPO, pick, samples
from tests.mixin.stage_differential import Snapshot, python_judgements, take_snapshot

SCENARIO = REPO / "tests" / "fixtures" / "scenarios" / "sglang-beside-vllm.yaml"
SGLANG = ("serve", "qwen-sglang")
VLLM = ("serve", "llama")


@functools.cache
def snapshot(phase: str | None) -> Snapshot:
    return take_snapshot(load_scenario(SCENARIO), phase, "gpuledger")


def _engine(snap: Snapshot, pod: str) -> EngineDoc:
    (found,) = [e for e in snap.document.engines if e.pod == pod]
    return found


@pytest.mark.parametrize(
    ("phase", "sglang"),
    [
        (None, ("engine_queueing", "max_num_seqs")),
        ("sglang-priority", ("engine_queueing", "max_num_seqs")),
        ("sglang-underscore", ("engine_queueing", "max_num_seqs")),
        ("sglang-kv-pressure", ("engine_queueing", "kv_cache")),
    ],
)
def test_each_kind_gets_its_stage(phase: str | None, sglang: tuple[str, str]) -> None:
    judged = python_judgements([snapshot(phase)])
    assert judged[SGLANG] == sglang
    assert judged[VLLM] == ("engine_queueing", "kv_cache")


def test_each_kind_gets_its_queue_kv_config_and_gpus() -> None:
    snap = snapshot(None)
    sgl, vllm = _engine(snap, "qwen-sglang-0"), _engine(snap, "llama-0")
    assert (sgl.kind, vllm.kind) == ("sglang", "vllm")
    assert (sgl.requests_running, sgl.requests_waiting) == (4.0, 40.0)
    assert sgl.kv_cache_usage_ratio == 0.3
    assert sgl.config["max_num_seqs"] == "4"
    assert sgl.config["tensor_parallel_size"] == "2"
    assert "model_path" not in sgl.config  # a model path is never kept (docs/security.md)
    assert "sk-secret" not in str(sgl) and "port" not in vllm.config
    assert [(g.role, g.rank) for g in sgl.gpus] == [("worker", "0"), ("worker", "1")]
    assert (sgl.gpus_configured, sgl.gpus_in_use) == (2, 2)
    assert (vllm.kv_cache_usage_ratio, vllm.config["max_num_seqs"]) == (0.97, "256")
    assert len(vllm.gpus) == 1
    current = samples(snap.exposition)
    kinds = {
        labels["pod"]: labels["engine_kind"]
        for _, labels, _ in pick(current, "gpuledger_engine_config_info")
    }
    assert kinds == {"qwen-sglang-0": "sglang", "llama-0": "vllm"}
    seqs = {labels["pod"]: v for _, labels, v in pick(current, "gpuledger_engine_max_num_seqs")}
    assert seqs == {"qwen-sglang-0": 4.0, "llama-0": 256.0}


def test_priorities_and_the_underscore_spelling_read_the_same_totals() -> None:
    for phase in ("sglang-priority", "sglang-underscore"):
        sgl = _engine(snapshot(phase), "qwen-sglang-0")
        assert (sgl.requests_running, sgl.requests_waiting, sgl.up) == (4.0, 40.0, True)


def test_explain_shows_the_kind_and_its_flag() -> None:
    out = render_text(explain([snapshot(None).document], workload="serve/qwen-sglang"))
    assert "engine sglang Qwen/Qwen2.5-7B-Instruct  DP rank 0  up  TP 2 x PP 1" in out
    assert "--max-running-requests 4" in out
    out = render_text(explain([snapshot(None).document], workload="serve/llama"))
    assert "engine vllm meta-llama/Llama-3.1-8B-Instruct" in out
