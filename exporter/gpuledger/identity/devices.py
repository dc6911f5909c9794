"""Container-local CUDA ordinal -> host GPU (docs/design.md, identity rule 4).

A process's `cuda:N` goes through two filters, and indices differ at every step:

1. the container's GPU list: the kubelet PodResources device ids when known, else
   `NVIDIA_VISIBLE_DEVICES` as the NVIDIA container toolkit reads it;
2. CUDA enumerates those devices in its own order (`CUDA_DEVICE_ORDER`) and then applies
   the process's `CUDA_VISIBLE_DEVICES`.

Everything is resolved to `HostGpu` entries (UUID-keyed), never left as indices.

MIG convention: a MIG device's `HostGpu.index` is its parent's NVML index, its
`mig_index` NVML's MIG device index (what the toolkit's `<gpu>:<mig>` form names; indices
may have gaps), and the MIG entries of one parent appear in `host` in that order. A MIG
device is named by its `MIG-<uuid>`, by
`<gpu>:<mig>` (toolkit and device plugin, index strategy), or by the legacy
`MIG-GPU-<parent uuid>/<gpu instance>/<compute instance>` (drivers before R470), which
needs the instance ids NVML reports.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "HostGpu",
    "apply_cuda_visible_devices",
    "container_device_map",
    "cuda_enumeration_order",
    "device_uuid",
    "parse_nvidia_visible_devices",
    "strip_replica_suffix",
]


@dataclass(frozen=True)
class HostGpu:
    """A GPU or MIG device as the host's NVML sees it."""

    index: int  # NVML index on the host (== PCI bus order)
    uuid: str  # "GPU-..." or "MIG-..."
    pci_bus_id: str
    mig_parent_uuid: str | None = None  # for MIG devices
    # A MIG device's GPU and compute instance ids and MIG device index, where NVML gave them.
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_index: int | None = None


_DIGITS = re.compile(r"[0-9]+")
_MIG_INDEX = re.compile(r"([0-9]+):([0-9]+)")
_LEGACY_MIG = re.compile(r"mig-(gpu-[^/]+)/([0-9]+)/([0-9]+)", re.IGNORECASE)
_PCI = re.compile(r"(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)")
# Longer digit strings are out of range anyway; cutting them short also keeps int() clear
# of Python's limit on converting very long digit strings.
_MAX_INDEX_DIGITS = 9


def _small_int(text: str) -> int | None:
    """A non-negative ASCII integer of reasonable size, else None."""
    if not _DIGITS.fullmatch(text):
        return None
    text = text.lstrip("0") or "0"
    return int(text) if len(text) <= _MAX_INDEX_DIGITS else None


def _is_mig(gpu: HostGpu) -> bool:
    return gpu.mig_parent_uuid is not None or gpu.uuid.upper().startswith("MIG-")


def _pci_key(bus_id: str) -> tuple[int, int, int, int, int, str]:
    """Numeric PCI order; tolerates both NVML's 8-digit and the kernel's 4-digit domain."""
    m = _PCI.fullmatch(bus_id.strip().lower())
    if m is None:
        return (1, 0, 0, 0, 0, bus_id)  # unparsable ids sort last, by text
    domain, bus, device, function = m.groups()
    return (0, int(domain or "0", 16), int(bus, 16), int(device, 16), int(function, 16), "")


def _dedupe(gpus: Iterable[HostGpu]) -> list[HostGpu]:
    seen: set[str] = set()
    out: list[HostGpu] = []
    for gpu in gpus:
        key = gpu.uuid.lower()
        if key not in seen:
            seen.add(key)
            out.append(gpu)
    return out


def _in_host_order(gpus: Iterable[HostGpu], host: Sequence[HostGpu]) -> list[HostGpu]:
    """Deduplicated, in the order of `host` (the tie-break among MIG siblings)."""
    position = {gpu.uuid.lower(): i for i, gpu in reversed(list(enumerate(host)))}
    return sorted(_dedupe(gpus), key=lambda g: position.get(g.uuid.lower(), len(position)))


