"""Kubernetes DRA (issue 21): GPUs allocated through ResourceClaims are joined like
device-plugin GPUs, and a pod waiting on its claims is pending for a claims reason."""

from __future__ import annotations

import time
from functools import cache
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.document.codec import from_json
from gpuledger.explain.chain import explain, render_text
from gpuledger.export.document import document_json, ledger_document
from gpuledger.pipeline import Pipeline
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import load_scenario
from tests.conftest import REPO
from tests.unit.ledger_inputs import exposition, series

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
G0 = "GPU-d0000000-0000-4000-8000-000000000000"
G1 = "GPU-d1000000-0000-4000-8000-000000000001"
G2 = "GPU-d2000000-0000-4000-8000-000000000002"
G4 = "GPU-d4000000-0000-4000-8000-000000000004"
G5 = "GPU-d5000000-0000-4000-8000-000000000005"
MIG = "MIG-d3a00000-0000-4000-8000-000000000031"


@cache
def run(scenario: str) -> tuple[dict[str, Any], str]:
    """A scenario's settled /ledger.json and /metrics, from one cycle."""
    with SimulatedNode(load_scenario(SCENARIOS / scenario)) as node:
        pipeline = Pipeline(node.pipeline_config(5.0))
        try:
            pipeline.warm_up(5.0)
            give_up = time.monotonic() + 5.0
            while True:
                published = pipeline.cycle()
                up = all(s.state != "down" for s in published.ledger.sources)
                if up or time.monotonic() > give_up:
                    doc = dict(document_json(ledger_document(published)))
                    return doc, exposition(published)
                time.sleep(0.1)
        finally:
            pipeline.close()


def node_run() -> tuple[dict[str, Any], str]:
    return run("dra-node.yaml")


def node_doc() -> dict[str, Any]:
    return node_run()[0]


def cluster_doc() -> dict[str, Any]:
    return run("dra-cluster.yaml")[0]


def _allocations(pod: str) -> list[dict[str, Any]]:
    doc = node_doc()
    return [a for c in doc["containers"] if c.get("pod") == pod for a in c["allocations"]]


def _active(kind: str) -> set[tuple[str, str]]:
    return {(d["pod"], d["gpu_uuid"]) for d in node_doc()["discrepancies"] if d["kind"] == kind}


def test_claim_gpu_is_allocated_with_its_claim_and_not_unallocated_use() -> None:
    [held] = _allocations("trainer")
    assert held["gpu_uuid"] == G2
    assert held["claim"]["name"] == "gpu-claim"
    assert held["claim"]["device"] == "gpu-2"
    assert ("trainer", G2) not in _active("unallocated_use")
    assert ("trainer", G2) not in _active("allocated_unused")


def test_mig_device_and_shared_claim_are_attributed_right() -> None:
    [mig] = _allocations("mig-pod")
    assert mig["gpu_uuid"] == MIG and mig["claim"]["name"] == "mig-claim"
    for pod in ("share-a", "share-b"):
        [shared] = _allocations(pod)
        assert (shared["gpu_uuid"], shared["claim"]["name"]) == (G1, "shared-gpu")
    assert not _active("unallocated_use")


def test_one_device_shared_by_two_claims_is_each_claims_share() -> None:
    # Consumable capacity (Kubernetes 1.35): the kubelet names each claim's share of gpu-5.
    for pod, share in (("slice-x", "a1"), ("slice-y", "a2")):
        [held] = _allocations(pod)
        assert held["gpu_uuid"] == G5
        assert held["claim"]["name"] == f"share-claim-{pod[-1]}"
        assert held["claim"]["share_id"] == f"5f1c0000-0000-4000-8000-0000000000{share}"
    assert not {p for p, g in _active("unallocated_use") if g == G5}
    assert not {p for p, g in _active("allocated_unused") if g == G5}
    shares = {
        (labels["pod"], labels["dra_claim_name"], labels["dra_share_id"])
        for name, pairs in series(node_run()[1])
        if name == "gpuledger_dra_allocation_info"
        for labels in [dict(pairs)]
        if labels["gpu_uuid"] == G5
    }
    assert shares == {
        ("slice-x", "share-claim-x", "5f1c0000-0000-4000-8000-0000000000a1"),
        ("slice-y", "share-claim-y", "5f1c0000-0000-4000-8000-0000000000a2"),
    }
    # An unshared device's share label stays empty, as before 1.35.
    assert ("trainer", "gpu-claim", "") in {
        (dict(p)["pod"], dict(p)["dra_claim_name"], dict(p)["dra_share_id"])
        for n, p in series(node_run()[1])
        if n == "gpuledger_dra_allocation_info"
    }


def test_device_plugin_and_dra_gpus_on_one_node_both_report() -> None:
    [plugin] = _allocations("dp-pod")
    assert (plugin["gpu_uuid"], plugin["resource"], plugin["claim"]) == (G0, "nvidia.com/gpu", None)
    assert {s["source"]: s["state"] for s in node_doc()["sources"]}["dra"] == "up"


def test_device_in_no_slice_is_said_not_guessed() -> None:
    assert _allocations("late-pod") == []
    assert ("late-pod", G4) not in _active("unallocated_use")
    assert any("gpu.nvidia.com/dra-node-1/gpu-4" in u for u in node_doc()["unknowns"])


def test_dra_pods_are_gpu_pods() -> None:
    pods = {p["name"]: p["gpu_requests"] for p in node_doc()["pods"]}
    assert pods["trainer"] == 1 and pods["late-pod"] == 1


def test_explain_shows_the_claim_in_the_chain() -> None:
    text = render_text(explain([from_json(node_doc())], pod="ml/trainer"))
    assert "claim ml/gpu-claim: DRA device gpu.nvidia.com/dra-node-1/gpu-2 -> " + G2 in text


def test_pod_that_cannot_allocate_its_claims_is_pending_for_a_claims_reason() -> None:
    pending = {p["name"]: p for p in cluster_doc()["pending"]}
    assert pending["claim-pod"]["reason"] == "claim_unallocatable"
    assert pending["claim-pod"]["gpus"] == 2
    assert pending["classless-0"]["reason"] == "device_class_missing"
    result = explain([from_json(cluster_doc())], workload="ml/claim-job")
    assert result["workloads"][0]["verdict"]["reason"] == "claim_unallocatable"
    text = render_text(result)
    assert "claim gpu-claim: no device of class gpu.nvidia.com fits on 6 nodes" in text


def test_cluster_view_counts_gpu_devices_per_node_from_every_resourceslice() -> None:
    # DRA-only nodes have no nvidia.com/gpu capacity: these series are how the
    # exporter-down rule still counts them as GPU nodes. A NIC driver's slice is no GPU's.
    found = {
        (labels["node"], labels["dra_node"], labels["dra_driver_name"]): value
        for labels, value in _samples(run("dra-cluster.yaml")[1], "gpuledger_dra_node_gpu_devices")
    }
    assert found == {
        ("gpuledger-cluster", "dra-only-1", "gpu.nvidia.com"): 2,
        ("gpuledger-cluster", "dra-only-2", "gpu.nvidia.com"): 1,
    }


def test_node_agent_exports_no_cluster_wide_slice_counts() -> None:
    assert _samples(node_run()[1], "gpuledger_dra_node_gpu_devices") == []


def _samples(text: str, family: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == family
    ]
