"""A dense MIG node for the benchmarks: 8 GPUs in MIG mode, each cut into 7 MIG devices
of profile 1g.10gb (an H100/H200 at its finest MIG layout), 56 pods each given one MIG
device by the device plugin's mixed strategy (`nvidia.com/mig-1g.10gb`) and running one
CUDA process on it under its container's init, plus 64 CPU-only pods (120 pods on the
node, as on the dense node of benchmarks/dense_node.py)."""

from __future__ import annotations

from typing import Any

from benchmarks.dense_node import _cgroup, _cid, _uid

GPUS = 8
MIG_PER_GPU = 7
PROFILE = "1g.10gb"
# GPU instance ids NVML gives seven 1g.10gb instances on an H100: 7 to 13.
FIRST_GPU_INSTANCE = 7
PODS = 120
RESOURCE = f"nvidia.com/mig-{PROFILE}"  # the device plugin's mixed strategy


def mig_uuid(gpu: int, mig: int) -> str:
    return f"MIG-{_uid('mig', gpu * MIG_PER_GPU + mig)}"


def dense_mig_node() -> dict[str, Any]:
    gpus = []
    for g in range(GPUS):
        gpus.append(
            {
                "uuid": f"GPU-{_uid('mig-gpu', g)}",
                "index": g,
                "memory_reserved": "512MiB",
                "mig": [
                    {
                        "uuid": mig_uuid(g, m),
                        "profile": PROFILE,
                        "index": m,
                        "gpu_instance_id": FIRST_GPU_INSTANCE + m,
                        "memory_total": "9984MiB",
                    }
                    for m in range(MIG_PER_GPU)
                ],
            }
        )
    processes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    allocations: list[dict[str, Any]] = []
    pid = 20_000
    for i in range(GPUS * MIG_PER_GPU):
        uid, cid = _uid("mig-pod", i), _cid("mig-pod", i)
        device = mig_uuid(i // MIG_PER_GPU, i % MIG_PER_GPU)
        cgroup = _cgroup(uid, cid)
        environ = {"NVIDIA_VISIBLE_DEVICES": device, "PATH": "/usr/bin"}
        processes += [
            {
                "pid": pid,
                "ppid": 1,
                "cgroup": cgroup,
                "cmdline": ["tini", "--"],
                "environ": environ,
            },
            {
                "pid": pid + 1,
                "ppid": pid,
                "cgroup": cgroup,
                "cmdline": ["python3", "serve.py"],
                "environ": environ,
                "gpu_memory": {device: f"{4 + i % 5}GiB"},
            },
        ]
        pid += 10
        name = f"small-{i}"
        namespace = f"team-{i % 6}"
        pods.append(
            {
                "namespace": namespace,
                "name": name,
                "uid": uid,
                "owner": {"kind": "ReplicaSet", "name": f"small-{i % 10}-6c9d8f7b5"},
                "containers": [
                    {
                        "name": "server",
                        "id": cid,
                        "gpus": 1,
                        "gpu_resource": f"nvidia.com/mig-{PROFILE}",
                    }
                ],
            }
        )
        allocations.append(
            {
                "namespace": namespace,
                "pod": name,
                "container": "server",
                "resource": RESOURCE,
                "devices": [device],
            }
        )
    while len(pods) < PODS:
        i = len(pods)
        pods.append(
            {
                "namespace": "misc",
                "name": f"web-{i}",
                "uid": _uid("mig-web", i),
                "containers": [{"name": "app", "id": _cid("mig-web", i)}],
            }
        )
    return {
        "node": "bench-mig-node",
        "gpus": gpus,
        "processes": processes,
        "kubernetes": {"pods": pods},
        "podresources": {"allocations": allocations},
    }
