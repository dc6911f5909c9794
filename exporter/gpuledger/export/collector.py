"""Ledger -> Prometheus metric families. Knows Prometheus, nothing about sources.

Runs on the latest published ledger (once per snapshot for the text format, see
web/server.py): no I/O, no waiting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample, Timestamp

from gpuledger import __version__
from gpuledger.ledger import ContainerRef, Ledger
from gpuledger.ledger.engines import identity as engine_identity
from gpuledger.model import SOURCE_STATES
from gpuledger.model.kubernetes import PodInfo
from gpuledger.model.nvml import MigDevice

CONTAINER_LABELS = ["namespace", "pod", "pod_uid", "container", "workload"]
MIG_INFO_LABELS = [
    "gpu_uuid",
    "parent_gpu_uuid",
    "mig_index",
    "gpu_instance_id",
    "compute_instance_id",
    "profile",
]
POD_LABELS = ["namespace", "pod", "pod_uid", "workload"]
# `target` (the scraped host:port) keeps two engines of one pod, or of no pod, apart.
ENGINE_LABELS = [*POD_LABELS, "model_name", "engine", "target"]
# A Ray-executor engine's identity on every node (docs/design.md, identity rule 9).
RAY_ENGINE_LABELS = ["ray_job_id", "ray_driver_node_id"]
CONFIG_LABELS = [
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_num_seqs",
    "num_gpu_blocks",
    "block_size",
]


@dataclass(frozen=True)
class Published:
    """What a scrape renders: the latest ledger plus the exporter's running counters."""

    ledger: Ledger
    errors_total: Mapping[tuple[str, str], int] = field(default_factory=dict)
    last_success: Mapping[str, float] = field(default_factory=dict)
    # From PipelineConfig.simulated: the data comes from gpuledger's simulator.
    simulated: bool = False
    # Metric family -> series a cap kept out, summed over snapshots (dropped_series).
    dropped_total: Mapping[str, int] = field(default_factory=dict)


def _container_values(ref: ContainerRef) -> list[str]:
    return [ref.namespace, ref.pod, ref.pod_uid, ref.container, ref.workload]


def _pod_values(pod: PodInfo) -> list[str]:
    return [pod.namespace, pod.name, pod.uid, pod.workload]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["node", *labels])


class _DeviceGauge(GaugeMetricFamily):
    """A gauge keyed by `gpu_uuid`. A MIG device's samples (gpu_uuid = its MIG UUID) also
    carry `parent_gpu_uuid`; a GPU's keep exactly the family's labels (docs/metrics.md)."""

    def __init__(self, name: str, doc: str, labels: list[str], parents: Mapping[str, str]):
        super().__init__(name, doc, labels=["node", *labels])
        self._names = ["node", *labels]
        self._device = self._names.index("gpu_uuid")
        self._parents = parents

    def add_metric(
        self, labels: Sequence[str], value: float, timestamp: Timestamp | float | None = None
    ) -> None:
        parent = self._parents.get(labels[self._device])
        if parent is None:
            super().add_metric(labels, value, timestamp)
            return
        named = dict(zip(self._names, labels, strict=True))
        named["parent_gpu_uuid"] = parent
        self.samples.append(Sample(self.name, named, value, timestamp))


def mig_parents(ledger: Ledger) -> dict[str, str]:
    """MIG device UUID -> its GPU's UUID."""
    return {m.uuid: g.uuid for g in ledger.gpus for m in g.mig_devices}


