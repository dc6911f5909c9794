"""Ledger -> Prometheus metric families. Knows Prometheus, nothing about sources.

Runs on the latest published ledger (once per snapshot for the text format, see
web/server.py): no I/O, no waiting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, Sample, Timestamp

from gpuledger import __version__
from gpuledger.export import families as F
from gpuledger.export.families import FamilySpec
from gpuledger.export.published import Published
from gpuledger.ledger import ContainerRef, Ledger, overflow_view
from gpuledger.ledger.engines import identity as engine_identity
from gpuledger.ledger.spans import JOIN_RULES
from gpuledger.model import SOURCE_STATES
from gpuledger.model.kubernetes import PodInfo
from gpuledger.model.nvml import LINK_LEVELS, MigDevice
from gpuledger.model.spans import LatencyCounts

# The engine's configuration labels, read from its config in this order.
CONFIG_LABELS = F.ENGINE_CONFIG_INFO.labels[len(F.ENGINE_LABELS) :]


def _container_values(ref: ContainerRef) -> list[str]:
    return [ref.namespace, ref.pod, ref.pod_uid, ref.container, ref.workload]


def _pod_values(pod: PodInfo) -> list[str]:
    return [pod.namespace, pod.name, pod.uid, pod.workload]


def _gauge(spec: FamilySpec) -> GaugeMetricFamily:
    assert spec.wire_type == "gauge", spec.name
    return GaugeMetricFamily(spec.name, spec.help, labels=["node", *spec.labels])


def _counter(spec: FamilySpec) -> CounterMetricFamily:
    assert spec.wire_type == "counter", spec.name
    return CounterMetricFamily(spec.name, spec.help, labels=["node", *spec.labels])


class _DeviceGauge(GaugeMetricFamily):
    """A gauge keyed by `gpu_uuid`. A MIG device's samples (gpu_uuid = its MIG UUID) also
    carry `parent_gpu_uuid`; a GPU's keep exactly the family's labels (docs/metrics.md)."""

    def __init__(self, spec: FamilySpec, parents: Mapping[str, str]):
        assert spec.device and spec.wire_type == "gauge", spec.name
        self._names = ["node", *spec.labels]
        super().__init__(spec.name, spec.help, labels=self._names)
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
    info = _gauge(F.GPU_INFO)
    parents = mig_parents(ledger)
    up = _DeviceGauge(F.GPU_UP, parents)
    total = _DeviceGauge(F.GPU_MEMORY_TOTAL_BYTES, parents)
    used = _DeviceGauge(F.GPU_MEMORY_USED_BYTES, parents)
    mig_info = _gauge(F.MIG_DEVICE_INFO)
    util = _gauge(F.GPU_UTILIZATION_RATIO)
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
    parents = mig_parents(ledger)
    memory = _DeviceGauge(F.CONTAINER_GPU_MEMORY_USED_BYTES, parents)
    count = _DeviceGauge(F.CONTAINER_GPU_PROCESSES, parents)
    for row in ledger.usage:
        values = [node, row.gpu_uuid, *_container_values(row.container)]
        memory.add_metric(values, row.memory_used_bytes)
        count.add_metric(values, row.processes)
    unattributed = _DeviceGauge(F.UNATTRIBUTED_GPU_MEMORY_USED_BYTES, parents)
    for uuid, used in sorted(ledger.unattributed.items()):
        unattributed.add_metric([node, uuid], used)
    devices = _DeviceGauge(F.CONTAINER_DEVICE_INFO, parents)
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
    allocation = _DeviceGauge(F.GPU_ALLOCATION_INFO, parents)
    for a in ledger.allocations:
        allocation.add_metric(
            [node, a.gpu_uuid, *_container_values(a.container)[:4], a.resource], 1
        )
    claims = _DeviceGauge(F.DRA_ALLOCATION_INFO, parents)
    for a in ledger.allocations:
        if a.claim is not None:
            c = a.claim
            dra = [c.claim_namespace, c.claim_name, c.driver, c.pool, c.device, c.share_id]
            claims.add_metric([node, a.gpu_uuid, *_container_values(a.container)[:4], *dra], 1)
    unused = _DeviceGauge(F.GPU_ALLOCATED_UNUSED, parents)
    unallocated = _DeviceGauge(F.GPU_UNALLOCATED_USE, parents)
    families = {"allocated_unused": unused, "unallocated_use": unallocated}
    for d in ledger.discrepancies:
        families[d.kind].add_metric(
            [node, d.gpu_uuid, *_container_values(d.container)], 1 if d.active else 0
        )
    starting = _gauge(F.POD_STARTING)
    for state in ledger.pods:
        starting.add_metric([node, *_pod_values(state.pod)], 1 if state.starting else 0)
    # Only where DRA allocates: a device-plugin node's exposition stays as it was.
    yield from (allocation, *([claims] if claims.samples else []), unused, unallocated, starting)


def pending_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    placement = _gauge(F.POD_PENDING_PLACEMENT)
    gpus = _gauge(F.POD_PENDING_GPUS)
    since = _gauge(F.POD_PENDING_SINCE_TIMESTAMP_SECONDS)
    for pod in ledger.pending:
        values = [node, *_pod_values(pod)]
        placement.add_metric([*values, pod.pending_reason or "other"], 1)
        gpus.add_metric(values, pod.gpu_requests)
        if pod.pending_since is not None:
            since.add_metric(values, pod.pending_since)
    yield from (placement, gpus, since)


def dra_node_families(ledger: Ledger) -> Iterator[Metric]:
    devices = _gauge(F.DRA_NODE_GPU_DEVICES)
    for row in ledger.dra_nodes:
        devices.add_metric([ledger.node, row.node, row.driver], row.devices)
    # Only where DRA publishes GPUs: a cluster without DRA exposes what it did before.
    yield from ([devices] if devices.samples else [])


def gateway_families(ledger: Ledger) -> Iterator[Metric]:
    """InferencePools, their members, and what each picker reported; nothing where the
    cluster has no pools (a cluster without the gateway exposes what it did before)."""
    node = ledger.node
    info = _gauge(F.INFERENCE_POOL_INFO)
    picker_up = _gauge(F.GATEWAY_PICKER_UP)
    queued = _gauge(F.GATEWAY_QUEUED_REQUESTS)
    ready = _gauge(F.GATEWAY_READY_ENDPOINTS)
    saturation = _gauge(F.GATEWAY_POOL_SATURATION)
    for row in ledger.pools:
        pool, picker = row.pool, row.picker
        ref = pool.picker
        key = [node, pool.namespace, pool.name]
        service, mode = (ref.service, ref.failure_mode) if ref else ("", "")
        info.add_metric([*key, pool.uid, service, mode], 1)
        if picker is None:
            continue
        picker_up.add_metric(key, 1 if picker.up else 0)
        for family, value in (
            (queued, picker.queued_requests),
            (ready, picker.ready_endpoints),
            (saturation, picker.saturation),
        ):
            if picker.up and value is not None:
                family.add_metric(key, value)
    members = _gauge(F.INFERENCE_POOL_MEMBER)
    for m in ledger.pool_members:
        pod = m.member
        members.add_metric(
            [node, m.namespace, m.pool, pod.name, pod.uid, pod.workload], 1 if pod.ready else 0
        )
    yield from (f for f in (info, members, picker_up, queued, ready, saturation) if f.samples)


def engine_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    up = _gauge(F.ENGINE_UP)
    requests = _gauge(F.ENGINE_REQUESTS)
    by_reason = _gauge(F.ENGINE_REQUESTS_WAITING_BY_REASON)
    kv = _gauge(F.ENGINE_KV_CACHE_USAGE_RATIO)
    preemptions = _counter(F.ENGINE_PREEMPTIONS)
    config = _gauge(F.ENGINE_CONFIG_INFO)
    gpu = _DeviceGauge(F.ENGINE_GPU_INFO, mig_parents(ledger))
    gpus = _gauge(F.ENGINE_GPUS)
    max_seqs = _gauge(F.ENGINE_MAX_NUM_SEQS)
    for e in ledger.engines:
        values = [node, e.namespace, e.pod, e.pod_uid, e.workload, e.model_name, e.engine, e.target]
        up.add_metric(values, 1 if e.up else 0)
        if e.gpus_configured is not None:
            gpus.add_metric([*values, "configured"], e.gpus_configured)
        if e.gpus_in_use is not None:
            gpus.add_metric([*values, "in_use"], e.gpus_in_use)
        if e.config.get("max_num_seqs", "").isdigit():
            max_seqs.add_metric(values, int(e.config["max_num_seqs"]))
        info = {**e.config, "engine_kind": e.kind}
        config.add_metric([*values, *(info.get(k, "") for k in CONFIG_LABELS)], 1)
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
    yield from engine_link_families(ledger)
    yield from engine_ray_families(ledger)


def _link_states(family: GaugeMetricFamily, values: Sequence[str], link: str) -> None:
    """A state set: one series per level, 1 for the engine's."""
    for level in LINK_LEVELS:
        family.add_metric([*values, level], 1 if level == link else 0)


