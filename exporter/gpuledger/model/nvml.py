"""NVML's view: the physical GPUs and the processes holding contexts on them."""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger.model.bundle import Key


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a context on a GPU, as NVML reports it (host PID namespace)."""

    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class Gpu:
    """One physical GPU (or MIG device) as NVML shows it."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    up: bool
    mig_mode: str = "unknown"  # enabled | disabled | unknown
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_ratio: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    # Why `up` is False, e.g. "gpu_is_lost"; bounded vocabulary.
    error_reason: str | None = None


@dataclass(frozen=True)
class NvmlSnapshot:
    driver_version: str | None
    gpus: tuple[Gpu, ...]


# This source's snapshot in a cycle's Snapshots.
NVML: Key[NvmlSnapshot] = Key("nvml")
