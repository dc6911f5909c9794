"""Ray joined to pods, processes and GPUs (identity rules 3 and 4). Pure.

Ray's ledger is logical (`num_gpus`), Kubernetes' is the device plugin's, NVML's is
physical. Node mode puts the three side by side for the Ray nodes that are pods here;
cluster mode counts what Ray cannot place, attributed to the Ray cluster's workload.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from gpuledger.engines.ray import is_worker, worker_ranks
from gpuledger.identity.rayjobs import RayEngineId, WorkerRanks, engine_id
from gpuledger.ledger import caps
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
class RayWorker:
    """A vLLM worker actor on a local Ray node, named by its engine's cross-node identity
    (identity rule 9), with the GPUs its process holds (NVML by PID)."""

    node: RayNodeView
    engine: RayEngineId
    actor_id: str
    class_name: str  # RayWorkerProc (RayExecutorV2) | RayWorkerWrapper (legacy)
    name: str  # vllm_Worker_<instance>_TP<t>…; "" for the legacy executor
    bundle_index: int | None
    ranks: WorkerRanks
    pid: int | None  # Ray's, in the Ray pod's PID namespace
    host_pid: int | None  # None: no process NVML lists is this actor
    # (device UUID, bytes) its process holds; empty when it holds none.
    memory: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class RayEngineLink:
    """The GPUs the workers of one Ray-executor engine hold on one local Ray node (its
    ranks on this node), and the weakest link among them (ledger/topology.py)."""

    node: RayNodeView
    engine: RayEngineId
    gpus: tuple[str, ...]
    link: str  # one of model.nvml.LINK_LEVELS


@dataclass(frozen=True)
class RayLocal:
    """Node mode: what the local Ray nodes say, joined."""

    nodes: tuple[RayNodeView, ...]
    actor_gpus: tuple[RayActorGpus, ...]
    actor_memory: tuple[RayActorMemory, ...]
    # vLLM Ray workers here; empty while procfs, NVML or Ray's job list is unknown.
    workers: tuple[RayWorker, ...] = ()
    # Per (Ray node, engine) holding two GPUs or more here: the weakest link among them.
    engine_links: tuple[RayEngineLink, ...] = ()


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
) -> tuple[RayLocal, RayLocal]:
    """The local Ray nodes joined, and the overflow: rows a cap kept out (ledger/caps.py).

    One Ray node per pod (a second one would repeat the pod's label set), at most
    MAX_RAY_NODES, those with the most GPUs; per Ray node at most MAX_RAY_ACTOR_CLASSES
    actor classes, those holding the most GPUs, the rest folded into OTHER_CLASS; at most
    MAX_GPU_ROWS actor memory rows. The overflow holds the rows left out or folded.
    """
    kept, over = _Rows(), _Rows()
    host_pids = HostPids(procs) if procs is not None else None
    chosen = _chosen_nodes(snapshots)
    for i, local in enumerate(snapshots):
        pod = local.pod
        allocated = (
            allocated_by_pod.get(pod.uid, 0) if allocated_by_pod is not None and pod else None
        )
        view = RayNodeView(local.node, pod, allocated)
        rows, memory = _actor_rows(view, local, host_pids, memory_by_pid, procs is not None)
        workers = [] if host_pids is None else ray_workers(view, local, host_pids, memory_by_pid)
        if i not in chosen:
            over.add(view, rows, memory, workers)
            continue
        rows, memory, folded_rows, folded_memory = fold_actor_classes(rows, memory)
        kept.add(view, rows, memory, workers)
        over.add(None, folded_rows, folded_memory)
    memory_kept, memory_surplus = caps.split(kept.actor_memory, caps.MAX_GPU_ROWS)
    kept.actor_memory = list(memory_kept)
    over.actor_memory.extend(memory_surplus)
    kept.workers, surplus = cap_workers(kept.workers)
    over.workers.extend(surplus)
    return kept.local(), over.local()


def ray_workers(
    view: RayNodeView,
    local: LocalRayNode,
    host_pids: HostPids,
    memory_by_pid: Mapping[int, Sequence[tuple[str, int | None]]],
) -> list[RayWorker]:
    """The ALIVE vLLM worker actors of RUNNING jobs on this Ray node (none while the
    job list is unknown), by actor id."""
    snapshot = local.snapshot
    ids = {j.job_id: engine_id(j, snapshot.nodes) for j in snapshot.jobs or ()}
    found = []
    for actor in sorted(snapshot.actors, key=lambda a: a.actor_id):
        engine = ids.get(actor.job_id or "")
        if engine is None or actor.state != "ALIVE" or actor.node_id != view.node.node_id:
            continue
        if not is_worker(actor):
            continue
        pid = host_pids.of(actor, view.pod)
        held: dict[str, int] = defaultdict(int)
        for uuid, used in memory_by_pid.get(pid, ()) if pid is not None else ():
            held[uuid] += used or 0
        found.append(
            RayWorker(
                node=view,
                engine=engine,
                actor_id=actor.actor_id,
                class_name=actor.class_name,
                name=actor.name or "",
                bundle_index=actor.bundle_index,
                ranks=worker_ranks(actor),
                pid=actor.pid,
                host_pid=pid,
                memory=tuple(sorted(held.items())),
            )
        )
    return found


def cap_workers(workers: Sequence[RayWorker]) -> tuple[list[RayWorker], list[RayWorker]]:
    """At most MAX_GPU_ROWS workers with distinct labels and MAX_GPU_ROWS (worker, GPU)
    rows; what is left out: repeated and surplus workers, and kept workers carrying only
    their surplus GPU rows."""
    unique: list[RayWorker] = []
    over: list[RayWorker] = []
    seen: set[tuple[object, ...]] = set()
    for w in workers:
        # Their labels: two unnamed workers outside a bundle would repeat a series.
        key = (w.node.pod.uid if w.node.pod else "", w.engine, w.bundle_index, w.ranks)
        (over if key in seen else unique).append(w)
        seen.add(key)
    kept, surplus = caps.split(unique, caps.MAX_GPU_ROWS)
    trimmed: list[RayWorker] = []
    over.extend(surplus)
    budget = caps.MAX_GPU_ROWS
    for w in kept:
        if len(w.memory) > budget:
            over.append(replace(w, memory=w.memory[budget:]))
            w = replace(w, memory=w.memory[:budget])  # noqa: PLW2901
        trimmed.append(w)
        budget -= len(w.memory)
    return trimmed, over


def _chosen_nodes(snapshots: Sequence[LocalRayNode]) -> set[int]:
    """Positions of the Ray nodes kept: the first per pod, then the MAX_RAY_NODES with
    the most GPUs (ties in Ray's order)."""
    first: dict[str | None, int] = {}
    for i, local in enumerate(snapshots):
        first.setdefault(local.pod.uid if local.pod is not None else None, i)
    ranked = sorted(first.values(), key=lambda i: (-snapshots[i].node.gpus_total, i))
    return set(ranked[: caps.MAX_RAY_NODES])


class _Rows:
    def __init__(self) -> None:
        self.nodes: list[RayNodeView] = []
        self.actor_gpus: list[RayActorGpus] = []
        self.actor_memory: list[RayActorMemory] = []
        self.workers: list[RayWorker] = []

    def add(
        self,
        view: RayNodeView | None,
        rows: Sequence[RayActorGpus],
        memory: Sequence[RayActorMemory],
        workers: Sequence[RayWorker] = (),
    ) -> None:
        if view is not None:
            self.nodes.append(view)
        self.actor_gpus.extend(rows)
        self.actor_memory.extend(memory)
        self.workers.extend(workers)

    def local(self) -> RayLocal:
        return RayLocal(
            tuple(self.nodes),
            tuple(self.actor_gpus),
            tuple(self.actor_memory),
            tuple(self.workers),
        )


def _actor_rows(
    view: RayNodeView,
    local: LocalRayNode,
    host_pids: HostPids | None,
    memory_by_pid: Mapping[int, Sequence[tuple[str, int | None]]],
    procs_known: bool,
) -> tuple[list[RayActorGpus], list[RayActorMemory]]:
    """One Ray node's GPU actors by (class, state), and their processes' GPU memory."""
    node_id, pod = view.node.node_id, view.pod
    local_actors = [a for a in local.snapshot.actors if a.node_id in (None, node_id)]
    unused: dict[str, int] = defaultdict(int)
    memory: dict[tuple[str, str], int] = defaultdict(int)
    for actor in local_actors:
        if actor.state != "ALIVE" or actor.node_id != node_id or not actor.num_gpus:
            continue
        pid = host_pids.of(actor, pod) if host_pids is not None else None
        held = memory_by_pid.get(pid, ()) if pid is not None else ()
        for uuid, used in held:
            memory[(actor.class_name, uuid)] += used or 0
        if procs_known and not any((used or 0) > 0 for _, used in held):
            unused[actor.class_name] += 1
    counts = gpu_actor_counts(RaySnapshot(actors=tuple(local_actors)))
    rows = [
        RayActorGpus(
            view,
            class_name,
            state,
            gpus,
            (unused.get(class_name, 0) if procs_known else None) if state == "ALIVE" else None,
        )
        for (class_name, state), gpus in sorted(counts.items())
    ]
    return rows, [
        RayActorMemory(view, cls, uuid, used) for (cls, uuid), used in sorted(memory.items())
    ]


def fold_actor_classes(
    rows: Sequence[RayActorGpus],
    memory: Sequence[RayActorMemory],
    limit: int = caps.MAX_RAY_ACTOR_CLASSES,
) -> tuple[list[RayActorGpus], list[RayActorMemory], list[RayActorGpus], list[RayActorMemory]]:
    """One Ray node's rows with at most `limit` classes, those holding the most GPUs (then
    by name), plus OTHER_CLASS summing the rest: per-state GPUs, actors without memory and
    memory per GPU add up as before. Also the rows that were folded."""
    totals: dict[str, float] = defaultdict(float)
    for row in rows:
        totals[row.class_name] += row.gpus
    for m in memory:
        totals.setdefault(m.class_name, 0.0)
    if len(totals) <= limit:
        return list(rows), list(memory), [], []
    keep = set(sorted(totals, key=lambda c: (-totals[c], c))[:limit])
    gpus: dict[tuple[str, str], float] = defaultdict(float)
    without: dict[tuple[str, str], int | None] = {}
    view = rows[0].node if rows else memory[0].node
    for row in rows:
        key = (row.class_name if row.class_name in keep else caps.OTHER_CLASS, row.state)
        gpus[key] += row.gpus
        before = without.get(key, 0)
        without[key] = None if row.without_memory is None else (before or 0) + row.without_memory
    used: dict[tuple[str, str], int] = defaultdict(int)
    for m in memory:
        used[(m.class_name if m.class_name in keep else caps.OTHER_CLASS, m.gpu_uuid)] += (
            m.used_bytes
        )
    return (
        [RayActorGpus(view, c, s, g, without[(c, s)]) for (c, s), g in sorted(gpus.items())],
        [RayActorMemory(view, c, u, b) for (c, u), b in sorted(used.items())],
        [r for r in rows if r.class_name not in keep],
        [m for m in memory if m.class_name not in keep],
    )


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
# Ray's ActorState values that hold or ask for GPUs. Anything else Ray may send is
# UNKNOWN, so the `state` label stays a fixed set.
ACTOR_STATES: Final = frozenset({"DEPENDENCIES_UNREADY", "ALIVE", *PENDING_ACTOR_STATES})
# PlacementGroupTableData.PlacementGroupState and PlacementGroupStats.SchedulingState.
GROUP_STATES: Final = frozenset({"PENDING", "PREPARED", "CREATED", "REMOVED", "RESCHEDULING"})
SCHEDULING_STATES: Final = frozenset(
    {
        "QUEUED",
        "REMOVED",
        "SCHEDULING_STARTED",
        "NO_RESOURCES",
        "INFEASIBLE",
        "FAILED_TO_COMMIT_RESOURCES",
        "FINISHED",
    }
)
UNKNOWN_STATE: Final = "UNKNOWN"


def _known(state: str, states: frozenset[str]) -> str:
    return state if state in states else UNKNOWN_STATE


def gpu_actor_counts(snapshot: RaySnapshot) -> Mapping[tuple[str, str], float]:
    """Logical GPUs held (ALIVE) or asked (pending) by GPU actors, by (class_name, state).

    DEAD actors hold nothing and are left out.
    """
    counts: dict[tuple[str, str], float] = {}
    for actor in snapshot.actors:
        if actor.num_gpus <= 0 or actor.state == "DEAD":
            continue
        key = (actor.class_name, _known(actor.state, ACTOR_STATES))
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
    """Placement groups by (state, scheduling_state); "" where Ray gave no scheduling state,
    UNKNOWN for a value outside Ray's enums."""
    counts: dict[tuple[str, str], int] = {}
    for group in snapshot.placement_groups:
        scheduling = group.scheduling_state
        key = (
            _known(group.state, GROUP_STATES),
            _known(scheduling, SCHEDULING_STATES) if scheduling else "",
        )
        counts[key] = counts.get(key, 0) + 1
    return frozen_map(counts)
