"""The ledger as a versioned JSON document: what /ledger.json serves and `explain` reads.

Only identities, titles and numbers: never an environment value or a command-line
argument (the engine config carries just the whitelisted flags). Schema: docs/explain.md.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpuledger import __version__
from gpuledger.export.published import Published
from gpuledger.ledger import ContainerRef, Ledger
from gpuledger.ledger.ray import RayWorker
from gpuledger.ledger.rayengines import EngineRay
from gpuledger.ledger.serve import ServeReplicaView
from gpuledger.model.kubernetes import PodInfo
from gpuledger.model.nvml import MigDevice
from gpuledger.model.podresources import ClaimDevice

SCHEMA = "gpuledger.io/ledger/v1"


def _container(ref: ContainerRef | None) -> dict[str, str] | None:
    if ref is None:
        return None
    return {
        "namespace": ref.namespace,
        "pod": ref.pod,
        "pod_uid": ref.pod_uid,
        "container": ref.container,
        "container_id": ref.container_id,
        "workload": ref.workload,
    }


def _claim_device(c: ClaimDevice | None) -> dict[str, Any] | None:
    """A DRA allocation's claim and device (None: a device-plugin allocation)."""
    if c is None:
        return None
    return {
        "namespace": c.claim_namespace,
        "name": c.claim_name,
        "driver": c.driver,
        "pool": c.pool,
        "device": c.device,
        "share_id": c.share_id or None,
    }


def _pending_claims(ledger: Ledger, pod: PodInfo) -> list[dict[str, Any]]:
    """The GPU claims a pending pod waits on, as the cluster's ResourceClaims say."""
    known = {(c.namespace, c.name): c for c in ledger.claims}
    return [
        {
            "name": c.name,
            "device_classes": list(c.device_classes),
            "gpus": c.gpus,
            "allocated": c.allocated,
            "reserved_for": c.reserved_for,
            "deleting": c.deleting,
        }
        for c in (known.get((pod.namespace, name)) for name in pod.claims)
        if c is not None
    ]


def _containers(ledger: Ledger) -> list[dict[str, Any]]:
    found: dict[ContainerRef, dict[str, Any]] = {}

    def entry(ref: ContainerRef) -> dict[str, Any]:
        if ref not in found:
            found[ref] = {**(_container(ref) or {}), "devices": [], "allocations": [], "usage": []}
        return found[ref]

    for m in ledger.device_maps:
        entry(m.container)["devices"].append(
            {"local_index": m.local_index, "gpu_uuid": m.gpu_uuid, "source": m.source}
        )
    for a in ledger.allocations:
        entry(a.container)["allocations"].append(
            {
                "gpu_uuid": a.gpu_uuid,
                "resource": a.resource,
                "device_id": a.device_id,
                "claim": _claim_device(a.claim),
            }
        )
    for u in ledger.usage:
        entry(u.container)["usage"].append(
            {
                "gpu_uuid": u.gpu_uuid,
                "memory_used_bytes": u.memory_used_bytes,
                "processes": u.processes,
            }
        )
    return [found[k] for k in sorted(found)]


def _mig_device(mig: MigDevice, ledger: Ledger) -> dict[str, Any]:
    """A MIG device under its GPU; containers, processes and discrepancies name it by
    `uuid` (its MIG UUID) wherever they name a GPU."""
    return {
        "uuid": mig.uuid,
        "parent_uuid": mig.parent_uuid,
        "index": mig.index,
        "gpu_instance_id": mig.gpu_instance_id,
        "compute_instance_id": mig.compute_instance_id,
        "profile": mig.profile,
        "up": mig.up,
        "error_reason": mig.error_reason,
        "memory_total_bytes": mig.memory_total_bytes,
        "memory_used_bytes": mig.memory_used_bytes,
        "unattributed_memory_bytes": ledger.unattributed.get(mig.uuid),
    }


