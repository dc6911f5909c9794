"""NVML's view: the physical GPUs, their MIG devices, and the processes holding contexts
on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gpuledger.model.bundle import Key

# How two GPUs of one node reach each other, strongest first: NVLink (direct, or through
# an NVSwitch both are linked to), then NVML's common ancestor of the pair
# (nvmlGpuTopologyLevel_t: INTERNAL one board, SINGLE one PCIe switch, MULTIPLE several
# switches, HOSTBRIDGE the host bridge, NODE across host bridges of one NUMA node, SYSTEM
# across NUMA nodes), and `unknown` where NVML did not say (never guessed).
LINK_LEVELS: Final = (
    "nvlink",
    "internal",
    "single",
    "multiple",
    "hostbridge",
    "node",
    "system",
    "unknown",
)
# What each level means to a person, for explain and the pages.
LINK_MEANING: Final = {
    "nvlink": "NVLink",
    "internal": "one board",
    "single": "one PCIe switch",
    "multiple": "several PCIe switches",
    "hostbridge": "through the PCIe host bridge",
    "node": "across PCIe host bridges of one NUMA node",
    "system": "crosses NUMA",
    "unknown": "NVML did not say",
}


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a context on a GPU, as NVML reports it (host PID namespace)."""

    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance in a GPU instance) of a GPU in MIG mode.

    Its processes are what NVML lists on its MIG handle. NVML reports no utilization for
    a MIG device, so there is none here.
    """

    uuid: str  # MIG-…
    parent_uuid: str  # the GPU it is part of
    index: int  # MIG device index under the parent (nvmlDeviceGetMigDeviceHandleByIndex)
    up: bool
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    profile: str = ""  # e.g. 1g.10gb, 1c.3g.40gb; "" when NVML names none
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    # Why `up` is False; bounded vocabulary.
    error_reason: str | None = None


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML shows it. In MIG mode, its processes are listed under its
    MIG devices (`mig_devices`), where they run, and not here."""

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
    mig_devices: tuple[MigDevice, ...] = ()  # in MIG device index order


@dataclass(frozen=True)
class GpuLink:
    """How two GPUs of this node reach each other, as NVML says (`a` < `b`, UUIDs).

    `common_ancestor` is NVML's level name (`internal` … `system`), None where
    nvmlDeviceGetTopologyCommonAncestor failed; `nvlink` True where an active NVLink joins
    them (directly, or through an NVSwitch both are linked to), False where both GPUs'
    links were all read and none does, None where that is not known.
    """

    a: str
    b: str
    common_ancestor: str | None
    nvlink: bool | None

    @property
    def link(self) -> str:
        """The pair's level in LINK_LEVELS: NVLink where it joins them, else the PCIe/CPU
        path; unknown where either is unknown."""
        if self.nvlink:
            return "nvlink"
        if self.nvlink is None or self.common_ancestor is None:
            return "unknown"
        return self.common_ancestor


@dataclass(frozen=True)
class NvmlSnapshot:
    driver_version: str | None
    gpus: tuple[Gpu, ...]
    # Every pair of this node's GPUs (up to caps in sources/nvml.py); empty where the
    # topology was not read (one GPU, or past the topology's share of the deadline).
    links: tuple[GpuLink, ...] = ()

    def pids(self) -> set[int]:
        """Every process NVML lists, on a GPU or on a MIG device."""
        found = {p.pid for g in self.gpus for p in g.processes}
        found.update(p.pid for g in self.gpus for m in g.mig_devices for p in m.processes)
        return found


# This source's snapshot in a cycle's Snapshots.
NVML: Key[NvmlSnapshot] = Key("nvml")
