"""The ledger: every identity rule, applied to one cycle's snapshots. No I/O here.

Inputs are the sources' frozen snapshots (any of them may be missing: that source was
down); the output is a frozen Ledger that the collector, /ledger.json and `explain` read.
A fact that cannot be known because a source is down is left out, never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, ClassVar

from gpuledger.engines import TITLE_PREFIXES
from gpuledger.identity.devices import HostGpu, container_device_map, device_uuid
from gpuledger.identity.processes import ancestors
from gpuledger.ledger import caps
from gpuledger.ledger.engines import (
    Engine,
    build_engines,
    cap_engines,
    known_engine_ids,
    known_kinds,
    known_workloads,
)
from gpuledger.ledger.gateway import Pool, PoolMemberRow, build_pools, pool_members
from gpuledger.ledger.ray import RayCluster, RayLocal, build_ray_cluster, build_ray_local
from gpuledger.ledger.rayengines import link_ray_engines, ray_job_unknowns
from gpuledger.ledger.serve import ServeLocal, build_serve
from gpuledger.ledger.spans import EngineHistory, RequestLedger, build_requests, engine_history
from gpuledger.ledger.topology import Topology, ray_engine_links, with_links
from gpuledger.model import Snapshots, SourceStatus
from gpuledger.model.dra import DRA, ClaimInfo, DraSnapshot, NodeDevices
from gpuledger.model.engines import ENGINES, EnginesSnapshot
from gpuledger.model.gateway import INFERENCE_POOLS, PICKERS
from gpuledger.model.kubernetes import PODS, PodInfo, PodsSnapshot
from gpuledger.model.nvml import NVML, Gpu, GpuProcess
from gpuledger.model.podresources import (
    PODRESOURCES,
    ClaimAllocation,
    ClaimDevice,
    PodResourcesSnapshot,
)
from gpuledger.model.procfs import PROCESSES, ProcessInfo, ProcSnapshot
from gpuledger.model.ray import RAY_CLUSTER, RAY_LOCAL, LocalRayNode
from gpuledger.model.serve import SERVE
from gpuledger.model.spans import SPANS

# How a capped field is cut: (rows, limit) -> (kept, past the cap).
Cut = Callable[[Sequence[Any], int], tuple[tuple[Any, ...], tuple[Any, ...]]]

SHORT_ID = 12  # container ID length people know from `crictl ps` / `docker ps`
_TERMINATED = frozenset({"Succeeded", "Failed"})


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

    # The ledger keys dicts and sets by containers (and container, GPU) thousands of
    # times a cycle; the generated hash built a six-field tuple each time. Equal refs
    # have equal ids, so hashing those two alone, once, stays consistent with __eq__.
    _hash: ClassVar[int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.pod_uid, self.container_id)))

    def __hash__(self) -> int:
        return self._hash


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
class Allocation:
    """The kubelet says this container holds this GPU (PodResources): through a device
    plugin (`resource` its name), or a ResourceClaim (`resource` the DRA driver)."""

    container: ContainerRef
    gpu_uuid: str
    resource: str
    device_id: str
    # DRA: the claim and device the kubelet names, resolved through a ResourceSlice.
    claim: ClaimDevice | None = None


@dataclass(frozen=True)
class Discrepancy:
    """A GPU's ledgers disagree: `kind` is allocated_unused or unallocated_use."""

    kind: str
    container: ContainerRef
    gpu_uuid: str
    active: bool


@dataclass(frozen=True)
class PodState:
    """A GPU pod on this node and whether it is still starting."""

    pod: PodInfo
    starting: bool


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


def _cap_discrepancies(
    found: Sequence[Discrepancy], limit: int
) -> tuple[tuple[Discrepancy, ...], tuple[Discrepancy, ...]]:
    """At most `limit` rows of each kind (each kind is its own family)."""
    kept: list[Discrepancy] = []
    dropped: list[Discrepancy] = []
    seen: dict[str, int] = defaultdict(int)
    for d in found:
        seen[d.kind] += 1
        (kept if seen[d.kind] <= limit else dropped).append(d)
    return tuple(kept), tuple(dropped)


def _cut(limit: int, by: Cut = caps.split) -> Mapping[str, object]:
    """Field metadata: `_capped` cuts the Ledger field of this name to `limit` with `by`."""
    return {"cut": lambda rows: by(rows, limit)}


