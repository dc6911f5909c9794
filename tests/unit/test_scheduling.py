"""Pending-placement reasons and workload names (identity rule 7), as pure functions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.identity.scheduling import (
    PENDING_REASONS,
    PLACEMENT_CAUSES,
    classify_pending,
    classify_unschedulable,
    is_gpu_resource,
    workload_of,
)

# Scheduler messages as clusters print them, from several releases (the taint and node
# selector wordings changed), with and without the preemption tail.
MESSAGES: list[tuple[str, str, str]] = [
    (
        "design example: 6 gpu beats 3 selector",
        "0/6 nodes are available: 3 node(s) didn't match node selector, 6 Insufficient "
        "nvidia.com/gpu. preemption: 0/6 nodes are available: 6 No preemption victims found "
        "for incoming pod.",
        "insufficient_gpu",
    ),
    (
        "1.27 single gpu node full, double dot",
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
        "available: 1 No preemption victims found for incoming pod..",
        "insufficient_gpu",
    ),
    (
        "1.25+ untolerated taint",
        "0/1 nodes are available: 1 node(s) had untolerated taint {gpu: }. preemption: 0/1 "
        "nodes are available: 1 Preemption is not helpful for scheduling..",
        "taint",
    ),
    (
        "control plane taint plus gpu shortage",
        "0/6 nodes are available: 1 node(s) had untolerated taint "
        "{node-role.kubernetes.io/control-plane: }, 5 Insufficient nvidia.com/gpu. "
        "preemption: 0/6 nodes are available: 1 Preemption is not helpful for scheduling, "
        "5 No preemption victims found for incoming pod.",
        "insufficient_gpu",
    ),
    (
        "pod affinity minority",
        "0/4 nodes are available: 1 node(s) didn't match pod affinity rules, 3 Insufficient "
        "nvidia.com/gpu. preemption: 0/4 nodes are available: 1 Preemption is not helpful "
        "for scheduling, 3 No preemption victims found for incoming pod.",
        "insufficient_gpu",
    ),
    (
        "pre-1.25 taints with their own commas, summed across keys",
        "0/13 nodes are available: 2 node(s) had taint {node-role.kubernetes.io/master: }, "
        "that the pod didn't tolerate, 2 node(s) were unschedulable, 3 node(s) didn't match "
        "Pod's node affinity/selector, 3 node(s) had taint {node-role.kubernetes.io/infra: }, "
        "that the pod didn't tolerate, 3 node(s) had taint {nvidia.com/gpu: }, that the pod "
        "didn't tolerate.",
        "taint",
    ),
    (
        "1.21+ node affinity/selector",
        "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector.",
        "node_selector",
    ),
    (
        "1.18 node selector",
        "0/3 nodes are available: 3 node(s) didn't match node selector.",
        "node_selector",
    ),
    (
        "1.20 node affinity",
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity.",
        "node_selector",
    ),
    (
        "pod anti-affinity",
        "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.",
        "affinity",
    ),
    (
        "older inter-pod wordings",
        "0/3 nodes are available: 1 node(s) didn't satisfy existing pods anti-affinity "
        "rules, 2 node(s) didn't match pod affinity/anti-affinity.",
        "affinity",
    ),
    (
        "volume node affinity is storage, not placement rules",
        "0/4 nodes are available: 4 node(s) had volume node affinity conflict.",
        "other",
    ),
    (
        "cpu and memory shortage",
        "0/3 nodes are available: 3 Insufficient cpu, 3 Insufficient memory.",
        "other",
    ),
    (
        "shortages overlap on a node: largest clause, not the sum",
        "0/4 nodes are available: 4 Insufficient cpu, 4 Insufficient memory, 4 Insufficient "
        "nvidia.com/gpu.",
        "insufficient_gpu",
    ),
    (
        "more nodes short of cpu than of gpu",
        "0/5 nodes are available: 5 Insufficient cpu, 3 Insufficient nvidia.com/gpu.",
        "other",
    ),
    (
        "tie: gpu beats selector",
        "0/4 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, "
        "2 Insufficient nvidia.com/gpu.",
        "insufficient_gpu",
    ),
    (
        "tie: taint beats selector",
        "0/4 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, "
        "2 node(s) had untolerated taint {dedicated: infra}.",
        "taint",
    ),
    (
        "tie: selector beats affinity",
        "0/4 nodes are available: 2 node(s) didn't match pod affinity rules, "
        "2 node(s) didn't match Pod's node affinity/selector.",
        "node_selector",
    ),
    (
        "tie: affinity beats other",
        "0/4 nodes are available: 2 node(s) didn't match pod affinity rules, 2 Too many pods.",
        "affinity",
    ),
    (
        "MIG profile resource",
        "0/2 nodes are available: 2 Insufficient nvidia.com/mig-1g.10gb. preemption: 0/2 "
        "nodes are available: 2 No preemption victims found for incoming pod.",
        "insufficient_gpu",
    ),
    (
        "another vendor's gpu is not configured",
        "0/2 nodes are available: 2 Insufficient amd.com/gpu.",
        "other",
    ),
    (
        "prefilter rejection without counts",
        "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. "
        "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.",
        "other",
    ),
    ("empty cluster", "no nodes available to schedule pods", "other"),
    ("empty message", "", "other"),
    (
        "third-party scheduler clause",
        "0/10 nodes are available: 1 node unregisterd, 6 node(s) didn't match Pod's node "
        "affinity/selector.",
        "node_selector",
    ),
    (
        "ports and pod count",
        "0/3 nodes are available: 1 Too many pods, 2 node(s) didn't have free ports for the "
        "requested pod ports.",
        "other",
    ),
    (
        "topology spread",
        "0/5 nodes are available: 3 node(s) didn't match pod topology spread constraints, "
        "2 Insufficient nvidia.com/gpu.",
        "other",
    ),
    (
        "a taint value that says Insufficient",
        "0/2 nodes are available: 2 node(s) had untolerated taint {reason: Insufficient}.",
        "taint",
    ),
    ("cordoned nodes", "0/2 nodes are available: 2 node(s) were unschedulable.", "taint"),
    (
        "preemption tail is ignored",
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. "
        "preemption: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        "node_selector",
    ),
    (
        "persistent volumes",
        "0/3 nodes are available: 3 node(s) didn't find available persistent volumes to bind.",
        "other",
    ),
    (
        "dynamic resource allocation",
        "0/1 nodes are available: 1 cannot allocate all claims.",
        "claim_unallocatable",
    ),
    (
        "DRA: claim allocated on another node beside a selector",
        "0/6 nodes are available: 5 resourceclaim not available on the node, "
        "1 node(s) didn't match Pod's node affinity/selector.",
        "claim_unallocatable",
    ),
    (
        "DRA: a device class that does not exist",
        "0/6 nodes are available: device class gpu.nvidia.comm does not exist.",
        "device_class_missing",
    ),
    (
        "DRA: claim being deleted",
        'resourceclaim "ml/gpu-claim" is being deleted',
        "claim_deleting",
    ),
    (
        "DRA: shared claim fully reserved",
        "0/6 nodes are available: resourceclaim in use.",
        "claim_in_use",
    ),
    (
        "DRA: claim being allocated",
        "resource claim ml/gpu-claim is in the process of being allocated",
        "claim_allocating",
    ),
    (
        "DRA: a device-plugin shortage outweighs fewer claim nodes",
        "0/6 nodes are available: 4 Insufficient nvidia.com/gpu, 2 cannot allocate all claims.",
        "insufficient_gpu",
    ),
    (
        "no header",
        "6 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {a: b}",
        "insufficient_gpu",
    ),
]


@pytest.mark.parametrize(
    ("message", "expected"), [(m, e) for _, m, e in MESSAGES], ids=[n for n, _, _ in MESSAGES]
)
def test_classify_unschedulable(message: str, expected: str) -> None:
    assert classify_unschedulable(message) == expected


def test_configured_gpu_resources() -> None:
    message = "0/2 nodes are available: 2 Insufficient amd.com/gpu."
    assert classify_unschedulable(message, ("amd.com/gpu",)) == "insufficient_gpu"
    # Configuring a list replaces the default: nvidia.com/gpu is then an ordinary resource.
    nvidia = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    assert classify_unschedulable(nvidia, ("amd.com/gpu",)) == "other"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/mig-3g.40gb", True),
        ("nvidia.com/gpu.shared", False),
        ("nvidia.com/gpumem", False),
        ("cpu", False),
    ],
)
def test_is_gpu_resource(name: str, expected: bool) -> None:
    assert is_gpu_resource(name) is expected


@given(st.text())
def test_classify_unschedulable_never_raises(message: str) -> None:
    assert classify_unschedulable(message) in PLACEMENT_CAUSES


_CLAUSES = st.sampled_from(
    [
        "node(s) had untolerated taint {a: b}",
        "node(s) had taint {x: }, that the pod didn't tolerate",
        "Insufficient nvidia.com/gpu",
        "Insufficient cpu",
        "node(s) didn't match Pod's node affinity/selector",
        "node(s) didn't match pod affinity rules",
        "node(s) had volume node affinity conflict",
        "Too many pods",
    ]
)


@given(
    st.lists(st.tuples(st.integers(0, 10**12), _CLAUSES), max_size=8),
    st.text(max_size=20),
)
def test_classify_unschedulable_scheduler_shaped(clauses: list[tuple[int, str]], tail: str) -> None:
    body = ", ".join(f"{n} {text}" for n, text in clauses)
    message = f"0/9 nodes are available: {body}. preemption: {tail}"
    assert classify_unschedulable(message) in PLACEMENT_CAUSES


def _scheduled(status: str, reason: str | None = None, message: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {"type": "PodScheduled", "status": status, "message": message}
    if reason is not None:
        condition["reason"] = reason
    return condition


READY = {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        pytest.param(None, None, id="no conditions"),
        pytest.param([READY], None, id="not yet seen by the scheduler"),
        pytest.param([_scheduled("True"), READY], None, id="placed"),
        pytest.param(
            [
                _scheduled(
                    "False",
                    "SchedulingGated",
                    "Scheduling is blocked due to non-empty scheduling gates",
                )
            ],
            "scheduling_gated",
            id="kueue gate",
        ),
        pytest.param(
            [
                _scheduled(
                    "False",
                    "Unschedulable",
                    "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                )
            ],
            "insufficient_gpu",
            id="unschedulable",
        ),
        pytest.param([_scheduled("False", "Unschedulable")], "other", id="unschedulable, no text"),
        pytest.param(
            [_scheduled("False", "SchedulerError", "binding rejected")], "other", id="other reason"
        ),
        pytest.param([_scheduled("Unknown")], None, id="unknown status"),
        pytest.param(["garbage", {"type": 3}], None, id="malformed entries"),
    ],
)
def test_classify_pending(conditions: Any, expected: str | None) -> None:
    result = classify_pending(conditions)
    assert result == expected
    assert result is None or result in PENDING_REASONS


def _owner(kind: str, name: str, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "controller": controller}


WORKLOADS: list[tuple[str, str, dict[str, str], list[dict[str, Any]], str]] = [
    (
        "deployment through its replicaset, hash label",
        "vllm-llama-5b6c7f889c-x7k2p",
        {"pod-template-hash": "5b6c7f889c"},
        [_owner("ReplicaSet", "vllm-llama-5b6c7f889c")],
        "vllm-llama",
    ),
    (
        "deployment, no hash label: suffix shaped like a hash",
        "api-7d9fb6c8d4-abcde",
        {},
        [_owner("ReplicaSet", "api-7d9fb6c8d4")],
        "api",
    ),
    (
        "bare replicaset keeps its name (suffix is no hash)",
        "cache-tier-xyz12",
        {},
        [_owner("ReplicaSet", "cache-tier")],
        "cache-tier",
    ),
    (
        "argo rollout hash label",
        "canary-6f8b9c7d5-q",
        {"rollouts-pod-template-hash": "6f8b9c7d5"},
        [_owner("ReplicaSet", "canary-6f8b9c7d5")],
        "canary",
    ),
    ("statefulset", "db-0", {}, [_owner("StatefulSet", "db")], "db"),
    ("job", "train-abcde", {}, [_owner("Job", "train")], "train"),
    (
        "job made by a cronjob keeps the job name",
        "nightly-28934520-xkq9z",
        {},
        [_owner("Job", "nightly-28934520")],
        "nightly-28934520",
    ),
    (
        "leaderworkerset label over its statefulset",
        "llm-0-1",
        {"leaderworkerset.sigs.k8s.io/name": "llm"},
        [_owner("StatefulSet", "llm-0")],
        "llm",
    ),
    (
        "ray cluster label",
        "raycluster-gpu-worker-abc",
        {"ray.io/cluster": "raycluster-gpu"},
        [{"kind": "RayCluster", "name": "raycluster-gpu", "controller": True}],
        "raycluster-gpu",
    ),
    (
        "override label wins over everything",
        "x-5b6c7f889c-abc",
        {
            "gpuledger.io/workload": "chat",
            "ray.io/cluster": "rc",
            "pod-template-hash": "5b6c7f889c",
        },
        [_owner("ReplicaSet", "x-5b6c7f889c")],
        "chat",
    ),
    ("no owner: the pod itself", "debug", {}, [], "debug"),
    ("static pod owned by its node", "etcd-node1", {}, [_owner("Node", "node1")], "etcd-node1"),
    ("daemonset", "gpuledger-abcde", {}, [_owner("DaemonSet", "gpuledger")], "gpuledger"),
    (
        "controller owner preferred over the first",
        "p",
        {},
        [_owner("ConfigMap", "cm", controller=False), _owner("StatefulSet", "ss")],
        "ss",
    ),
]


@pytest.mark.parametrize(
    ("pod", "labels", "owners", "expected"),
    [(p, lab, o, e) for _, p, lab, o, e in WORKLOADS],
    ids=[n for n, *_ in WORKLOADS],
)
def test_workload_of(
    pod: str, labels: dict[str, str], owners: list[dict[str, Any]], expected: str
) -> None:
    assert workload_of(pod, labels, owners) == expected


def test_workload_of_tolerates_none() -> None:
    assert workload_of("p", None, None) == "p"
