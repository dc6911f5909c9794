"""Scenarios shared by the reliability tests: one node where every source has something to say."""

from __future__ import annotations

from typing import Any

from tests.reliability.harness import cg

GPU0 = "GPU-70000000-0000-4000-8000-000000000000"
GPU1 = "GPU-70000000-0000-4000-8000-000000000001"
TRAIN_UID = "77777777-0000-4000-8000-777777777777"
TRAIN_CID = "7" * 64
RAY_UID = "88888888-0000-4000-8000-888888888888"
RAY_CID = "8" * 64
GIB = 1024**3

SOURCES = ("nvml", "procfs", "podresources", "kubernetes", "vllm", "ray")


def full_node() -> dict[str, Any]:
    """Two GPUs; a training pod on GPU0, a Ray worker pod (one actor) on GPU1, a host
    process on GPU1, one vLLM engine (a static target), all six sources configured."""
    return {
        "node": "n1",
        "gpus": [{"uuid": GPU0}, {"uuid": GPU1}],
        "processes": [
            {
                "pid": 100,
                "cgroup": cg(TRAIN_UID, TRAIN_CID),
                "cmdline": ["python3", "train.py"],
                "environ": {"NVIDIA_VISIBLE_DEVICES": GPU0},
                "gpu_memory": {GPU0: "10GiB"},
            },
            {"pid": 200, "cgroup": cg(RAY_UID, RAY_CID), "cmdline": ["ray", "start"]},
            {
                "pid": 201,
                "ppid": 200,
                "nspid": [201, 42],
                "cgroup": cg(RAY_UID, RAY_CID),
                "cmdline": "ray::Worker",
                "gpu_memory": {GPU1: "5GiB"},
            },
            {"pid": 300, "cmdline": ["host-tool"], "gpu_memory": {GPU1: "1GiB"}},
        ],
        "kubernetes": {
            "pods": [
                {
                    "namespace": "ml",
                    "name": "train-0",
                    "uid": TRAIN_UID,
                    "containers": [{"name": "main", "id": TRAIN_CID, "gpus": 1}],
                },
                {
                    "namespace": "ml",
                    "name": "ray-worker-0",
                    "uid": RAY_UID,
                    "pod_ip": "10.1.0.9",
                    "labels": {"ray.io/cluster": "rc"},
                    "containers": [{"name": "ray", "id": RAY_CID, "gpus": 1}],
                },
            ]
        },
        "podresources": {
            "allocations": [
                {"namespace": "ml", "pod": "train-0", "container": "main", "devices": [GPU0]},
                {"namespace": "ml", "pod": "ray-worker-0", "container": "ray", "devices": [GPU1]},
            ]
        },
        "vllm": [{"engines": [{"model_name": "m", "running": 1, "waiting": 2}]}],
        "ray": {
            "nodes": [{"name": "w", "pod": "ml/ray-worker-0", "gpus": 1}],
            "actors": [{"class_name": "Worker", "node": "w", "pid": 42, "num_gpus": 1}],
        },
    }


CHURN_GPUS = [f"GPU-72000000-0000-4000-8000-{i:012d}" for i in range(4)]


def job_uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


def job_cid(i: int) -> str:
    return f"{i:064x}"


def churn_node(first: int, count: int = 3, lost: tuple[int, ...] = ()) -> dict[str, Any]:
    """Jobs first..first+count-1 are alive: job i is pod churn/job-i with one process
    (pid 1000+i) holding 1 GiB on GPU i % 4, which the kubelet allocated to it. A host
    process (pid 50) always holds 1 GiB on GPU 0. GPUs whose index is in `lost` answer
    GPU_IS_LOST."""
    jobs = range(first, first + count)
    return {
        "node": "n1",
        "gpus": [{"uuid": g, "lost": i in lost} for i, g in enumerate(CHURN_GPUS)],
        "processes": [
            {"pid": 50, "cmdline": ["host-daemon"], "gpu_memory": {CHURN_GPUS[0]: "1GiB"}},
            *(
                {
                    "pid": 1000 + i,
                    "cgroup": cg(job_uid(i), job_cid(i)),
                    "cmdline": ["python3", "job.py"],
                    "environ": {"NVIDIA_VISIBLE_DEVICES": CHURN_GPUS[i % 4], "HF_TOKEN": "x"},
                    "gpu_memory": {CHURN_GPUS[i % 4]: "1GiB"},
                }
                for i in jobs
            ),
        ],
        "kubernetes": {
            "pods": [
                {
                    "namespace": "churn",
                    "name": f"job-{i}",
                    "uid": job_uid(i),
                    "containers": [{"name": "main", "id": job_cid(i), "gpus": 1}],
                }
                for i in jobs
            ]
        },
        "podresources": {
            "allocations": [
                {
                    "namespace": "churn",
                    "pod": f"job-{i}",
                    "container": "main",
                    "devices": [CHURN_GPUS[i % 4]],
                }
                for i in jobs
            ]
        },
    }


RAY_POD_UID = "99999999-0000-4000-8000-999999999999"
RAY_POD_CID = "9" * 64


def soak_node(generation: int) -> dict[str, Any]:
    """churn_node with every source busy: jobs rotate every generation (one ends, one
    starts), GPU 2 is lost for 10 of every 100 generations, the vLLM engine's queue and
    the Ray worker's actors change every time."""
    doc = churn_node(generation % 97, count=3, lost=(2,) if generation % 100 >= 90 else ())
    doc["kubernetes"]["pods"].append(
        {
            "namespace": "ray",
            "name": "worker-0",
            "uid": RAY_POD_UID,
            "pod_ip": "10.2.0.7",
            "labels": {"ray.io/cluster": "rc"},
            "containers": [{"name": "ray", "id": RAY_POD_CID, "gpus": 1}],
        }
    )
    doc["podresources"]["allocations"].append(
        {"namespace": "ray", "pod": "worker-0", "container": "ray", "devices": [CHURN_GPUS[3]]}
    )
    doc["processes"].append(
        {
            "pid": 600,
            "nspid": [600, 7],
            "cgroup": cg(RAY_POD_UID, RAY_POD_CID),
            "cmdline": "ray::Worker",
            "gpu_memory": {CHURN_GPUS[3]: f"{1 + generation % 5}GiB"},
        }
    )
    doc["vllm"] = [
        {
            "engines": [
                {
                    "model_name": "m",
                    "running": generation % 17,
                    "waiting": generation % 5,
                    "preemptions_total": generation,
                    "kv_cache_usage": (generation % 100) / 100,
                }
            ]
        }
    ]
    doc["ray"] = {
        "nodes": [{"name": "w", "pod": "ray/worker-0", "gpus": 1}],
        "actors": [
            {"class_name": "Worker", "node": "w", "pid": 7, "num_gpus": 1},
            {"class_name": "Helper", "node": "w", "pid": 8, "num_gpus": 0,
             "count": 1 + generation % 4},
            {"class_name": "Waiting", "num_gpus": 1, "count": 1 + generation % 3},
        ],
    }  # fmt: skip
    return doc
