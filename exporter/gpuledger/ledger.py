"""The ledger: every identity rule, applied to one cycle's snapshots. No I/O here.

Inputs are the sources' frozen snapshots (any of them may be missing: that source was
down); the output is a frozen Ledger that the collector, /ledger.json and `explain` read.
A fact that cannot be known because a source is down is left out, never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuledger.identity.devices import HostGpu, container_device_map
from gpuledger.model import Gpu, NvmlSnapshot, ProcessInfo, ProcSnapshot, SourceStatus

SHORT_ID = 12  # container ID length people know from `crictl ps` / `docker ps`


@dataclass(frozen=True, order=True)
class ContainerRef:
    """A container, by the identities that survive restarts and renames."""

    pod_uid: str
    container_id: str
    namespace: str = ""
    pod: str = ""
    # The container's name; the short container ID until the Kubernetes layer names it,
    # so two GPU containers of one pod never collapse into one series.
    container: str = ""
    workload: str = ""


@dataclass(frozen=True)
class ContainerGpuUsage:
    container: ContainerRef
    gpu_uuid: str
    memory_used_bytes: int
    processes: int


@dataclass(frozen=True)
class DeviceMapping:
    """Container ordinal `local_index` (CUDA device N inside it) is host GPU `gpu_uuid`."""

    container: ContainerRef
    local_index: int
    gpu_uuid: str
    source: str  # env | podresources


@dataclass(frozen=True)
class ProcessView:
    """One GPU process (or an ancestor of one) with everything the ledger knows about it."""

    pid: int
    ppid: int | None
    title: str
    container: ContainerRef | None
    # (gpu_uuid, used bytes or None) as NVML reports them.
    gpu_memory: tuple[tuple[str, int | None], ...]
    # What the process calls cuda:0, cuda:1, … as host GPU UUIDs; None when unknown.
    cuda_devices: tuple[str, ...] | None


@dataclass(frozen=True)
class Ledger:
    node: str
    mode: str
    taken_at: float  # wall-clock seconds since the epoch
    driver_version: str | None
    gpus: tuple[Gpu, ...]
    usage: tuple[ContainerGpuUsage, ...]
    # gpu_uuid -> bytes held by processes in no pod; absent when procfs was down.
    unattributed: Mapping[str, int]
    device_maps: tuple[DeviceMapping, ...]
    processes: tuple[ProcessView, ...]
    sources: tuple[SourceStatus, ...]


def container_of(info: ProcessInfo) -> ContainerRef | None:
    identity = info.cgroup
    if identity.pod_uid is None:
        return None
    container_id = identity.container_id or ""
    return ContainerRef(
        pod_uid=identity.pod_uid,
        container_id=container_id,
        container=container_id[:SHORT_ID],
    )


def host_gpus(gpus: Sequence[Gpu]) -> tuple[HostGpu, ...]:
    return tuple(HostGpu(index=g.index, uuid=g.uuid, pci_bus_id=g.pci_bus_id) for g in gpus)


def _container_root_env(
    members: Sequence[ProcessInfo], procs: Mapping[int, ProcessInfo]
) -> Mapping[str, str]:
    """Environment of the process nearest the container's init that carries NVIDIA_VISIBLE_DEVICES.

    The NVIDIA runtime reads it from the container's init environment; children inherit
    it unless they rewrite it, so the outermost member is the best witness.
    """

    def depth(info: ProcessInfo) -> int:
        steps, current = 0, info
        own = container_of(info)
        while current.ppid is not None and current.ppid in procs:
            parent = procs[current.ppid]
            if container_of(parent) != own:
                break
            current, steps = parent, steps + 1
        return steps

    witnesses = [m for m in members if "NVIDIA_VISIBLE_DEVICES" in m.environ]
    if not witnesses:
        return {}
    return min(witnesses, key=lambda m: (depth(m), m.pid)).environ


def build_ledger(
    *,
    node: str,
    mode: str,
    taken_at: float,
    nvml: NvmlSnapshot | None,
    procs: ProcSnapshot | None,
    sources: Sequence[SourceStatus],
) -> Ledger:
    gpus = nvml.gpus if nvml else ()
    host = host_gpus(gpus)
    process_table: Mapping[int, ProcessInfo] = procs.processes if procs else {}

    memory_by_pid: dict[int, list[tuple[str, int | None]]] = defaultdict(list)
    for gpu in gpus:
        for proc in gpu.processes:
            memory_by_pid[proc.pid].append((gpu.uuid, proc.used_memory_bytes))

    members: dict[ContainerRef, list[ProcessInfo]] = defaultdict(list)
    for info in process_table.values():
        ref = container_of(info)
        if ref is not None:
            members[ref].append(info)

    container_devices: dict[ContainerRef, tuple[HostGpu, ...]] = {}
    device_maps: list[DeviceMapping] = []
    for ref in sorted(members):
        env = _container_root_env(members[ref], process_table)
        if "NVIDIA_VISIBLE_DEVICES" not in env:
            continue
        mapped = container_device_map(
            env["NVIDIA_VISIBLE_DEVICES"], None, env.get("CUDA_DEVICE_ORDER"), host
        )
        container_devices[ref] = mapped
        device_maps.extend(DeviceMapping(ref, i, gpu.uuid, "env") for i, gpu in enumerate(mapped))

    usage_bytes: dict[tuple[ContainerRef, str], int] = defaultdict(int)
    usage_count: dict[tuple[ContainerRef, str], int] = defaultdict(int)
    unattributed: dict[str, int] = defaultdict(int)
    views: list[ProcessView] = []
    for pid in sorted(set(memory_by_pid) | set(process_table)):
        found = process_table.get(pid)
        ref = container_of(found) if found else None
        held = tuple(memory_by_pid.get(pid, ()))
        # A PID procfs could not read (exited meanwhile, or not in our PID namespace)
        # is in no known pod, but not known to be in none either: count it nowhere.
        if found is not None:
            for uuid, used in held:
                if ref is None:
                    unattributed[uuid] += used or 0
                else:
                    usage_bytes[(ref, uuid)] += used or 0
                    usage_count[(ref, uuid)] += 1
        views.append(
            ProcessView(
                pid=pid,
                ppid=found.ppid if found else None,
                title=found.title if found else "",
                container=ref,
                gpu_memory=held,
                cuda_devices=_cuda_devices(found, ref, container_devices, host),
            )
        )

    if procs is not None:
        for gpu in gpus:
            unattributed.setdefault(gpu.uuid, 0)
    usage = tuple(
        ContainerGpuUsage(ref, uuid, usage_bytes[(ref, uuid)], usage_count[(ref, uuid)])
        for ref, uuid in sorted(usage_bytes)
    )
    return Ledger(
        node=node,
        mode=mode,
        taken_at=taken_at,
        driver_version=nvml.driver_version if nvml else None,
        gpus=gpus,
        usage=usage,
        unattributed=dict(unattributed),
        device_maps=tuple(device_maps),
        processes=tuple(views),
        sources=tuple(sources),
    )


def _cuda_devices(
    info: ProcessInfo | None,
    ref: ContainerRef | None,
    container_devices: Mapping[ContainerRef, tuple[HostGpu, ...]],
    host: Sequence[HostGpu],
) -> tuple[str, ...] | None:
    if info is None:
        return None
    if ref is None:
        visible: Sequence[HostGpu] = host  # a host process sees every GPU
    elif ref in container_devices:
        visible = container_devices[ref]
    else:
        return None  # the container's device list is unknown
    mapped = container_device_map(
        None,
        info.environ.get("CUDA_VISIBLE_DEVICES"),
        info.environ.get("CUDA_DEVICE_ORDER"),
        visible,
        allocated_uuids=[g.uuid for g in visible],
    )
    return tuple(g.uuid for g in mapped)