@dataclass(frozen=True)
class Overflow:
    """Rows a per-node cap (ledger/caps.py) kept out of the ledger, or a duplicate
    identity would have repeated: never exported, only counted by the collector in
    gpuledger_series_dropped_total.

    Each field is named after the Ledger field it overflows, with its type
    (tests/unit/test_families.py): the rows past a cap are a Ledger view of their own
    (`overflow_view`). A field with a `_cut` is cut by `_capped` after the join; the others
    where their rows are built (GPUs, engines, Ray, Serve)."""

    gpus: tuple[Gpu, ...] = ()
    usage: tuple[ContainerGpuUsage, ...] = field(default=(), metadata=_cut(caps.MAX_GPU_ROWS))
    device_maps: tuple[DeviceMapping, ...] = field(default=(), metadata=_cut(caps.MAX_GPU_ROWS))
    allocations: tuple[Allocation, ...] = field(default=(), metadata=_cut(caps.MAX_GPU_ROWS))
    discrepancies: tuple[Discrepancy, ...] = field(
        default=(), metadata=_cut(caps.MAX_GPU_ROWS, by=_cap_discrepancies)
    )
    pods: tuple[PodState, ...] = field(default=(), metadata=_cut(caps.MAX_GPU_PODS))
    engines: tuple[Engine, ...] = ()
    pending: tuple[PodInfo, ...] = field(default=(), metadata=_cut(caps.MAX_PENDING_PODS))
    dra_nodes: tuple[NodeDevices, ...] = field(default=(), metadata=_cut(caps.MAX_DRA_NODES))
    pools: tuple[Pool, ...] = field(default=(), metadata=_cut(caps.MAX_POOLS))
    pool_members: tuple[PoolMemberRow, ...] = field(
        default=(), metadata=_cut(caps.MAX_POOL_MEMBERS)
    )
    # Ray nodes past the cap with their rows, and the actor rows folded into OTHER_CLASS.
    ray: RayLocal | None = None
    # Serve deployment rows and replicas past their caps.
    serve: ServeLocal | None = None
    # Not a Ledger field: kept engines carrying only the GPU rows past MAX_GPU_ROWS.
    engine_gpus: tuple[Engine, ...] = ()

    @property
    def empty(self) -> bool:
        return not any(_has_rows(getattr(self, f.name)) for f in fields(self))


def _has_rows(value: object) -> bool:
    """Whether an Overflow field holds a row: a tuple's items, or a joined part's
    (RayLocal, ServeLocal) tuples."""
    if isinstance(value, tuple):
        return bool(value)
    if is_dataclass(value) and not isinstance(value, type):
        return any(_has_rows(getattr(value, f.name)) for f in fields(value))
    return False


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
    allocations: tuple[Allocation, ...] = ()
    discrepancies: tuple[Discrepancy, ...] = ()
    pods: tuple[PodState, ...] = ()
    engines: tuple[Engine, ...] = ()
    # Pods not placed on any node (cluster mode).
    pending: tuple[PodInfo, ...] = ()
    # What could not be known this cycle and why, for explain and /ledger.json.
    unknowns: tuple[str, ...] = field(default_factory=tuple)
    ray: RayLocal | None = None
    ray_cluster: RayCluster | None = None
    overflow: Overflow = field(default_factory=Overflow)
    # Node mode: Ray Serve's deployments with a router or a replica here.
    serve: ServeLocal | None = None
    # Cluster mode: the GPU ResourceClaims of the cluster (pending pods name theirs).
    claims: tuple[ClaimInfo, ...] = ()
    # Cluster mode: GPU devices per node in the GPU drivers' ResourceSlices.
    dra_nodes: tuple[NodeDevices, ...] = ()
    # Node mode with the span receiver on: the requests received, tied to their engines
    # (ledger/spans.py); and every engine's state over the last cycles, for reading a
    # request against the engine as it was.
    requests: RequestLedger | None = None
    engine_history: tuple[EngineHistory, ...] = ()
    # Cluster mode: InferencePools, their member pods and their pickers' readings.
    pools: tuple[Pool, ...] = ()
    pool_members: tuple[PoolMemberRow, ...] = ()


class _Pods:
    """Pod lookups by UID and by namespace/name; empty when the informer is down."""

    def __init__(self, snapshot: PodsSnapshot | None) -> None:
        pods = snapshot.pods if snapshot else ()
        self.known = snapshot is not None
        self.by_uid = {p.uid: p for p in pods}
        self.by_name = {(p.namespace, p.name): p for p in pods}
        self._refs: dict[tuple[str, str], ContainerRef] = {}

    def ref(self, pod_uid: str, container_id: str) -> ContainerRef:
        # A container's processes share one ref: made once per ledger.
        key = (pod_uid, container_id)
        found = self._refs.get(key)
        if found is None:
            found = self._refs[key] = self._new_ref(pod_uid, container_id)
        return found

    def _new_ref(self, pod_uid: str, container_id: str) -> ContainerRef:
        pod = self.by_uid.get(pod_uid)
        if pod is None:
            return ContainerRef(pod_uid, container_id, container=container_id[:SHORT_ID])
        name = next((n for n, cid in pod.container_ids.items() if cid == container_id), None)
        return ContainerRef(
            pod_uid=pod_uid,
            container_id=container_id,
            namespace=pod.namespace,
            pod=pod.name,
            container=name or container_id[:SHORT_ID],
            workload=pod.workload,
        )

    def allocated_ref(self, namespace: str, pod_name: str, container: str) -> ContainerRef | None:
        pod = self.by_name.get((namespace, pod_name))
        if pod is None:
            if self.known:
                return None  # the kubelet lists a pod the API no longer has: gone
            return ContainerRef("", "", namespace, pod_name, container)
        if pod.phase in _TERMINATED:
            return None  # old kubelets keep listing terminated pods' devices
        return ContainerRef(
            pod.uid,
            pod.container_ids.get(container, ""),
            pod.namespace,
            pod.name,
            container,
            pod.workload,
        )


