"""`gpuledger explain`: the right objects and the right layer for each situation."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from functools import cache
from typing import Any

import pytest

from gpuledger.document.v1 import LedgerDocument
from gpuledger.explain.chain import EXIT_NOT_FOUND, ExplainError, explain, render_text
from gpuledger.sim.harness import settled_document
from gpuledger.sim.scenario import load_scenario
from tests.conftest import REPO

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
NODE = SCENARIOS / "explain-node.yaml"
CLUSTER = SCENARIOS / "explain-cluster.yaml"


@cache
def node_doc(phase: str | None = None) -> LedgerDocument:
    return settled_document(load_scenario(NODE).at_phase(phase))


@cache
def cluster_doc() -> LedgerDocument:
    return settled_document(load_scenario(CLUSTER))


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    assert len(result["workloads"]) == 1
    return result["workloads"][0]["verdict"]


def test_routing_when_one_replica_queues_and_a_sibling_has_headroom() -> None:
    v = verdict(explain([node_doc()], workload="serve/chat"))
    assert (v["stage"], v["reason"]) == ("routing", "imbalance")
    assert any("running = --max-num-seqs 32" in e for e in v["evidence"])
    assert any("chat-1" in e and "has headroom" in e for e in v["evidence"])


def test_pending_placement_wins_over_everything_else() -> None:
    result = explain([node_doc(), cluster_doc()], workload="serve/chat")
    v = verdict(result)
    assert (v["stage"], v["reason"]) == ("pending_placement", "insufficient_gpu")
    assert any("serve/chat-2 not placed" in e and "8 GPU(s)" in e for e in v["evidence"])
    text = render_text(result)
    assert "NOT PLACED: insufficient_gpu" in text


def test_engine_queueing_on_kv_cache_with_parallelism_and_allocation_disagreements() -> None:
    result = explain([node_doc()], pod="serve/llama-0")
    v = verdict(result)
    assert (v["stage"], v["reason"]) == ("engine_queueing", "kv_cache")
    issues = result["workloads"][0]["discrepancies"]
    assert any(
        "parallelism mismatch" in i and "configured for 4" in i and "hold 2" in i for i in issues
    )
    assert sum("allocated unused" in i for i in issues) == 2
    text = render_text(result)
    assert "cuda:1 = GPU-43000000-0000-4000-8000-000000000003" in text
    assert (
        "ordinal 3 -> GPU-45000000-0000-4000-8000-000000000005  host index 5 on gpu-node-7  "
        "(podresources)" in text
    )


def test_starting_while_the_model_loads() -> None:
    v = verdict(explain([node_doc()], workload="serve/qwen"))
    assert (v["stage"], v["reason"]) == ("starting", "pod_not_ready")
    assert any("qwen-0 placed on gpu-node-7, not Ready yet" in e for e in v["evidence"])
    assert any("not answering" in e for e in v["evidence"])


def test_a_down_engine_says_why_it_does_not_answer() -> None:
    """The engine's scrape failure (its error_reason in the document) ends the evidence."""
    doc = node_doc()
    (down,) = [e for e in doc.engines if e.workload == "qwen"]
    assert (down.up, down.error_reason) == (False, "refused")
    text = render_text(explain([doc], workload="serve/qwen"))
    assert f"evidence: serve/qwen-0 engine ? not answering at {down.url} (refused)" in text


def test_engine_queueing_at_max_num_seqs_and_deferred() -> None:
    balanced = verdict(explain([node_doc("chat-balanced")], workload="serve/chat"))
    assert balanced["stage"] == "serving"
    deferred = verdict(explain([node_doc("chat-deferred")], workload="serve/chat"))
    assert (deferred["stage"], deferred["reason"]) == ("engine_queueing", "deferred")
    idle = verdict(explain([node_doc("all-idle")], workload="serve/chat"))
    assert idle["stage"] == "idle"


def test_gpu_query_names_holders_and_unallocated_use() -> None:
    result = explain([node_doc()], gpu="GPU-47")
    assert result["gpu"]["index"] == 7
    assert [w["workload"] for w in result["workloads"]] == ["notebook-bob"]
    issues = result["workloads"][0]["discrepancies"]
    assert any(i.startswith("unallocated use: research/notebook-bob") for i in issues)


def test_engine_query_by_model_name() -> None:
    result = explain([node_doc()], engine="meta-llama/Llama-3.1-70B-Instruct")
    assert [w["workload"] for w in result["workloads"]] == ["llama"]