def gpu_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    info = _gauge(
        "gpuledger_gpu_info",
        "One per GPU: identity attributes. Join on gpu_uuid; gpu_index is host-local.",
        ["gpu_uuid", "gpu_index", "model", "pci_bus_id", "mig_mode"],
    )
    parents = mig_parents(ledger)
    up = _DeviceGauge(
        "gpuledger_gpu_up", "1 if every NVML query for this GPU succeeded.", ["gpu_uuid"], parents
    )
    total = _DeviceGauge(
        "gpuledger_gpu_memory_total_bytes", "GPU memory size (NVML).", ["gpu_uuid"], parents
    )
    used = _DeviceGauge(
        "gpuledger_gpu_memory_used_bytes", "GPU memory in use (NVML).", ["gpu_uuid"], parents
    )
    mig_info = _gauge(
        "gpuledger_mig_device_info",
        "One per MIG device (gpu_uuid: its MIG UUID) of a GPU in MIG mode: its GPU, MIG "
        "device index, GPU and compute instance ids and profile.",
        MIG_INFO_LABELS,
    )
    util = _gauge(
        "gpuledger_gpu_utilization_ratio",
        "Fraction of the last sample period a kernel ran on the GPU (NVML), 0-1.",
        ["gpu_uuid"],
    )
    for gpu in ledger.gpus:
        info.add_metric([node, gpu.uuid, str(gpu.index), gpu.name, gpu.pci_bus_id, gpu.mig_mode], 1)
        up.add_metric([node, gpu.uuid], 1 if gpu.up else 0)
        if gpu.memory_total_bytes is not None:
            total.add_metric([node, gpu.uuid], gpu.memory_total_bytes)
        if gpu.memory_used_bytes is not None:
            used.add_metric([node, gpu.uuid], gpu.memory_used_bytes)
        if gpu.utilization_ratio is not None:
            util.add_metric([node, gpu.uuid], gpu.utilization_ratio)
        for mig in gpu.mig_devices:  # NVML has no utilization for them
            mig_info.add_metric([node, *_mig_values(mig)], 1)
            up.add_metric([node, mig.uuid], 1 if mig.up else 0)
            if mig.memory_total_bytes is not None:
                total.add_metric([node, mig.uuid], mig.memory_total_bytes)
            if mig.memory_used_bytes is not None:
                used.add_metric([node, mig.uuid], mig.memory_used_bytes)
    yield from (info, up, total, used, util)
    if mig_info.samples:  # a node without MIG keeps its exposition as it was
        yield mig_info


def _mig_values(mig: MigDevice) -> list[str]:
    ids = (mig.gpu_instance_id, mig.compute_instance_id)
    instance, compute = ("" if i is None else str(i) for i in ids)
    return [mig.uuid, mig.parent_uuid, str(mig.index), instance, compute, mig.profile]


def container_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    labels = ["gpu_uuid", *CONTAINER_LABELS]
    parents = mig_parents(ledger)
    memory = _DeviceGauge(
        "gpuledger_container_gpu_memory_used_bytes",
        "GPU memory held by a container's processes on one GPU (NVML per-process, summed).",
        labels,
        parents,
    )
    count = _DeviceGauge(
        "gpuledger_container_gpu_processes",
        "Processes of a container holding a context on one GPU.",
        labels,
        parents,
    )
    for row in ledger.usage:
        values = [node, row.gpu_uuid, *_container_values(row.container)]
        memory.add_metric(values, row.memory_used_bytes)
        count.add_metric(values, row.processes)
    unattributed = _DeviceGauge(
        "gpuledger_unattributed_gpu_memory_used_bytes",
        "GPU memory held by processes that belong to no pod (host processes).",
        ["gpu_uuid"],
        parents,
    )
    for uuid, used in sorted(ledger.unattributed.items()):
        unattributed.add_metric([node, uuid], used)
    devices = _DeviceGauge(
        "gpuledger_container_device_info",
        "Container ordinal local_index (CUDA device N inside the container) is host GPU gpu_uuid.",
        [*CONTAINER_LABELS[:4], "local_index", "gpu_uuid", "source"],
        parents,
    )
    for mapping in ledger.device_maps:
        devices.add_metric(
            [
                node,
                *_container_values(mapping.container)[:4],
                str(mapping.local_index),
                mapping.gpu_uuid,
                mapping.source,
            ],
            1,
        )
    yield from (memory, count, unattributed, devices)


