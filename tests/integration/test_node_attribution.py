"""The acceptance of the foundation: memory lands on the right pod UID, container and GPU."""

from __future__ import annotations

from typing import Any

from tests.conftest import pick, value

GPU0 = "GPU-11111111-1111-4111-8111-111111111111"
GPU1 = "GPU-22222222-2222-4222-8222-222222222222"
GPU2 = "GPU-33333333-3333-4333-8333-333333333333"
POD_A = "0b9a8c3e-1f2d-4e5a-8b6c-7d8e9f0a1b2c"
POD_B = "5d6e7f80-9a1b-4c2d-8e3f-405162738495"
CTR_A = "a" * 64
CTR_B = "b" * 64


def cgroup_v2(pod_uid: str, container_id: str) -> str:
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/"
        f"cri-containerd-{container_id}.scope"
    )


def cgroup_v1_cgroupfs(pod_uid: str, container_id: str) -> str:
    return "\n".join(
        f"{n}:{c}:/kubepods/besteffort/pod{pod_uid}/{container_id}"
        for n, c in [(12, "memory"), (11, "devices"), (4, "cpu,cpuacct")]
    )


def scenario() -> dict[str, Any]:
    return {
        "node": "n1",
        "gpus": [
            {"index": 0, "uuid": GPU0, "memory_total": "80GiB"},
            {"index": 1, "uuid": GPU1, "memory_total": "80GiB"},
            {"index": 2, "uuid": GPU2, "memory_total": "80GiB"},
        ],
        "processes": [
            # Two pods time-slicing GPU 0, one with a cgroup v1 / cgroupfs layout.
            {
                "pid": 100,
                "cgroup": cgroup_v2(POD_A, CTR_A),
                "gpu_memory": {GPU0: "10GiB"},
                "environ": {"NVIDIA_VISIBLE_DEVICES": GPU0},
            },
            {
                "pid": 101,
                "ppid": 100,
                "cgroup": cgroup_v2(POD_A, CTR_A),
                "gpu_memory": {GPU0: "2GiB"},
            },
            {
                "pid": 200,
                "cgroup": cgroup_v1_cgroupfs(POD_B, CTR_B),
                "gpu_memory": {GPU0: "6GiB", GPU2: "1GiB"},
                "environ": {
                    "NVIDIA_VISIBLE_DEVICES": f"{GPU2},{GPU0}",
                    "CUDA_VISIBLE_DEVICES": "1,0",
                },
            },
            # A host process in no pod.
            {
                "pid": 300,
                "cgroup": "0::/user.slice/user-1000.slice/session-1.scope",
                "gpu_memory": {GPU1: "3GiB"},
            },
        ],
    }


GiB = 1024**3


def test_two_pods_on_one_gpu_are_split_by_pod_uid(simulate: Any) -> None:
    s = simulate(scenario()).scrape()
    name = "gpuledger_container_gpu_memory_used_bytes"
    assert value(s, name, pod_uid=POD_A, gpu_uuid=GPU0) == 12 * GiB
    assert value(s, name, pod_uid=POD_B, gpu_uuid=GPU0) == 6 * GiB
    assert value(s, name, pod_uid=POD_B, gpu_uuid=GPU2) == 1 * GiB
    assert value(s, "gpuledger_container_gpu_processes", pod_uid=POD_A, gpu_uuid=GPU0) == 2
    # Names are unknown without the Kubernetes layer: the short container ID stands in.
    assert value(s, name, pod_uid=POD_A, gpu_uuid=GPU0) == value(
        s, name, container=CTR_A[:12], gpu_uuid=GPU0
    )


def test_host_process_is_unattributed_not_lost(simulate: Any) -> None:
    s = simulate(scenario()).scrape()
    assert value(s, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=GPU1) == 3 * GiB
    assert value(s, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=GPU0) == 0
    assert not pick(s, "gpuledger_container_gpu_memory_used_bytes", gpu_uuid=GPU1)


def test_container_ordinals_follow_pci_order_not_env_order(simulate: Any) -> None:
    s = simulate(scenario()).scrape()
    devices = pick(s, "gpuledger_container_device_info", pod_uid=POD_B)
    ordinals = {d[1]["local_index"]: d[1]["gpu_uuid"] for d in devices}
    # NVIDIA_VISIBLE_DEVICES lists GPU2 first, but CUDA enumerates in PCI order.
    assert ordinals == {"0": GPU0, "1": GPU2}
    assert {d[1]["source"] for d in devices} == {"env"}


def test_reordering_cuda_visible_devices_maps_process_ordinals(simulate: Any) -> None:
    run = simulate(scenario())
    run.scrape()
    published, _ = run.exporter.current()
    assert published is not None
    view = {p.pid: p for p in published.ledger.processes}
    # CUDA_VISIBLE_DEVICES=1,0 inside the container: cuda:0 is container ordinal 1 = GPU2.
    assert view[200].cuda_devices == (GPU2, GPU0)
    assert view[300].cuda_devices == (GPU0, GPU1, GPU2)  # host process sees every GPU


def test_gpu_level_series(simulate: Any) -> None:
    s = simulate(scenario()).scrape()
    info = pick(s, "gpuledger_gpu_info", gpu_uuid=GPU1)
    assert info and info[0][1]["gpu_index"] == "1" and info[0][1]["node"] == "n1"
    assert value(s, "gpuledger_gpu_memory_used_bytes", gpu_uuid=GPU0) == 18 * GiB
    assert value(s, "gpuledger_gpu_memory_total_bytes", gpu_uuid=GPU0) == 80 * GiB
    assert value(s, "gpuledger_gpu_up", gpu_uuid=GPU2) == 1
    assert value(s, "gpuledger_source_up", source="nvml") == 1
    assert value(s, "gpuledger_source_up", source="procfs") == 1


def test_exited_process_series_disappear(simulate: Any) -> None:
    doc = scenario()
    doc["phases"] = [{"name": "b-exits", "processes": {200: None}}]
    run = simulate(doc)
    assert pick(run.scrape(), "gpuledger_container_gpu_memory_used_bytes", pod_uid=POD_B)
    after = run.scrape(phase="b-exits")
    assert not pick(after, "gpuledger_container_gpu_memory_used_bytes", pod_uid=POD_B)
    assert pick(after, "gpuledger_container_gpu_memory_used_bytes", pod_uid=POD_A)
