"""A TP 4 vLLM engine on the Ray executor across two simulated nodes (identity rule 9).

tests/fixtures/scenarios/ray-engine-node-a.yaml (the Ray head pod: API server, EngineCore,
workers TP0 and TP1) and ray-engine-node-b.yaml (a Ray worker pod: TP2, TP3) describe one
Ray cluster, each from its own node: the real pipeline runs on each in turn, and what both
node agents export is joined as Prometheus and `gpuledger explain` join it. The rules
themselves, in promtool: tests/mixin/test_ray_engine_footprint.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.explain.chain import explain, render_text
from gpuledger.export.document import document_bytes, ledger_document
from gpuledger.sim.fake_apiserver import FakeApiServer, make_agent_pod, make_pod
from gpuledger.sim.scenario import Scenario, load_scenario
from tests.conftest import REPO, Run, Sample, pick, samples, value
from tests.integration.test_fleet_explain import AgentServer

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
ENGINE = {"namespace": "ray", "pod": "llama-head", "engine": "0"}


def scenario(node: str) -> Scenario:
    return load_scenario(SCENARIOS / f"ray-engine-node-{node}.yaml")


def observe(sc: Scenario, tmp: Path, phase: str | None = None) -> tuple[list[Sample], Any]:
    """One node agent's /metrics samples and /ledger.json, once its sources answered."""
    run = Run(sc, tmp)
    try:
        run.settle(phase)
        published = run.exporter.run_once()
        body, _ = run.exporter.render(None)
        return samples(body.decode()), ledger_document(published)
    finally:
        run.close()


def test_both_scenarios_describe_one_ray_cluster() -> None:
    a, b = scenario("a").ray, scenario("b").ray
    assert a is not None and b is not None
    assert (a.cluster, a.jobs) == (b.cluster, b.jobs)
    assert [(n.name, n.gpus) for n in a.nodes] == [(n.name, n.gpus) for n in b.nodes]


def test_engine_a_holds_4_gpus_on_2_nodes_against_tp_4(tmp_path: Path) -> None:
    a, doc_a = observe(scenario("a"), tmp_path / "a")
    b, doc_b = observe(scenario("b"), tmp_path / "b")
    # The engine's node: its Ray job, and TP x PP from the job's placement group.
    (job,) = pick(a, "gpuledger_engine_ray_job_info", **ENGINE)
    identity = {k: job[1][k] for k in ("ray_job_id", "ray_driver_node_id")}
    assert identity["ray_job_id"] == "01000000"
    assert value(a, "gpuledger_engine_gpus", **ENGINE, state="configured") == 4
    # TP 4 from the API server's flags, though it holds no GPU and no GPU process
    # descends from it (the workers are the raylet's children): procfs reads it as the
    # EngineCore's parent.
    (config,) = pick(a, "gpuledger_engine_config_info", **ENGINE)
    assert config[1]["tensor_parallel_size"] == "4"
    assert (doc_a.engines[0].api_server_pid, doc_a.engines[0].pids) == (1050, (1050, 1051))
    assert value(a, "gpuledger_engine_ray_workers", **ENGINE, state="ALIVE") == 4
    assert not pick(a, "gpuledger_engine_gpus", **ENGINE, state="in_use")
    # Each node agent reports the workers on its node under the same identity.
    workers = pick(a, "gpuledger_ray_worker_info", **identity)
    workers += pick(b, "gpuledger_ray_worker_info", **identity)
    assert sorted((w[1]["node"], w[1]["pod"], w[1]["tp_rank"]) for w in workers) == [
        ("gpu-node-a", "llama-head", "0"),
        ("gpu-node-a", "llama-head", "1"),
        ("gpu-node-b", "llama-worker-0", "2"),
        ("gpu-node-b", "llama-worker-0", "3"),
    ]
    memory = pick(a, "gpuledger_ray_worker_gpu_memory_used_bytes", **identity)
    memory += pick(b, "gpuledger_ray_worker_gpu_memory_used_bytes", **identity)
    gpus = {(m[1]["node"], m[1]["gpu_uuid"]) for m in memory}
    assert len(gpus) == 4 and {node for node, _ in gpus} == {"gpu-node-a", "gpu-node-b"}
    assert {m[1]["tp_rank"]: m[2] for m in memory} == dict.fromkeys("0123", 70 * 2**30)

    text = render_text(explain([doc_a, doc_b], engine="ray/llama-head"))
    assert "Ray job 01000000: driver EngineCore pid 11" in text
    for rank, node in (("0", "a"), ("1", "a"), ("2", "b"), ("3", "b")):
        assert f"worker TP{rank} PP0 (bundle {rank}) RayWorkerProc" in text
        line = next(x for x in text.splitlines() if f"worker TP{rank} " in x)
        assert f"on gpu-node-{node}" in line and "holds GPU-" in line
    assert (
        "GPUs in use by its workers: 4 on 2 node(s) (gpu-node-a, gpu-node-b), configured 4 "
        "(TP x PP)" in text
    )
    assert "TP 4 x PP 1" in text
    assert "parallelism mismatch" not in text