def _ref_fields(ref: ContainerRef) -> tuple[str, ...]:
    """ContainerRef's field order, as a plain tuple: the dataclass's own __lt__ builds two
    tuples per comparison, a tenth of the ledger's time on a dense node."""
    return (ref.pod_uid, ref.container_id, ref.namespace, ref.pod, ref.container, ref.workload)


def _ref_and_uuid(key: tuple[ContainerRef, str]) -> tuple[tuple[str, ...], str]:
    return _ref_fields(key[0]), key[1]


def _by_ref(item: tuple[ContainerRef, object]) -> tuple[str, ...]:
    return _ref_fields(item[0])


def container_of(info: ProcessInfo, pods: _Pods | None = None) -> ContainerRef | None:
    identity = info.cgroup
    if identity.pod_uid is None:
        return None
    return (pods or _Pods(None)).ref(identity.pod_uid, identity.container_id or "")


def host_gpus(gpus: Sequence[Gpu]) -> tuple[HostGpu, ...]:
    """Every GPU, each followed by its MIG devices in MIG device index order (the order
    the `<gpu>:<mig>` form counts), which carry the parent's index and bus id."""
    found: list[HostGpu] = []
    for g in gpus:
        found.append(HostGpu(index=g.index, uuid=g.uuid, pci_bus_id=g.pci_bus_id))
        found.extend(
            HostGpu(
                index=g.index,
                uuid=m.uuid,
                pci_bus_id=g.pci_bus_id,
                mig_parent_uuid=g.uuid,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
                mig_index=m.index,
            )
            for m in g.mig_devices
        )
    return tuple(found)


def device_processes(gpus: Sequence[Gpu]) -> Iterator[tuple[str, Sequence[GpuProcess]]]:
    """(device UUID, its processes) for every GPU and MIG device: a process on a MIG
    device is counted there, by the MIG UUID, and never again on its GPU."""
    for g in gpus:
        yield g.uuid, g.processes
        for m in g.mig_devices:
            yield m.uuid, m.processes


def _container_root_env(
    members: Sequence[ProcessInfo], procs: Mapping[int, ProcessInfo]
) -> Mapping[str, str]:
    """Environment of the process nearest the container's init that carries NVIDIA_VISIBLE_DEVICES.

    The NVIDIA runtime reads it from the container's init environment; children inherit
    it unless they rewrite it, so the outermost member is the best witness.
    """

    def depth(info: ProcessInfo) -> int:
        steps = 0
        for parent in ancestors(info, procs):
            if parent.cgroup != info.cgroup:
                break
            steps += 1
        return steps

    witnesses = [m for m in members if "NVIDIA_VISIBLE_DEVICES" in m.environ]
    if not witnesses:
        return {}
    return min(witnesses, key=lambda m: (depth(m), m.pid)).environ


def _allocations(
    snapshot: PodResourcesSnapshot | None, pods: _Pods, host: Sequence[HostGpu] = ()
) -> tuple[Allocation, ...]:
    if snapshot is None:
        return ()
    found: dict[tuple[ContainerRef, str], Allocation] = {}
    resolved: dict[str, str] = {}
    for item in snapshot.allocations:
        ref = pods.allocated_ref(item.namespace, item.pod, item.container)
        if ref is not None:
            # An index id (`1`, `1:2` for a MIG device) is keyed by the UUID it names.
            uuid = resolved.get(item.gpu_uuid)
            if uuid is None:
                uuid = resolved[item.gpu_uuid] = device_uuid(item.gpu_uuid, host)
            # Time-slicing replicas of one GPU in one container count once.
            found.setdefault((ref, uuid), Allocation(ref, uuid, item.resource, item.device_id))
    return tuple(found[k] for k in sorted(found, key=_ref_and_uuid))


@dataclass(frozen=True)
class _Claims:
    """DRA devices the kubelet names, resolved (allocations) or not (containers whose
    allocations are then unknown, and what to say about them)."""

    allocations: tuple[Allocation, ...] = ()
    unresolved: frozenset[ContainerRef] = frozenset()
    unknowns: tuple[str, ...] = ()


