"""What /ledger.json carries, as frozen types: produced by export/document.py, read by
explain, the verdict, both pages and the agents reader (docs/explain.md).

Field names are the JSON keys and field order is the JSON order (codec.py walks them).
A field with a default is one an older v1 document may lack (tests/fixtures/
ledger_documents/ holds one of each shape); the default is what such a document meant.
Pure: no I/O, no gpuledger.sources, no ledger import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuledger.engines import KINDS

SCHEMA = "gpuledger.io/ledger/v1"
# Agents older than the engines' `kind` read one kind only: the first.
_FIRST_KIND = KINDS[0].name


@dataclass(frozen=True, kw_only=True)
class SourceDoc:
    source: str
    up: bool
    # up | down | not_configured; None in documents older than the state (then a
    # `disabled` reason means not configured: explain.chain.source_state).
    state: str | None = None
    reason: str | None
    message: str | None
    duration_seconds: float


@dataclass(frozen=True, kw_only=True)
class MigDeviceDoc:
    """A MIG device under its GPU; containers, processes and discrepancies name it by
    `uuid` (its MIG UUID) wherever they name a GPU."""

    uuid: str
    parent_uuid: str
    index: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    profile: str
    up: bool
    error_reason: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    unattributed_memory_bytes: int | None


@dataclass(frozen=True, kw_only=True)
class GpuDoc:
    uuid: str
    index: int
    model: str
    pci_bus_id: str
    mig_mode: str
    up: bool
    error_reason: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_ratio: float | None
    unattributed_memory_bytes: int | None
    mig_devices: tuple[MigDeviceDoc, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DeviceDoc:
    """Container ordinal `local_index` is host GPU `gpu_uuid` (source: env | podresources)."""

    local_index: int
    gpu_uuid: str
    source: str


@dataclass(frozen=True, kw_only=True)
class ClaimDeviceDoc:
    """A DRA allocation's ResourceClaim and the driver's device."""

    namespace: str
    name: str
    driver: str
    pool: str
    device: str
    share_id: str | None


@dataclass(frozen=True, kw_only=True)
class AllocationDoc:
    gpu_uuid: str
    resource: str
    device_id: str
    claim: ClaimDeviceDoc | None = None  # None: a device-plugin allocation


@dataclass(frozen=True, kw_only=True)
class UsageDoc:
    gpu_uuid: str
    memory_used_bytes: int
    processes: int


@dataclass(frozen=True, kw_only=True)
class ContainerRefDoc:
    namespace: str
    pod: str
    pod_uid: str
    container: str
    container_id: str
    workload: str


@dataclass(frozen=True, kw_only=True)
class ContainerDoc:
    namespace: str
    pod: str
    pod_uid: str
    container: str
    container_id: str
    workload: str
    devices: tuple[DeviceDoc, ...]
    allocations: tuple[AllocationDoc, ...]
    usage: tuple[UsageDoc, ...]


@dataclass(frozen=True, kw_only=True)
class GpuMemoryDoc:
    gpu_uuid: str
    used_bytes: int | None


@dataclass(frozen=True, kw_only=True)
class ProcessDoc:
    pid: int
    ppid: int | None
    title: str
    container: ContainerRefDoc | None
    gpu_memory: tuple[GpuMemoryDoc, ...]
    cuda_devices: tuple[str, ...] | None


@dataclass(frozen=True, kw_only=True)
class PodDoc:
    namespace: str
    name: str
    uid: str
    workload: str
    phase: str
    ready: bool
    starting: bool
    gpu_requests: int
    node: str | None


@dataclass(frozen=True, kw_only=True)
class EngineGpuDoc:
    gpu_uuid: str
    role: str
    rank: str


@dataclass(frozen=True, kw_only=True)
class WorkerNodeDoc:
    ray_node_id: str
    node_ip: str
    workers: int


@dataclass(frozen=True, kw_only=True)
class EngineRayDoc:
    """The Ray job the engine's EngineCore drives: its identity on every node, and the
    Ray nodes holding its workers (whose node agents report them)."""

    job_id: str
    driver_node_id: str
    driver_pid: int | None
    driver_node_ip: str
    worker_class: str
    workers: Mapping[str, int]
    world_size: int | None
    worker_nodes: tuple[WorkerNodeDoc, ...]


@dataclass(frozen=True, kw_only=True)
class EngineDoc:
    namespace: str
    pod: str
    pod_uid: str
    workload: str
    model_name: str
    engine: str
    url: str
    origin: str
    up: bool
    requests_running: float | None
    requests_waiting: float | None
    waiting_by_reason: Mapping[str, float]
    kv_cache_usage_ratio: float | None
    preemptions_total: float | None
    config: Mapping[str, str]
    gpus: tuple[EngineGpuDoc, ...]
    gpus_configured: int | None
    gpus_in_use: int | None
    # How its processes were found: the API server listening on the target's port, else
    # the old one-server-per-pod rule (docs/explain.md). Older documents lack them.
    target: str = ""
    process_binding: str = "none"
    api_server_pid: int | None = None
    sockets: str | None = None
    pids: tuple[int, ...] = ()
    ray: EngineRayDoc | None = None
    # Why the last scrape failed (refused, timeout, http_500, ...), when it did.
    error_reason: str | None = None
    # The engine kind (gpuledger.engines); "" while a target of unknown kind never answered.
    kind: str = _FIRST_KIND
    # The weakest link among its GPUs on this node (nvlink, internal, single, multiple,
    # hostbridge, node, system, unknown); None on fewer than two, and in older documents.
    gpu_link: str | None = None


@dataclass(frozen=True, kw_only=True)
class PendingClaimDoc:
    """A GPU ResourceClaim a pending pod waits on."""

    name: str
    device_classes: tuple[str, ...]
    gpus: int
    allocated: bool
    reserved_for: int
    deleting: bool


@dataclass(frozen=True, kw_only=True)
class PendingDoc:
    namespace: str
    name: str
    uid: str
    workload: str
    reason: str | None
    gpus: float  # a pod's GPU requests; Ray's pending GPUs in the cluster view's rows
    since: float | None = None
    nodes: int | None = None  # the nodes the scheduler tried, when its message says
    claims: tuple[PendingClaimDoc, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RayNodeDoc:
    namespace: str
    pod: str
    pod_uid: str
    workload: str
    ray_node_id: str
    node_ip: str
    gpus_total: float
    gpus_available: float | None
    gpus_allocated: int | None


@dataclass(frozen=True, kw_only=True)
class RayActorDoc:
    namespace: str
    pod: str
    workload: str
    ray_node_id: str
    class_name: str
    state: str
    gpus: float
    without_gpu_memory: int | None


@dataclass(frozen=True, kw_only=True)
class RayWorkerDoc:
    """A vLLM Ray worker on this node, labelled with its engine's (job_id, driver_node_id)."""

    namespace: str
    pod: str
    pod_uid: str
    workload: str
    ray_node_id: str
    job_id: str
    driver_node_id: str
    actor_id: str
    class_name: str
    name: str
    bundle_index: int | None
    tp_rank: int | None
    pp_rank: int | None
    pid: int | None
    host_pid: int | None
    gpus: tuple[GpuMemoryDoc, ...]


