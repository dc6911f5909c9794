"""Ray Serve joined to pods, processes and engines. Pure.

A replica is a Ray actor: its PID (in the Ray pod's PID namespace) becomes a host PID by
NSpid (identity rule 3, ledger/ray.py), its Ray node is a pod (rule 8), and the vLLM
engine in it is the one whose retitled engine processes descend from the replica's process. A
router's queue belongs to the pod of the Ray node whose metrics reported it. Rows are keyed
by (namespace, workload, application, deployment); a Ray node that is no pod (outside
Kubernetes) counts for the snapshot's configured workload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from gpuledger.engines import parse_engine_title
from gpuledger.engines.kinds import ENGINE_CORE
from gpuledger.identity.processes import ancestors
from gpuledger.ledger import caps
from gpuledger.ledger.engines import Engine
from gpuledger.ledger.ray import HostPids
from gpuledger.model.kubernetes import PodInfo
from gpuledger.model.procfs import ProcessInfo
from gpuledger.model.ray import LocalRayNode, RayActor
from gpuledger.model.serve import ServeDeployment, ServeReplica, ServeSnapshot

# Ray Serve's ReplicaState and DeploymentStatus (ray/serve/_private/common.py, 2.60);
# anything else reads UNKNOWN, so the `state`/`status` labels stay fixed sets.
REPLICA_STATES: Final = frozenset(
    {"STARTING", "UPDATING", "RECOVERING", "RUNNING", "STOPPING", "STOPPED", "PENDING_MIGRATION"}
)
DEPLOYMENT_STATUSES: Final = frozenset(
    {"UPDATING", "HEALTHY", "UNHEALTHY", "DEPLOY_FAILED", "UPSCALING", "DOWNSCALING"}
)
UNKNOWN: Final = "UNKNOWN"


@dataclass(frozen=True)
class ServeReplicaView:
    namespace: str
    pod: str
    pod_uid: str
    workload: str
    application: str
    deployment: str
    replica: str
    state: str
    pid: int | None  # in the Ray pod's PID namespace
    host_pid: int | None
    # Requests the replica runs now; None when its node's metrics were not read.
    ongoing: float | None
    # (target, model_name, engine) of the vLLM engines running inside the replica.
    engines: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class ServeDeploymentView:
    namespace: str
    workload: str
    application: str
    deployment: str
    status: str
    max_ongoing_requests: int | None
    target_replicas: int | None
    # What the routers on this node's Ray nodes hold for it (None: no router here reported).
    router_queued: float | None
    router_at_replicas: float | None
    replicas: tuple[ServeReplicaView, ...] = ()


@dataclass(frozen=True)
class ServeLocal:
    """Node mode: Serve's deployments with a router or a replica here."""

    deployments: tuple[ServeDeploymentView, ...] = ()
    # Local Ray nodes whose metrics were not read: their queues are unknown.
    unknown_nodes: tuple[str, ...] = ()
    # Overflow only: replicas past the cap whose deployment's row was kept.
    more_replicas: tuple[ServeReplicaView, ...] = ()

    @property
    def replicas(self) -> tuple[ServeReplicaView, ...]:
        return (*(r for d in self.deployments for r in d.replicas), *self.more_replicas)


_Key = tuple[str, str, str, str]  # namespace, workload, application, deployment


@dataclass
class _Row:
    deployment: ServeDeployment
    queued: float | None = None
    at_replicas: float | None = None
    replicas: list[ServeReplicaView] = field(default_factory=list)


def build_serve(
    snapshot: ServeSnapshot | None,
    local: Sequence[LocalRayNode] | None,
    procs: Mapping[int, ProcessInfo] | None,
    engines: Sequence[Engine],
) -> tuple[ServeLocal | None, ServeLocal | None]:
    """Serve's rows on this node, and the overflow a cap kept out (ledger/caps.py)."""
    if snapshot is None or local is None:
        return None, None
    pods = {n.node.node_id: n.pod for n in local}
    known = {(d.application, d.deployment): d for d in snapshot.deployments}
    rows: dict[_Key, _Row] = {}

    def row(pod: PodInfo | None, app: str, dep: str) -> _Row:
        ns, workload = _owner(pod, snapshot)
        return rows.setdefault((ns, workload, app, dep), _Row(known[(app, dep)]))

    ongoing: dict[tuple[str, str, str, str], float] = {}
    for metrics in snapshot.nodes:
        if not metrics.up or metrics.node_id not in pods:
            continue
        pod = pods[metrics.node_id]
        for router in metrics.routers:
            if (router.application, router.deployment) not in known:
                continue  # a deployment deleted since: its gauge lingers in Ray's metrics
            r = row(pod, router.application, router.deployment)
            r.queued = (r.queued or 0.0) + router.queued
            if router.at_replicas is not None:
                r.at_replicas = (r.at_replicas or 0.0) + router.at_replicas
        for item in metrics.replicas:
            ongoing[(metrics.node_id, item.application, item.deployment, item.replica)] = (
                item.ongoing
            )
    read = {m.node_id for m in snapshot.nodes if m.up}
    host_pids = HostPids(procs) if procs is not None else None
    in_replica = _engines_by_process(procs or {}, engines)
    for replica in snapshot.replicas:
        if replica.node_id not in pods or (replica.application, replica.deployment) not in known:
            continue
        pod = pods[replica.node_id]
        host_pid = _host_pid(replica, pod, host_pids)
        load = ongoing.get(
            (replica.node_id, replica.application, replica.deployment, replica.replica)
        )
        if load is None and replica.node_id in read:
            load = 0.0  # a replica that has reported nothing yet runs nothing
        view = _replica_view(
            replica, pod, snapshot, host_pid=host_pid, ongoing=load, in_replica=in_replica
        )
        row(pod, replica.application, replica.deployment).replicas.append(view)
    unknown = tuple(m.node_id for m in snapshot.nodes if not m.up)
    return _capped([_view(k, r) for k, r in sorted(rows.items())], unknown)


