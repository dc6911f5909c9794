"""NVML's topology: how each pair of this node's GPUs reaches the other. Read-only.

Per pair, nvmlDeviceGetTopologyCommonAncestor (the PCIe/CPU path); per GPU, each NVLink's
state (nvmlDeviceGetNvLinkState) and, for an active one, what is at its other end
(nvmlDeviceGetNvLinkRemotePciInfo_v2, nvmlDeviceGetNvLinkRemoteDeviceType). Names,
constants and layouts as nvidia-ml-py 13.615 (pynvml.py) and nvml.h define them.

Bounded: at most MAX_TOPOLOGY_GPUS GPUs (their pairs), NVML_NVLINK_MAX_LINKS links each,
and a time budget inside the NVML source's deadline; what was not read is unknown. A call
that fails makes what it would have told unknown, never guessed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import pynvml

from gpuledger.model.nvml import GpuLink

log = logging.getLogger(__name__)

# 120 pairs; an HGX baseboard has 8 GPUs (28 pairs), an NVL72 tray 4.
MAX_TOPOLOGY_GPUS = 16

_LEVELS: dict[int, str] = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "internal",
    pynvml.NVML_TOPOLOGY_SINGLE: "single",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "multiple",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "hostbridge",
    pynvml.NVML_TOPOLOGY_NODE: "node",
    pynvml.NVML_TOPOLOGY_SYSTEM: "system",
}
# A link NVML says the device does not have: not a failure, no link there.
_NO_SUCH_LINK = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)

PciAddress = tuple[int, int, int]  # domain, bus, device


@dataclass(frozen=True)
class TopologyGpu:
    uuid: str
    handle: Any
    address: PciAddress


@dataclass(frozen=True)
class NvLinks:
    """One GPU's active NVLinks: the PCI address at the far end of each, whether one
    reaches an NVSwitch, the far ends of unknown type, and whether every link answered."""

    remotes: frozenset[PciAddress]
    to_switch: bool
    untyped: frozenset[PciAddress]
    complete: bool


def pci_address(info: Any) -> PciAddress:
    return int(info.domain), int(info.bus), int(info.device)


def read_links(
    gpus: Sequence[TopologyGpu], deadline: float, ancestors: dict[tuple[str, str], str]
) -> tuple[GpuLink, ...]:
    """Every pair of `gpus` (the first MAX_TOPOLOGY_GPUS, by UUID); pairs past `deadline`
    (time.monotonic()) are unknown. `ancestors` caches common ancestors by UUID pair: the
    PCIe path of two GPUs does not change while they are the same GPUs."""
    chosen = sorted(gpus, key=lambda g: g.uuid)[:MAX_TOPOLOGY_GPUS]
    if len(gpus) > MAX_TOPOLOGY_GPUS:
        log.warning("topology read for %d of %d GPUs only", MAX_TOPOLOGY_GPUS, len(gpus))
    nvlinks = {g.uuid: _nvlinks(g.handle) for g in chosen if time.monotonic() < deadline}
    local = frozenset(g.address for g in chosen)
    links = []
    for a, b in combinations(chosen, 2):
        key = (a.uuid, b.uuid)
        if key not in ancestors and time.monotonic() < deadline:
            level = _common_ancestor(a.handle, b.handle)
            if level is not None:
                ancestors[key] = level
        first, second = nvlinks.get(a.uuid), nvlinks.get(b.uuid)
        joined = None if first is None or second is None else _joined(a, first, b, second, local)
        links.append(GpuLink(a.uuid, b.uuid, ancestors.get(key), joined))
    wanted = {(a.uuid, b.uuid) for a, b in combinations(chosen, 2)}
    for stale in set(ancestors) - wanted:  # a GPU gone or replaced
        del ancestors[stale]
    return tuple(links)


def _common_ancestor(first: Any, second: Any) -> str | None:
    try:
        return _LEVELS.get(int(pynvml.nvmlDeviceGetTopologyCommonAncestor(first, second)))
    except pynvml.NVMLError as exc:
        log.debug("common ancestor unknown: %s", exc)
        return None


def _nvlinks(handle: Any) -> NvLinks:
    remotes: set[PciAddress] = set()
    untyped: set[PciAddress] = set()
    to_switch, complete = False, True
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            remote = pci_address(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
        except pynvml.NVMLError as exc:
            if int(exc.value) not in _NO_SUCH_LINK:
                complete = False
            continue
        remotes.add(remote)
        kind = _remote_type(handle, link)
        to_switch = to_switch or kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN:
            untyped.add(remote)
    return NvLinks(frozenset(remotes), to_switch, frozenset(untyped), complete)


def _remote_type(handle: Any, link: int) -> int:
    try:
        return int(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
    except pynvml.NVMLError:  # older drivers lack it
        return int(pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN)


def _joined(
    a: TopologyGpu, first: NvLinks, b: TopologyGpu, second: NvLinks, local: frozenset[PciAddress]
) -> bool | None:
    """Whether an active NVLink joins the two: directly (one's link ends at the other),
    or through NVSwitches both are linked to (one fabric per node, as on HGX boards)."""
    if b.address in first.remotes or a.address in second.remotes:
        return True
    if first.to_switch and second.to_switch:
        return True
    # A far end of unknown type that is no GPU here may be a switch: not known.
    unresolved = (first.untyped | second.untyped) - local
    if not (first.complete and second.complete) or unresolved:
        return None
    return False