def kubernetes_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    parents = mig_parents(ledger)
    allocation = _DeviceGauge(
        "gpuledger_gpu_allocation_info",
        "1: the kubelet (PodResources) says this container holds this GPU.",
        ["gpu_uuid", *CONTAINER_LABELS[:4], "resource"],
        parents,
    )
    for a in ledger.allocations:
        allocation.add_metric(
            [node, a.gpu_uuid, *_container_values(a.container)[:4], a.resource], 1
        )
    labels = ["gpu_uuid", *CONTAINER_LABELS]
    unused = _DeviceGauge(
        "gpuledger_gpu_allocated_unused",
        "1: GPU allocated to the container, but none of its processes has a context on it.",
        labels,
        parents,
    )
    unallocated = _DeviceGauge(
        "gpuledger_gpu_unallocated_use",
        "1: a container's process uses this GPU although it is not allocated to it.",
        labels,
        parents,
    )
    families = {"allocated_unused": unused, "unallocated_use": unallocated}
    for d in ledger.discrepancies:
        families[d.kind].add_metric(
            [node, d.gpu_uuid, *_container_values(d.container)], 1 if d.active else 0
        )
    starting = _gauge(
        "gpuledger_pod_starting",
        "1: a GPU pod on this node is placed but not Ready yet (pulling, loading the model).",
        POD_LABELS,
    )
    for state in ledger.pods:
        starting.add_metric([node, *_pod_values(state.pod)], 1 if state.starting else 0)
    yield from (allocation, unused, unallocated, starting)


def pending_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    placement = _gauge(
        "gpuledger_pod_pending_placement",
        "1 per pod the scheduler has not placed (PodScheduled=False), by dominant reason.",
        [*POD_LABELS, "reason"],
    )
    gpus = _gauge("gpuledger_pod_pending_gpus", "GPUs an unplaced pod requests.", POD_LABELS)
    since = _gauge(
        "gpuledger_pod_pending_since_timestamp_seconds",
        "When PodScheduled became False for an unplaced pod (Unix time).",
        POD_LABELS,
    )
    for pod in ledger.pending:
        values = [node, *_pod_values(pod)]
        placement.add_metric([*values, pod.pending_reason or "other"], 1)
        gpus.add_metric(values, pod.gpu_requests)
        if pod.pending_since is not None:
            since.add_metric(values, pod.pending_since)
    yield from (placement, gpus, since)