def _claim_allocations(
    snapshot: PodResourcesSnapshot | None, pods: _Pods, dra: DraSnapshot | None
) -> _Claims:
    """DRA rows joined like device-plugin ones: (driver, pool, device) -> the slice
    device's `uuid`. A device no slice seen names is said, never guessed."""
    if snapshot is None or not snapshot.claims:
        return _Claims()
    by_name = {(d.driver, d.pool, d.name): d for d in (dra.devices if dra else ())}
    found: dict[tuple[ContainerRef, str], Allocation] = {}
    unresolved: set[ContainerRef] = set()
    unknowns: list[str] = []
    for row in snapshot.claims:
        ref = pods.allocated_ref(row.namespace, row.pod, row.container)
        if ref is None:
            continue
        device = by_name.get((row.device.driver, row.device.pool, row.device.device))
        if device is None:
            unresolved.add(ref)
            unknowns.append(_unresolved(row, dra is not None))
            continue
        allocation = Allocation(ref, device.uuid, row.device.driver, row.device.device, row.device)
        found.setdefault((ref, device.uuid), allocation)
    return _Claims(
        tuple(found[k] for k in sorted(found, key=_ref_and_uuid)),
        frozenset(unresolved),
        tuple(dict.fromkeys(unknowns)),
    )


def _unresolved(row: ClaimAllocation, slices_read: bool) -> str:
    why = "in no ResourceSlice of this node" if slices_read else "ResourceSlices not read"
    return (
        f"DRA device {row.device.qualified} of claim {row.device.claim_namespace}/"
        f"{row.device.claim_name} (pod {row.namespace}/{row.pod}): {why}, its GPU unknown"
    )


def _dra_gpus(snapshot: PodResourcesSnapshot | None) -> dict[tuple[str, str], int]:
    """DRA GPU devices per pod (namespace, name), counted once however many share them."""
    devices: dict[tuple[str, str], set[str]] = defaultdict(set)
    for row in snapshot.claims if snapshot else ():
        devices[(row.namespace, row.pod)].add(row.device.qualified)
    return {pod: len(found) for pod, found in devices.items()}


def _with_claim_gpus(
    pods: Sequence[PodInfo], counts: Mapping[tuple[str, str], int]
) -> list[PodInfo]:
    """Pods with their DRA GPUs added to gpu_requests: every GPU-pod decision sees them."""
    return [
        replace(p, gpu_requests=p.gpu_requests + counts[(p.namespace, p.name)])
        if counts.get((p.namespace, p.name))
        else p
        for p in pods
    ]


def _pending_claim_gpus(pending: PodsSnapshot, dra: DraSnapshot | None) -> list[PodInfo]:
    """Cluster mode: each pending pod's GPUs asked through its claims' device classes."""
    claims = {(c.namespace, c.name): c.gpus for c in (dra.claims if dra else ())}
    counts = {
        (p.namespace, p.name): sum(claims.get((p.namespace, c), 0) for c in p.claims)
        for p in pending.pods
        if p.claims
    }
    return _with_claim_gpus(pending.pods, counts)


def _pending_claims(pending: PodsSnapshot | None, dra: DraSnapshot | None) -> tuple[ClaimInfo, ...]:
    """The claims pending pods name, and only those (cardinality, memory)."""
    named = {(p.namespace, c) for p in (pending.pods if pending else ()) for c in p.claims}
    return tuple(c for c in (dra.claims if dra else ()) if (c.namespace, c.name) in named)


def _device_maps(
    members: Mapping[ContainerRef, list[ProcessInfo]],
    allocations: Sequence[Allocation],
    procs: Mapping[int, ProcessInfo],
    host: Sequence[HostGpu],
) -> dict[ContainerRef, tuple[tuple[HostGpu, ...], str]]:
    """Each container's GPU list in CUDA order, and where it came from."""
    allocated: dict[ContainerRef, list[str]] = defaultdict(list)
    for a in allocations:
        allocated[a.container].append(a.gpu_uuid)
    maps: dict[ContainerRef, tuple[tuple[HostGpu, ...], str]] = {}
    # Containers given the same devices map them the same way: compute each list once
    # (and share the tuple, which the per-process mapping then memoizes on).
    memo: dict[tuple[tuple[str, ...], str | None], tuple[HostGpu, ...]] = {}
    for ref, uuids in allocated.items():
        env = _container_root_env(members.get(ref, []), procs)
        key = (tuple(uuids), env.get("CUDA_DEVICE_ORDER"))
        mapped = memo.get(key)
        if mapped is None:
            mapped = memo[key] = container_device_map(None, None, key[1], host, uuids)
        maps[ref] = (mapped, "podresources")
    for ref, infos in members.items():
        if ref in maps:
            continue
        env = _container_root_env(infos, procs)
        if "NVIDIA_VISIBLE_DEVICES" in env:
            mapped = container_device_map(
                env["NVIDIA_VISIBLE_DEVICES"], None, env.get("CUDA_DEVICE_ORDER"), host
            )
            maps[ref] = (mapped, "env")
    return maps