def engine_link_families(ledger: Ledger) -> Iterator[Metric]:
    """The weakest link among each engine's GPUs here; absent on a node without an
    engine on two GPUs or more."""
    weakest = _gauge(F.ENGINE_GPU_LINK_WEAKEST)
    for e in ledger.engines:
        if e.gpu_link is not None:
            _link_states(weakest, [ledger.node, *engine_identity(e)], e.gpu_link)
    yield from (f for f in (weakest,) if f.samples)


def engine_ray_families(ledger: Ledger) -> Iterator[Metric]:
    """Driver side of a Ray-executor engine: its Ray job and what Ray says of its workers
    (docs/design.md, identity rule 9). Absent on a node without such engines."""
    job = _gauge(F.ENGINE_RAY_JOB_INFO)
    workers = _gauge(F.ENGINE_RAY_WORKERS)
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
    nodes = _gauge(F.RAY_NODE_GPUS)
    actors = _gauge(F.RAY_ACTOR_GPUS)
    without = _gauge(F.RAY_ACTORS_WITHOUT_GPU_MEMORY)
    memory = _DeviceGauge(F.RAY_ACTOR_GPU_MEMORY_USED_BYTES, mig_parents(ledger))
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
    info = _gauge(F.RAY_WORKER_INFO)
    memory = _DeviceGauge(F.RAY_WORKER_GPU_MEMORY_USED_BYTES, mig_parents(ledger))
    for w in ledger.ray.workers if ledger.ray is not None else ():
        pod = _ray_pod(w.node.pod)
        engine = [w.engine.job_id, w.engine.driver_node_id]
        labels = [_number(w.bundle_index), _number(w.ranks.tp), _number(w.ranks.pp)]
        values = [ledger.node, *pod, _workload(w.node.pod), *engine]
        info.add_metric([*values, w.class_name, *labels], 1)
        for uuid, used in w.memory:
            memory.add_metric([ledger.node, uuid, *pod, *engine, *labels], used)
    weakest = _gauge(F.RAY_ENGINE_GPU_LINK_WEAKEST)
    for link in ledger.ray.engine_links if ledger.ray is not None else ():
        values = [ledger.node, *_ray_pod(link.node.pod), _workload(link.node.pod)]
        engine = [link.engine.job_id, link.engine.driver_node_id]
        _link_states(weakest, [*values, *engine], link.link)
    yield from (f for f in (info, memory, weakest) if f.samples)