def engine_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    up = _gauge(
        "gpuledger_engine_up", "1 if the last scrape of this vLLM engine succeeded.", ENGINE_LABELS
    )
    requests = _gauge(
        "gpuledger_engine_requests",
        "Requests in the engine: running (in this step's batch) or waiting (queued).",
        [*ENGINE_LABELS, "state"],
    )
    by_reason = _gauge(
        "gpuledger_engine_requests_waiting_by_reason",
        "Waiting requests by the engine's reason (vLLM 0.20+: capacity, deferred).",
        [*ENGINE_LABELS, "reason"],
    )
    kv = _gauge(
        "gpuledger_engine_kv_cache_usage_ratio",
        "Fraction of KV-cache blocks in use, 0-1.",
        ENGINE_LABELS,
    )
    preemptions = CounterMetricFamily(
        "gpuledger_engine_preemptions",
        "Requests the engine preempted (vllm:num_preemptions_total).",
        labels=["node", *ENGINE_LABELS],
    )
    config = _gauge(
        "gpuledger_engine_config_info",
        "1: the engine's configuration (whitelisted API-server flags and cache config).",
        [*ENGINE_LABELS, *CONFIG_LABELS],
    )
    gpu = _DeviceGauge(
        "gpuledger_engine_gpu_info",
        "1: a process of the engine (role engine_core or worker, rank) holds this GPU.",
        [*ENGINE_LABELS, "gpu_uuid", "role", "rank"],
        mig_parents(ledger),
    )
    gpus = _gauge(
        "gpuledger_engine_gpus",
        "GPUs of one engine: configured (tensor x pipeline parallel size from its flags) and "
        "in_use (distinct GPUs its processes hold, NVML).",
        [*ENGINE_LABELS, "state"],
    )
    max_seqs = _gauge(
        "gpuledger_engine_max_num_seqs",
        "The engine's --max-num-seqs: requests one step may batch; absent when not set.",
        ENGINE_LABELS,
    )
    for e in ledger.engines:
        values = [node, e.namespace, e.pod, e.pod_uid, e.workload, e.model_name, e.engine, e.target]
        up.add_metric(values, 1 if e.up else 0)
        if e.gpus_configured is not None:
            gpus.add_metric([*values, "configured"], e.gpus_configured)
        if e.gpus_in_use is not None:
            gpus.add_metric([*values, "in_use"], e.gpus_in_use)
        if e.config.get("max_num_seqs", "").isdigit():
            max_seqs.add_metric(values, int(e.config["max_num_seqs"]))
        config.add_metric([*values, *(e.config.get(k, "") for k in CONFIG_LABELS)], 1)
        for g in e.gpus:
            gpu.add_metric([*values, g.gpu_uuid, g.role, g.rank], 1)
        m = e.metrics
        if m is None:
            continue
        for state, count in (("running", m.requests_running), ("waiting", m.requests_waiting)):
            if count is not None:
                requests.add_metric([*values, state], count)
        for reason, count in sorted(m.waiting_by_reason.items()):
            by_reason.add_metric([*values, reason], count)
        if m.kv_cache_usage_ratio is not None:
            kv.add_metric(values, m.kv_cache_usage_ratio)
        if m.preemptions_total is not None:
            preemptions.add_metric(values, m.preemptions_total)
    yield from (up, requests, by_reason, kv, preemptions, config, gpu, gpus, max_seqs)
    yield from engine_ray_families(ledger)


def engine_ray_families(ledger: Ledger) -> Iterator[Metric]:
    """Driver side of a Ray-executor engine: its Ray job and what Ray says of its workers
    (docs/design.md, identity rule 9). Absent on a node without such engines."""
    job = _gauge(
        "gpuledger_engine_ray_job_info",
        "1: the engine's EngineCore is the driver of this Ray job; its workers are Ray "
        "actors on any node, reported there as gpuledger_ray_worker_info.",
        [*ENGINE_LABELS, *RAY_ENGINE_LABELS],
    )
    workers = _gauge(
        "gpuledger_engine_ray_workers",
        "The engine's Ray worker actors on every node, by state (Ray's view).",
        [*ENGINE_LABELS, "state"],
    )
    for e in ledger.engines:
        if e.ray is None:
            continue
        values = [ledger.node, *engine_identity(e)]
        job.add_metric([*values, e.ray.id.job_id, e.ray.id.driver_node_id], 1)
        for state, count in sorted(e.ray.workers.items()):
            workers.add_metric([*values, state], count)
    yield from (f for f in (job, workers) if f.samples)


