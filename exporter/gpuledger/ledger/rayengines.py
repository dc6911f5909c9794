"""Engines joined to the Ray jobs their engine core drives (identity rule 9). Pure.

With the Ray executor an engine's workers are Ray actors, children of the raylets of
any node, not of its API server. The node agent of the engine's node links the engine to
its job (the driver is a Ray node of the engine's pod, the entrypoint is the EngineCore's
title with the engine's DP rank, and, where procfs sees the EngineCore, its PID is the
driver's), and reports what Ray says of the job's workers on every node. Each node agent
reports the workers on its own node under the same (job id, driver node id): one join in
PromQL, or explain reading both, gives the whole engine.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

from gpuledger.engines import parse_engine_title
from gpuledger.engines.kinds import ENGINE_CORE
from gpuledger.engines.ray import engine_dp_rank, is_worker
from gpuledger.identity.rayjobs import RayEngineId, driver_node
from gpuledger.model import frozen_map
from gpuledger.model.procfs import ProcessInfo
from gpuledger.model.ray import LocalRayNode, RayActor, RayJob, RayNode, RayPlacementGroup

if TYPE_CHECKING:
    from gpuledger.ledger.engines import Engine

# Ray's ActorState values that a live worker can be in; anything else reads UNKNOWN.
WORKER_STATES: Final = ("ALIVE", "PENDING_CREATION", "RESTARTING", "DEPENDENCIES_UNREADY")
UNKNOWN_STATE: Final = "UNKNOWN"


@dataclass(frozen=True)
class WorkerNode:
    """A Ray node holding workers of the engine: explain reads its node agent."""

    ray_node_id: str
    node_ip: str
    workers: int


@dataclass(frozen=True)
class EngineRay:
    """The Ray job an engine's EngineCore drives, as Ray reports it from every node."""

    id: RayEngineId
    driver_pid: int | None  # in the driver's PID namespace
    driver_node_ip: str
    # The executor's worker class (RayWorkerProc, RayWorkerWrapper); "" with none alive.
    worker_class: str
    # Worker actors by state (ALIVE always present): Ray's view, every node.
    workers: Mapping[str, int] = field(default_factory=frozen_map)
    # GPU bundles of the placement group its workers run in: TP x PP as vLLM asked Ray.
    world_size: int | None = None
    worker_nodes: tuple[WorkerNode, ...] = ()


def link_ray_engines(
    engines: Sequence[Engine],
    local: Sequence[LocalRayNode] | None,
    procs: Mapping[int, ProcessInfo],
) -> tuple[Engine, ...]:
    """The engines, those that drive a Ray job with `ray` set. A Ray-executor engine's
    GPUs in use are its workers' on every node, not what processes here hold: its
    `gpus_in_use` is left unknown (the footprint recording rule and explain count them),
    also when its job cannot be told (the API server says `--distributed-executor-backend
    ray` and Ray is down). Without the API server's flags its configured GPUs are the
    job's placement group's GPU bundles."""
    links = _links(engines, local or (), procs)
    return tuple(_linked(e, links.get(i)) for i, e in enumerate(engines))


def _linked(engine: Engine, found: tuple[RayJob, LocalRayNode] | None) -> Engine:
    if found is None:
        if engine.config.get("distributed_executor_backend") == "ray":
            return replace(engine, gpus_in_use=None)
        return engine
    ray = engine_ray(*found)
    configured = engine.gpus_configured
    if not engine.config.get("tensor_parallel_size"):
        configured = ray.world_size  # the API server's flags are not known here
    return replace(engine, ray=ray, gpus_configured=configured, gpus_in_use=None)


def _links(
    engines: Sequence[Engine], local: Sequence[LocalRayNode], procs: Mapping[int, ProcessInfo]
) -> dict[int, tuple[RayJob, LocalRayNode]]:
    """Engine position -> its job and the Ray node the job's driver runs on. An engine is
    keyed by (its pod's UID, DP rank), a job by (the UID of the pod its driver's Ray node
    is, the DP rank in its title): one of each on a key links; several jobs are told
    apart by the EngineCore's PID where procfs has it; anything else stays unlinked."""
    jobs: dict[tuple[str, int], list[tuple[RayJob, LocalRayNode]]] = defaultdict(list)
    for node in local:
        pod_uid = node.pod.uid if node.pod is not None else ""
        for job in node.snapshot.jobs or ():
            rank = engine_dp_rank(job)
            where = driver_node(job, node.snapshot.nodes)
            if rank is not None and where is not None and where.node_id == node.node.node_id:
                jobs[(pod_uid, rank)].append((job, node))
    by_key: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, engine in enumerate(engines):
        by_key[(engine.pod_uid, int(engine.engine) if engine.engine.isdigit() else 0)].append(i)
    links = {}
    for key, positions in by_key.items():
        found = _one(jobs.get(key, []), key, procs)
        if found is not None and len(positions) == 1:
            links[positions[0]] = found
    return links