def _number(value: int | None) -> str:
    return "" if value is None else str(value)


def ray_cluster_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    groups = _gauge(F.RAY_PLACEMENT_GROUPS)
    pending = _gauge(F.RAY_PENDING_GPUS)
    cluster = ledger.ray_cluster
    if cluster is not None:
        ids = [node, cluster.namespace, cluster.workload]
        for (state, scheduling), count in sorted(cluster.placement_groups.items()):
            groups.add_metric([*ids, state, scheduling], count)
        for kind in ("placement_group", "actor"):
            pending.add_metric([*ids, kind], cluster.pending_gpus.get(kind, 0.0))
    yield from (groups, pending)


def serve_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    info = _gauge(F.SERVE_DEPLOYMENT_INFO)
    queued = _gauge(F.SERVE_ROUTER_QUEUED_REQUESTS)
    at_replicas = _gauge(F.SERVE_ROUTER_REQUESTS_AT_REPLICAS)
    replica_info = _gauge(F.SERVE_REPLICA_INFO)
    ongoing = _gauge(F.SERVE_REPLICA_ONGOING_REQUESTS)
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


def _merged(counts: Sequence[LatencyCounts]) -> LatencyCounts:
    """One engine's histogram from its senders' (an API server restarted is a new
    sender): counts and sums added, each bucket's newest exemplar."""
    first = counts[0]
    exemplars: dict[int, tuple[str, float, float]] = {}
    for c in counts:
        for bucket, exemplar in c.exemplars.items():
            if bucket not in exemplars or exemplar[2] > exemplars[bucket][2]:
                exemplars[bucket] = exemplar
    return LatencyCounts(
        first.bounds,
        tuple(sum(column) for column in zip(*(c.counts for c in counts), strict=True)),
        sum(c.total for c in counts),
        exemplars,
    )


def _buckets(counts: LatencyCounts) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
    bounds = [f"{b:g}" for b in counts.bounds] + ["+Inf"]
    buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
    for i, (le, count) in enumerate(zip(bounds, counts.counts, strict=True)):
        found = counts.exemplars.get(i)
        if found is None:
            buckets.append((le, float(count)))
        else:
            trace_id, value, at = found
            buckets.append((le, float(count), Exemplar({"trace_id": trace_id}, value, at)))
    return buckets


