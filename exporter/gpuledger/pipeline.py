"""One collection cycle: run the sources in dependency order under their deadlines, join.

The sources of each mode are the lists below. Sources whose needs are met start together;
each runs in its own thread under its own deadline, so a cycle takes at most one
deadline per dependency level (three today: Serve reads the Ray nodes found here), and a
scrape never waits on any of it: it renders the last published ledger. How to add a
source: docs/design.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuledger.export.collector import dropped_series
from gpuledger.export.published import Published
from gpuledger.ledger import Ledger, build_ledger
from gpuledger.model import Key, Snapshots, SourceStatus
from gpuledger.model.engines import ENGINES
from gpuledger.model.kubernetes import PODS
from gpuledger.model.podresources import PODRESOURCES
from gpuledger.model.ray import RAY_CLUSTER, RAY_LOCAL
from gpuledger.model.serve import SERVE
from gpuledger.model.spans import GrpcSecurity, SpanSink
from gpuledger.sources.base import DISABLED, NotConfigured, Source, SourceRunner, Started
from gpuledger.sources.engines.source import EngineScraper, EngineSource
from gpuledger.sources.gateway.picker import PickerSource
from gpuledger.sources.kubernetes.dra import (
    DEFAULT_GPU_DEVICE_CLASSES,
    DEFAULT_GPU_DRIVERS,
    DraSource,
)
from gpuledger.sources.kubernetes.pods import PodInformer
from gpuledger.sources.kubernetes.pools import InferencePoolSource
from gpuledger.sources.nvml import NvmlSource
from gpuledger.sources.otlp.receiver import DEFAULT_MAX_BODY_BYTES
from gpuledger.sources.otlp.source import SpansSource
from gpuledger.sources.podresources import PodResourcesSource
from gpuledger.sources.procfs.source import ProcfsSource
from gpuledger.sources.ray.serve import ServeClient, ServeSource
from gpuledger.sources.ray.state import RayClusterSource, RayLocalSource, RayStateClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineConfig:
    node: str
    mode: str = "node"
    proc_root: str = "/proc"
    nvml_library: str | None = None
    source_deadline_seconds: float = 5.0
    # None: not configured here (e.g. a box without Kubernetes).
    podresources_socket: str | None = None
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-*")
    # Cluster mode: report unplaced pods that request no GPU too.
    pending_all_pods: bool = False
    kubernetes: bool = False
    # Kubernetes DRA (resource.k8s.io/v1): False leaves the source out of the list.
    dra: bool = False
    dra_device_classes: tuple[str, ...] = DEFAULT_GPU_DEVICE_CLASSES
    dra_drivers: tuple[str, ...] = DEFAULT_GPU_DRIVERS
    kubeconfig: str | None = None
    # Cluster mode: InferencePools (inference.networking.k8s.io/v1) and their endpoint
    # pickers' metrics; False leaves both sources out of the list, as DRA.
    gateway: bool = False
    # (NAMESPACE/POOL, URL): a picker's metrics URL, instead of its Service's.
    gateway_picker_urls: tuple[tuple[str, str], ...] = ()
    # Sent to pickers only, as a bearer token: never the service account's own token
    # (any namespace that may create an InferencePool chooses where a picker is).
    gateway_picker_token: str | None = field(default=None, repr=False)
    gateway_picker_ca_file: str | None = None
    engine_targets: tuple[str, ...] = ()
    engine_discovery: bool = True
    engine_timeout_seconds: float = 3.0
    engine_max_body_bytes: int = 8 * 1024 * 1024
    ray_address: str | None = None
    ray_token: str | None = field(default=None, repr=False)  # never printed
    # Cluster mode: the (namespace, workload) Ray's pending work is attributed to.
    ray_workload: tuple[str, str] = ("", "ray")
    # The sources are the simulator's (`demo`, `simulate`): every output says so.
    simulated: bool = False
    # Node mode: the OTLP span receiver (POST /v1/traces on --listen, and gRPC when
    # otlp_grpc_listen is set).
    otlp_receiver: bool = False
    otlp_grpc_listen: str | None = None
    otlp_max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


def node_sources(config: PipelineConfig) -> list[Source[Any]]:
    """The node agent (DaemonSet): this node's GPUs, processes, pods and engines."""
    deadline = config.source_deadline_seconds
    return [
        NvmlSource(config.nvml_library, topology_seconds=deadline * 0.2),
        ProcfsSource(config.proc_root, socket_seconds=deadline * 0.2),
        PodResourcesSource(
            config.podresources_socket,
            config.gpu_resources,
            timeout_seconds=max(0.1, deadline * 0.8),
            dra_drivers=config.dra_drivers,
        )
        if config.podresources_socket
        else NotConfigured(PODRESOURCES),
        PodInformer(
            "node",
            node_name=config.node,
            kubeconfig=config.kubeconfig,
            gpu_resources=config.gpu_resources,
        )
        if config.kubernetes
        else NotConfigured(PODS),
        EngineSource(
            EngineScraper(
                timeout_seconds=min(config.engine_timeout_seconds, deadline / 2),
                max_body_bytes=config.engine_max_body_bytes,
            ),
            config.engine_targets,
            discovery=config.engine_discovery,
        )
        if config.engine_targets or (config.engine_discovery and config.kubernetes)
        else NotConfigured(ENGINES),
        RayLocalSource(_ray_client(config)) if config.ray_address else NotConfigured(RAY_LOCAL),
        _serve_source(config) if config.ray_address else NotConfigured(SERVE),
        *_dra_source(config, "node"),
        # Absent when off, as DRA: an agent without the receiver exports what it did before.
        *([SpansSource(max_body_bytes=config.otlp_max_body_bytes)] if config.otlp_receiver else []),
    ]