def _one(
    candidates: Sequence[tuple[RayJob, LocalRayNode]],
    key: tuple[str, int],
    procs: Mapping[int, ProcessInfo],
) -> tuple[RayJob, LocalRayNode] | None:
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    # Several EngineCores of this rank drive jobs from this pod: the one procfs sees.
    seen = _engine_core_pids(key, procs)
    chosen = [c for c in candidates if c[0].driver_pid in seen]
    return chosen[0] if len(chosen) == 1 else None


def _engine_core_pids(key: tuple[str, int], procs: Mapping[int, ProcessInfo]) -> set[int]:
    """PIDs, as their own PID namespace numbers them, of the pod's engine cores of the rank."""
    pod_uid, rank = key
    found = set()
    for info in procs.values():
        core = parse_engine_title(info.title)
        if core is None or core.role != ENGINE_CORE or (info.cgroup.pod_uid or "") != pod_uid:
            continue
        if (core.dp_rank or 0) == rank and info.nspid:
            found.add(info.nspid[-1])
    return found


def engine_ray(job: RayJob, node: LocalRayNode) -> EngineRay:
    """What Ray says of the job driven from this Ray node: its workers anywhere and the
    GPU bundles of their placement group."""
    workers = [a for a in node.driven_actors if a.job_id == job.job_id and is_worker(a)]
    if job.job_id in node.driven_unread:  # Ray's side of this job is unknown, not empty
        return EngineRay(
            RayEngineId(job.job_id, node.node.node_id), job.driver_pid, node.node.node_ip, ""
        )
    states: dict[str, int] = {"ALIVE": 0}
    for actor in workers:
        state = actor.state if actor.state in WORKER_STATES else UNKNOWN_STATE
        states[state] = states.get(state, 0) + 1
    classes = sorted({a.class_name for a in workers if a.state == "ALIVE"})
    groups = [g for g in node.driven_groups if g.creator_job_id == job.job_id]
    return EngineRay(
        id=RayEngineId(job.job_id, node.node.node_id),
        driver_pid=job.driver_pid,
        driver_node_ip=node.node.node_ip,
        worker_class=classes[0] if len(classes) == 1 else "",
        workers=frozen_map(states),
        world_size=_world_size(workers, groups),
        worker_nodes=_worker_nodes(workers, node.snapshot.nodes),
    )


def _world_size(workers: Iterable[RayActor], groups: Sequence[RayPlacementGroup]) -> int | None:
    """GPU bundles of the groups the workers run in (else of every group the job made)."""
    used = {a.placement_group_id for a in workers if a.placement_group_id}
    chosen = [g for g in groups if g.pg_id in used] or list(groups)
    if not chosen:
        return None
    return sum(1 for g in chosen for b in g.bundles if b.gpus > 0)


def _worker_nodes(workers: Iterable[RayActor], nodes: Sequence[RayNode]) -> tuple[WorkerNode, ...]:
    ips = {n.node_id: n.node_ip for n in nodes}
    counts: dict[str, int] = defaultdict(int)
    for actor in workers:
        if actor.state == "ALIVE" and actor.node_id:
            counts[actor.node_id] += 1
    return tuple(WorkerNode(n, ips.get(n, ""), c) for n, c in sorted(counts.items()))


def ray_job_unknowns(local: Sequence[LocalRayNode] | None) -> tuple[str, ...]:
    """What the Ray source could not read of engines' jobs while it was up: the job list
    (then no engine is linked and no worker named), or one engine's job."""
    if not local:
        return ()
    snapshot = local[0].snapshot
    failed = [w for w in snapshot.warnings if w.startswith(("jobs:", "job "))]
    if snapshot.jobs is None:
        return (
            "no Ray job list: which engines run on the Ray executor, and their workers, "
            f"unknown ({'; '.join(failed) or 'not read'})",
        )
    return tuple(
        f"Ray {w}: that engine's workers and placement group unknown"
        for w in failed
        if w.startswith("job ")
    )
