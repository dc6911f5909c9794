"""Ray joined to pods, processes and GPUs (identity rules 3 and 4). Pure.

Ray's ledger is logical (`num_gpus`), Kubernetes' is the device plugin's, NVML's is
physical. Node mode puts the three side by side for the Ray nodes that are pods here;
cluster mode counts what Ray cannot place, attributed to the Ray cluster's workload.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpuledger.model import frozen_map
from gpuledger.model.kubernetes import PodInfo
from gpuledger.model.procfs import ProcessInfo
from gpuledger.model.ray import LocalRayNode, RayActor, RayNode, RaySnapshot


@dataclass(frozen=True)
class RayNodeView:
    node: RayNode
    pod: PodInfo | None  # None outside Kubernetes
    # GPUs Kubernetes allocated to the Ray pod (PodResources); None when unknown.
    gpus_allocated: int | None


@dataclass(frozen=True)
class RayActorGpus:
    """Logical GPUs of one Ray node's actors, by class and state."""

    node: RayNodeView
    class_name: str
    state: str
    gpus: float
    # ALIVE GPU actors of this class whose process holds no GPU memory (NVML).
    without_memory: int | None


@dataclass(frozen=True)
class RayActorMemory:
    node: RayNodeView
    class_name: str
    gpu_uuid: str
    used_bytes: int


@dataclass(frozen=True)
class RayLocal:
    """Node mode: what the local Ray nodes say, joined."""

    nodes: tuple[RayNodeView, ...]
    actor_gpus: tuple[RayActorGpus, ...]
    actor_memory: tuple[RayActorMemory, ...]


@dataclass(frozen=True)
class RayCluster:
    """Cluster mode: what Ray cannot place."""

    namespace: str
    workload: str
    placement_groups: Mapping[tuple[str, str], int]
    pending_gpus: Mapping[str, float]


class HostPids:
    """Ray reports PIDs in the pod's PID namespace: the host PID by NSpid (rule 3).

    Indexed once per ledger: a scan of every process per actor was quadratic on a dense
    node. Where several processes match, the first in `procs` order wins, as before.
    """

    def __init__(self, procs: Mapping[int, ProcessInfo]) -> None:
        self._in_pod: dict[tuple[str | None, int], int] = {}
        self._anywhere: dict[int, int] = {}
        for info in procs.values():
            if info.nspid:
                inner = info.nspid[-1]
                self._in_pod.setdefault((info.cgroup.pod_uid, inner), info.pid)
                self._anywhere.setdefault(inner, info.pid)

    def of(self, actor: RayActor, pod: PodInfo | None) -> int | None:
        if actor.pid is None or actor.pid <= 0:
            return None
        if pod is None:
            return self._anywhere.get(actor.pid)
        return self._in_pod.get((pod.uid, actor.pid))


def build_ray_local(
    snapshots: Sequence[LocalRayNode],
    procs: Mapping[int, ProcessInfo] | None,
    memory_by_pid: Mapping[int, Sequence[tuple[str, int | None]]],
    allocated_by_pod: Mapping[str, int] | None,
) -> RayLocal:
    nodes: list[RayNodeView] = []
    actor_gpus: list[RayActorGpus] = []
    actor_memory: list[RayActorMemory] = []
    host_pids = HostPids(procs) if procs is not None else None
    for local in snapshots:
        snapshot, node, pod = local.snapshot, local.node, local.pod
        allocated = (
            allocated_by_pod.get(pod.uid, 0) if allocated_by_pod is not None and pod else None
        )
        view = RayNodeView(node, pod, allocated)
        nodes.append(view)
        local_actors = [a for a in snapshot.actors if a.node_id in (None, node.node_id)]
        unused: dict[str, int] = defaultdict(int)
        memory: dict[tuple[str, str], int] = defaultdict(int)
        for actor in local_actors:
            if actor.state != "ALIVE" or actor.node_id != node.node_id or not actor.num_gpus:
                continue
            pid = host_pids.of(actor, pod) if host_pids is not None else None
            held = memory_by_pid.get(pid, ()) if pid is not None else ()
            for uuid, used in held:
                memory[(actor.class_name, uuid)] += used or 0
            if procs is not None and not any((used or 0) > 0 for _, used in held):
                unused[actor.class_name] += 1
        counts = gpu_actor_counts(RaySnapshot(actors=tuple(local_actors)))
        for (class_name, state), gpus in sorted(counts.items()):
            actor_gpus.append(
                RayActorGpus(
                    view,
                    class_name,
                    state,
                    gpus,
                    (unused.get(class_name, 0) if procs is not None else None)
                    if state == "ALIVE"
                    else None,
                )
            )
        actor_memory.extend(
            RayActorMemory(view, cls, uuid, used) for (cls, uuid), used in sorted(memory.items())
        )
    return RayLocal(tuple(nodes), tuple(actor_gpus), tuple(actor_memory))


def build_ray_cluster(snapshot: RaySnapshot, namespace: str, workload: str) -> RayCluster:
    return RayCluster(
        namespace=namespace,
        workload=workload,
        placement_groups=placement_group_counts(snapshot),
        pending_gpus=pending_gpus(snapshot),
    )


# RESTARTING is "equivalent to PENDING_CREATION" in Ray's ActorState docs: the actor waits
# to be placed again. DEPENDENCIES_UNREADY waits for its arguments, not for resources.
PENDING_ACTOR_STATES: Final = frozenset({"PENDING_CREATION", "RESTARTING"})


def gpu_actor_counts(snapshot: RaySnapshot) -> Mapping[tuple[str, str], float]:
    """Logical GPUs held (ALIVE) or asked (pending) by GPU actors, by (class_name, state).

    DEAD actors hold nothing and are left out.
    """
    counts: dict[tuple[str, str], float] = {}
    for actor in snapshot.actors:
        if actor.num_gpus <= 0 or actor.state == "DEAD":
            continue
        key = (actor.class_name, actor.state)
        counts[key] = counts.get(key, 0.0) + actor.num_gpus
    return frozen_map(counts)


def pending_gpus(snapshot: RaySnapshot) -> Mapping[str, float]:
    """GPUs asked by Ray work that is not placed, by kind (placement_group / actor).

    A placement group in PENDING counts all its bundles; in RESCHEDULING only bundles that
    lost their node. An actor counts when it is pending and belongs to no placement group
    in the snapshot: an actor inside a group asks for the group's bundle, which is either
    counted with the group (pending) or already reserved (created) - never twice.
    """
    by_kind = {"placement_group": 0.0, "actor": 0.0}
    group_ids = {g.pg_id for g in snapshot.placement_groups}
    for group in snapshot.placement_groups:
        if group.state == "PENDING":
            by_kind["placement_group"] += group.gpus
        elif group.state == "RESCHEDULING":
            by_kind["placement_group"] += sum(b.gpus for b in group.bundles if b.node_id is None)
    for actor in snapshot.actors:
        if actor.state not in PENDING_ACTOR_STATES or actor.num_gpus <= 0:
            continue
        if actor.placement_group_id is not None and actor.placement_group_id in group_ids:
            continue
        by_kind["actor"] += actor.num_gpus
    return frozen_map(by_kind)


def placement_group_counts(snapshot: RaySnapshot) -> Mapping[tuple[str, str], int]:
    """Placement groups by (state, scheduling_state); "" where Ray gave no scheduling state."""
    counts: dict[tuple[str, str], int] = {}
    for group in snapshot.placement_groups:
        key = (group.state, group.scheduling_state or "")
        counts[key] = counts.get(key, 0) + 1
    return frozen_map(counts)