def request_families(ledger: Ledger) -> Iterator[Metric]:
    """Per-engine latency histograms from the spans tied to it, and the receiver's own
    state; nothing while the receiver is off."""
    requests = ledger.requests
    if requests is None:
        return
    node = ledger.node
    by_engine: dict[tuple[str, ...], tuple[list[LatencyCounts], list[LatencyCounts]]] = {}
    joined: Counter[str] = Counter()
    for sender in requests.senders:
        joined[sender.joined_by] += 1
        if sender.engine is None:
            continue
        queue, ttft = by_engine.setdefault(sender.engine, ([], []))
        queue.extend([sender.queue_time] if sender.queue_time else [])
        ttft.extend([sender.ttft] if sender.ttft else [])
    for spec, index in ((F.ENGINE_REQUEST_QUEUE_SECONDS, 0), (F.ENGINE_REQUEST_TTFT_SECONDS, 1)):
        family = HistogramMetricFamily(spec.name, spec.help, labels=["node", *spec.labels])
        for engine, lists in sorted(by_engine.items()):
            if lists[index]:
                merged = _merged(lists[index])
                family.add_metric([node, *engine], _buckets(merged), merged.total)
        yield family
    senders = _gauge(F.OTLP_SENDERS)
    for rule in JOIN_RULES:
        senders.add_metric([node, rule], joined[rule])
    yield senders
    refused = _counter(F.OTLP_REFUSED_TOTAL)
    for reason, count in sorted(requests.refused_total.items()):
        refused.add_metric([node, reason], count)
    yield refused
    stored = _gauge(F.OTLP_STORED_BYTES)
    stored.add_metric([node], requests.stored_bytes)
    yield stored


def dropped_series(ledger: Ledger) -> dict[str, int]:
    """Series per family that the ledger's caps kept out this snapshot: its overflow,
    built into families by the same code as what is exported, and counted."""
    o = ledger.overflow
    if o.empty:
        return {}
    view = overflow_view(ledger)
    # Kept engines' GPU rows past the cap: only their engine GPU family was cut.
    surplus = replace(view, engines=o.engine_gpus)
    # Every mode's builders: a view holds only rows that were cut, whichever mode cut them.
    builders = {build for builds in LEDGER_FAMILIES.values() for build in builds}
    families = [f for build in builders for f in build(view)]
    families += [f for f in engine_families(surplus) if f.name == F.ENGINE_GPU_INFO.name]
    counts: Counter[str] = Counter()
    for family in families:
        if family.samples:
            suffix = "_total" if family.type == "counter" else ""
            counts[family.name + suffix] += len(family.samples)
    return dict(counts)


def dropped_family(published: Published) -> Metric:
    dropped = _counter(F.SERIES_DROPPED)
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
    up = _gauge(F.SOURCE_UP)
    # A state set (kube-state-metrics style): tells a source that is not configured on this
    # exporter from one that is down, while source_up stays 0 for both as before.
    state = _gauge(F.SOURCE_STATE)
    duration = _gauge(F.SOURCE_DURATION_SECONDS)
    for status in ledger.sources:
        up.add_metric([node, status.source], 1 if status.up else 0)
        for name in SOURCE_STATES:
            state.add_metric([node, status.source, name], 1 if status.state == name else 0)
        duration.add_metric([node, status.source], status.duration_seconds)
    cpu = _counter(F.SOURCE_CPU_SECONDS)
    for source, seconds in sorted(published.cpu_seconds_total.items()):
        cpu.add_metric([node, source], seconds)
    errors = _counter(F.SOURCE_ERRORS)
    for (source, reason), value in sorted(published.errors_total.items()):
        errors.add_metric([node, source, reason], value)
    last = _gauge(F.SOURCE_LAST_SUCCESS_TIMESTAMP_SECONDS)
    for source, when in sorted(published.last_success.items()):
        last.add_metric([node, source], when)
    build = _gauge(F.BUILD_INFO)
    build.add_metric([node, __version__, "true" if published.simulated else "false"], 1)
    yield from (up, state, duration, cpu, errors, last, build)


def age_family(published: Published, now: float) -> Metric:
    """The one series that changes between scrapes of the same snapshot."""
    age = _gauge(F.SNAPSHOT_AGE_SECONDS)
    age.add_metric([published.ledger.node], max(0.0, now - published.ledger.taken_at))
    return age


# The families of each mode that come from the ledger alone, in exposition order.
LEDGER_FAMILIES: Mapping[str, tuple[Callable[[Ledger], Iterator[Metric]], ...]] = {
    "node": (
        gpu_families,
        container_families,
        kubernetes_families,
        engine_families,
        ray_families,
        serve_families,
        request_families,
    ),
    "cluster": (pending_families, dra_node_families, ray_cluster_families, gateway_families),
}


def snapshot_families(published: Published, now: float) -> Iterator[Metric]:
    """Everything derived from one snapshot alone (rendered once per cycle)."""
    for build in LEDGER_FAMILIES[published.ledger.mode]:
        yield from build(published.ledger)
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