def ray_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    nodes = _gauge(
        "gpuledger_ray_node_gpus",
        "GPUs of a Ray node that is this pod: Ray's logical total and available, and the "
        "GPUs Kubernetes allocated to the pod (state=allocated).",
        ["namespace", "pod", "pod_uid", "ray_node_id", "state"],
    )
    actors = _gauge(
        "gpuledger_ray_actor_gpus",
        "Logical GPUs held (ALIVE) or asked (pending) by Ray actors on this Ray node.",
        [*POD_LABELS, "class_name", "state"],
    )
    without = _gauge(
        "gpuledger_ray_actors_without_gpu_memory",
        "ALIVE Ray actors with num_gpus > 0 whose process holds no GPU memory (NVML).",
        [*POD_LABELS, "class_name"],
    )
    memory = _DeviceGauge(
        "gpuledger_ray_actor_gpu_memory_used_bytes",
        "GPU memory held by Ray actors' processes (actor PID -> host PID by NSpid -> NVML).",
        ["gpu_uuid", "namespace", "pod", "pod_uid", "class_name"],
        mig_parents(ledger),
    )
    ray = ledger.ray
    if ray is not None:
        for view in ray.nodes:
            ids = _ray_pod(view.pod)
            for state, gpus in (
                ("total", view.node.gpus_total),
                ("available", view.node.gpus_available),
                ("allocated", view.gpus_allocated),
            ):
                if gpus is not None:
                    nodes.add_metric([node, *ids, view.node.node_id, state], gpus)
        for row in ray.actor_gpus:
            values = [node, *_ray_pod(row.node.pod), _workload(row.node.pod)]
            actors.add_metric([*values, row.class_name, row.state], row.gpus)
            if row.without_memory is not None:
                without.add_metric([*values, row.class_name], row.without_memory)
        for m in ray.actor_memory:
            memory.add_metric([node, m.gpu_uuid, *_ray_pod(m.node.pod), m.class_name], m.used_bytes)
    yield from (nodes, actors, without, memory)
    yield from ray_worker_families(ledger)


def ray_worker_families(ledger: Ledger) -> Iterator[Metric]:
    """Worker side of Ray-executor engines: the vLLM worker actors on this node's Ray
    nodes, under their engine's cross-node identity. Absent on a node without any."""
    ranks = ["bundle_index", "tp_rank", "pp_rank"]
    info = _gauge(
        "gpuledger_ray_worker_info",
        "1 per vLLM worker actor (RayWorkerProc, RayWorkerWrapper) on this node's Ray nodes "
        "whose process was looked up in NVML; ranks from its name (empty for the legacy "
        "executor), bundle_index its placement group bundle.",
        [*POD_LABELS, *RAY_ENGINE_LABELS, "class_name", *ranks],
    )
    memory = _DeviceGauge(
        "gpuledger_ray_worker_gpu_memory_used_bytes",
        "GPU memory a vLLM Ray worker's process holds (NVML by PID), per GPU.",
        ["gpu_uuid", *POD_LABELS[:3], *RAY_ENGINE_LABELS, *ranks],
        mig_parents(ledger),
    )
    for w in ledger.ray.workers if ledger.ray is not None else ():
        pod = _ray_pod(w.node.pod)
        engine = [w.engine.job_id, w.engine.driver_node_id]
        labels = [_number(w.bundle_index), _number(w.ranks.tp), _number(w.ranks.pp)]
        values = [ledger.node, *pod, _workload(w.node.pod), *engine]
        info.add_metric([*values, w.class_name, *labels], 1)
        for uuid, used in w.memory:
            memory.add_metric([ledger.node, uuid, *pod, *engine, *labels], used)
    yield from (f for f in (info, memory) if f.samples)


def _number(value: int | None) -> str:
    return "" if value is None else str(value)


def ray_cluster_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    groups = _gauge(
        "gpuledger_ray_placement_groups",
        "Ray placement groups by state and scheduling state (NO_RESOURCES waits for "
        "resources others hold; INFEASIBLE never fits the cluster).",
        ["namespace", "workload", "state", "scheduling_state"],
    )
    pending = _gauge(
        "gpuledger_ray_pending_gpus",
        "GPUs asked by Ray work that is not placed: placement groups and actors.",
        ["namespace", "workload", "kind"],
    )
    cluster = ledger.ray_cluster
    if cluster is not None:
        ids = [node, cluster.namespace, cluster.workload]
        for (state, scheduling), count in sorted(cluster.placement_groups.items()):
            groups.add_metric([*ids, state, scheduling], count)
        for kind in ("placement_group", "actor"):
            pending.add_metric([*ids, kind], cluster.pending_gpus.get(kind, 0.0))
    yield from (groups, pending)


