"""The ledger as a versioned JSON document: what /ledger.json serves and `explain` reads.

Only identities, titles and numbers: never an environment value or a command-line
argument (the engine config carries just the whitelisted flags). The types are
gpuledger/document/v1.py; schema: docs/explain.md and docs/ledger.schema.json.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping

from gpuledger import __version__
from gpuledger.document.codec import to_json
from gpuledger.document.v1 import (
    SCHEMA,
    AllocationDoc,
    ClaimDeviceDoc,
    ContainerDoc,
    ContainerRefDoc,
    DeviceDoc,
    DiscrepancyDoc,
    EngineDoc,
    EngineGpuDoc,
    EngineRayDoc,
    GatewayDoc,
    GpuDoc,
    GpuMemoryDoc,
    LedgerDocument,
    MigDeviceDoc,
    PendingClaimDoc,
    PendingDoc,
    PickerDoc,
    PlacementGroupsDoc,
    PodDoc,
    PoolDoc,
    PoolMemberDoc,
    ProcessDoc,
    RayActorDoc,
    RayClusterDoc,
    RayDoc,
    RayEngineLinkDoc,
    RayNodeDoc,
    RayWorkerDoc,
    ServeDeploymentDoc,
    ServeDoc,
    ServeEngineDoc,
    ServeReplicaDoc,
    SourceDoc,
    UsageDoc,
    WorkerNodeDoc,
)
from gpuledger.export.published import Published
from gpuledger.export.spans_document import spans_doc
from gpuledger.ledger import ContainerRef, Ledger
from gpuledger.ledger.engines import Engine
from gpuledger.ledger.ray import RayWorker
from gpuledger.ledger.rayengines import EngineRay
from gpuledger.ledger.serve import ServeReplicaView
from gpuledger.model.dra import ClaimInfo
from gpuledger.model.gateway import PickerReading
from gpuledger.model.kubernetes import PodInfo
from gpuledger.model.nvml import Gpu, MigDevice
from gpuledger.model.podresources import ClaimDevice

__all__ = ["SCHEMA", "document_bytes", "ledger_document"]


def _ref(ref: ContainerRef) -> ContainerRefDoc:
    return ContainerRefDoc(
        namespace=ref.namespace,
        pod=ref.pod,
        pod_uid=ref.pod_uid,
        container=ref.container,
        container_id=ref.container_id,
        workload=ref.workload,
    )


def _containers(ledger: Ledger) -> tuple[ContainerDoc, ...]:
    devices: dict[ContainerRef, list[DeviceDoc]] = defaultdict(list)
    allocations: dict[ContainerRef, list[AllocationDoc]] = defaultdict(list)
    usage: dict[ContainerRef, list[UsageDoc]] = defaultdict(list)
    for m in ledger.device_maps:
        devices[m.container].append(
            DeviceDoc(local_index=m.local_index, gpu_uuid=m.gpu_uuid, source=m.source)
        )
    for a in ledger.allocations:
        allocations[a.container].append(
            AllocationDoc(
                gpu_uuid=a.gpu_uuid,
                resource=a.resource,
                device_id=a.device_id,
                claim=_claim_device(a.claim),
            )
        )
    for u in ledger.usage:
        usage[u.container].append(
            UsageDoc(
                gpu_uuid=u.gpu_uuid, memory_used_bytes=u.memory_used_bytes, processes=u.processes
            )
        )
    refs = sorted({*devices, *allocations, *usage})
    return tuple(
        ContainerDoc(
            **vars(_ref(r)),
            devices=tuple(devices[r]),
            allocations=tuple(allocations[r]),
            usage=tuple(usage[r]),
        )
        for r in refs
    )


def _claim_device(c: ClaimDevice | None) -> ClaimDeviceDoc | None:
    if c is None:
        return None
    return ClaimDeviceDoc(
        namespace=c.claim_namespace,
        name=c.claim_name,
        driver=c.driver,
        pool=c.pool,
        device=c.device,
        share_id=c.share_id or None,
    )


def _pending_claims(
    known: Mapping[tuple[str, str], ClaimInfo], pod: PodInfo
) -> tuple[PendingClaimDoc, ...]:
    """The GPU claims a pending pod waits on, as the cluster's ResourceClaims say
    (`known`: the claims by namespace and name, made once for every pending pod)."""
    if not pod.claims:
        return ()
    return tuple(
        PendingClaimDoc(
            name=c.name,
            device_classes=c.device_classes,
            gpus=c.gpus,
            allocated=c.allocated,
            reserved_for=c.reserved_for,
            deleting=c.deleting,
        )
        for c in (known.get((pod.namespace, name)) for name in pod.claims)
        if c is not None
    )


def _mig_device(mig: MigDevice, ledger: Ledger) -> MigDeviceDoc:
    return MigDeviceDoc(
        uuid=mig.uuid,
        parent_uuid=mig.parent_uuid,
        index=mig.index,
        gpu_instance_id=mig.gpu_instance_id,
        compute_instance_id=mig.compute_instance_id,
        profile=mig.profile,
        up=mig.up,
        error_reason=mig.error_reason,
        memory_total_bytes=mig.memory_total_bytes,
        memory_used_bytes=mig.memory_used_bytes,
        unattributed_memory_bytes=ledger.unattributed.get(mig.uuid),
    )


def _gpu(g: Gpu, ledger: Ledger) -> GpuDoc:
    return GpuDoc(
        uuid=g.uuid,
        index=g.index,
        model=g.name,
        pci_bus_id=g.pci_bus_id,
        mig_mode=g.mig_mode,
        up=g.up,
        error_reason=g.error_reason,
        memory_total_bytes=g.memory_total_bytes,
        memory_used_bytes=g.memory_used_bytes,
        utilization_ratio=g.utilization_ratio,
        unattributed_memory_bytes=ledger.unattributed.get(g.uuid),
        mig_devices=tuple(_mig_device(m, ledger) for m in g.mig_devices),
    )


def _engine(e: Engine) -> EngineDoc:
    m = e.metrics
    return EngineDoc(
        namespace=e.namespace,
        pod=e.pod,
        pod_uid=e.pod_uid,
        workload=e.workload,
        model_name=e.model_name,
        engine=e.engine,
        url=e.url,
        origin=e.origin,
        up=e.up,
        requests_running=m.requests_running if m else None,
        requests_waiting=m.requests_waiting if m else None,
        waiting_by_reason=dict(m.waiting_by_reason) if m else {},
        kv_cache_usage_ratio=m.kv_cache_usage_ratio if m else None,
        preemptions_total=m.preemptions_total if m else None,
        config=dict(e.config),
        gpus=tuple(EngineGpuDoc(gpu_uuid=g.gpu_uuid, role=g.role, rank=g.rank) for g in e.gpus),
        gpus_configured=e.gpus_configured,
        gpus_in_use=e.gpus_in_use,
        target=e.target,
        process_binding=e.process_binding,
        api_server_pid=e.api_server_pid,
        sockets=e.sockets,
        pids=e.pids,
        ray=_engine_ray(e.ray),
        # Why it is down: the verdict's evidence says it after the URL.
        error_reason=e.error_reason,
        kind=e.kind,
        gpu_link=e.gpu_link,
    )


def _engine_ray(ray: EngineRay | None) -> EngineRayDoc | None:
    if ray is None:
        return None
    return EngineRayDoc(
        job_id=ray.id.job_id,
        driver_node_id=ray.id.driver_node_id,
        driver_pid=ray.driver_pid,
        driver_node_ip=ray.driver_node_ip,
        worker_class=ray.worker_class,
        workers=dict(ray.workers),
        world_size=ray.world_size,
        worker_nodes=tuple(
            WorkerNodeDoc(ray_node_id=n.ray_node_id, node_ip=n.node_ip, workers=n.workers)
            for n in ray.worker_nodes
        ),
    )


def _pod_ids(pod: PodInfo | None) -> dict[str, str]:
    """namespace, pod, pod_uid and workload of a Ray pod; empty outside Kubernetes."""
    return {
        "namespace": pod.namespace if pod else "",
        "pod": pod.name if pod else "",
        "pod_uid": pod.uid if pod else "",
        "workload": pod.workload if pod else "",
    }


def _ray_worker(w: RayWorker) -> RayWorkerDoc:
    return RayWorkerDoc(
        **_pod_ids(w.node.pod),
        ray_node_id=w.node.node.node_id,
        job_id=w.engine.job_id,
        driver_node_id=w.engine.driver_node_id,
        actor_id=w.actor_id,
        class_name=w.class_name,
        name=w.name,
        bundle_index=w.bundle_index,
        tp_rank=w.ranks.tp,
        pp_rank=w.ranks.pp,
        pid=w.pid,
        host_pid=w.host_pid,
        gpus=tuple(GpuMemoryDoc(gpu_uuid=u, used_bytes=b) for u, b in w.memory),
    )


def _process_docs(ledger: Ledger) -> tuple[ProcessDoc, ...]:
    return tuple(
        ProcessDoc(
            pid=p.pid,
            ppid=p.ppid,
            title=p.title,
            container=_ref(p.container) if p.container is not None else None,
            gpu_memory=tuple(GpuMemoryDoc(gpu_uuid=u, used_bytes=b) for u, b in p.gpu_memory),
            cuda_devices=p.cuda_devices,
        )
        for p in ledger.processes
    )


def _ray_local(ledger: Ledger) -> RayDoc:
    if ledger.ray is None:
        return RayDoc(cluster=_ray_cluster(ledger))
    nodes = tuple(
        RayNodeDoc(
            **_pod_ids(view.pod),
            ray_node_id=view.node.node_id,
            node_ip=view.node.node_ip,
            gpus_total=view.node.gpus_total,
            gpus_available=view.node.gpus_available,
            gpus_allocated=view.gpus_allocated,
        )
        for view in ledger.ray.nodes
    )
    actors = tuple(
        RayActorDoc(
            namespace=row.node.pod.namespace if row.node.pod else "",
            pod=row.node.pod.name if row.node.pod else "",
            workload=row.node.pod.workload if row.node.pod else "",
            ray_node_id=row.node.node.node_id,
            class_name=row.class_name,
            state=row.state,
            gpus=row.gpus,
            without_gpu_memory=row.without_memory,
        )
        for row in ledger.ray.actor_gpus
    )
    workers = tuple(_ray_worker(w) for w in ledger.ray.workers)
    links = tuple(
        RayEngineLinkDoc(
            **_pod_ids(x.node.pod),
            ray_node_id=x.node.node.node_id,
            job_id=x.engine.job_id,
            driver_node_id=x.engine.driver_node_id,
            gpus=x.gpus,
            link=x.link,
        )
        for x in ledger.ray.engine_links
    )
    return RayDoc(
        nodes=nodes,
        actors=actors,
        workers=workers,
        cluster=_ray_cluster(ledger),
        engine_links=links,
    )


def _ray_cluster(ledger: Ledger) -> RayClusterDoc | None:
    c = ledger.ray_cluster
    if c is None:
        return None
    return RayClusterDoc(
        namespace=c.namespace,
        workload=c.workload,
        placement_groups=tuple(
            PlacementGroupsDoc(state=st, scheduling_state=ss, count=n)
            for (st, ss), n in sorted(c.placement_groups.items())
        ),
        pending_gpus=dict(c.pending_gpus),
    )


def _serve_replica(r: ServeReplicaView) -> ServeReplicaDoc:
    return ServeReplicaDoc(
        namespace=r.namespace,
        pod=r.pod,
        pod_uid=r.pod_uid,
        workload=r.workload,
        replica=r.replica,
        state=r.state,
        pid=r.pid,
        host_pid=r.host_pid,
        ongoing_requests=r.ongoing,
        engines=tuple(ServeEngineDoc(target=t, model_name=m, engine=e) for t, m, e in r.engines),
    )


def _serve(ledger: Ledger) -> ServeDoc:
    """Serve's deployments with a router or a replica here, each with its replicas here."""
    serve = ledger.serve
    if serve is None:
        return ServeDoc()
    return ServeDoc(
        deployments=tuple(
            ServeDeploymentDoc(
                namespace=d.namespace,
                workload=d.workload,
                application=d.application,
                deployment=d.deployment,
                status=d.status,
                max_ongoing_requests=d.max_ongoing_requests,
                target_replicas=d.target_replicas,
                router_queued_requests=d.router_queued,
                router_requests_at_replicas=d.router_at_replicas,
                replicas=tuple(_serve_replica(r) for r in d.replicas),
            )
            for d in serve.deployments
        ),
        unread_ray_nodes=serve.unknown_nodes,
    )