@dataclass(frozen=True, kw_only=True)
class RayEngineLinkDoc:
    """The GPUs a Ray-executor engine's workers hold on one Ray node here, and the weakest
    link among them."""

    namespace: str
    pod: str
    pod_uid: str
    workload: str
    ray_node_id: str
    job_id: str
    driver_node_id: str
    gpus: tuple[str, ...]
    link: str


@dataclass(frozen=True, kw_only=True)
class PlacementGroupsDoc:
    state: str
    scheduling_state: str
    count: int


@dataclass(frozen=True, kw_only=True)
class RayClusterDoc:
    namespace: str
    workload: str
    placement_groups: tuple[PlacementGroupsDoc, ...]
    pending_gpus: Mapping[str, float]


@dataclass(frozen=True, kw_only=True)
class RayDoc:
    nodes: tuple[RayNodeDoc, ...] = ()
    actors: tuple[RayActorDoc, ...] = ()
    workers: tuple[RayWorkerDoc, ...] = ()
    cluster: RayClusterDoc | None = None
    engine_links: tuple[RayEngineLinkDoc, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ServeEngineDoc:
    target: str
    model_name: str
    engine: str


@dataclass(frozen=True, kw_only=True)
class ServeReplicaDoc:
    namespace: str
    pod: str
    pod_uid: str
    workload: str
    replica: str
    state: str
    pid: int | None
    host_pid: int | None
    ongoing_requests: float | None
    engines: tuple[ServeEngineDoc, ...]


@dataclass(frozen=True, kw_only=True)
class ServeDeploymentDoc:
    namespace: str
    workload: str
    application: str
    deployment: str
    status: str
    max_ongoing_requests: int | None
    target_replicas: int | None
    router_queued_requests: float | None
    router_requests_at_replicas: float | None
    replicas: tuple[ServeReplicaDoc, ...]


@dataclass(frozen=True, kw_only=True)
class ServeDoc:
    deployments: tuple[ServeDeploymentDoc, ...] = ()
    unread_ray_nodes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DiscrepancyDoc:
    """A GPU's ledgers disagree: `kind` is allocated_unused or unallocated_use."""

    kind: str
    gpu_uuid: str
    namespace: str
    pod: str
    pod_uid: str
    container: str
    container_id: str
    workload: str


@dataclass(frozen=True, kw_only=True)
class RequestDoc:
    """One finished request, from its engine's `llm_request` span. Times are the
    engine's clock (Unix seconds); durations are the engine's own measurements."""

    request_id: str  # vLLM's gen_ai.request.id: cmpl-<X-Request-Id>-0
    trace_id: str
    span_id: str
    parent_span_id: str
    arrived_at: float
    finished_at: float
    queue_seconds: float | None = None
    ttft_seconds: float | None = None
    e2e_seconds: float | None = None
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    inference_seconds: float | None = None
    scheduler_seconds: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    max_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class EngineStateDoc:
    """An engine's state in one cycle, from its /metrics (the agent's clock)."""

    at: float
    up: bool
    running: float | None
    waiting: float | None
    waiting_by_reason: Mapping[str, float] = field(default_factory=dict)
    kv_cache_usage_ratio: float | None = None
    max_num_seqs: int | None = None


@dataclass(frozen=True, kw_only=True)
class SpanSenderDoc:
    """One process that sent request spans, the engine they were tied to and the rule
    that tied them (`joined_by`: peer_socket, k8s_pod_uid, peer_pod, host_pid; none
    with `untied_reason`)."""

    peer: str
    service_name: str
    instance_id: str
    process_id: int | None
    pod_uid: str = ""
    joined_by: str
    untied_reason: str = ""
    # The engine (EngineDoc's target, model_name, engine) when tied; "" otherwise.
    target: str = ""
    model_name: str = ""
    engine: str = ""
    received_total: int = 0
    recent: tuple[RequestDoc, ...] = ()  # newest last
    slowest: tuple[RequestDoc, ...] = ()  # slowest first
    states: tuple[EngineStateDoc, ...] = ()  # the tied engine's, oldest first


@dataclass(frozen=True, kw_only=True)
class RouterSpanDoc:
    """A router's span (Ray Serve, a gateway): ids, kind and times only."""

    service_name: str
    peer: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    started_at: float
    finished_at: float


@dataclass(frozen=True, kw_only=True)
class SpansDoc:
    """What the agent's span receiver holds; `receiving` is False when it is off."""

    receiving: bool = False
    senders: tuple[SpanSenderDoc, ...] = ()
    routers: tuple[RouterSpanDoc, ...] = ()
    refused_total: Mapping[str, int] = field(default_factory=dict)
    stored_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class PoolMemberDoc:
    """A pod an InferencePool's selector matches: an endpoint per target port."""

    uid: str
    name: str
    workload: str
    node: str | None
    pod_ip: str | None
    ready: bool


@dataclass(frozen=True, kw_only=True)
class PickerDoc:
    """What a pool's endpoint picker reported (tests/fixtures/gateway/README.md)."""

    url: str
    up: bool
    error_reason: str | None = None
    names: str | None = None  # llm_d_epp or legacy
    queued_requests: float | None = None  # None: flow control off
    queued_bytes: float | None = None
    ready_endpoints: float | None = None
    average_queue_size: float | None = None
    average_kv_cache_utilization: float | None = None
    saturation: float | None = None
    endpoint_queues: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class PoolDoc:
    """An InferencePool (cluster view): its selector, members and picker."""

    namespace: str
    name: str
    uid: str
    selector: Mapping[str, str] = field(default_factory=dict)
    target_ports: tuple[int, ...] = ()
    picker_service: str | None = None
    failure_mode: str | None = None
    accepted: str | None = None
    members_error: str | None = None
    members: tuple[PoolMemberDoc, ...] = ()
    picker: PickerDoc | None = None


@dataclass(frozen=True, kw_only=True)
class GatewayDoc:
    pools: tuple[PoolDoc, ...] = ()


@dataclass(frozen=True, kw_only=True)
class LedgerDocument:
    """/ledger.json. Only `schema` and `node` are required of a document read: a missing
    list is an empty one (an agent that has nothing of that kind)."""

    schema: str
    version: str = ""
    node: str
    mode: str = "node"
    taken_at: float = 0.0
    driver_version: str | None = None
    # True under `gpuledger demo` and `simulate`: not real hardware.
    simulated: bool = False
    sources: tuple[SourceDoc, ...] = ()
    unknowns: tuple[str, ...] = ()
    gpus: tuple[GpuDoc, ...] = ()
    containers: tuple[ContainerDoc, ...] = ()
    processes: tuple[ProcessDoc, ...] = ()
    pods: tuple[PodDoc, ...] = ()
    engines: tuple[EngineDoc, ...] = ()
    pending: tuple[PendingDoc, ...] = ()
    ray: RayDoc = field(default_factory=RayDoc)
    serve: ServeDoc = field(default_factory=ServeDoc)
    discrepancies: tuple[DiscrepancyDoc, ...] = ()
    spans: SpansDoc = field(default_factory=SpansDoc)
    gateway: GatewayDoc = field(default_factory=GatewayDoc)