def _discrepancies(
    allocations: Sequence[Allocation],
    usage: Sequence[ContainerGpuUsage],
    *,
    allocations_known: bool,
    usage_known: bool,
    unresolved: frozenset[ContainerRef] = frozenset(),
) -> tuple[Discrepancy, ...]:
    used = {(u.container, u.gpu_uuid) for u in usage}
    held = {(a.container, a.gpu_uuid) for a in allocations}
    found: list[Discrepancy] = []
    if allocations_known and usage_known:
        for a in allocations:
            if a.container.pod_uid:  # only a pod the API knows can be matched to processes
                found.append(
                    Discrepancy(
                        "allocated_unused",
                        a.container,
                        a.gpu_uuid,
                        (a.container, a.gpu_uuid) not in used,
                    )
                )
        for u in usage:
            # Named by the API, and every device it holds known: its allocations compare.
            if u.container.namespace and u.container not in unresolved:
                found.append(
                    Discrepancy(
                        "unallocated_use",
                        u.container,
                        u.gpu_uuid,
                        (u.container, u.gpu_uuid) not in held,
                    )
                )
    return tuple(found)


def _pod_states(
    pods: PodsSnapshot | None, dra_gpus: Mapping[tuple[str, str], int]
) -> tuple[PodState, ...]:
    if pods is None:
        return ()
    states = [
        PodState(p, starting=not p.ready)
        for p in _with_claim_gpus(pods.pods, dra_gpus)
        if p.gpu_requests > 0 and p.phase not in _TERMINATED and not p.deletion
    ]
    return tuple(sorted(states, key=lambda s: (s.pod.namespace, s.pod.name)))


def build_ledger(
    snapshots: Snapshots,
    previous: Ledger | None = None,
    *,
    node: str,
    mode: str,
    taken_at: float,
) -> Ledger:
    """Join one cycle's snapshots. `previous` is the last cycle's ledger: an engine that
    stops answering keeps the identity it had there (its series go to up=0, not away)."""
    node_mode = mode == "node"
    nvml = snapshots.get(NVML)
    procs = snapshots.get(PROCESSES)
    pods = snapshots.get(PODS) if node_mode else None
    pending = None if node_mode else snapshots.get(PODS)
    podresources = snapshots.get(PODRESOURCES)
    ray_local = snapshots.get(RAY_LOCAL) if node_mode else None
    ray_cluster = None if node_mode else _ray_cluster(snapshots)
    dra = snapshots.get(DRA)
    sources = snapshots.statuses
    gpus, gpus_over = _unique_gpus(nvml.gpus if nvml else ())
    host = host_gpus(gpus)
    process_table: Mapping[int, ProcessInfo] = procs.processes if procs else {}
    pod_index = _Pods(pods)

    memory_by_pid = _memory_by_pid(gpus)
    refs, members = _containers(process_table, pod_index)
    claims = _claim_allocations(podresources, pod_index, snapshots.get(DRA))
    allocations = _all_allocations(podresources, pod_index, host, claims)
    maps = _device_maps(members, allocations, process_table, host)
    usage, unattributed, views = _process_usage(
        memory_by_pid,
        process_table,
        refs,
        maps,
        host,
        devices=[d for d, _ in device_processes(gpus)] if procs is not None else [],
    )
    layers = _serving_layers(
        snapshots,
        previous,
        memory_by_pid,
        allocations if podresources is not None and pods is not None else None,
        node_mode=node_mode,
        node=node,
    )
    pools = () if node_mode else build_pools(snapshots.get(INFERENCE_POOLS), snapshots.get(PICKERS))
    ledger = Ledger(
        node=node,
        mode=mode,
        taken_at=taken_at,
        driver_version=nvml.driver_version if nvml else None,
        gpus=gpus,
        usage=usage,
        unattributed=unattributed,
        device_maps=_device_mappings(maps),
        processes=tuple(views),
        sources=tuple(sources),
        allocations=allocations,
        discrepancies=_discrepancies(
            allocations,
            usage,
            allocations_known=podresources is not None and pods is not None,
            usage_known=nvml is not None and procs is not None,
            unresolved=claims.unresolved,
        ),
        pods=_pod_states(pods, _dra_gpus(podresources)),
        engines=layers.engines,
        pending=_pending_pods(pending, snapshots.get(DRA)),
        unknowns=(
            *_unknowns(sources),
            *_slice_unknowns(None if node_mode else dra),
            *claims.unknowns,
            *_serve_unknowns(layers.serve),
            *ray_job_unknowns(ray_local),
        ),
        ray=layers.ray,
        ray_cluster=ray_cluster,
        serve=layers.serve,
        claims=_pending_claims(pending, dra),
        dra_nodes=dra.nodes if dra is not None and not node_mode else (),
        pools=pools,
        pool_members=pool_members(pools),
        requests=build_requests(
            snapshots.get(SPANS),
            layers.engines,
            process_table,
            pods,
            procs.sockets if procs is not None else None,
        ),
        # Kept only while spans are received: nothing else reads it.
        engine_history=engine_history(
            layers.engines, previous.engine_history if previous else (), taken_at
        )
        if snapshots.get(SPANS) is not None
        else (),
    )
    return _capped(ledger, layers.overflow(gpus_over))


