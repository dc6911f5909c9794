"""A simulated MIG node through the real pipeline: every MIG device's memory lands on the
right pod and container, through PodResources (the device plugin's single and mixed
strategies, and its index strategy) and through the environment alike; allocated-unused
and unallocated-use are judged per MIG device; the series carry the parent GPU."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Sample, pick, value

GIB = 1024**3
GPU_A = "GPU-a1a1a1a1-0000-4000-8000-000000000000"
GPU_B = "GPU-b2b2b2b2-0000-4000-8000-000000000001"
GPU_PLAIN = "GPU-c3c3c3c3-0000-4000-8000-000000000002"

# (MIG UUID, parent, MIG device index, profile, GPU instance id)
MIGS = [
    ("MIG-a0000000-1111-5000-8000-00000000a000", GPU_A, 0, "1g.10gb", 9),
    ("MIG-a1111111-1111-5000-8000-00000000a001", GPU_A, 1, "1g.10gb", 10),
    ("MIG-a2222222-1111-5000-8000-00000000a002", GPU_A, 2, "3g.40gb", 2),
    ("MIG-b0000000-1111-5000-8000-00000000b000", GPU_B, 0, "3g.40gb", 1),
    ("MIG-b1111111-1111-5000-8000-00000000b001", GPU_B, 3, "4g.40gb", 2),
]
INDEX_FORM = {GPU_A: 0, GPU_B: 1}  # GPU_PLAIN is index 2


def pod_uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-00000000{n:04x}"


def container_id(n: int) -> str:
    return f"{n:02x}" * 32


def cgroup(n: int) -> str:
    uid = pod_uid(n).replace("-", "_")
    return (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{uid}.slice/cri-containerd-{container_id(n)}.scope"
    )


def mig_node(strategy: str) -> dict[str, Any]:
    """One pod per MIG device, each with one process holding a distinct amount of memory
    on its device (pod i: i+1 GiB), so a device attributed to the wrong pod shows.

    strategy: `single` (nvidia.com/gpu, MIG UUIDs), `mixed` (nvidia.com/mig-<profile>),
    `index` (mixed, `<gpu>:<mig>` ids), or `env` (no PodResources: the container's
    NVIDIA_VISIBLE_DEVICES names the device, by UUID or `<gpu>:<mig>`).
    """
    pods, allocations, processes = [], [], []
    for i, (mig, parent, index, profile, _) in enumerate(MIGS):
        n = i + 1
        resource = "nvidia.com/gpu" if strategy == "single" else f"nvidia.com/mig-{profile}"
        index_form = f"{INDEX_FORM[parent]}:{index}"
        device = index_form if strategy == "index" or (strategy == "env" and i % 2) else mig
        pods.append(
            {
                "namespace": "mig",
                "name": f"p{n}",
                "uid": pod_uid(n),
                "containers": [
                    {"name": f"c{n}", "id": container_id(n), "gpus": 1, "gpu_resource": resource}
                ],
            }
        )
        allocations.append(
            {"namespace": "mig", "pod": f"p{n}", "container": f"c{n}", "resource": resource,
             "devices": [device]}
        )  # fmt: skip
        processes.append(
            {
                "pid": 1000 + n,
                "cgroup": cgroup(n),
                "environ": {"NVIDIA_VISIBLE_DEVICES": device},
                "gpu_memory": {mig: f"{n}GiB"},
            }
        )
    doc: dict[str, Any] = {
        "node": "mig-node",
        "gpus": [
            {"uuid": GPU_A, "memory_reserved": "1GiB", "mig": _migs(GPU_A)},
            {"uuid": GPU_B, "mig": _migs(GPU_B)},
            {"uuid": GPU_PLAIN, "utilization": 0.25},
        ],
        "processes": processes,
        "kubernetes": {"pods": pods},
    }
    if strategy != "env":
        doc["podresources"] = {"allocations": allocations}
    return doc


def _migs(parent: str) -> list[dict[str, Any]]:
    return [
        {"uuid": mig, "index": index, "profile": profile, "gpu_instance_id": gi}
        for mig, p, index, profile, gi in MIGS
        if p == parent
    ]


def assert_every_device_on_its_pod(s: list[Sample], *, allocated: bool) -> None:
    for i, (mig, parent, _, _, _) in enumerate(MIGS):
        n = i + 1
        who = {"namespace": "mig", "pod": f"p{n}", "pod_uid": pod_uid(n), "container": f"c{n}"}
        rows = pick(s, "gpuledger_container_gpu_memory_used_bytes", **who)
        assert [(r[1]["gpu_uuid"], r[1]["parent_gpu_uuid"], r[2]) for r in rows] == [
            (mig, parent, n * GIB)
        ], (mig, rows)
        assert pick(s, "gpuledger_container_gpu_memory_used_bytes", gpu_uuid=mig) == rows
        assert value(s, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=mig) == 0
        # The container's ordinal 0 is its MIG device, from PodResources or its environment.
        device = value(
            s, "gpuledger_container_device_info", **{**who, "local_index": "0", "gpu_uuid": mig}
        )
        assert device == 1
        if allocated:
            assert value(s, "gpuledger_gpu_allocation_info", **who, gpu_uuid=mig) == 1
            assert value(s, "gpuledger_gpu_allocated_unused", **who, gpu_uuid=mig) == 0
            assert value(s, "gpuledger_gpu_unallocated_use", **who, gpu_uuid=mig) == 0


@pytest.mark.parametrize("strategy", ["single", "mixed", "index"])
def test_podresources_attributes_every_mig_device(simulate: Any, strategy: str) -> None:
    s = simulate(mig_node(strategy)).settle()
    assert value(s, "gpuledger_source_up", source="podresources") == 1
    assert_every_device_on_its_pod(s, allocated=True)
    assert not pick(s, "gpuledger_gpu_allocated_unused", gpu_uuid=GPU_A)
    for name in ("gpuledger_gpu_allocated_unused", "gpuledger_gpu_unallocated_use"):
        assert sum(r[2] for r in pick(s, name)) == 0
    # Mixed-strategy pods ask for nvidia.com/mig-*: they are GPU pods all the same.
    assert len(pick(s, "gpuledger_pod_starting", namespace="mig")) == len(MIGS)


def test_the_environment_attributes_every_mig_device(simulate: Any) -> None:
    s = simulate(mig_node("env")).settle()
    source = {r[1]["source"] for r in pick(s, "gpuledger_container_device_info")}
    assert source == {"env"}
    assert_every_device_on_its_pod(s, allocated=False)


def test_mig_device_series_carry_their_parent(simulate: Any) -> None:
    s = simulate(mig_node("single")).settle()
    for mig, parent, index, profile, gi in MIGS:
        info = pick(s, "gpuledger_mig_device_info", gpu_uuid=mig)
        assert [r[1] for r in info] == [
            {
                "node": "mig-node",
                "gpu_uuid": mig,
                "parent_gpu_uuid": parent,
                "mig_index": str(index),
                "gpu_instance_id": str(gi),
                "compute_instance_id": "0",
                "profile": profile,
            }
        ]
        assert value(s, "gpuledger_gpu_up", gpu_uuid=mig, parent_gpu_uuid=parent) == 1
        total = int(profile.split(".")[1].removesuffix("gb")) * GIB
        assert value(s, "gpuledger_gpu_memory_total_bytes", gpu_uuid=mig) == total
        # NVML has no utilization for a MIG device: none is invented.
        assert not pick(s, "gpuledger_gpu_utilization_ratio", gpu_uuid=mig)
    # Each process counted once: on its MIG device; the GPU's memory holds its instances'.
    assert value(s, "gpuledger_gpu_memory_used_bytes", gpu_uuid=GPU_A) == (1 + 1 + 2 + 3) * GIB
    assert value(s, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=GPU_A) == 0
    assert not pick(s, "gpuledger_gpu_utilization_ratio", gpu_uuid=GPU_A)
    # A GPU's series are as they were: no parent label, and physical GPUs count once.
    plain = pick(s, "gpuledger_gpu_up", gpu_uuid=GPU_PLAIN)
    assert [set(r[1]) for r in plain] == [{"node", "gpu_uuid"}]
    assert value(s, "gpuledger_gpu_utilization_ratio", gpu_uuid=GPU_PLAIN) == 0.25
    assert len(pick(s, "gpuledger_gpu_info")) == 3
    modes = {r[1]["gpu_uuid"]: r[1]["mig_mode"] for r in pick(s, "gpuledger_gpu_info")}
    assert modes == {GPU_A: "enabled", GPU_B: "enabled", GPU_PLAIN: "disabled"}


def test_allocated_unused_and_unallocated_use_per_mig_device(simulate: Any) -> None:
    doc = mig_node("mixed")
    mig0, mig1 = MIGS[0][0], MIGS[1][0]
    # p1's process leaves its device; p2's also opens p1's (a privileged pod, say).
    doc["processes"][0]["gpu_memory"] = {}
    doc["processes"][1]["gpu_memory"] = {mig1: "2GiB", mig0: "5GiB"}
    s = simulate(doc).settle()
    p1 = {"pod": "p1", "container": "c1"}
    p2 = {"pod": "p2", "container": "c2"}
    assert value(s, "gpuledger_gpu_allocated_unused", **p1, gpu_uuid=mig0) == 1
    assert value(s, "gpuledger_gpu_allocated_unused", **p2, gpu_uuid=mig1) == 0
    assert value(s, "gpuledger_gpu_unallocated_use", **p2, gpu_uuid=mig0) == 1
    assert value(s, "gpuledger_gpu_unallocated_use", **p2, gpu_uuid=mig1) == 0
    unused = pick(s, "gpuledger_gpu_allocated_unused", gpu_uuid=mig0)
    assert [r[1]["parent_gpu_uuid"] for r in unused] == [GPU_A]
    assert sum(r[2] for r in pick(s, "gpuledger_gpu_allocated_unused")) == 1
    assert sum(r[2] for r in pick(s, "gpuledger_gpu_unallocated_use")) == 1


def test_ledger_json_carries_mig_devices_under_their_gpu(simulate: Any) -> None:
    from gpuledger.export.document import document_json, ledger_document

    run = simulate(mig_node("single"))
    run.settle()
    published, _ = run.exporter.current()
    assert published is not None
    doc = document_json(ledger_document(published))
    gpus = {g["uuid"]: g for g in doc["gpus"]}
    assert gpus[GPU_PLAIN]["mig_devices"] == []
    under_a = gpus[GPU_A]["mig_devices"]
    assert [(m["uuid"], m["index"], m["gpu_instance_id"], m["profile"]) for m in under_a] == [
        (mig, index, gi, profile) for mig, p, index, profile, gi in MIGS if p == GPU_A
    ]
    assert {m["parent_uuid"] for m in under_a} == {GPU_A}
    assert under_a[0]["memory_used_bytes"] == 1 * GIB
    usage = {
        (c["pod"], u["gpu_uuid"], u["memory_used_bytes"])
        for c in doc["containers"]
        for u in c["usage"]
    }
    assert usage == {(f"p{i + 1}", m[0], (i + 1) * GIB) for i, m in enumerate(MIGS)}