def _sources(ledger: Ledger) -> tuple[SourceDoc, ...]:
    return tuple(
        SourceDoc(
            source=s.source,
            up=s.up,
            state=s.state,
            reason=s.error_reason,
            message=s.error_message,
            duration_seconds=s.duration_seconds,
        )
        for s in ledger.sources
    )


def _pods(ledger: Ledger) -> tuple[PodDoc, ...]:
    return tuple(
        PodDoc(
            namespace=s.pod.namespace,
            name=s.pod.name,
            uid=s.pod.uid,
            workload=s.pod.workload,
            phase=s.pod.phase,
            ready=s.pod.ready,
            starting=s.starting,
            gpu_requests=s.pod.gpu_requests,
            node=s.pod.node_name,
        )
        for s in ledger.pods
    )


def _pending(ledger: Ledger) -> tuple[PendingDoc, ...]:
    known = {(c.namespace, c.name): c for c in ledger.claims}
    return tuple(
        PendingDoc(
            namespace=p.namespace,
            name=p.name,
            uid=p.uid,
            workload=p.workload,
            reason=p.pending_reason,
            gpus=p.gpu_requests,
            since=p.pending_since,
            nodes=p.pending_nodes,
            claims=_pending_claims(known, p),
        )
        for p in ledger.pending
    )


