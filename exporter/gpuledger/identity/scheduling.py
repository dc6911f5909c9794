"""Why a Pod is not placed, and which workload it belongs to (docs/design.md, identity rule 7).

Pure functions over the JSON shapes the Kubernetes API returns (camelCase keys), so the
informer can call them on raw watch events without building client model objects.

Unschedulable messages are the scheduler's human text, e.g.::

    0/6 nodes are available: 3 node(s) didn't match node selector, 6 Insufficient
    nvidia.com/gpu. preemption: 0/6 nodes are available: 6 No preemption victims found
    for incoming pod.

Its wording changed across releases (`had taint {k: v}, that the pod didn't tolerate`
before 1.25, `had untolerated taint {k: v}` after; `didn't match node selector` before
1.21, `didn't match Pod's node affinity/selector` after), so clauses are matched by key
phrases, and text never seen before falls to `other` rather than failing.

Dynamic Resource Allocation (kube-scheduler's `DynamicResources` plugin, read in
Kubernetes 1.34) adds its own clauses: `cannot allocate all claims` (no node has devices
that fit every claim, or an allocated claim's node is not this one: `resourceclaim not
available on the node`), `resourceclaim in use` (reserved for as many pods as it may
be), `resource claim ... is in the process of being allocated`, `device class ... does
not exist`, and `resourceclaim ... is being deleted`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "CLAIM_CAUSES",
    "DEFAULT_GPU_RESOURCES",
    "PENDING_REASONS",
    "PLACEMENT_CAUSES",
    "cause_nodes",
    "classify_pending",
    "classify_unschedulable",
    "is_gpu_resource",
    "pod_scheduled_condition",
    "workload_of",
]

# Entries ending in "*" are prefixes: MIG profiles are resources of their own
# (`nvidia.com/mig-1g.10gb`, ...) under the device plugin's "mixed" strategy.
DEFAULT_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-*")

# Tie-break precedence, strongest first. A GPU shortage wins a tie because it is the
# cause capacity planning acts on; taints and selectors are configuration, `other` last.
# A claim's causes sit after the device-plugin shortage: a class that does not exist
# and a claim being deleted are configuration, no waiting fixes them; the rest resolve.
PLACEMENT_CAUSES: tuple[str, ...] = (
    "insufficient_gpu",
    "claim_unallocatable",
    "device_class_missing",
    "claim_deleting",
    "claim_in_use",
    "claim_allocating",
    "taint",
    "node_selector",
    "affinity",
    "other",
)
PENDING_REASONS: tuple[str, ...] = (*PLACEMENT_CAUSES, "scheduling_gated")

WORKLOAD_LABEL = "gpuledger.io/workload"
RAY_CLUSTER_LABEL = "ray.io/cluster"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
# Deployments label their pods with the ReplicaSet's hash; Argo Rollouts use their own key.
TEMPLATE_HASH_LABELS = ("pod-template-hash", "rollouts-pod-template-hash")

# The tail after ". preemption:" repeats the node count with preemption outcomes.
_PREEMPTION_TAIL = re.compile(r"\.?\s*preemption:", re.IGNORECASE)
_HEADER = re.compile(r"^\s*\d+/\d+ nodes are available:?\s*", re.IGNORECASE)
# Clauses are "<count> <text>" joined by ", "; the pre-1.25 taint clause has a comma of
# its own (", that the pod didn't tolerate"), so split only where a count follows.
_CLAUSE_SPLIT = re.compile(r",\s*(?=\d+\s)")
# Bounded digits: int() of thousands of digits raises in Python >= 3.11.
_COUNTED = re.compile(r"^\s*(\d{1,9})\s+(.*)$", re.DOTALL)
# Anchored at the clause start, so a taint key or value that says "Insufficient" is no
# resource shortage.
_INSUFFICIENT = re.compile(r"^\s*insufficient\s+(\S+)", re.IGNORECASE)
_VOLUME = re.compile(r"volume node affinity|persistent ?volume", re.IGNORECASE)
_TAINT = re.compile(r"\btaint|were unschedulable", re.IGNORECASE)
# Inter-pod (anti-)affinity, in all its wordings: "didn't match pod affinity rules",
# "didn't match pod anti-affinity rules", "didn't satisfy existing pods anti-affinity
# rules", "didn't match pod affinity/anti-affinity".
_POD_AFFINITY = re.compile(r"\bpods? (?:anti-)?affinity|anti-affinity", re.IGNORECASE)
# "didn't match Pod's node affinity/selector", "didn't match node selector",
# "didn't match Pod's node affinity".
_NODE_SELECTOR = re.compile(r"node affinity|node selector|nodeselector", re.IGNORECASE)
# The DynamicResources plugin's clauses, checked first: a claim's name may say anything.
_CLAIM_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"cannot allocate all claims|resourceclaim not available", re.I),
        "claim_unallocatable",
    ),
    (re.compile(r"device ?class\b.*\b(?:does not exist|not found)", re.I), "device_class_missing"),
    (re.compile(r"resource ?claim\b.*\bbeing deleted", re.I), "claim_deleting"),
    (re.compile(r"resource ?claim\b.*\bin use\b", re.I), "claim_in_use"),
    (re.compile(r"process of being allocated", re.I), "claim_allocating"),
)
# Causes of the DynamicResources plugin: the pod's claims, not its resource limits.
CLAIM_CAUSES: tuple[str, ...] = tuple(cause for _, cause in _CLAIM_CAUSES)


def is_gpu_resource(name: str, gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES) -> bool:
    """Whether an extended resource name counts as a GPU (`*` suffix = prefix match)."""
    for pattern in gpu_resources:
        if pattern.endswith("*"):
            if name.startswith(pattern[:-1]):
                return True
        elif name == pattern:
            return True
    return False


def _clause_cause(text: str, gpu_resources: Sequence[str]) -> tuple[str, bool]:
    """(cause, is_resource_shortage) of one clause's text."""
    insufficient = _INSUFFICIENT.match(text)
    if insufficient is not None:
        resource = insufficient.group(1).rstrip(".,;")
        cause = "insufficient_gpu" if is_gpu_resource(resource, gpu_resources) else "other"
        return cause, True
    for pattern, claim_cause in _CLAIM_CAUSES:
        if pattern.search(text):
            return claim_cause, claim_cause == "claim_unallocatable"
    if _VOLUME.search(text):  # "volume node affinity conflict" is storage, not placement rules
        return "other", False
    # A cordoned node ("were unschedulable") is the node repelling every pod, the same
    # operator action as a NoSchedule taint; newer releases word it as the taint itself.
    if _TAINT.search(text):
        return "taint", False
    if _POD_AFFINITY.search(text):
        return "affinity", False
    if _NODE_SELECTOR.search(text):
        return "node_selector", False
    return "other", False