def _engines(ledger: Ledger) -> list[dict[str, Any]]:
    out = []
    for e in ledger.engines:
        m = e.metrics
        out.append(
            {
                "namespace": e.namespace,
                "pod": e.pod,
                "pod_uid": e.pod_uid,
                "workload": e.workload,
                "model_name": e.model_name,
                "engine": e.engine,
                "url": e.url,
                "origin": e.origin,
                "up": e.up,
                "requests_running": m.requests_running if m else None,
                "requests_waiting": m.requests_waiting if m else None,
                "waiting_by_reason": dict(m.waiting_by_reason) if m else {},
                "kv_cache_usage_ratio": m.kv_cache_usage_ratio if m else None,
                "preemptions_total": m.preemptions_total if m else None,
                "config": dict(e.config),
                "gpus": [{"gpu_uuid": g.gpu_uuid, "role": g.role, "rank": g.rank} for g in e.gpus],
                "gpus_configured": e.gpus_configured,
                "gpus_in_use": e.gpus_in_use,
                # How its processes were found: the API server listening on the
                # target's port, else the old one-server-per-pod rule (docs/explain.md).
                "target": e.target,
                "process_binding": e.process_binding,
                "api_server_pid": e.api_server_pid,
                "sockets": e.sockets,
                "pids": list(e.pids),
                "ray": _engine_ray(e.ray),
            }
        )
    return out


def _engine_ray(ray: EngineRay | None) -> dict[str, Any] | None:
    """The Ray job the engine's EngineCore drives: its identity on every node, and the
    Ray nodes holding its workers (whose node agents report them)."""
    if ray is None:
        return None
    return {
        "job_id": ray.id.job_id,
        "driver_node_id": ray.id.driver_node_id,
        "driver_pid": ray.driver_pid,
        "driver_node_ip": ray.driver_node_ip,
        "worker_class": ray.worker_class,
        "workers": dict(ray.workers),
        "world_size": ray.world_size,
        "worker_nodes": [
            {"ray_node_id": n.ray_node_id, "node_ip": n.node_ip, "workers": n.workers}
            for n in ray.worker_nodes
        ],
    }


def _ray_worker(w: RayWorker) -> dict[str, Any]:
    pod = w.node.pod
    return {
        "namespace": pod.namespace if pod else "",
        "pod": pod.name if pod else "",
        "pod_uid": pod.uid if pod else "",
        "workload": pod.workload if pod else "",
        "ray_node_id": w.node.node.node_id,
        "job_id": w.engine.job_id,
        "driver_node_id": w.engine.driver_node_id,
        "actor_id": w.actor_id,
        "class_name": w.class_name,
        "name": w.name,
        "bundle_index": w.bundle_index,
        "tp_rank": w.ranks.tp,
        "pp_rank": w.ranks.pp,
        "pid": w.pid,
        "host_pid": w.host_pid,
        "gpus": [{"gpu_uuid": u, "used_bytes": b} for u, b in w.memory],
    }


def _processes(ledger: Ledger) -> list[dict[str, Any]]:
    return [
        {
            "pid": p.pid,
            "ppid": p.ppid,
            "title": p.title,
            "container": _container(p.container),
            "gpu_memory": [{"gpu_uuid": u, "used_bytes": b} for u, b in p.gpu_memory],
            "cuda_devices": list(p.cuda_devices) if p.cuda_devices is not None else None,
        }
        for p in ledger.processes
    ]


def _ray(ledger: Ledger) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": [], "actors": [], "workers": [], "cluster": None}
    if ledger.ray is not None:
        for view in ledger.ray.nodes:
            pod = view.pod
            out["nodes"].append(
                {
                    "namespace": pod.namespace if pod else "",
                    "pod": pod.name if pod else "",
                    "pod_uid": pod.uid if pod else "",
                    "workload": pod.workload if pod else "",
                    "ray_node_id": view.node.node_id,
                    "node_ip": view.node.node_ip,
                    "gpus_total": view.node.gpus_total,
                    "gpus_available": view.node.gpus_available,
                    "gpus_allocated": view.gpus_allocated,
                }
            )
        for row in ledger.ray.actor_gpus:
            pod = row.node.pod
            out["actors"].append(
                {
                    "namespace": pod.namespace if pod else "",
                    "pod": pod.name if pod else "",
                    "workload": pod.workload if pod else "",
                    "ray_node_id": row.node.node.node_id,
                    "class_name": row.class_name,
                    "state": row.state,
                    "gpus": row.gpus,
                    "without_gpu_memory": row.without_memory,
                }
            )
        out["workers"] = [_ray_worker(w) for w in ledger.ray.workers]
    if ledger.ray_cluster is not None:
        c = ledger.ray_cluster
        out["cluster"] = {
            "namespace": c.namespace,
            "workload": c.workload,
            "placement_groups": [
                {"state": st, "scheduling_state": ss, "count": n}
                for (st, ss), n in sorted(c.placement_groups.items())
            ],
            "pending_gpus": dict(c.pending_gpus),
        }
    return out