SERVE_DEPLOYMENT_LABELS = ["namespace", "workload", "application", "deployment"]
SERVE_REPLICA_LABELS = [*POD_LABELS, "application", "deployment", "replica"]


def serve_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    info = _gauge(
        "gpuledger_serve_deployment_info",
        "1 per Ray Serve deployment with a router or a replica on this node: its status "
        "and max_ongoing_requests (requests one replica takes; the rest wait at the router).",
        [*SERVE_DEPLOYMENT_LABELS, "status", "max_ongoing_requests"],
    )
    queued = _gauge(
        "gpuledger_serve_router_queued_requests",
        "Requests the Serve routers (proxies, deployment handles) on this node's Ray nodes "
        "hold for a deployment, not assigned to a replica yet.",
        SERVE_DEPLOYMENT_LABELS,
    )
    at_replicas = _gauge(
        "gpuledger_serve_router_requests_at_replicas",
        "Requests those routers have assigned to the deployment's replicas, not finished yet.",
        SERVE_DEPLOYMENT_LABELS,
    )
    replica_info = _gauge(
        "gpuledger_serve_replica_info",
        "1 per Ray Serve replica on this node's Ray nodes: its pod and state.",
        [*SERVE_REPLICA_LABELS, "state"],
    )
    ongoing = _gauge(
        "gpuledger_serve_replica_ongoing_requests",
        "Requests a Ray Serve replica runs now (ray_serve_replica_processing_queries).",
        SERVE_REPLICA_LABELS,
    )
    serve = ledger.serve
    for d in serve.deployments if serve is not None else ():
        key = [node, d.namespace, d.workload, d.application, d.deployment]
        limit = "" if d.max_ongoing_requests is None else str(d.max_ongoing_requests)
        info.add_metric([*key, d.status, limit], 1)
        if d.router_queued is not None:
            queued.add_metric(key, d.router_queued)
        if d.router_at_replicas is not None:
            at_replicas.add_metric(key, d.router_at_replicas)
    for r in serve.replicas if serve is not None else ():
        values = [node, r.namespace, r.pod, r.pod_uid, r.workload]
        values += [r.application, r.deployment, r.replica]
        replica_info.add_metric([*values, r.state], 1)
        if r.ongoing is not None:
            ongoing.add_metric(values, r.ongoing)
    # A node without Serve keeps its exposition as it was.
    yield from (f for f in (info, queued, at_replicas, replica_info, ongoing) if f.samples)


def dropped_series(ledger: Ledger) -> dict[str, int]:
    """Series per family that the ledger's caps kept out this snapshot: its overflow,
    built into families by the same code as what is exported, and counted."""
    o = ledger.overflow
    if o.empty:
        return {}
    view = replace(
        ledger,
        gpus=o.gpus,
        unattributed={},
        usage=o.usage,
        device_maps=o.device_maps,
        allocations=o.allocations,
        discrepancies=o.discrepancies,
        pods=o.pods,
        engines=o.engines,
        pending=o.pending,
        ray=o.ray,
        ray_cluster=None,
        serve=o.serve,
    )
    surplus_gpus = [
        f
        for f in engine_families(replace(view, engines=o.engine_gpus))
        if f.name == "gpuledger_engine_gpu_info"
    ]
    counts: Counter[str] = Counter()
    for family in (
        *gpu_families(view),
        *container_families(view),
        *kubernetes_families(view),
        *engine_families(view),
        *surplus_gpus,
        *ray_families(view),
        *serve_families(view),
        *pending_families(view),
    ):
        if family.samples:
            suffix = "_total" if family.type == "counter" else ""
            counts[family.name + suffix] += len(family.samples)
    return dict(counts)


def dropped_family(published: Published) -> Metric:
    dropped = CounterMetricFamily(
        "gpuledger_series_dropped",
        "Series a per-node cardinality cap kept out of a metric family, summed over "
        'snapshots. Ray actor classes past the cap are folded into class_name="_other".',
        labels=["node", "family"],
    )
    for family, count in sorted(published.dropped_total.items()):
        dropped.add_metric([published.ledger.node, family], count)
    return dropped


