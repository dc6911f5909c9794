"""Snapshots built in memory for the pure ledger, and its exposition through the real
collector: oversized and colliding inputs without a simulated node."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.export.collector import snapshot_families
from gpuledger.export.exposition import render_text
from gpuledger.export.published import Published
from gpuledger.identity.cgroup import CgroupIdentity
from gpuledger.ledger import Ledger, build_ledger
from gpuledger.model import Snapshots
from gpuledger.model.bundle import Key
from gpuledger.model.dra import DRA, DraSnapshot, SliceDevice
from gpuledger.model.engines import ENGINES, EngineMetrics, EngineScrape, EngineTarget
from gpuledger.model.kubernetes import PODS, PodInfo, PodsSnapshot
from gpuledger.model.nvml import NVML, Gpu, GpuProcess, NvmlSnapshot
from gpuledger.model.podresources import (
    PODRESOURCES,
    ClaimAllocation,
    ClaimDevice,
    DeviceAllocation,
    PodResourcesSnapshot,
)
from gpuledger.model.procfs import PROCESSES, ProcessInfo, ProcSnapshot
from gpuledger.model.ray import RAY_LOCAL, LocalRayNode, RayActor, RayNode, RaySnapshot

NODE = "n1"
Series = tuple[str, tuple[tuple[str, str], ...]]


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-0000-0000-000000000000"


def pod_uid(i: int, kind: str = "p") -> str:
    return f"{kind[:1]}{i:07x}-0000-0000-0000-000000000000"


def pod(
    i: int,
    *,
    namespace: str = "ns",
    name: str | None = None,
    ip: str | None = None,
    gpus: int = 1,
    annotations: Mapping[str, str] | None = None,
    containers: Mapping[str, str] | None = None,
) -> PodInfo:
    return PodInfo(
        uid=pod_uid(i),
        namespace=namespace,
        name=name or f"pod-{i}",
        node_name=NODE,
        phase="Running",
        labels={},
        workload=name or f"pod-{i}",
        pod_ip=ip,
        container_ids=containers or {"c": f"{i:064x}"},
        gpu_requests=gpus,
        pending_reason=None,
        pending_since=None,
        ready=False,
        deletion=False,
        annotations=annotations or {},
    )


def process(
    pid: int,
    *,
    ppid: int = 1,
    title: str = "python3",
    uid: str | None = None,
    container: str | None = None,
    nspid: tuple[int, ...] = (),
) -> ProcessInfo:
    return ProcessInfo(
        pid=pid,
        ppid=ppid,
        nspid=nspid or (pid,),
        title=title,
        cgroup=CgroupIdentity(uid, container, "containerd" if uid else None, None),
    )


def gpus(count: int, holders: Mapping[int, Sequence[int]] | None = None) -> NvmlSnapshot:
    """`count` GPUs; `holders` maps a GPU index to the PIDs holding 1 MiB on it."""
    holders = holders or {}
    return NvmlSnapshot(
        "550.0",
        tuple(
            Gpu(
                index=i,
                uuid=uuid(i),
                name="H100",
                pci_bus_id=f"0000:{i:02x}:00.0",
                up=True,
                memory_total_bytes=80 << 30,
                memory_used_bytes=1 << 30,
                processes=tuple(GpuProcess(pid, 1 << 20) for pid in holders.get(i, ())),
            )
            for i in range(count)
        ),
    )


def scrape(
    target: EngineTarget, engines: Iterable[tuple[str, str]], up: bool = True
) -> EngineScrape:
    metrics = tuple(
        EngineMetrics(model, rank, requests_running=1.0, requests_waiting=0.0)
        for model, rank in engines
    )
    return EngineScrape(
        target,
        up,
        None if up else "refused",
        None if up else "refused",
        metrics if up else (),
        0.01,
    )


def actor(i: int, class_name: str, node_id: str, gpus: float, state: str = "ALIVE") -> RayActor:
    return RayActor(
        actor_id=f"a{i}",
        class_name=class_name,
        state=state,
        pid=None,
        node_id=node_id,
        num_gpus=gpus,
        job_id=None,
        placement_group_id=None,
        ray_namespace=None,
    )


def ray_node(node_id: str, gpus: float, ip: str = "") -> RayNode:
    return RayNode(node_id, ip, None, "ALIVE", False, {"GPU": gpus}, {"GPU": 0.0})


def local_ray(node: RayNode, pod_info: PodInfo | None, actors: Sequence[RayActor]) -> LocalRayNode:
    return LocalRayNode(RaySnapshot(nodes=(node,), actors=tuple(actors)), node, pod_info)


def ledger(mode: str = "node", **parts: Any) -> Ledger:
    """A ledger from the snapshots given by name: nvml, procs, pods, podresources, vllm,
    ray (node mode: LocalRayNodes)."""
    keys: dict[str, Key[Any]] = {
        "nvml": NVML,
        "procs": PROCESSES,
        "pods": PODS,
        "podresources": PODRESOURCES,
        "vllm": ENGINES,
        "ray": RAY_LOCAL,
        "dra": DRA,
    }
    values = {keys[name]: value for name, value in parts.items()}
    return build_ledger(Snapshots(values), node=NODE, mode=mode, taken_at=0.0)


def procs(infos: Iterable[ProcessInfo]) -> ProcSnapshot:
    return ProcSnapshot({p.pid: p for p in infos})


def pods(infos: Iterable[PodInfo]) -> PodsSnapshot:
    return PodsSnapshot(tuple(infos), synced=True)


def allocations(rows: Iterable[tuple[PodInfo, int]]) -> PodResourcesSnapshot:
    return PodResourcesSnapshot(
        tuple(
            DeviceAllocation(p.namespace, p.name, "c", "nvidia.com/gpu", uuid(g), uuid(g), 0)
            for p, g in rows
        ),
        None,
    )


def claim_allocations(
    base: PodResourcesSnapshot, rows: Iterable[tuple[PodInfo, int]]
) -> tuple[PodResourcesSnapshot, DraSnapshot]:
    """`base` plus a DRA claim per (pod, GPU) row, and the slice naming each GPU."""
    claims = tuple(
        ClaimAllocation(
            p.namespace,
            p.name,
            "c",
            ClaimDevice(p.namespace, f"claim-{g}", "gpu.nvidia.com", NODE, f"gpu-{g}"),
        )
        for p, g in rows
    )
    slices = tuple(SliceDevice("gpu.nvidia.com", NODE, f"gpu-{g}", uuid(g)) for _, g in rows)
    return replace(base, claims=claims), DraSnapshot(devices=slices)


def exposition(published: Published | Ledger) -> str:
    if isinstance(published, Ledger):
        published = Published(published)
    return render_text(snapshot_families(published, 0.0)).decode()


def series(text: str) -> list[Series]:
    """Every sample as (name, sorted labels), in order."""
    return [
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def per_family(text: str) -> Counter[str]:
    return Counter(name for name, _ in series(text))


def repeated(text: str) -> list[Series]:
    """Samples whose name and label set an earlier sample already had."""
    seen: set[Series] = set()
    found = []
    for one in series(text):
        if one in seen:
            found.append(one)
        seen.add(one)
    return found
