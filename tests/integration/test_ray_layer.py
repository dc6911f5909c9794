"""Ray layer through the harness: logical GPUs vs Kubernetes allocation vs NVML."""

from __future__ import annotations

from typing import Any

from tests.conftest import pick, value

G = [f"GPU-50000000-0000-4000-8000-00000000000{i}" for i in range(4)]
UID_W = "aaaaaaaa-7777-4777-8777-777777777777"
CID_W = "7" * 64


def cg(uid: str, cid: str) -> str:
    return (
        f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    )


def scenario(**ray_overrides: Any) -> dict[str, Any]:
    ray: dict[str, Any] = {
        "nodes": [
            {"name": "head", "ip": "10.9.0.1", "gpus": 0, "head": True},
            # `ray start --num-gpus 4` in a pod Kubernetes gave 2 GPUs.
            {"name": "worker", "pod": "ml/raycluster-a-gpu-worker-x8k2", "gpus": 4},
        ],
        "actors": [
            {"class_name": "Trainer", "node": "worker", "pid": 31, "num_gpus": 1},
            {"class_name": "Trainer", "node": "worker", "pid": 32, "num_gpus": 1},
            # ALIVE with num_gpus=1 but its process never touches the GPU.
            {"class_name": "Evaluator", "node": "worker", "pid": 33, "num_gpus": 1},
            {"class_name": "Trainer", "num_gpus": 1, "state": "PENDING_CREATION"},
        ],
    }
    ray.update(ray_overrides)
    return {
        "node": "n1",
        "gpus": [{"uuid": g} for g in G],
        "processes": [
            {
                "pid": 9001,
                "ppid": 1,
                "nspid": [9001, 1],
                "cgroup": cg(UID_W, CID_W),
                "cmdline": ["ray", "start"],
            },
            {
                "pid": 9031,
                "ppid": 9001,
                "nspid": [9031, 31],
                "cgroup": cg(UID_W, CID_W),
                "cmdline": "ray::Trainer",
                "gpu_memory": {G[0]: "20GiB"},
            },
            {
                "pid": 9032,
                "ppid": 9001,
                "nspid": [9032, 32],
                "cgroup": cg(UID_W, CID_W),
                "cmdline": "ray::Trainer",
                "gpu_memory": {G[1]: "21GiB"},
            },
        ],
        "kubernetes": {
            "pods": [
                {
                    "namespace": "ml",
                    "name": "raycluster-a-gpu-worker-x8k2",
                    "uid": UID_W,
                    "pod_ip": "10.9.0.2",
                    "labels": {"ray.io/cluster": "raycluster-a"},
                    "containers": [{"name": "ray-worker", "id": CID_W, "gpus": 2}],
                },
            ]
        },
        "podresources": {
            "allocations": [
                {
                    "namespace": "ml",
                    "pod": "raycluster-a-gpu-worker-x8k2",
                    "container": "ray-worker",
                    "devices": [G[0], G[1]],
                },
            ]
        },
        "ray": ray,
    }


def test_logical_gpus_exceeding_the_pods_allocation_are_visible(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    node = {"pod_uid": UID_W}
    assert value(s, "gpuledger_ray_node_gpus", state="total", **node) == 4
    assert value(s, "gpuledger_ray_node_gpus", state="allocated", **node) == 2
    assert value(s, "gpuledger_ray_node_gpus", state="available", **node) == 1
    # The head is not a pod on this node: not reported here.
    assert len({r[1]["ray_node_id"] for r in pick(s, "gpuledger_ray_node_gpus")}) == 1


def test_actor_gpus_by_class_and_state_with_workload(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    assert (
        value(
            s,
            "gpuledger_ray_actor_gpus",
            class_name="Trainer",
            state="ALIVE",
            workload="raycluster-a",
        )
        == 2
    )
    assert value(s, "gpuledger_ray_actor_gpus", class_name="Evaluator", state="ALIVE") == 1
    # Pending actors are placed on no node: the cluster view counts them, not a node.
    assert not pick(s, "gpuledger_ray_actor_gpus", state="PENDING_CREATION")


def test_actor_memory_through_nspid_and_the_actor_that_holds_none(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    mem = "gpuledger_ray_actor_gpu_memory_used_bytes"
    assert value(s, mem, class_name="Trainer", gpu_uuid=G[0]) == 20 * 1024**3
    assert value(s, mem, class_name="Trainer", gpu_uuid=G[1]) == 21 * 1024**3
    assert value(s, "gpuledger_ray_actors_without_gpu_memory", class_name="Evaluator") == 1
    assert value(s, "gpuledger_ray_actors_without_gpu_memory", class_name="Trainer") == 0


def test_cluster_mode_placement_groups_and_pending_gpus(simulate: Any) -> None:
    doc = {
        "node": "cluster-view",
        "mode": "cluster",
        "ray": {
            "workload": "ml/raycluster-a",
            "nodes": [{"name": "head", "ip": "10.9.0.1", "gpus": 2}],
            "actors": [
                {"class_name": "Trainer", "node": "head", "num_gpus": 2},
                {"class_name": "Trainer", "num_gpus": 1, "state": "PENDING_CREATION"},
            ],
            "placement_groups": [
                {
                    "name": "never-fits",
                    "bundles": [8, 8],
                    "state": "PENDING",
                    "scheduling_state": "INFEASIBLE",
                },
                {
                    "name": "waits",
                    "bundles": [1],
                    "state": "PENDING",
                    "scheduling_state": "NO_RESOURCES",
                },
            ],
        },
    }
    s = simulate(doc).settle()
    ids = {"namespace": "ml", "workload": "raycluster-a"}
    assert (
        value(
            s,
            "gpuledger_ray_placement_groups",
            state="PENDING",
            scheduling_state="INFEASIBLE",
            **ids,
        )
        == 1
    )
    assert (
        value(
            s,
            "gpuledger_ray_placement_groups",
            state="PENDING",
            scheduling_state="NO_RESOURCES",
            **ids,
        )
        == 1
    )
    assert value(s, "gpuledger_ray_pending_gpus", kind="placement_group", **ids) == 17
    assert value(s, "gpuledger_ray_pending_gpus", kind="actor", **ids) == 1
    assert value(s, "gpuledger_source_up", source="ray") == 1


def test_token_auth_and_a_dashboard_that_is_down(simulate: Any) -> None:
    run = simulate(scenario(token="sekret-ray-token"))
    s = run.settle()
    assert value(s, "gpuledger_source_up", source="ray") == 1
    body, _ = run.exporter.render(None)
    assert b"sekret-ray-token" not in body
    run.node.ray.set_fault("refuse")
    s = run.scrape()
    assert value(s, "gpuledger_source_up", source="ray") == 0
    assert value(s, "gpuledger_source_errors_total", source="ray", reason="unreachable") == 1
    assert not pick(s, "gpuledger_ray_node_gpus")
    assert value(s, "gpuledger_source_up", source="nvml") == 1
    run.node.ray.set_fault("ok")
    assert value(run.scrape(), "gpuledger_source_up", source="ray") == 1


def test_wrong_token_says_what_to_do(simulate: Any) -> None:
    run = simulate(scenario(token="right"))
    run.node.ray.set_token("different")
    run.scrape()
    published, _ = run.exporter.current()
    ray = next(s for s in published.ledger.sources if s.source == "ray")
    assert ray.error_reason == "unauthorized"
    assert "--ray-token-file" in (ray.error_message or "")