def classify_unschedulable(
    message: str, gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES
) -> str:
    """The dominant cause in a scheduler `Unschedulable` message.

    Each clause's node count is added to its cause, except resource shortages: one node
    lacking both cpu and memory is counted in both `Insufficient` clauses, so those take
    the largest clause per cause instead of the sum. The cause with the most nodes wins;
    ties go by `PLACEMENT_CAUSES` order. Clauses without a count weigh one node.
    Returns one of `PLACEMENT_CAUSES`, never raises.
    """
    if not isinstance(message, str):
        return "other"
    body = _PREEMPTION_TAIL.split(message, maxsplit=1)[0]
    body = _HEADER.sub("", body).strip().rstrip(".")
    summed: dict[str, int] = {}
    shortage: dict[str, int] = {}
    for clause in _CLAUSE_SPLIT.split(body):
        if not clause.strip():
            continue
        counted = _COUNTED.match(clause)
        count, text = (int(counted.group(1)), counted.group(2)) if counted else (1, clause)
        cause, is_shortage = _clause_cause(text, gpu_resources)
        if is_shortage:
            shortage[cause] = max(shortage.get(cause, 0), count)
        else:
            summed[cause] = summed.get(cause, 0) + count
    scores = {c: summed.get(c, 0) + shortage.get(c, 0) for c in PLACEMENT_CAUSES}
    best = max(scores.values())
    if best <= 0:
        return "other"
    # PLACEMENT_CAUSES is in precedence order, so the first at the maximum wins the tie.
    return next(c for c in PLACEMENT_CAUSES if scores[c] == best)