def _picker(reading: PickerReading | None) -> PickerDoc | None:
    if reading is None:
        return None
    return PickerDoc(
        url=reading.url,
        up=reading.up,
        error_reason=reading.error_reason,
        names=reading.names,
        queued_requests=reading.queued_requests,
        queued_bytes=reading.queued_bytes,
        ready_endpoints=reading.ready_endpoints,
        average_queue_size=reading.average_queue_size,
        average_kv_cache_utilization=reading.average_kv_cache_utilization,
        saturation=reading.saturation,
        endpoint_queues=dict(reading.endpoint_queues),
    )


def _gateway(ledger: Ledger) -> GatewayDoc:
    """Cluster mode: every InferencePool with its members and its picker's reading."""
    return GatewayDoc(
        pools=tuple(
            PoolDoc(
                namespace=p.pool.namespace,
                name=p.pool.name,
                uid=p.pool.uid,
                selector=dict(p.pool.selector),
                target_ports=p.pool.target_ports,
                picker_service=p.pool.picker.service if p.pool.picker else None,
                failure_mode=p.pool.picker.failure_mode if p.pool.picker else None,
                accepted=p.pool.accepted,
                members_error=p.pool.members_error,
                members=tuple(
                    PoolMemberDoc(
                        uid=m.uid,
                        name=m.name,
                        workload=m.workload,
                        node=m.node_name,
                        pod_ip=m.pod_ip,
                        ready=m.ready,
                    )
                    for m in sorted(p.pool.members, key=lambda m: (m.name, m.uid))
                ),
                picker=_picker(p.picker),
            )
            for p in ledger.pools
        )
    )