def _all_allocations(
    podresources: PodResourcesSnapshot | None,
    pod_index: _Pods,
    host: Sequence[HostGpu],
    claims: _Claims,
) -> tuple[Allocation, ...]:
    """Device-plugin and DRA allocations alike, by container and device."""
    return tuple(
        sorted(
            (*_allocations(podresources, pod_index, host), *claims.allocations),
            key=lambda a: _ref_and_uuid((a.container, a.gpu_uuid)),
        )
    )


def _device_mappings(
    maps: Mapping[ContainerRef, tuple[tuple[HostGpu, ...], str]],
) -> tuple[DeviceMapping, ...]:
    """Each container's ordinals in CUDA's order, with the rule that gave them."""
    return tuple(
        DeviceMapping(ref, i, gpu.uuid, source)
        for ref, (mapped, source) in sorted(maps.items(), key=_by_ref)
        for i, gpu in enumerate(mapped)
    )


def _pending_pods(pending: PodsSnapshot | None, dra: DraSnapshot | None) -> tuple[PodInfo, ...]:
    """Cluster mode: the unplaced pods, their claims' GPUs counted, by namespace and name."""
    if not pending:
        return ()
    return tuple(sorted(_pending_claim_gpus(pending, dra), key=lambda p: (p.namespace, p.name)))


@dataclass(frozen=True)
class _ServingLayers:
    """Ray, the engines and Ray Serve as joined on this node, with what their caps cut."""

    ray: RayLocal | None
    ray_over: RayLocal | None
    engines: tuple[Engine, ...]
    engines_over: tuple[Engine, ...]
    engine_gpus_over: tuple[Engine, ...]
    serve: ServeLocal | None
    serve_over: ServeLocal | None

    def overflow(self, gpus: tuple[Gpu, ...]) -> Overflow:
        """What the caps cut before the join's own cut (`_capped`): GPUs and these."""
        return Overflow(
            gpus=gpus,
            engines=self.engines_over,
            engine_gpus=self.engine_gpus_over,
            ray=self.ray_over,
            serve=self.serve_over,
        )


def _serving_layers(
    snapshots: Snapshots,
    previous: Ledger | None,
    memory_by_pid: Mapping[int, list[tuple[str, int | None]]],
    allocations: tuple[Allocation, ...] | None,
    *,
    node_mode: bool,
    node: str,
) -> _ServingLayers:
    nvml = snapshots.get(NVML)
    procs = snapshots.get(PROCESSES)
    process_table: Mapping[int, ProcessInfo] = procs.processes if procs else {}
    ray_local = snapshots.get(RAY_LOCAL) if node_mode else None
    gpu_by_pid = {pid: [uuid for uuid, _ in held] for pid, held in memory_by_pid.items()}
    ray, ray_over = _ray_local(
        ray_local,
        process_table if procs is not None and nvml is not None else None,
        memory_by_pid,
        allocations,
    )
    engines, engines_over, engine_gpus_over = _joined_engines(
        snapshots.get(ENGINES), procs, gpu_by_pid, previous, ray_local, node=node
    )
    topology = Topology.of(nvml.gpus if nvml else (), nvml.links if nvml else ())
    engines, engines_over = with_links(engines, topology), with_links(engines_over, topology)
    ray, ray_over = _with_ray_links(ray, ray_over, topology)
    serve, serve_over = build_serve(
        snapshots.get(SERVE) if node_mode else None,
        ray_local,
        process_table if procs is not None else None,
        engines,
    )
    return _ServingLayers(ray, ray_over, engines, engines_over, engine_gpus_over, serve, serve_over)


def _with_ray_links(
    ray: RayLocal | None, over: RayLocal | None, topology: Topology
) -> tuple[RayLocal | None, RayLocal | None]:
    """The Ray-executor engines' links on this node: from the workers kept, and from those
    the caps cut (with the links past MAX_ENGINES) into the overflow."""
    if ray is None:
        return ray, over
    kept, surplus = ray_engine_links(ray.workers, topology)
    cut, _ = ray_engine_links(over.workers if over is not None else (), topology)
    ray = replace(ray, engine_links=kept)
    if over is not None:
        over = replace(over, engine_links=(*surplus, *cut))
    return ray, over


def _memory_by_pid(gpus: Sequence[Gpu]) -> dict[int, list[tuple[str, int | None]]]:
    """PID -> (device UUID, bytes) of every process NVML lists, on GPUs and MIG devices."""
    memory: dict[int, list[tuple[str, int | None]]] = defaultdict(list)
    for device, on_device in device_processes(gpus):
        for proc in on_device:
            memory[proc.pid].append((device, proc.used_memory_bytes))
    return memory


def _containers(
    process_table: Mapping[int, ProcessInfo], pod_index: _Pods
) -> tuple[dict[int, ContainerRef | None], dict[ContainerRef, list[ProcessInfo]]]:
    """Each process's container (identity rule 2), and each container's processes."""
    refs = {pid: container_of(info, pod_index) for pid, info in process_table.items()}
    members: dict[ContainerRef, list[ProcessInfo]] = defaultdict(list)
    for pid, ref in refs.items():
        if ref is not None:
            members[ref].append(process_table[pid])
    return refs, members