def _serve_replica(r: ServeReplicaView) -> dict[str, Any]:
    return {
        "namespace": r.namespace,
        "pod": r.pod,
        "pod_uid": r.pod_uid,
        "workload": r.workload,
        "replica": r.replica,
        "state": r.state,
        "pid": r.pid,
        "host_pid": r.host_pid,
        "ongoing_requests": r.ongoing,
        "engines": [{"target": t, "model_name": m, "engine": e} for t, m, e in r.engines],
    }


def _serve(ledger: Ledger) -> dict[str, Any]:
    """Serve's deployments with a router or a replica here, each with its replicas here."""
    serve = ledger.serve
    return {
        "deployments": [
            {
                "namespace": d.namespace,
                "workload": d.workload,
                "application": d.application,
                "deployment": d.deployment,
                "status": d.status,
                "max_ongoing_requests": d.max_ongoing_requests,
                "target_replicas": d.target_replicas,
                "router_queued_requests": d.router_queued,
                "router_requests_at_replicas": d.router_at_replicas,
                "replicas": [_serve_replica(r) for r in d.replicas],
            }
            for d in (serve.deployments if serve is not None else ())
        ],
        "unread_ray_nodes": list(serve.unknown_nodes if serve is not None else ()),
    }


def ledger_document(published: Published) -> dict[str, Any]:
    ledger = published.ledger
    users: dict[str, list[str]] = defaultdict(list)
    for u in ledger.usage:
        users[u.gpu_uuid].append(u.container.pod_uid)
    return {
        "schema": SCHEMA,
        "version": __version__,
        "node": ledger.node,
        "mode": ledger.mode,
        "taken_at": ledger.taken_at,
        "driver_version": ledger.driver_version,
        # True under `gpuledger demo` and `simulate`: not real hardware.
        "simulated": published.simulated,
        "sources": [
            {
                "source": s.source,
                "up": s.up,
                "state": s.state,
                "reason": s.error_reason,
                "message": s.error_message,
                "duration_seconds": s.duration_seconds,
            }
            for s in ledger.sources
        ],
        "unknowns": list(ledger.unknowns),
        "gpus": [
            {
                "uuid": g.uuid,
                "index": g.index,
                "model": g.name,
                "pci_bus_id": g.pci_bus_id,
                "mig_mode": g.mig_mode,
                "up": g.up,
                "error_reason": g.error_reason,
                "memory_total_bytes": g.memory_total_bytes,
                "memory_used_bytes": g.memory_used_bytes,
                "utilization_ratio": g.utilization_ratio,
                "unattributed_memory_bytes": ledger.unattributed.get(g.uuid),
                "mig_devices": [_mig_device(m, ledger) for m in g.mig_devices],
            }
            for g in ledger.gpus
        ],
        "containers": _containers(ledger),
        "processes": _processes(ledger),
        "pods": [
            {
                "namespace": s.pod.namespace,
                "name": s.pod.name,
                "uid": s.pod.uid,
                "workload": s.pod.workload,
                "phase": s.pod.phase,
                "ready": s.pod.ready,
                "starting": s.starting,
                "gpu_requests": s.pod.gpu_requests,
                "node": s.pod.node_name,
            }
            for s in ledger.pods
        ],
        "engines": _engines(ledger),
        "pending": [
            {
                "namespace": p.namespace,
                "name": p.name,
                "uid": p.uid,
                "workload": p.workload,
                "reason": p.pending_reason,
                "gpus": p.gpu_requests,
                "since": p.pending_since,
                "nodes": p.pending_nodes,
                "claims": _pending_claims(ledger, p),
            }
            for p in ledger.pending
        ],
        "ray": _ray(ledger),
        "serve": _serve(ledger),
        "discrepancies": [
            {"kind": d.kind, "gpu_uuid": d.gpu_uuid, **(_container(d.container) or {})}
            for d in ledger.discrepancies
            if d.active
        ],
    }
