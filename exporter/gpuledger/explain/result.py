"""What `gpuledger explain` answers, typed: the JSON of `explain --json` (keys are field
names, in field order: gpuledger/document/codec.py) and what `render_text` reads back.

The rows are the ledger document's own (gpuledger/document/v1.py) with what explain adds:
the node whose document holds them, a container ordinal's host device, an engine's Ray
footprint across nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuledger.document.v1 import (
    ContainerDoc,
    DeviceDoc,
    EngineDoc,
    EngineRayDoc,
    PendingDoc,
    PodDoc,
    PoolDoc,
    ProcessDoc,
    RayEngineLinkDoc,
    RayWorkerDoc,
    ServeDeploymentDoc,
    WorkerNodeDoc,
)


@dataclass(frozen=True, kw_only=True)
class VerdictShown:
    stage: str
    reason: str | None
    evidence: tuple[str, ...]
    next_step: str
    runbook_url: str | None


@dataclass(frozen=True, kw_only=True)
class RayWorkerEntry(RayWorkerDoc):
    node: str


@dataclass(frozen=True, kw_only=True)
class RayLinkEntry(RayEngineLinkDoc):
    """The weakest link among an engine's ranks on one node, with its GPUs' host indices."""

    node: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Footprint(EngineRayDoc):
    """An engine's Ray job with its workers on every node read. `gpus_in_use` counts
    distinct (node, GPU) and is None while a worker Ray lists ALIVE is on a Ray node whose
    agent was not read."""

    found: tuple[RayWorkerEntry, ...]
    unread: tuple[WorkerNodeDoc, ...]
    gpus_in_use: int | None
    nodes: tuple[str, ...]
    links: tuple[RayLinkEntry, ...] = ()


@dataclass(frozen=True, kw_only=True)
class EngineEntry(EngineDoc):
    node: str
    ray_footprint: Footprint | None
    # Host indices of its GPUs on its node, for the weakest link's line.
    gpu_indices: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DeviceEntry(DeviceDoc):
    gpu_index: int | None
    device: str  # `MIG-… (GPU-… instance 3, 1g.10gb)` for a MIG device


@dataclass(frozen=True, kw_only=True)
class ContainerEntry(ContainerDoc):
    devices: tuple[DeviceEntry, ...]
    node: str


@dataclass(frozen=True, kw_only=True)
class ProcessEntry(ProcessDoc):
    node: str


@dataclass(frozen=True, kw_only=True)
class ServeEntry(ServeDeploymentDoc):
    node: str


@dataclass(frozen=True, kw_only=True)
class PodEntry:
    pod: PodDoc  # its node filled in from its document where the pod names none
    engines: tuple[EngineEntry, ...]
    processes: tuple[ProcessEntry, ...]
    containers: tuple[ContainerEntry, ...]


@dataclass(frozen=True, kw_only=True)
class WorkloadResult:
    namespace: str
    workload: str
    pods: tuple[PodEntry, ...]
    pending: tuple[PendingDoc, ...]
    serve: tuple[ServeEntry, ...]
    verdict: VerdictShown
    discrepancies: tuple[str, ...]
    # Its engines in no pod (a bare host, docs/design.md identity rule 7): a pod's
    # engines are under the pod.
    host_engines: tuple[EngineEntry, ...] = ()
    # InferencePools with a member pod of the workload (the cluster view's document).
    pools: tuple[PoolDoc, ...] = ()


@dataclass(frozen=True, kw_only=True)
class HostProcess:
    """A process in no pod holding memory on the GPU (or on one of its MIG devices)."""

    pid: int
    title: str
    cuda_devices: tuple[str, ...] | None
    used_bytes: int | None
    gpu_uuid: str


@dataclass(frozen=True, kw_only=True)
class GpuShown:
    """What the text reads of the asked GPU or MIG device (its JSON has every field of
    the document's GPU or MIG device as well)."""

    uuid: str
    index: int
    model: str
    up: bool
    error_reason: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    unattributed_memory_bytes: int | None
    parent_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    profile: str = ""
    node: str = ""
    device: str = ""
    host_processes: tuple[HostProcess, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ExplainResult:
    query: Mapping[str, str]
    workloads: tuple[WorkloadResult, ...]
    unknowns: tuple[str, ...]
    not_configured: Mapping[str, tuple[str, ...]]
    simulated: tuple[str, ...]