def _dra_source(config: PipelineConfig, mode: str) -> list[Source[Any]]:
    """The DRA source where it is on; absent otherwise, so a cluster without DRA (and a
    box without Kubernetes) exports what it did before."""
    if not (config.dra and config.kubernetes):
        return []
    return [
        DraSource(
            "node" if mode == "node" else "cluster",
            node_name=config.node if mode == "node" else None,
            kubeconfig=config.kubeconfig,
            drivers=config.dra_drivers,
            device_classes=config.dra_device_classes,
            timeout_seconds=max(0.1, config.source_deadline_seconds * 0.8),
        )
    ]


def cluster_sources(config: PipelineConfig) -> list[Source[Any]]:
    """The cluster view (one replica): what is not placed anywhere yet."""
    namespace, workload = config.ray_workload
    return [
        PodInformer(
            "cluster",
            kubeconfig=config.kubeconfig,
            gpu_resources=config.gpu_resources,
            pending_gpu_only=not config.pending_all_pods,
        )
        if config.kubernetes
        else NotConfigured(PODS),
        RayClusterSource(_ray_client(config), namespace, workload)
        if config.ray_address
        else NotConfigured(RAY_CLUSTER),
        *_dra_source(config, "cluster"),
        *_gateway_sources(config),
    ]


def _gateway_sources(config: PipelineConfig) -> list[Source[Any]]:
    """InferencePools and their pickers where the gateway is on; absent otherwise, so a
    cluster without the Inference Extension exports what it did before."""
    if not (config.gateway and config.kubernetes):
        return []
    deadline = config.source_deadline_seconds
    return [
        InferencePoolSource(
            kubeconfig=config.kubeconfig,
            picker_urls=dict(config.gateway_picker_urls),
            timeout_seconds=max(0.1, deadline * 0.8),
        ),
        PickerSource(
            timeout_seconds=min(config.engine_timeout_seconds, max(0.1, deadline * 0.8)),
            max_body_bytes=config.engine_max_body_bytes,
            token=config.gateway_picker_token,
            ca_file=config.gateway_picker_ca_file,
        ),
    ]


def _ray_client(config: PipelineConfig) -> RayStateClient:
    return RayStateClient(
        config.ray_address or "",
        token=config.ray_token,
        timeout_seconds=max(0.1, config.source_deadline_seconds * 0.8),
    )


def _serve_source(config: PipelineConfig) -> ServeSource:
    client = ServeClient(
        config.ray_address or "",
        token=config.ray_token,
        timeout_seconds=max(0.1, config.source_deadline_seconds * 0.8),
    )
    # Outside Kubernetes a Ray node is no pod: its Serve rows count for --ray-workload.
    return ServeSource(client, *config.ray_workload)


def dependency_levels(sources: Sequence[Source[Any]]) -> list[list[Source[Any]]]:
    """Sources grouped so that each runs after every source it needs (in the list)."""
    by_key: dict[Key[Any], Source[Any]] = {s.key: s for s in sources}
    level: dict[int, int] = {}

    def depth(source: Source[Any], seen: tuple[int, ...] = ()) -> int:
        if id(source) in seen:
            raise ValueError(f"source {source.name} needs itself through {len(seen)} others")
        if id(source) not in level:
            needed = [by_key[k] for k in source.needs if k in by_key]
            seen = (*seen, id(source))
            level[id(source)] = 1 + max((depth(n, seen) for n in needed), default=-1)
        return level[id(source)]

    groups: dict[int, list[Source[Any]]] = {}
    for source in sources:
        groups.setdefault(depth(source), []).append(source)
    return [groups[i] for i in sorted(groups)]