def cause_nodes(
    message: str, cause: str, gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES
) -> int | None:
    """Nodes the scheduler's message counts for `cause` (clauses summed), None if none."""
    body = _HEADER.sub("", _PREEMPTION_TAIL.split(message, maxsplit=1)[0]).strip().rstrip(".")
    total = None
    for clause in _CLAUSE_SPLIT.split(body):
        counted = _COUNTED.match(clause)
        if counted is not None and _clause_cause(counted.group(2), gpu_resources)[0] == cause:
            total = (total or 0) + int(counted.group(1))
    return total


def pod_scheduled_condition(
    conditions: Iterable[Mapping[str, Any]] | None,
) -> Mapping[str, Any] | None:
    """The `PodScheduled` entry of `status.conditions`, if present."""
    for condition in conditions or ():
        if isinstance(condition, Mapping) and condition.get("type") == "PodScheduled":
            return condition
    return None


def classify_pending(
    conditions: Iterable[Mapping[str, Any]] | None,
    gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES,
) -> str | None:
    """Why a Pod is not placed, from its `status.conditions`; None when it is placed or
    the scheduler has not looked at it yet (no PodScheduled condition).

    `SchedulingGated` (Kueue and other admission controllers hold `schedulingGates`)
    -> `scheduling_gated`; `Unschedulable` -> `classify_unschedulable(message)`; any
    other reason for PodScheduled=False (e.g. `SchedulerError`) -> `other`.
    """
    condition = pod_scheduled_condition(conditions)
    if condition is None or condition.get("status") != "False":
        return None
    reason = condition.get("reason")
    if reason == "SchedulingGated":
        return "scheduling_gated"
    if reason == "Unschedulable":
        message = condition.get("message")
        return classify_unschedulable(message if isinstance(message, str) else "", gpu_resources)
    return "other"


def _controller_owner(owner_references: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The managing owner (`controller: true`), else the first one listed."""
    owners = [o for o in owner_references if isinstance(o, Mapping)]
    for owner in owners:
        if owner.get("controller") is True:
            return owner
    return owners[0] if owners else None


# Template hashes are rendered with Kubernetes' "safe" alphabet (no vowels, no 0/1/3).
_HASH_SUFFIX = re.compile(r"^(.+)-([bcdfghjklmnpqrstvwxz2456789]{5,10})$")


def _deployment_of(replicaset: str, labels: Mapping[str, str]) -> str:
    for key in TEMPLATE_HASH_LABELS:
        template_hash = labels.get(key)
        if template_hash and replicaset.endswith(f"-{template_hash}"):
            return replicaset[: -len(template_hash) - 1]
    match = _HASH_SUFFIX.match(replicaset)
    return match.group(1) if match else replicaset  # a bare ReplicaSet keeps its name


def workload_of(
    pod_name: str,
    labels: Mapping[str, str] | None,
    owner_references: Sequence[Mapping[str, Any]] | None,
) -> str:
    """The owner a person would name (rule 7); the namespace is a separate label.

    Precedence: label `gpuledger.io/workload`; label `ray.io/cluster` (the RayCluster);
    label `leaderworkerset.sigs.k8s.io/name` (LWS pods are owned by StatefulSets the LWS
    made); then the controlling owner: a ReplicaSet stands for its Deployment (name minus
    the `-<pod-template-hash>` suffix); StatefulSet, Job, DaemonSet and other kinds give
    their own name. A Job made by a CronJob keeps the Job's name: the Pod only references
    the Job, and looking up the Job's owner would cost an API call per Job. Pods with no
    owner, and static pods (whose owner is their Node), are their own workload.
    """
    labels = labels or {}
    for key in (WORKLOAD_LABEL, RAY_CLUSTER_LABEL, LWS_NAME_LABEL):
        value = labels.get(key)
        if value:
            return value
    owner = _controller_owner(owner_references or ())
    if owner is None:
        return pod_name
    kind = owner.get("kind")
    name = owner.get("name")
    if not isinstance(name, str) or not name or kind == "Node":
        return pod_name
    if kind == "ReplicaSet":
        return _deployment_of(name, labels)
    return name