def _owner(pod: PodInfo | None, snapshot: ServeSnapshot) -> tuple[str, str]:
    if pod is None:
        return snapshot.namespace, snapshot.workload
    return pod.namespace, pod.workload


def _host_pid(replica: ServeReplica, pod: PodInfo | None, pids: HostPids | None) -> int | None:
    if pids is None or replica.pid is None:
        return None
    # HostPids reads an actor's PID and its pod; a replica is an actor.
    actor = RayActor(
        actor_id=replica.actor_id or "",
        class_name="",
        state="ALIVE",
        pid=replica.pid,
        node_id=replica.node_id,
        num_gpus=0.0,
        job_id=None,
        placement_group_id=None,
        ray_namespace=None,
    )
    return pids.of(actor, pod)


def _replica_view(
    replica: ServeReplica,
    pod: PodInfo | None,
    snapshot: ServeSnapshot,
    *,
    host_pid: int | None,
    ongoing: float | None,
    in_replica: Mapping[int, tuple[tuple[str, str, str], ...]],
) -> ServeReplicaView:
    ns, workload = _owner(pod, snapshot)
    return ServeReplicaView(
        namespace=ns,
        pod=pod.name if pod is not None else "",
        pod_uid=pod.uid if pod is not None else "",
        workload=workload,
        application=replica.application,
        deployment=replica.deployment,
        replica=replica.replica,
        state=replica.state if replica.state in REPLICA_STATES else UNKNOWN,
        pid=replica.pid,
        host_pid=host_pid,
        ongoing=ongoing,
        engines=in_replica.get(host_pid, ()) if host_pid is not None else (),
    )


def _engines_by_process(
    procs: Mapping[int, ProcessInfo], engines: Sequence[Engine]
) -> dict[int, tuple[tuple[str, str, str], ...]]:
    """Host PID -> the engines whose retitled processes descend from it (or are it),
    matched on the Pod UID and data-parallel rank as ledger/engines.py joins them."""
    by_rank: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for e in engines:
        by_rank.setdefault((e.pod_uid, e.engine), []).append((e.target, e.model_name, e.engine))
    if not by_rank:
        return {}
    found: dict[int, set[tuple[str, str, str]]] = {}
    for info in procs.values():
        parsed = parse_engine_title(info.title, info.pid)
        if parsed is None or parsed.role != ENGINE_CORE:
            continue
        rank = str(parsed.dp_rank or 0)
        matched = by_rank.get((info.cgroup.pod_uid or "", rank), ())
        for holder in (info, *ancestors(info, procs)):
            found.setdefault(holder.pid, set()).update(matched)
    return {pid: tuple(sorted(names)) for pid, names in found.items() if names}


def _view(key: _Key, row: _Row) -> ServeDeploymentView:
    ns, workload, app, dep = key
    d = row.deployment
    return ServeDeploymentView(
        namespace=ns,
        workload=workload,
        application=app,
        deployment=dep,
        status=d.status if d.status in DEPLOYMENT_STATUSES else UNKNOWN,
        max_ongoing_requests=d.max_ongoing_requests,
        target_replicas=d.target_replicas,
        router_queued=row.queued,
        router_at_replicas=row.at_replicas,
        replicas=tuple(sorted(row.replicas, key=lambda r: (r.pod, r.replica))),
    )


def _capped(
    views: Sequence[ServeDeploymentView], unknown: tuple[str, ...]
) -> tuple[ServeLocal, ServeLocal]:
    """At most MAX_SERVE_DEPLOYMENTS rows and MAX_SERVE_REPLICAS replicas in all, in
    identity order; the rest is the overflow."""
    kept, surplus = caps.split(views, caps.MAX_SERVE_DEPLOYMENTS)
    budget = caps.MAX_SERVE_REPLICAS
    trimmed: list[ServeDeploymentView] = []
    extra: list[ServeReplicaView] = []
    for view in kept:
        keep, rest = caps.split(view.replicas, budget)
        budget -= len(keep)
        trimmed.append(replace(view, replicas=keep))
        extra.extend(rest)
    return ServeLocal(tuple(trimmed), unknown), ServeLocal(surplus, more_replicas=tuple(extra))