def _ray_pod(pod: PodInfo | None) -> list[str]:
    return [pod.namespace, pod.name, pod.uid] if pod is not None else ["", "", ""]


def _workload(pod: PodInfo | None) -> str:
    return pod.workload if pod is not None else ""


def self_families(published: Published, now: float) -> Iterator[Metric]:
    ledger = published.ledger
    node = ledger.node
    up = _gauge("gpuledger_source_up", "1 if the source's last fetch succeeded.", ["source"])
    # A state set (kube-state-metrics style): tells a source that is not configured on this
    # exporter from one that is down, while source_up stays 0 for both as before.
    state = _gauge(
        "gpuledger_source_state",
        "1 for the source's state (up, down, not_configured: this exporter does not read it), "
        "0 for the others.",
        ["source", "state"],
    )
    duration = _gauge(
        "gpuledger_source_duration_seconds", "How long the source's last fetch took.", ["source"]
    )
    for status in ledger.sources:
        up.add_metric([node, status.source], 1 if status.up else 0)
        for name in SOURCE_STATES:
            state.add_metric([node, status.source, name], 1 if status.state == name else 0)
        duration.add_metric([node, status.source], status.duration_seconds)
    errors = CounterMetricFamily(
        "gpuledger_source_errors",
        "Failed fetches by source and reason since the exporter started.",
        labels=["node", "source", "reason"],
    )
    for (source, reason), value in sorted(published.errors_total.items()):
        errors.add_metric([node, source, reason], value)
    last = _gauge(
        "gpuledger_source_last_success_timestamp_seconds",
        "When the source last fetched successfully (Unix time).",
        ["source"],
    )
    for source, when in sorted(published.last_success.items()):
        last.add_metric([node, source], when)
    build = _gauge(
        "gpuledger_build_info",
        "1; the running gpuledger version; simulated is true under gpuledger demo and "
        "simulate (no real hardware).",
        ["version", "simulated"],
    )
    build.add_metric([node, __version__, "true" if published.simulated else "false"], 1)
    yield from (up, state, duration, errors, last, build)


def age_family(published: Published, now: float) -> Metric:
    """The one series that changes between scrapes of the same snapshot."""
    age = _gauge(
        "gpuledger_snapshot_age_seconds",
        "Age of the snapshot this scrape renders; grows when the collection loop is stuck.",
        [],
    )
    age.add_metric([published.ledger.node], max(0.0, now - published.ledger.taken_at))
    return age


def snapshot_families(published: Published, now: float) -> Iterator[Metric]:
    """Everything derived from one snapshot alone (rendered once per cycle)."""
    ledger = published.ledger
    if ledger.mode == "node":
        yield from gpu_families(ledger)
        yield from container_families(ledger)
        yield from kubernetes_families(ledger)
        yield from engine_families(ledger)
        yield from ray_families(ledger)
        yield from serve_families(ledger)
    else:
        yield from pending_families(ledger)
        yield from ray_cluster_families(ledger)
    if published.dropped_total:
        yield dropped_family(published)
    yield from self_families(published, now)


class LedgerCollector(Collector):
    """Renders whatever `current()` returns: (latest state or None, now), for
    prometheus_client's encoders.

    `part`: "snapshot" (all but the age), "age" (the age alone) or "all".
    """

    def __init__(
        self, current: Callable[[], tuple[Published | None, float]], part: str = "all"
    ) -> None:
        self._current = current
        self._part = part

    def families(self) -> Iterator[Metric]:
        published, now = self._current()
        if published is None:
            return
        if self._part in ("snapshot", "all"):
            yield from snapshot_families(published, now)
        if self._part in ("age", "all"):
            yield age_family(published, now)

    def collect(self) -> Iterator[Metric]:
        return self.families()