def test_unknown_objects_are_clear_messages() -> None:
    with pytest.raises(ExplainError) as err:
        explain([node_doc()], pod="serve/nope")
    assert err.value.code == EXIT_NOT_FOUND
    assert "pod 'serve/nope' is in no ledger read" in str(err.value)
    with pytest.raises(ExplainError, match="no GPU matching 'GPU-ffff'"):
        explain([node_doc()], gpu="GPU-ffff")


def test_missing_source_is_named_not_guessed() -> None:
    doc = dataclasses.replace(
        node_doc(), unknowns=("no PodResources: allocation unknown (socket_missing)",)
    )
    text = render_text(explain([doc], workload="serve/chat"))
    assert "unknown: gpu-node-7: no PodResources: allocation unknown (socket_missing)" in text


def test_cli_exit_codes_and_json_output() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuledger", "explain", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    ok = run("--scenario", str(NODE), "--workload", "serve/llama", "--output", "json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["workloads"][0]["verdict"]["stage"] == "engine_queueing"
    for secret in ("sk-explain-secret", "hf_explain_secret", "/models/m"):
        assert secret not in ok.stdout
    missing = run("--scenario", str(NODE), "--pod", "serve/ghost")
    assert missing.returncode == 1 and "serve/ghost" in missing.stderr
    assert "Traceback" not in missing.stderr
    unreachable = run("--from", "http://127.0.0.1:9", "--pod", "a/b")
    assert unreachable.returncode == 3
    # Without --from or --scenario it asks the Kubernetes API (test_fleet_explain.py).
    unconfigured = run("--kubeconfig", "/nonexistent/kubeconfig", "--pod", "a/b")
    assert unconfigured.returncode == 3
    assert "cannot load kubeconfig /nonexistent/kubeconfig" in unconfigured.stderr
    usage = run("--via", "tunnel", "--pod", "a/b")
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1


def test_ray_overcommit_and_unplaceable_placement_groups() -> None:
    from gpuledger.sim.scenario import parse_scenario
    from tests.integration.test_ray_layer import scenario as ray_scenario

    node = settled_document(parse_scenario(ray_scenario(), "ray-node.yaml"))
    cluster = settled_document(
        parse_scenario(
            {
                "node": "cluster-view",
                "mode": "cluster",
                "ray": {
                    "workload": "ml/raycluster-a",
                    "nodes": [{"name": "head", "ip": "10.9.0.1", "gpus": 2}],
                    "placement_groups": [
                        {
                            "name": "big",
                            "bundles": [8],
                            "state": "PENDING",
                            "scheduling_state": "INFEASIBLE",
                        }
                    ],
                },
            },
            "ray-cluster.yaml",
        )
    )
    alone = explain([node], workload="ml/raycluster-a")["workloads"][0]
    assert any(
        "Ray over-commit" in i and "advertises 4 GPUs, Kubernetes allocated 2" in i
        for i in alone["discrepancies"]
    )
    assert any("1 ALIVE Evaluator" in i for i in alone["discrepancies"])
    both = explain([node, cluster], workload="ml/raycluster-a")["workloads"][0]
    assert (both["verdict"]["stage"], both["verdict"]["reason"]) == (
        "pending_placement",
        "ray_infeasible",
    )


def test_cli_pool_on_the_gateway_scenario() -> None:
    """`explain --pool` on the simulated cluster view of gateway-cluster.yaml (GIE v1.6.0's
    pools, llm-d-router v0.10.0's pickers: tests/fixtures/gateway/)."""
    scenario = REPO / "tests" / "fixtures" / "scenarios" / "gateway-cluster.yaml"
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}

    def run(pool: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuledger", "explain", "--scenario", str(scenario),
             "--pool", pool],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip

    held = run("llm/pool-a")
    assert held.returncode == 0, held.stderr
    assert (
        "workload llm/vllm-a\n  gateway: InferencePool llm/pool-a  picker Service pool-a-epp"
        in (held.stdout)
    )
    assert "30 held by flow control" in held.stdout and held.stdout.count("    endpoint ") == 3
    empty = run("llm/pool-empty")
    assert empty.returncode == 0 and "  it selects no pod" in empty.stdout
    missing = run("llm/pool-aa")
    assert missing.returncode == 1 and "did you mean llm/pool-a?" in missing.stderr