def test_workers_on_three_gpus_are_a_parallelism_mismatch(tmp_path: Path) -> None:
    _, doc_a = observe(scenario("a"), tmp_path / "a")
    b, doc_b = observe(scenario("b"), tmp_path / "b", phase="shared-gpu")
    memory = pick(b, "gpuledger_ray_worker_gpu_memory_used_bytes")
    assert len({m[1]["gpu_uuid"] for m in memory}) == 1  # TP2 and TP3 on one GPU
    result = explain([doc_a, doc_b], engine="ray/llama-head")
    (workload,) = result["workloads"]
    assert (
        "parallelism mismatch: ray/llama-head engine 0 is configured for 4 GPU(s) (TP x PP) "
        "but its Ray workers hold 3" in workload["discrepancies"]
    )


def test_a_node_agent_not_read_makes_the_footprint_unknown(tmp_path: Path) -> None:
    _, doc_a = observe(scenario("a"), tmp_path / "a")
    result = explain([doc_a], engine="ray/llama-head")
    text = render_text(result)
    assert "2 worker(s) on Ray node" in text and "its node agent was not read" in text
    assert "GPUs in use by its workers: ? on 1 node(s)" in text
    assert any("its GPUs in use unknown" in u for u in result["unknowns"])
    assert not any("parallelism" in d for d in result["workloads"][0]["discrepancies"])


def test_ray_dashboard_down_leaves_the_rest_and_says_what_is_unknown(tmp_path: Path) -> None:
    sc = scenario("a")
    assert sc.ray is not None
    down = replace(sc, ray=replace(sc.ray, fault="http_500"))
    a, doc = observe(down, tmp_path / "a")
    assert value(a, "gpuledger_source_up", source="ray") == 0
    for source in ("nvml", "procfs", "kubernetes", "podresources", "vllm"):
        assert value(a, "gpuledger_source_up", source=source) == 1, source
    assert value(a, "gpuledger_engine_up", **ENGINE) == 1
    for family in ("gpuledger_engine_ray_job_info", "gpuledger_ray_worker_info"):
        assert not pick(a, family)
    # The engine says it runs on Ray: its own processes' GPUs are not its count.
    assert not pick(a, "gpuledger_engine_gpus", **ENGINE, state="in_use")
    # The GPUs, their memory and who holds them stay known.
    pod = {"namespace": "ray", "pod": "llama-head", "container": "ray-head"}
    assert len(pick(a, "gpuledger_container_gpu_memory_used_bytes", **pod)) == 2
    assert doc.engines[0].ray is None
    text = render_text(explain([doc], engine="ray/llama-head"))
    assert "unknown: gpu-node-a: no Ray state API" in text
    assert "Ray job 0" not in text  # no chain: the job is unknown


def test_explain_finds_the_agents_of_the_workers_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpuledger explain --engine` reads the agent of the engine's pod's node, then those of
    the nodes whose pods are the Ray nodes holding its workers (found by pod IP)."""
    _, doc_a = observe(scenario("a"), tmp_path / "a")
    _, doc_b = observe(scenario("b"), tmp_path / "b")
    agents = {"gpu-node-a": AgentServer(document_bytes(doc_a))}
    agents["gpu-node-b"] = AgentServer(document_bytes(doc_b))
    agents["gpu-node-c"] = AgentServer(b"{}")  # no Ray worker there: never read
    with FakeApiServer() as api:
        for node, agent in agents.items():
            pod = make_agent_pod(
                "monitoring", f"gpuledger-{node}", component="node", node=node, port=agent.port
            )
            api.add_pod(pod)
        labels = {"ray.io/cluster": "llama"}
        for name, node, ip in (
            ("llama-head", "gpu-node-a", "10.244.1.10"),
            ("llama-worker-0", "gpu-node-b", "10.244.2.10"),
        ):
            api.add_pod(make_pod("ray", name, node=node, pod_ip=ip, labels=labels))
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        code = main(
            [
                "explain",
                "--kubeconfig",
                str(kubeconfig),
                "--engine",
                "ray/llama-head",
                "--via",
                "direct",
            ]
        )
    out = capsys.readouterr().out
    for agent in agents.values():
        agent.down()
    assert code == 0, out
    assert "worker TP3 PP0 (bundle 3) RayWorkerProc  pod ray/llama-worker-0 on gpu-node-b" in out
    assert "GPUs in use by its workers: 4 on 2 node(s)" in out
    assert (agents["gpu-node-a"].requests, agents["gpu-node-b"].requests) == (1, 1)
    assert agents["gpu-node-c"].requests == 0


def test_the_weakest_link_among_the_ranks_on_each_node(tmp_path: Path) -> None:
    """Node a's two GPUs are NVLink-bridged, node b's sit on two NUMA nodes: each agent
    says so for the ranks on its node, and explain under the engine's footprint."""
    a, doc_a = observe(scenario("a"), tmp_path / "a")
    b, doc_b = observe(scenario("b"), tmp_path / "b")
    for samples_, node, link in ((a, "gpu-node-a", "nvlink"), (b, "gpu-node-b", "system")):
        rows = pick(samples_, "gpuledger_ray_engine_gpu_link_weakest", ray_job_id="01000000")
        assert {r[1]["link"] for r in rows if r[2] == 1} == {link}, node
        assert len(rows) == 8  # a state set
    text = render_text(explain([doc_a, doc_b], engine="ray/llama-head"))
    assert "ranks on gpu-node-a (pod ray/llama-head) over GPUs 0,1: weakest link nvlink" in text
    assert "ranks on gpu-node-b (pod ray/llama-worker-0) over GPUs 0,1: weakest link system" in (
        text
    )