def _mig_at(migs: Sequence[HostGpu], mig_index: int) -> HostGpu | None:
    """The MIG device the toolkit's `<gpu>:<mig>` names: `<mig>` is NVML's MIG device
    index (indices may have gaps); by position only where NVML's index is not known."""
    if any(g.mig_index is not None for g in migs):
        return next((g for g in migs if g.mig_index == mig_index), None)
    return migs[mig_index] if mig_index < len(migs) else None


def _resolve_legacy_mig(entry: str, host: Sequence[HostGpu]) -> HostGpu | None:
    """`MIG-GPU-<parent uuid>/<gi>/<ci>` -> the MIG device with those instance ids."""
    m = _LEGACY_MIG.fullmatch(entry)
    if m is None:
        return None
    parent, gi, ci = m.group(1).lower(), _small_int(m.group(2)), _small_int(m.group(3))
    return next(
        (
            g
            for g in host
            if (g.mig_parent_uuid or "").lower() == parent
            and (g.gpu_instance_id, g.compute_instance_id) == (gi, ci)
            and gi is not None
        ),
        None,
    )


def _resolve_toolkit_id(entry: str, host: Sequence[HostGpu]) -> HostGpu | None:
    """One toolkit / device-plugin device id: index, `<gpu>:<mig>`, GPU or MIG UUID, or
    the legacy `MIG-GPU-<uuid>/<gi>/<ci>`."""
    entry = entry.strip()
    legacy = _resolve_legacy_mig(entry, host)
    if legacy is not None:
        return legacy
    index = _small_int(entry)
    if index is not None:
        return next((g for g in host if g.index == index and not _is_mig(g)), None)
    m = _MIG_INDEX.fullmatch(entry)
    if m is not None:
        gpu_index, mig_index = _small_int(m.group(1)), _small_int(m.group(2))
        if gpu_index is None or mig_index is None:
            return None
        parent = next((g for g in host if g.index == gpu_index and not _is_mig(g)), None)
        if parent is not None:
            parent_uuid = parent.uuid.lower()
            migs = [g for g in host if (g.mig_parent_uuid or "").lower() == parent_uuid]
        else:  # parent not listed: fall back to MIG entries carrying its index
            migs = [g for g in host if _is_mig(g) and g.index == gpu_index]
        return _mig_at(migs, mig_index)
    wanted = entry.lower()
    return next((g for g in host if g.uuid.lower() == wanted), None)


def cuda_enumeration_order(
    gpus: Sequence[HostGpu], device_order: str | None
) -> tuple[HostGpu, ...]:
    """The order in which CUDA numbers `gpus` inside the container (before CUDA_VISIBLE_DEVICES).

    `CUDA_DEVICE_ORDER=PCI_BUS_ID` sorts by PCI bus id. The default, `FASTEST_FIRST`,
    ranks by compute capability and falls back to PCI order among equals. We assume the
    GPUs a Pod gets on one node are homogeneous (the device plugin advertises one model
    per resource name), so both orders reduce to PCI order. On a mixed node with
    FASTEST_FIRST this can be wrong; set `CUDA_DEVICE_ORDER=PCI_BUS_ID` there.
    The sort is stable: MIG devices of one parent (same bus id) keep their given order.
    """
    del device_order  # both settings give PCI order under the assumption above
    return tuple(sorted(gpus, key=lambda g: _pci_key(g.pci_bus_id)))


def parse_nvidia_visible_devices(value: str | None, host: Sequence[HostGpu]) -> tuple[HostGpu, ...]:
    """The GPUs the NVIDIA container toolkit gives a container for `NVIDIA_VISIBLE_DEVICES`.

    Unset, empty or `void`: no GPU (the toolkit leaves the container alone). `none`: driver
    only, no GPU. `all`: every non-MIG host GPU. Otherwise a comma list of host indices,
    GPU UUIDs, MIG UUIDs or `<gpu>:<mig>` indices. Unknown entries are skipped: the toolkit
    would refuse to start such a container, but we report what we can. The result is
    deduplicated and in CUDA enumeration order.
    """
    if value is None:
        return ()
    value = value.strip()
    if value.lower() in ("", "void", "none"):
        return ()
    if value.lower() == "all":
        chosen = [g for g in host if not _is_mig(g)]
    else:
        resolved = (_resolve_toolkit_id(entry, host) for entry in value.split(","))
        chosen = [g for g in resolved if g is not None]
    return cuda_enumeration_order(_in_host_order(chosen, host), None)