def _process_usage(
    memory_by_pid: Mapping[int, list[tuple[str, int | None]]],
    process_table: Mapping[int, ProcessInfo],
    refs: Mapping[int, ContainerRef | None],
    maps: Mapping[ContainerRef, tuple[tuple[HostGpu, ...], str]],
    host: Sequence[HostGpu],
    *,
    devices: Sequence[str],
) -> tuple[tuple[ContainerGpuUsage, ...], dict[str, int], tuple[ProcessView, ...]]:
    """GPU memory per container and device, memory in no pod per device (each of `devices`
    listed, 0 included; none when procfs was down), and every process's view."""
    usage_bytes: dict[tuple[ContainerRef, str], int] = defaultdict(int)
    usage_count: dict[tuple[ContainerRef, str], int] = defaultdict(int)
    unattributed: dict[str, int] = defaultdict(int)
    views: list[ProcessView] = []
    device_memo: dict[tuple[int, str | None, str | None], tuple[str, ...]] = {}
    for pid in sorted(set(memory_by_pid) | set(process_table)):
        found = process_table.get(pid)
        ref = refs.get(pid)
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
                cuda_devices=_cuda_devices(found, ref, maps, host, process_table, memo=device_memo),
            )
        )
    for device in devices:  # every device known to hold 0 bytes in no pod, not unknown
        unattributed.setdefault(device, 0)
    usage = tuple(
        ContainerGpuUsage(ref, uuid, usage_bytes[(ref, uuid)], usage_count[(ref, uuid)])
        for ref, uuid in sorted(usage_bytes, key=_ref_and_uuid)
    )
    return usage, dict(unattributed), tuple(views)


def _joined_engines(
    scrapes: EnginesSnapshot | None,
    procs: ProcSnapshot | None,
    gpu_by_pid: Mapping[int, list[str]],
    previous: Ledger | None,
    ray_local: Sequence[LocalRayNode] | None,
    *,
    node: str,
) -> tuple[tuple[Engine, ...], tuple[Engine, ...], tuple[Engine, ...]]:
    """The engines with their processes, GPUs and Ray jobs, cut to the cap: (kept, cut,
    kept engines' GPU rows past the cap)."""
    process_table: Mapping[int, ProcessInfo] = procs.processes if procs else {}
    return cap_engines(
        link_ray_engines(
            build_engines(
                scrapes,
                process_table,
                gpu_by_pid,
                known_engine_ids(previous.engines) if previous is not None else {},
                procs.sockets if procs is not None else None,
                known_kinds=known_kinds(previous.engines) if previous is not None else None,
                known_workloads=(
                    known_workloads(previous.engines) if previous is not None else None
                ),
                node=node,
            ),
            ray_local,
            process_table,
        )
    )


def _ray_local(
    local: Sequence[LocalRayNode] | None,
    procs: Mapping[int, ProcessInfo] | None,
    memory_by_pid: Mapping[int, Sequence[tuple[str, int | None]]],
    allocations: Sequence[Allocation] | None,
) -> tuple[RayLocal | None, RayLocal | None]:
    """The local Ray nodes joined, and their overflow; `allocations` None when unknown."""
    if local is None:
        return None, None
    allocated_by_pod: dict[str, int] | None = None
    if allocations is not None:
        allocated_by_pod = defaultdict(int)
        for a in allocations:
            allocated_by_pod[a.container.pod_uid] += 1
    return build_ray_local(local, procs, memory_by_pid, allocated_by_pod)


def _capped(ledger: Ledger, overflow: Overflow) -> Ledger:
    """The ledger with each field that has a `_cut` (see Overflow) cut to its cap, and what
    was cut added to `overflow`. Applied last: discrepancies are judged on every row."""
    kept: dict[str, Any] = {}
    over: dict[str, Any] = {}
    for f in fields(Overflow):
        cut = f.metadata.get("cut")
        if cut is not None:
            kept[f.name], over[f.name] = cut(getattr(ledger, f.name))
    return replace(ledger, **kept, overflow=replace(overflow, **over))


def overflow_view(ledger: Ledger) -> Ledger:
    """The ledger of the rows its caps kept out: every Overflow field in place of the
    Ledger field of its name, every other row emptied (so built into families by the same
    code as what is exported, it has exactly the series that were dropped)."""
    rows = {f.name: getattr(ledger.overflow, f.name) for f in fields(Overflow)}
    view: dict[str, Any] = {}
    for f in fields(Ledger):
        if f.name in _IDENTITY:
            continue
        view[f.name] = rows[f.name] if f.name in rows else _nothing(getattr(ledger, f.name))
    return replace(ledger, **view)


# Ledger fields that say which ledger it is, not rows of it.
_IDENTITY = frozenset({"node", "mode", "taken_at", "driver_version"})