class Pipeline:
    def __init__(
        self, config: PipelineConfig, sources: Sequence[Source[Any]] | None = None
    ) -> None:
        self.config = config
        if sources is None:
            sources = node_sources(config) if config.mode == "node" else cluster_sources(config)
        self.sources = list(sources)
        self._levels = dependency_levels(self.sources)
        deadline = config.source_deadline_seconds
        self._runners: dict[str, SourceRunner[Any]] = {
            s.name: SourceRunner(s.name, deadline) for s in self.sources
        }
        self._previous: Ledger | None = None
        self._errors: Counter[tuple[str, str]] = Counter()
        self._dropped: Counter[str] = Counter()
        self._last_success: dict[str, float] = {}
        self._last_reason: dict[str, str | None] = {}
        self._cpu_seen: dict[str, float] = {}  # each source's CpuMeter total, last cycle
        self._lock = threading.Lock()

    @property
    def span_sink(self) -> SpanSink | None:
        """The span receiver the HTTP server hands POST /v1/traces to; None when off."""
        for source in self.sources:
            if isinstance(source, SpansSource):
                return source.receiver
        return None

    def start_span_grpc(self, listen: tuple[str, int], security: GrpcSecurity) -> int | None:
        """The receiver's OTLP/gRPC listener; its port, None when the receiver is off."""
        for source in self.sources:
            if isinstance(source, SpansSource):
                return source.start_grpc(listen, security)
        return None

    def warm_up(self, timeout_seconds: float) -> None:
        """Give background sources (the pod informer) up to `timeout_seconds` to list
        once, so the first snapshot already carries pod names (later ones would anyway)."""
        for source in self.sources:
            source.warm_up(timeout_seconds)

    def cycle(self) -> Published:
        """Take one coherent snapshot of every source and join it."""
        started = time.time()
        values: dict[Key[Any], object] = {}
        statuses: dict[str, SourceStatus] = {}
        item_errors: list[tuple[str, str]] = []
        for level in self._levels:
            inputs = Snapshots(values)
            running = [(s, self._start(s, inputs)) for s in level]
            for source, fetch in running:
                value, status = fetch.wait()
                if value is None and status.error_reason != DISABLED:
                    value = source.fallback()
                elif value is not None:
                    item_errors += [(source.name, r) for r in source.item_errors(value)]
                if value is not None:
                    values[source.key] = value
                statuses[source.name] = status
        ordered = [self._with_cpu(s, statuses[s.name]) for s in self.sources]
        snapshots = Snapshots(values, ordered)
        ledger = build_ledger(
            snapshots,
            self._previous,
            node=self.config.node,
            mode=self.config.mode,
            taken_at=time.time(),
        )
        self._previous = ledger
        self._account(snapshots.statuses, started, item_errors)
        dropped = dropped_series(ledger)
        with self._lock:
            self._dropped.update(dropped)
        return self.published(ledger)

    def _start(self, source: Source[Any], inputs: Snapshots) -> Started[Any]:
        if isinstance(source, NotConfigured):
            return Started.disabled(source.name)
        meter = source.cpu
        return self._runners[source.name].start(lambda: meter.run(lambda: source.fetch(inputs)))

    def _with_cpu(self, source: Source[Any], status: SourceStatus) -> SourceStatus:
        """The status with the CPU its source spent since the last cycle: this fetch, its
        helpers, its background thread, and an abandoned fetch once it ends."""
        total = source.cpu.total
        spent = total - self._cpu_seen.get(source.name, 0.0)
        self._cpu_seen[source.name] = total
        return replace(status, cpu_seconds=spent)

    def _account(
        self,
        statuses: Sequence[SourceStatus],
        when: float,
        item_errors: Sequence[tuple[str, str]],
    ) -> None:
        with self._lock:
            self._errors.update(item_errors)
            for status in statuses:
                if status.up:
                    self._last_success[status.source] = when
                elif status.error_reason != DISABLED:
                    self._errors[(status.source, status.error_reason or "unknown")] += 1
                self._log_transition(status)

    def _log_transition(self, status: SourceStatus) -> None:
        # Transitions only: a source down for hours must not flood the log.
        reason = None if status.up else status.error_reason
        if self._last_reason.get(status.source, "") == reason:
            return
        if status.up:
            log.info("source %s is up", status.source)
        elif reason == DISABLED:
            log.info("source %s is not configured", status.source)
        else:
            log.warning("source %s is down (%s): %s", status.source, reason, status.error_message)
        self._last_reason[status.source] = reason

    def published(self, ledger: Ledger) -> Published:
        with self._lock:
            return Published(
                ledger=ledger,
                errors_total=dict(self._errors),
                last_success=dict(self._last_success),
                simulated=self.config.simulated,
                dropped_total=dict(self._dropped),
                cpu_seconds_total={
                    s.name: s.cpu.total for s in self.sources if not isinstance(s, NotConfigured)
                },
            )

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()
        for source in self.sources:
            try:
                source.close()
            except Exception:  # closing must not stop the others from closing
                log.debug("close failed", exc_info=True)


__all__ = ["Pipeline", "PipelineConfig", "cluster_sources", "dependency_levels", "node_sources"]
