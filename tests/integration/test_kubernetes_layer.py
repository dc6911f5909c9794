"""Kubernetes layer through the harness: fake API server + fake kubelet + fake NVML."""

from __future__ import annotations

from typing import Any

from tests.conftest import pick, value

G0 = "GPU-10000000-0000-4000-8000-000000000000"
G1 = "GPU-10000000-0000-4000-8000-000000000001"
G2 = "GPU-10000000-0000-4000-8000-000000000002"
UID_A, UID_B, UID_C, UID_D, UID_E = (f"{c * 8}-0000-4000-8000-{c * 12}" for c in "abcde")
CID = {k: k * 64 for k in "abcdef"}


def cgroup(uid: str, cid: str) -> str:
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    )


def scenario(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "node": "n1",
        "gpus": [{"uuid": G0}, {"uuid": G1}, {"uuid": G2}],
        "processes": [
            {"pid": 100, "cgroup": cgroup(UID_A, CID["a"]), "gpu_memory": {G0: "30GiB"}},
            {"pid": 200, "cgroup": cgroup(UID_B, CID["b"]), "gpu_memory": {G2: "5GiB"}},
            {"pid": 300, "cgroup": cgroup(UID_C, CID["c"]), "gpu_memory": {G2: "6GiB"}},
            {"pid": 400, "cgroup": cgroup(UID_D, CID["d"]), "gpu_memory": {G2: "1GiB"}},
        ],
        "kubernetes": {
            "pods": [
                {
                    "namespace": "llm",
                    "name": "llama-7d9f8c6b5-x2x4q",
                    "uid": UID_A,
                    "owner": {"kind": "ReplicaSet", "name": "llama-7d9f8c6b5"},
                    "labels": {"pod-template-hash": "7d9f8c6b5"},
                    "containers": [{"name": "vllm", "id": CID["a"], "gpus": 2}],
                },
                {
                    "namespace": "ts",
                    "name": "embed-0",
                    "uid": UID_B,
                    "owner": {"kind": "StatefulSet", "name": "embed"},
                    "containers": [{"name": "server", "id": CID["b"], "gpus": 1}],
                },
                {
                    "namespace": "ts",
                    "name": "rerank-0",
                    "uid": UID_C,
                    "owner": {"kind": "StatefulSet", "name": "rerank"},
                    "containers": [{"name": "server", "id": CID["c"], "gpus": 1}],
                },
                # Asked for no GPU, but its image sets NVIDIA_VISIBLE_DEVICES=all.
                {
                    "namespace": "rogue",
                    "name": "notebook",
                    "uid": UID_D,
                    "containers": [{"name": "jupyter", "id": CID["d"]}],
                },
                {
                    "namespace": "llm",
                    "name": "loading",
                    "uid": UID_E,
                    "ready": False,
                    "containers": [{"name": "vllm", "id": CID["e"], "gpus": 1}],
                },
                {
                    "namespace": "batch",
                    "name": "done",
                    "phase": "Succeeded",
                    "ready": False,
                    "containers": [{"name": "job", "id": CID["f"], "gpus": 1}],
                },
            ]
        },
        "podresources": {
            "allocations": [
                {
                    "namespace": "llm",
                    "pod": "llama-7d9f8c6b5-x2x4q",
                    "container": "vllm",
                    "devices": [G1, G0],
                },
                {
                    "namespace": "ts",
                    "pod": "embed-0",
                    "container": "server",
                    "devices": [f"{G2}::0"],
                },
                {
                    "namespace": "ts",
                    "pod": "rerank-0",
                    "container": "server",
                    "devices": [f"{G2}::1"],
                },
                {"namespace": "llm", "pod": "loading", "container": "vllm", "devices": [G1]},
                # An old kubelet still lists the finished pod's device.
                {"namespace": "batch", "pod": "done", "container": "job", "devices": [G1]},
            ]
        },
    }
    doc.update(overrides)
    return doc


