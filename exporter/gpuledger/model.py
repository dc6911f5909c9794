"""Typed, frozen snapshots: what each source saw in one cycle.

Sources produce these and nothing else; the ledger consumes them and does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from gpuledger.identity.cgroup import NO_IDENTITY, CgroupIdentity

K = TypeVar("K")
V = TypeVar("V")


def frozen_map(items: Mapping[K, V] | None = None) -> Mapping[K, V]:
    """A read-only mapping, so a snapshot cannot be changed after it is taken."""
    return MappingProxyType(dict(items or {}))


@dataclass(frozen=True)
class SourceStatus:
    """How one source fared in one cycle."""

    source: str
    up: bool
    duration_seconds: float
    # Short, bounded vocabulary (a label value): timeout, library_not_found, ...
    error_reason: str | None = None
    # One line a person can act on. Never contains environment values or arguments.
    error_message: str | None = None


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


@dataclass(frozen=True)
class ProcessInfo:
    """What procfs tells about one host process. Only whitelisted environment names are kept."""

    pid: int
    ppid: int | None
    # NSpid from /proc/<pid>/status: host PID first, innermost namespace PID last.
    nspid: tuple[int, ...]
    # Process title: first word of argv[0] (vLLM and Ray rename their processes there).
    title: str
    cgroup: CgroupIdentity = NO_IDENTITY
    environ: Mapping[str, str] = field(default_factory=frozen_map)
    # Only the whitelisted `--flag value` pairs of the command line (see procfs.ALLOWED_FLAGS).
    flags: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class ProcSnapshot:
    processes: Mapping[int, ProcessInfo]