def _resolve_cuda_entry(entry: str, visible: Sequence[HostGpu]) -> HostGpu | None:
    """One CUDA_VISIBLE_DEVICES entry against the devices CUDA can see, or None if invalid."""
    if _DIGITS.fullmatch(entry):
        index = _small_int(entry)
        return visible[index] if index is not None and index < len(visible) else None
    wanted = entry.lower()
    if not wanted.startswith(("gpu-", "mig-")):
        return None
    if _LEGACY_MIG.fullmatch(wanted):
        return _resolve_legacy_mig(wanted, visible)
    # CUDA accepts any prefix that names exactly one device; an exact match always does.
    matches = _dedupe(g for g in visible if g.uuid.lower().startswith(wanted))
    return matches[0] if len(matches) == 1 else None


def apply_cuda_visible_devices(
    value: str | None, visible: Sequence[HostGpu]
) -> tuple[HostGpu, ...]:
    """The devices a process sees, in `cuda:N` order, after its `CUDA_VISIBLE_DEVICES`.

    Unset: all of `visible`. Empty: none. Otherwise comma-separated entries, each an
    ordinal into `visible`, a `GPU-` UUID or unique UUID prefix, or a `MIG-` UUID (or
    unique prefix), or the legacy `MIG-GPU-<uuid>/<gi>/<ci>` (resolved by the instance
    ids NVML reports; invalid where they are unknown). Like CUDA, parsing stops at the
    first invalid entry (out of range, negative, unknown or ambiguous UUID, duplicate,
    anything else) and keeps the entries before it.
    """
    if value is None:
        return tuple(visible)
    chosen: list[HostGpu] = []
    seen: set[str] = set()
    for raw in value.split(","):
        gpu = _resolve_cuda_entry(raw.strip(), visible)
        if gpu is None or gpu.uuid.lower() in seen:
            break
        seen.add(gpu.uuid.lower())
        chosen.append(gpu)
    return tuple(chosen)


def device_uuid(device_id: str, host: Sequence[HostGpu]) -> str:
    """The host UUID (as NVML spells it) a device plugin id names: a GPU or MIG UUID, an
    index, `<gpu>:<mig>` or the legacy MIG form; the id itself when it names none."""
    found = _resolve_toolkit_id(strip_replica_suffix(device_id), host)
    return found.uuid if found is not None else device_id


def strip_replica_suffix(device_id: str) -> str:
    """`GPU-<uuid>::3` -> `GPU-<uuid>`: drop the replica number time-slicing/MPS adds."""
    device_id = device_id.strip()
    head, sep, tail = device_id.rpartition("::")
    if sep and head and _DIGITS.fullmatch(tail):
        return head
    return device_id


def container_device_map(
    nvidia_visible_devices: str | None,
    cuda_visible_devices: str | None,
    cuda_device_order: str | None,
    host: Sequence[HostGpu],
    allocated_uuids: Sequence[str] | None = None,
) -> tuple[HostGpu, ...]:
    """Host GPUs by the process's CUDA ordinal: position i in the result is `cuda:i`.

    The container's list is `allocated_uuids` (kubelet PodResources device ids, which may
    carry a `::N` replica suffix, or be indices under the device plugin's index strategy)
    when non-empty, else `NVIDIA_VISIBLE_DEVICES`. An empty allocation falls back to the
    environment because a container without a device-plugin allocation still gets
    whatever its image's `NVIDIA_VISIBLE_DEVICES` asks for (CUDA base images say `all`).
    Unknown ids are skipped.
    """
    if allocated_uuids:
        resolved = (_resolve_toolkit_id(strip_replica_suffix(d), host) for d in allocated_uuids)
        listed = _in_host_order((g for g in resolved if g is not None), host)
    else:
        listed = list(parse_nvidia_visible_devices(nvidia_visible_devices, host))
    ordered = cuda_enumeration_order(listed, cuda_device_order)
    return apply_cuda_visible_devices(cuda_visible_devices, ordered)
