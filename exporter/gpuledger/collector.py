"""Ledger -> Prometheus metric families. Knows Prometheus, nothing about sources.

Runs at scrape time on the latest published ledger: no I/O, no waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuledger import __version__
from gpuledger.ledger import ContainerRef, Ledger

CONTAINER_LABELS = ["namespace", "pod", "pod_uid", "container", "workload"]


@dataclass(frozen=True)
class Published:
    """What a scrape renders: the latest ledger plus the exporter's running counters."""

    ledger: Ledger
    errors_total: Mapping[tuple[str, str], int] = field(default_factory=dict)
    last_success: Mapping[str, float] = field(default_factory=dict)


def _container_values(ref: ContainerRef) -> list[str]:
    return [ref.namespace, ref.pod, ref.pod_uid, ref.container, ref.workload]


def _gauge(name: str, doc: str, labels: list[str], unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=["node", *labels], unit=unit)


def gpu_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    info = _gauge(
        "gpuledger_gpu_info",
        "One per GPU: identity attributes. Join on gpu_uuid; gpu_index is host-local.",
        ["gpu_uuid", "gpu_index", "model", "pci_bus_id", "mig_mode"],
    )
    up = _gauge("gpuledger_gpu_up", "1 if every NVML query for this GPU succeeded.", ["gpu_uuid"])
    total = _gauge("gpuledger_gpu_memory_total_bytes", "GPU memory size (NVML).", ["gpu_uuid"])
    used = _gauge("gpuledger_gpu_memory_used_bytes", "GPU memory in use (NVML).", ["gpu_uuid"])
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
    yield from (info, up, total, used, util)


def container_families(ledger: Ledger) -> Iterator[Metric]:
    node = ledger.node
    labels = ["gpu_uuid", *CONTAINER_LABELS]
    memory = _gauge(
        "gpuledger_container_gpu_memory_used_bytes",
        "GPU memory held by a container's processes on one GPU (NVML per-process, summed).",
        labels,
    )
    count = _gauge(
        "gpuledger_container_gpu_processes",
        "Processes of a container holding a context on one GPU.",
        labels,
    )
    for row in ledger.usage:
        values = [node, row.gpu_uuid, *_container_values(row.container)]
        memory.add_metric(values, row.memory_used_bytes)
        count.add_metric(values, row.processes)
    unattributed = _gauge(
        "gpuledger_unattributed_gpu_memory_used_bytes",
        "GPU memory held by processes that belong to no pod (host processes).",
        ["gpu_uuid"],
    )
    for uuid, used in sorted(ledger.unattributed.items()):
        unattributed.add_metric([node, uuid], used)
    devices = _gauge(
        "gpuledger_container_device_info",
        "Container ordinal local_index (CUDA device N inside the container) is host GPU gpu_uuid.",
        [*CONTAINER_LABELS[:4], "local_index", "gpu_uuid", "source"],
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


def self_families(published: Published, now: float) -> Iterator[Metric]:
    ledger = published.ledger
    node = ledger.node
    up = _gauge("gpuledger_source_up", "1 if the source's last fetch succeeded.", ["source"])
    duration = _gauge(
        "gpuledger_source_duration_seconds", "How long the source's last fetch took.", ["source"]
    )
    for status in ledger.sources:
        up.add_metric([node, status.source], 1 if status.up else 0)
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
    age = _gauge(
        "gpuledger_snapshot_age_seconds",
        "Age of the snapshot this scrape renders; grows when the collection loop is stuck.",
        [],
    )
    age.add_metric([node], max(0.0, now - ledger.taken_at))
    build = _gauge("gpuledger_build_info", "1; the running gpuledger version.", ["version"])
    build.add_metric([node, __version__], 1)
    yield from (up, duration, errors, last, age, build)


class LedgerCollector(Collector):
    """Renders whatever `current()` returns at scrape time: (latest state or None, now)."""

    def __init__(self, current: Callable[[], tuple[Published | None, float]]) -> None:
        self._current = current

    def collect(self) -> Iterator[Metric]:
        published, now = self._current()
        if published is None:
            return
        yield from gpu_families(published.ledger)
        yield from container_families(published.ledger)
        yield from self_families(published, now)