def test_allocations_are_joined_to_pod_uids_and_names(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    rows = pick(s, "gpuledger_gpu_allocation_info")
    held = {(r[1]["pod"], r[1]["pod_uid"], r[1]["container"], r[1]["gpu_uuid"]) for r in rows}
    assert held == {
        ("llama-7d9f8c6b5-x2x4q", UID_A, "vllm", G0),
        ("llama-7d9f8c6b5-x2x4q", UID_A, "vllm", G1),
        ("embed-0", UID_B, "server", G2),
        ("rerank-0", UID_C, "server", G2),
        ("loading", UID_E, "vllm", G1),
    }
    assert {r[1]["resource"] for r in rows} == {"nvidia.com/gpu"}


def test_container_ordinals_from_podresources_follow_cuda_order(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    maps = pick(s, "gpuledger_container_device_info", pod_uid=UID_A)
    # The kubelet listed G1 first; CUDA enumerates by PCI bus: cuda:0 is G0.
    assert {(m[1]["local_index"], m[1]["gpu_uuid"], m[1]["source"]) for m in maps} == {
        ("0", G0, "podresources"),
        ("1", G1, "podresources"),
    }


def test_allocated_but_unused_and_used_without_allocation(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    unused = "gpuledger_gpu_allocated_unused"
    assert value(s, unused, pod_uid=UID_A, gpu_uuid=G1) == 1
    assert value(s, unused, pod_uid=UID_A, gpu_uuid=G0) == 0
    assert value(s, unused, pod_uid=UID_B, gpu_uuid=G2) == 0  # time-sliced, both in use
    assert value(s, unused, pod_uid=UID_C, gpu_uuid=G2) == 0
    unallocated = "gpuledger_gpu_unallocated_use"
    assert value(s, unallocated, pod_uid=UID_D, gpu_uuid=G2) == 1
    assert value(s, unallocated, pod_uid=UID_D, gpu_uuid=G2, namespace="rogue") == 1
    assert value(s, unallocated, pod_uid=UID_B, gpu_uuid=G2) == 0
    # The finished pod the old kubelet still lists holds nothing.
    assert not pick(s, "gpuledger_gpu_allocation_info", pod="done")


def test_per_container_series_carry_names_and_workloads(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    row = pick(s, "gpuledger_container_gpu_memory_used_bytes", pod_uid=UID_A)[0][1]
    assert (row["namespace"], row["pod"], row["container"], row["workload"]) == (
        "llm",
        "llama-7d9f8c6b5-x2x4q",
        "vllm",
        "llama",
    )
    assert value(s, "gpuledger_container_gpu_memory_used_bytes", workload="embed") == 5 * 1024**3


def test_starting_pods(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    assert value(s, "gpuledger_pod_starting", pod="loading") == 1
    assert value(s, "gpuledger_pod_starting", pod="embed-0") == 0
    assert not pick(s, "gpuledger_pod_starting", pod="notebook")  # no GPU request
    assert not pick(s, "gpuledger_pod_starting", pod="done")  # terminated


def test_deleted_pod_series_disappear(simulate: Any) -> None:
    doc = scenario(
        phases=[
            {
                "name": "rerank-gone",
                "pods": {"ts/rerank-0": None},
                "processes": {300: None},
                "allocations": [
                    a for a in scenario()["podresources"]["allocations"] if a["pod"] != "rerank-0"
                ],
            }
        ]
    )
    run = simulate(doc)
    assert pick(run.settle(), "gpuledger_gpu_allocation_info", pod="rerank-0")
    for _ in range(50):
        s = run.scrape(phase="rerank-gone")
        if not pick(s, "gpuledger_pod_starting", pod="rerank-0"):
            break
    for metric in (
        "gpuledger_gpu_allocation_info",
        "gpuledger_container_gpu_memory_used_bytes",
        "gpuledger_gpu_allocated_unused",
        "gpuledger_pod_starting",
    ):
        assert not pick(s, metric, pod_uid=UID_C), metric
    assert pick(s, "gpuledger_gpu_allocation_info", pod_uid=UID_B)


def test_kubelet_down_drops_only_its_series_and_recovers(simulate: Any) -> None:
    doc = scenario(
        phases=[
            {"name": "down", "podresources_fault": "unavailable"},
            {"name": "up", "podresources_fault": "ok"},
        ]
    )
    run = simulate(doc)
    run.settle()
    s = run.scrape(phase="down")
    assert value(s, "gpuledger_source_up", source="podresources") == 0
    assert (
        value(s, "gpuledger_source_errors_total", source="podresources", reason="unavailable") >= 1
    )
    assert not pick(s, "gpuledger_gpu_allocation_info")
    assert not pick(s, "gpuledger_gpu_allocated_unused")  # unknown, not "all fine"
    assert value(s, "gpuledger_container_gpu_memory_used_bytes", pod_uid=UID_A) == 30 * 1024**3
    s = run.scrape(phase="up")
    assert value(s, "gpuledger_source_up", source="podresources") == 1
    assert pick(s, "gpuledger_gpu_allocation_info")


def test_api_server_down_after_first_list_keeps_cached_identities(simulate: Any) -> None:
    doc = scenario(phases=[{"name": "down", "kubernetes_fault": "refuse"}])
    run = simulate(doc)
    run.settle()
    run.node.apply(run.scenario.at_phase("down"))
    for _ in range(100):
        s = run.scrape()
        if value(s, "gpuledger_source_up", source="kubernetes") == 0:
            break
    assert value(s, "gpuledger_source_up", source="kubernetes") == 0
    assert value(s, "gpuledger_source_errors_total", source="kubernetes", reason="unreachable") >= 1
    # The cache from the first list still names the pods; the source's last success
    # timestamp stops moving, which is how the staleness shows.
    row = pick(s, "gpuledger_container_gpu_memory_used_bytes", pod_uid=UID_A)
    assert row and row[0][1]["pod"] == "llama-7d9f8c6b5-x2x4q" and row[0][2] == 30 * 1024**3
    assert value(s, "gpuledger_gpu_allocated_unused", pod_uid=UID_A, gpu_uuid=G1) == 1
    last = value(s, "gpuledger_source_last_success_timestamp_seconds", source="kubernetes")
    s = run.scrape()
    assert value(s, "gpuledger_source_last_success_timestamp_seconds", source="kubernetes") == last
    assert value(s, "gpuledger_source_up", source="nvml") == 1


def test_missing_socket_is_reported_with_its_reason(simulate: Any) -> None:
    run = simulate(scenario(podresources={"fault": "missing", "allocations": []}))
    s = run.scrape()
    assert value(s, "gpuledger_source_up", source="podresources") == 0
    assert (
        value(s, "gpuledger_source_errors_total", source="podresources", reason="socket_missing")
        == 1
    )
    published, _ = run.exporter.current()
    assert any("no PodResources: allocation unknown" in u for u in published.ledger.unknowns)


def test_cluster_mode_reports_unplaced_pods_by_reason(simulate: Any) -> None:
    doc = {
        "node": "cluster-view",
        "mode": "cluster",
        "kubernetes": {
            "pods": [
                {
                    "namespace": "llm",
                    "name": "big-0",
                    "owner": {"kind": "StatefulSet", "name": "big"},
                    "containers": [{"name": "vllm", "gpus": 8}],
                    "pending": {
                        "reason": "Unschedulable",
                        "message": "0/6 nodes are available: 2 node(s) didn't match Pod's node "
                        "affinity/selector, 4 Insufficient nvidia.com/gpu. preemption: 0/6 "
                        "nodes are available: 6 No preemption victims found for incoming pod.",
                    },
                },
                {
                    "namespace": "team",
                    "name": "queued",
                    "containers": [{"name": "t", "gpus": 1}],
                    "pending": {"reason": "SchedulingGated"},
                },
                {"namespace": "llm", "name": "placed", "containers": [{"name": "v", "gpus": 1}]},
            ]
        },
    }
    run = simulate(doc)
    s = run.settle()
    for _ in range(50):
        if len(pick(s, "gpuledger_pod_pending_placement")) == 2:
            break
        s = run.scrape()
    rows = {r[1]["pod"]: r[1] for r in pick(s, "gpuledger_pod_pending_placement")}
    assert set(rows) == {"big-0", "queued"}
    assert rows["big-0"]["reason"] == "insufficient_gpu"
    assert rows["big-0"]["workload"] == "big"
    assert rows["queued"]["reason"] == "scheduling_gated"
    assert value(s, "gpuledger_pod_pending_gpus", pod="big-0") == 8
    assert value(s, "gpuledger_pod_pending_since_timestamp_seconds", pod="big-0") > 1.7e9
    assert not pick(s, "gpuledger_gpu_info")  # cluster mode reads no GPUs
    assert not pick(s, "gpuledger_source_up", source="nvml")


def test_mig_allocations_keep_mig_ids(simulate: Any) -> None:
    mig = "MIG-4b7f3f2c-2a4e-5b8e-9d7c-1f2e3d4c5b6a"
    doc = scenario()
    doc["podresources"]["allocations"].append(
        {
            "namespace": "ts",
            "pod": "embed-0",
            "container": "server",
            "resource": "nvidia.com/mig-1g.10gb",
            "devices": [mig],
        }
    )
    s = simulate(doc).settle()
    row = pick(s, "gpuledger_gpu_allocation_info", gpu_uuid=mig)
    assert row and row[0][1]["resource"] == "nvidia.com/mig-1g.10gb"
    assert row[0][1]["pod_uid"] == UID_B


def test_thousands_of_pending_pods(simulate: Any) -> None:
    pods = [
        {
            "namespace": f"team-{i % 40}",
            "name": f"job-{i}",
            "containers": [{"name": "t", "gpus": 1 + i % 4}],
            "pending": {
                "reason": "Unschedulable",
                "message": f"0/{i % 9 + 3} nodes are available: "
                f"{i % 9 + 3} Insufficient nvidia.com/gpu.",
            },
        }
        for i in range(2000)
    ]
    pods.append(
        {
            "namespace": "x",
            "name": "cpu-only",
            "containers": [{"name": "c"}],
            "pending": {
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu.",
            },
        }
    )
    run = simulate({"mode": "cluster", "kubernetes": {"pods": pods}})
    s = run.settle()
    for _ in range(100):
        rows = pick(s, "gpuledger_pod_pending_placement")
        if len(rows) == 2000:
            break
        s = run.scrape()
    assert len(rows) == 2000  # the pod that asks for no GPU is left out by default
    assert {r[1]["reason"] for r in rows} == {"insufficient_gpu"}
    assert sum(r[2] for r in pick(s, "gpuledger_pod_pending_gpus")) == sum(
        1 + i % 4 for i in range(2000)
    )
