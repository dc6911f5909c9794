"""A dense simulated node for the benchmarks: 8 GPUs, 64 GPU processes, 120 pods,
8 vLLM engines (expositions the size of the real 0.32 sample), 2,000 Ray actors
cluster-wide. `scale` multiplies processes and pods (and actors)."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

GPUS = 8


def _uid(kind: str, i: int) -> str:
    return str(uuid.UUID(hashlib.md5(f"{kind}-{i}".encode()).hexdigest()))


def _cid(kind: str, i: int) -> str:
    return hashlib.sha256(f"{kind}-{i}".encode()).hexdigest()


def _cgroup(pod_uid: str, cid: str) -> str:
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    )


def dense_node(scale: int = 1) -> dict[str, Any]:
    gpus = [f"GPU-{_uid('gpu', i)}" for i in range(GPUS)]
    processes: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    allocations: list[dict[str, Any]] = []
    vllm: list[dict[str, Any]] = []
    pid = 10_000
    # 8 vLLM engines, one GPU each: API server -> EngineCore -> worker (16 GPU processes).
    for e in range(8):
        uid, cid = _uid("llm", e), _cid("llm", e)
        name = f"llm-{e}"
        g = gpus[e]
        cg = _cgroup(uid, cid)
        processes += [
            {
                "pid": pid,
                "ppid": 1,
                "cgroup": cg,
                "cmdline": [
                    "vllm",
                    "serve",
                    "/models/m",
                    "--max-num-seqs",
                    "128",
                    "--api-key",
                    "x",
                ],
                "environ": {"NVIDIA_VISIBLE_DEVICES": g, "HF_TOKEN": "hf_x", "PATH": "/usr/bin"},
            },
            {
                "pid": pid + 1,
                "ppid": pid,
                "cgroup": cg,
                "cmdline": "VLLM::EngineCore",
                "gpu_memory": {g: "600MiB"},
            },
            {
                "pid": pid + 2,
                "ppid": pid + 1,
                "cgroup": cg,
                "cmdline": "VLLM::Worker_TP0",
                "gpu_memory": {g: "60GiB"},
            },
        ]
        pid += 10
        pods.append(
            {
                "namespace": "serve",
                "name": name,
                "uid": uid,
                "owner": {"kind": "StatefulSet", "name": f"model-{e % 4}"},
                "containers": [{"name": "vllm", "id": cid, "gpus": 1}],
            }
        )
        allocations.append(
            {"namespace": "serve", "pod": name, "container": "vllm", "devices": [f"{g}::0"]}
        )
        vllm.append(
            {
                "pod": f"serve/{name}",
                "engines": [
                    {
                        "model_name": f"org/model-{e % 4}",
                        "running": 20 + e,
                        "waiting": e * 3,
                        "waiting_by_reason": {"capacity": e * 3, "deferred": 0},
                        "kv_cache_usage": 0.1 * e,
                        "preemptions_total": e,
                    }
                ],
            }
        )
    # 48 * scale more GPU processes in time-sliced pods, 2 processes per pod.
    for p in range(24 * scale):
        uid, cid = _uid("ts", p), _cid("ts", p)
        g = gpus[p % GPUS]
        cg = _cgroup(uid, cid)
        processes += [
            {
                "pid": pid,
                "ppid": 1,
                "cgroup": cg,
                "cmdline": ["python3", "serve.py"],
                "environ": {"NVIDIA_VISIBLE_DEVICES": g},
                "gpu_memory": {g: "1GiB"},
            },
            {
                "pid": pid + 1,
                "ppid": pid,
                "cgroup": cg,
                "cmdline": ["python3", "worker.py"],
                "gpu_memory": {g: "512MiB"},
            },
        ]
        pid += 10
        name = f"embed-{p}"
        pods.append(
            {
                "namespace": f"team-{p % 6}",
                "name": name,
                "uid": uid,
                "owner": {"kind": "ReplicaSet", "name": f"embed-{p % 10}-5d8c7b9f6"},
                "labels": {"pod-template-hash": "5d8c7b9f6"},
                "containers": [{"name": "server", "id": cid, "gpus": 1}],
            }
        )
        allocations.append(
            {
                "namespace": f"team-{p % 6}",
                "pod": name,
                "container": "server",
                "devices": [f"{g}::{p + 1}"],
            }
        )
    # CPU-only pods to reach 120 * scale pods, 2 of them Ray workers.
    while len(pods) < 120 * scale:
        i = len(pods)
        pods.append(
            {
                "namespace": "misc",
                "name": f"web-{i}",
                "uid": _uid("web", i),
                "pod_ip": f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}",
                "labels": {"ray.io/cluster": "rc"} if i % 60 == 0 else {},
                "containers": [{"name": "app", "id": _cid("web", i)}],
            }
        )
    ray_pods = [p for p in pods if p.get("labels", {}).get("ray.io/cluster")]
    ray_nodes = [
        {"name": f"local-{i}", "pod": f"misc/{p['name']}", "gpus": 0}
        for i, p in enumerate(ray_pods)
    ]
    ray_nodes += [
        {"name": f"remote-{i}", "ip": f"10.200.{i // 250}.{i % 250 + 1}", "gpus": 8}
        for i in range(98)
    ]
    # Ray actors stay 2,000 cluster-wide at every scale: the scale is this node's pods.
    actors = [
        {
            "class_name": f"Actor{i % 7}",
            "node": ray_nodes[i % len(ray_nodes)]["name"],
            "pid": 100 + i,
            "num_gpus": 0 if i % 3 else 1,
        }
        for i in range(2000)
    ]
    return {
        "node": "bench-node",
        "gpus": [
            {"uuid": g, "index": i, "memory_reserved": "512MiB", "utilization": 0.5}
            for i, g in enumerate(gpus)
        ],
        "processes": processes,
        "kubernetes": {"pods": pods},
        "podresources": {"allocations": allocations},
        "vllm": vllm,
        "ray": {"nodes": ray_nodes, "actors": actors},
    }