def _nothing(value: object) -> object:
    """An empty value of a Ledger field's kind."""
    if isinstance(value, tuple):
        return ()
    if isinstance(value, Mapping):
        return {}
    if isinstance(value, Overflow):
        return Overflow()
    return None


def _unique_gpus(gpus: Sequence[Gpu]) -> tuple[tuple[Gpu, ...], tuple[Gpu, ...]]:
    """One GPU per UUID (identity rule 1): a driver that repeats a UUID must not repeat
    its series. The first wins; the rest are overflow."""
    seen: set[str] = set()
    kept: list[Gpu] = []
    repeated: list[Gpu] = []
    for gpu in gpus:
        (repeated if gpu.uuid in seen else kept).append(gpu)
        seen.add(gpu.uuid)
    return tuple(kept), tuple(repeated)


def _ray_cluster(snapshots: Snapshots) -> RayCluster | None:
    found = snapshots.get(RAY_CLUSTER)
    return build_ray_cluster(found.state, found.namespace, found.workload) if found else None


_MISSING = {
    "nvml": "no NVML: GPU list, memory and processes unknown",
    "procfs": "no procfs: which pod each GPU process belongs to is unknown",
    "kubernetes": "no Kubernetes API: pod names, workloads and readiness unknown",
    "podresources": "no PodResources: allocation unknown",
    "vllm": "no vLLM scrape: engine queues unknown",
    "ray": (
        "no Ray state API: logical GPUs, actors, placement groups, and the Ray jobs and "
        "workers of engines on the Ray executor unknown"
    ),
    "serve": "no Ray Serve: deployments, router queues and replica requests unknown",
    "dra": "no ResourceSlices/ResourceClaims: DRA GPUs unknown",
    "inferencepools": "no InferencePools: which engines form a pool, and its picker, unknown",
    "picker": "no endpoint pickers read: the gateway's queue unknown",
}


def _slice_unknowns(dra: DraSnapshot | None) -> tuple[str, ...]:
    """Cluster mode: the claims were read but the cluster's slices were not."""
    if dra is None or dra.nodes_error is None:
        return ()
    return (
        f"ResourceSlices not listed ({dra.nodes_error}): nodes with DRA GPUs only are not "
        "counted as GPU nodes",
    )


def _serve_unknowns(serve: ServeLocal | None) -> tuple[str, ...]:
    """Local Ray nodes whose Serve metrics were not read while the source was up."""
    return tuple(
        f"no Serve metrics from Ray node {node_id[:12]}: its router queues and replica "
        "requests unknown"
        for node_id in (serve.unknown_nodes if serve is not None else ())
    )


def _unknowns(sources: Sequence[SourceStatus]) -> tuple[str, ...]:
    return tuple(
        f"{_MISSING.get(s.source, s.source + ' down')} ({s.error_reason})"
        for s in sources
        if not s.up and s.error_reason != "disabled"
    )


def _cuda_devices(
    info: ProcessInfo | None,
    ref: ContainerRef | None,
    maps: Mapping[ContainerRef, tuple[tuple[HostGpu, ...], str]],
    host: Sequence[HostGpu],
    procs: Mapping[int, ProcessInfo],
    *,
    memo: dict[tuple[int, str | None, str | None], tuple[str, ...]],
) -> tuple[str, ...] | None:
    """The GPU UUIDs a process sees, by CUDA ordinal. `memo` holds answers for one
    ledger: containers given the same GPUs, and their processes, mostly share them."""
    if info is None:
        return None
    if ref is None:
        visible: Sequence[HostGpu] = host  # a host process sees every GPU
    else:
        mapping = maps.get(ref)
        if mapping is None:
            return None  # the container's device list is unknown
        visible = mapping[0]
    environ = _device_environ(info, procs)
    if environ is None:
        return None
    # By identity: the lists are shared (one per distinct allocation) and outlive the memo.
    key = (id(visible), environ.get("CUDA_VISIBLE_DEVICES"), environ.get("CUDA_DEVICE_ORDER"))
    found = memo.get(key)
    if found is None:
        mapped = container_device_map(
            None, key[1], key[2], visible, allocated_uuids=[g.uuid for g in visible]
        )
        found = memo[key] = tuple(g.uuid for g in mapped)
    return found


# Processes that rename themselves with setproctitle: it reuses the memory of the
# environment block, so /proc/<pid>/environ no longer shows what they inherited.
_RETITLED = TITLE_PREFIXES


def _device_environ(
    info: ProcessInfo, procs: Mapping[int, ProcessInfo]
) -> Mapping[str, str] | None:
    """The environment that decides this process's devices: its own, or for a retitled
    engine process that of its nearest intact ancestor in the same container (the API
    server whose CUDA_VISIBLE_DEVICES it inherited); None when none is known."""
    if not info.title.startswith(_RETITLED):
        return info.environ
    for parent in ancestors(info, procs):
        if parent.cgroup != info.cgroup:
            return None
        if not parent.title.startswith(_RETITLED):
            return parent.environ
    return None