def ledger_document(published: Published) -> LedgerDocument:
    ledger = published.ledger
    return LedgerDocument(
        schema=SCHEMA,
        version=__version__,
        node=ledger.node,
        mode=ledger.mode,
        taken_at=ledger.taken_at,
        driver_version=ledger.driver_version,
        simulated=published.simulated,
        sources=_sources(ledger),
        unknowns=ledger.unknowns,
        gpus=tuple(_gpu(g, ledger) for g in ledger.gpus),
        containers=_containers(ledger),
        processes=_process_docs(ledger),
        pods=_pods(ledger),
        engines=tuple(_engine(e) for e in ledger.engines),
        pending=_pending(ledger),
        ray=_ray_local(ledger),
        serve=_serve(ledger),
        discrepancies=tuple(
            DiscrepancyDoc(kind=d.kind, gpu_uuid=d.gpu_uuid, **vars(_ref(d.container)))
            for d in ledger.discrepancies
            if d.active
        ),
        spans=spans_doc(ledger),
        gateway=_gateway(ledger),
    )


def document_bytes(doc: LedgerDocument) -> bytes:
    """/ledger.json's body: compact, since json's C encoder writes only that (an indented
    10,000-pod document took the pure-Python encoder ~20 ms a cycle)."""
    return json.dumps(to_json(doc), separators=(",", ":")).encode()


def document_json(doc: LedgerDocument) -> Mapping[str, object]:
    """The document as json.loads would give it back (for tests and the harness)."""
    result: Mapping[str, object] = to_json(doc)
    return result
