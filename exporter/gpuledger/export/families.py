# ruff: noqa: RUF001, RUF003 - the docs' text: typographic × and – as docs/*.md write them
"""Every metric family the exporter writes, declared once, as data (kube-state-metrics
style): name, type, help, labels, stability, the Ledger field its rows come from, the
per-node cap that bounds them (ledger/caps.py) and its series budget.

The collector builds its families from these declarations and nothing else names a family;
`docs/metrics.md`'s tables and `docs/scaling.md`'s budget tables are rendered from them
(scripts/render-metrics-docs; tests/unit/test_metrics_reference.py fails when they differ).
Adding a family is one `declare(...)` here and its rows in the collector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from gpuledger.ledger import caps

Kind = Literal["gauge", "counter", "info", "stateset", "histogram"]
# On the wire (text format 0.0.4) info and state-set families are gauges: an info family
# is one series valued 1 per identity, a state set one series per state, exactly one 1.
GAUGE: Final[Kind] = "gauge"
COUNTER: Final[Kind] = "counter"
INFO: Final[Kind] = "info"
STATESET: Final[Kind] = "stateset"
# A histogram's series are its buckets, _sum and _count; its exemplars (OpenMetrics only)
# carry a trace id, never a label.
HISTOGRAM: Final[Kind] = "histogram"

Stability = Literal["stable", "experimental"]
STABLE: Final[Stability] = "stable"
EXPERIMENTAL: Final[Stability] = "experimental"

Mode = Literal["node", "cluster"]
NODE: Final[Mode] = "node"
CLUSTER: Final[Mode] = "cluster"

# docs/metrics.md's sections, each with its table of families.
Section = Literal[
    "gpus",
    "mig",
    "containers",
    "kubernetes",
    "pending",
    "dra",
    "engines",
    "ray",
    "serve",
    "gateway",
    "self",
]
GPUS: Final[Section] = "gpus"
MIG: Final[Section] = "mig"
CONTAINERS: Final[Section] = "containers"
KUBERNETES: Final[Section] = "kubernetes"
PENDING: Final[Section] = "pending"
DRA: Final[Section] = "dra"
ENGINES: Final[Section] = "engines"
RAY: Final[Section] = "ray"
SERVE: Final[Section] = "serve"
GATEWAY: Final[Section] = "gateway"
SELF: Final[Section] = "self"

# A family's labels start with these; docs/metrics.md names the prefix once.
ENGINE_LABELS: Final = ("namespace", "pod", "pod_uid", "workload", "model_name", "engine", "target")


@dataclass(frozen=True)
class Budget:
    """A family's series bound in one mode (docs/scaling.md, "Series budget per node")."""

    mode: Mode
    bound: str  # the formula, e.g. "G + M", "2 × 256"
    bounded_by: str  # what bounds it
    worst: int  # series at most, on the worst case node


@dataclass(frozen=True)
class FamilySpec:
    name: str  # as exposed: a counter's ends in _total
    kind: Kind
    section: Section
    help: str  # the exposition's HELP
    labels: tuple[str, ...]  # beyond `node`, in exposition order
    stability: Stability
    # The Ledger field its rows come from (or Published's, for the exporter's own counters).
    rows: str
    budget: tuple[Budget, ...]
    meaning: str  # docs/metrics.md's cell (Markdown)
    # Keyed by gpu_uuid: a MIG device's series also carry parent_gpu_uuid.
    device: bool = False
    # The caps.py constant that bounds its rows; past it rows are counted as dropped.
    cap: str | None = None
    # A repeated identity (a driver repeating a GPU UUID) is dropped and counted.
    repeats: bool = False

    @property
    def wire_type(self) -> Literal["gauge", "counter", "histogram"]:
        if self.kind in (COUNTER, HISTOGRAM):
            return "counter" if self.kind == COUNTER else "histogram"
        return "gauge"

    @property
    def dropped(self) -> bool:
        """Whether gpuledger_series_dropped_total{family} can count this family."""
        return self.cap is not None or self.repeats

    @property
    def cap_value(self) -> int | None:
        return None if self.cap is None else int(getattr(caps, self.cap))

    @property
    def modes(self) -> tuple[Mode, ...]:
        return tuple(b.mode for b in self.budget)


_DECLARED: list[FamilySpec] = []


def declare(
    name: str,
    kind: Kind,
    section: Section,
    *,
    help: str,
    labels: tuple[str, ...],
    stability: Stability,
    rows: str,
    budget: tuple[Budget, ...],
    meaning: str,
    device: bool = False,
    cap: str | None = None,
    repeats: bool = False,
) -> FamilySpec:
    spec = FamilySpec(
        name, kind, section, help, labels, stability, rows, budget, meaning, device, cap, repeats
    )
    if cap is not None and not isinstance(getattr(caps, cap, None), int):
        raise ValueError(f"{name}: {cap} is not a cap in ledger/caps.py")
    if any(f.name == name for f in _DECLARED):
        raise ValueError(f"{name} declared twice")
    _DECLARED.append(spec)
    return spec


def dropped_budget() -> tuple[Budget, ...]:
    """gpuledger_series_dropped_total's bound: one series per family declared so far that
    a cap or a repeated identity can bite, per mode."""
    found = []
    for mode in (NODE, CLUSTER):
        count = sum(1 for f in _DECLARED if f.dropped and mode in f.modes)
        what = f"the {count} {mode}-mode families a cap or a repeated identity can bite"
        found.append(Budget(mode, "families", what, count))
    return tuple(found)


GPU_INFO: Final = declare(
    "gpuledger_gpu_info",
    INFO,
    GPUS,
    help="One per GPU: identity attributes. Join on gpu_uuid; gpu_index is host-local.",
    labels=("gpu_uuid", "gpu_index", "model", "pci_bus_id", "mig_mode"),
    stability=STABLE,
    rows="gpus",
    repeats=True,
    budget=(
        Budget(NODE, "G", "NVML's device count; one per UUID (a repeated UUID is dropped)", 16),
    ),
    meaning="1 per GPU. `mig_mode` is `enabled`, `disabled` or `unsupported`.",
)

GPU_UP: Final = declare(
    "gpuledger_gpu_up",
    GAUGE,
    GPUS,
    help="1 if every NVML query for this GPU succeeded.",
    labels=("gpu_uuid",),
    stability=STABLE,
    rows="gpus",
    device=True,
    repeats=True,
    budget=(Budget(NODE, "G + M", "GPUs and MIG devices", 128),),
    meaning=(
        "1 when every NVML query for this GPU succeeded; 0 when NVML answers e.g. "
        "`GPU_IS_LOST` for it. The GPU keeps its `_info` (static facts survive) and loses"
        " its memory/utilization series."
    ),
)

GPU_MEMORY_TOTAL_BYTES: Final = declare(
    "gpuledger_gpu_memory_total_bytes",
    GAUGE,
    GPUS,
    help="GPU memory size (NVML).",
    labels=("gpu_uuid",),
    stability=STABLE,
    rows="gpus",
    device=True,
    repeats=True,
    budget=(Budget(NODE, "G + M", "as above", 128),),
    meaning="Device memory (NVML memory info v2 where the driver has it, v1 otherwise).",
)

GPU_MEMORY_USED_BYTES: Final = declare(
    "gpuledger_gpu_memory_used_bytes",
    GAUGE,
    GPUS,
    help="GPU memory in use (NVML).",
    labels=("gpu_uuid",),
    stability=STABLE,
    rows="gpus",
    device=True,
    repeats=True,
    budget=(Budget(NODE, "G + M", "as above", 128),),
    meaning="Device memory in use (v2 excludes driver-reserved memory).",
)

GPU_UTILIZATION_RATIO: Final = declare(
    "gpuledger_gpu_utilization_ratio",
    GAUGE,
    GPUS,
    help="Fraction of the last sample period a kernel ran on the GPU (NVML), 0-1.",
    labels=("gpu_uuid",),
    stability=STABLE,
    rows="gpus",
    repeats=True,
    budget=(Budget(NODE, "G", "GPUs (NVML has none for MIG devices)", 16),),
    meaning=(
        "Fraction of the last sample period in which a kernel ran. Absent where NVML does"
        " not support it (MIG-enabled GPUs)."
    ),
)

MIG_DEVICE_INFO: Final = declare(
    "gpuledger_mig_device_info",
    INFO,
    MIG,
    help=(
        "One per MIG device (gpu_uuid: its MIG UUID) of a GPU in MIG mode: its GPU, MIG "
        "device index, GPU and compute instance ids and profile."
    ),
    labels=(
        "gpu_uuid",
        "parent_gpu_uuid",
        "mig_index",
        "gpu_instance_id",
        "compute_instance_id",
        "profile",
    ),
    stability=EXPERIMENTAL,
    rows="gpus",
    repeats=True,
    budget=(Budget(NODE, "M", "MIG devices, 7 per GPU at most", 112),),
    meaning=(
        "1 per MIG device. `profile` is NVML's name for its shape (`1g.10gb`, `3g.40gb`, "
        "`1c.3g.40gb`, as in `nvidia.com/mig-<profile>`); `mig_index` is what "
        "`nvmlDeviceGetMigDeviceHandleByIndex` and the toolkit's `<gpu>:<mig>` take; the "
        "instance ids are what `nvidia-smi` shows as GI and CI. Present only where a GPU "
        'has MIG devices (the GPU\'s own `gpuledger_gpu_info` says `mig_mode="enabled"`).'
    ),
)

CONTAINER_GPU_MEMORY_USED_BYTES: Final = declare(
    "gpuledger_container_gpu_memory_used_bytes",
    GAUGE,
    CONTAINERS,
    help="GPU memory held by a container's processes on one GPU (NVML per-process, summed).",
    labels=("gpu_uuid", "namespace", "pod", "pod_uid", "container", "workload"),
    stability=STABLE,
    rows="usage",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS` (container, GPU)", 1024),),
    meaning=(
        "NVML per-process GPU memory summed over the container's processes (process → pod"
        " by `/proc/<pid>/cgroup`). Two pods time-slicing one GPU get one series each."
    ),
)

CONTAINER_GPU_PROCESSES: Final = declare(
    "gpuledger_container_gpu_processes",
    GAUGE,
    CONTAINERS,
    help="Processes of a container holding a context on one GPU.",
    labels=("gpu_uuid", "namespace", "pod", "pod_uid", "container", "workload"),
    stability=STABLE,
    rows="usage",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS` (container, GPU)", 1024),),
    meaning="Processes of that container holding a context on that GPU.",
)

UNATTRIBUTED_GPU_MEMORY_USED_BYTES: Final = declare(
    "gpuledger_unattributed_gpu_memory_used_bytes",
    GAUGE,
    CONTAINERS,
    help="GPU memory held by processes that belong to no pod (host processes).",
    labels=("gpu_uuid",),
    stability=STABLE,
    rows="unattributed",
    device=True,
    budget=(Budget(NODE, "G + M", "one per device, however many host processes", 128),),
    meaning=(
        "GPU memory of processes that are in no pod (host processes). One series per GPU,"
        " 0 when none. Absent when `procfs` is down. A process NVML lists but procfs "
        "cannot read (it exited meanwhile) is counted neither here nor on a container."
    ),
)

CONTAINER_DEVICE_INFO: Final = declare(
    "gpuledger_container_device_info",
    INFO,
    CONTAINERS,
    help="Container ordinal local_index (CUDA device N inside the container) is host GPU gpu_uuid.",
    labels=("namespace", "pod", "pod_uid", "container", "local_index", "gpu_uuid", "source"),
    stability=EXPERIMENTAL,
    rows="device_maps",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS` (container, ordinal)", 1024),),
    meaning=(
        "1: ordinal `local_index` inside the container (what CUDA calls device N there, "
        "before the process's own `CUDA_VISIBLE_DEVICES`) is host GPU `gpu_uuid`. "
        '`source="env"`: from `NVIDIA_VISIBLE_DEVICES` of the outermost container process'
        " that carries it, ordered as CUDA enumerates (PCI bus order). "
        '`source="podresources"` (the Kubernetes layer): the GPUs PodResources allocated,'
        ' in CUDA enumeration order (PCI bus order); wins over `source="env"` for the '
        "same container. The kubelet's own list order is not the order CUDA numbers "
        "devices in."
    ),
)

GPU_ALLOCATION_INFO: Final = declare(
    "gpuledger_gpu_allocation_info",
    INFO,
    KUBERNETES,
    help="1: the kubelet (PodResources) says this container holds this GPU.",
    labels=("gpu_uuid", "namespace", "pod", "pod_uid", "container", "resource"),
    stability=STABLE,
    rows="allocations",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(
        Budget(
            NODE,
            "1,024",
            "`MAX_GPU_ROWS` PodResources allocations (replicas of a GPU count once)",
            1024,
        ),
    ),
    meaning=(
        "1: the kubelet (PodResources `List`) says this container holds this GPU. "
        "Time-slicing replicas (`GPU-…::N`) of one GPU in one container count once; two "
        "pods sharing a GPU get one series each. Pods the API reports "
        "`Succeeded`/`Failed` (old kubelets still list them) and pods the API no longer "
        "has are left out. `pod_uid` is empty only while the `kubernetes` source is down."
    ),
)

DRA_ALLOCATION_INFO: Final = declare(
    "gpuledger_dra_allocation_info",
    INFO,
    KUBERNETES,
    help="1: this container holds this GPU through a DRA ResourceClaim (dcgm-exporter's labels).",
    labels=(
        "gpu_uuid",
        "namespace",
        "pod",
        "pod_uid",
        "container",
        "dra_claim_namespace",
        "dra_claim_name",
        "dra_driver_name",
        "dra_pool_name",
        "dra_device_name",
        "dra_share_id",
    ),
    stability=EXPERIMENTAL,
    rows="allocations",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS` allocations, those made through a claim", 1024),),
    meaning=(
        "1 for each allocation of `gpuledger_gpu_allocation_info` made through a Kubernetes "
        "DRA ResourceClaim (PodResources `dynamic_resources`, kubelet 1.34), its GPU or MIG "
        "UUID resolved through the node's `resource.k8s.io/v1` ResourceSlices (the NVIDIA "
        "DRA driver's `uuid` attribute); the allocation family's `resource` is then the "
        "driver. The claim and device labels are named as dcgm-exporter's; several pods "
        "sharing a claim get one series each; `dra_share_id` is empty unless the kubelet "
        "names a share. A device no slice names yet is in the ledger's unknowns, and its "
        "container is not judged for unallocated use. Absent on nodes without DRA "
        "allocations. Device plugin alone: `gpuledger_gpu_allocation_info unless on "
        "(gpu_uuid, pod_uid, container) gpuledger_dra_allocation_info`."
    ),
)


GPU_ALLOCATED_UNUSED: Final = declare(
    "gpuledger_gpu_allocated_unused",
    GAUGE,
    KUBERNETES,
    help="1: GPU allocated to the container, but none of its processes has a context on it.",
    labels=("gpu_uuid", "namespace", "pod", "pod_uid", "container", "workload"),
    stability=STABLE,
    rows="discrepancies",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS`", 1024),),
    meaning=(
        "1: allocated to the container but none of its processes has a context on the GPU"
        " (a pod holding a card it never opens); 0: in use. Only where allocation, pods "
        "and processes are all known this cycle."
    ),
)

GPU_UNALLOCATED_USE: Final = declare(
    "gpuledger_gpu_unallocated_use",
    GAUGE,
    KUBERNETES,
    help="1: a container's process uses this GPU although it is not allocated to it.",
    labels=("gpu_uuid", "namespace", "pod", "pod_uid", "container", "workload"),
    stability=STABLE,
    rows="discrepancies",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS`", 1024),),
    meaning=(
        "1: a container's process uses this GPU but it is not allocated to that container"
        " (an image with `NVIDIA_VISIBLE_DEVICES=all`, a privileged pod); 0: allocated. "
        "Only for containers the API names, while PodResources is up."
    ),
)

POD_STARTING: Final = declare(
    "gpuledger_pod_starting",
    GAUGE,
    KUBERNETES,
    help="1: a GPU pod on this node is placed but not Ready yet (pulling, loading the model).",
    labels=("namespace", "pod", "pod_uid", "workload"),
    stability=EXPERIMENTAL,
    rows="pods",
    cap="MAX_GPU_PODS",
    budget=(Budget(NODE, "256", "`MAX_GPU_PODS`", 256),),
    meaning=(
        "Pods on this node that request GPUs: 1 while placed but not Ready (pulling the "
        "image, loading the model), 0 once Ready."
    ),
)

POD_PENDING_PLACEMENT: Final = declare(
    "gpuledger_pod_pending_placement",
    GAUGE,
    PENDING,
    help="1 per pod the scheduler has not placed (PodScheduled=False), by dominant reason.",
    labels=("namespace", "pod", "pod_uid", "workload", "reason"),
    stability=STABLE,
    rows="pending",
    cap="MAX_PENDING_PODS",
    budget=(Budget(CLUSTER, "10,000", "`MAX_PENDING_PODS`, one reason each", 10000),),
    meaning=(
        "1 per pod requesting GPUs with `PodScheduled=False`. `reason`: "
        "`scheduling_gated` (e.g. Kueue has not admitted it), or the dominant cause in "
        "the scheduler's `Unschedulable` message: `insufficient_gpu`, the DRA causes "
        "`claim_unallocatable`, `device_class_missing`, `claim_deleting`, `claim_in_use`, "
        "`claim_allocating` (kube-scheduler 1.34 `DynamicResources`), then "
        "`node_selector`, `affinity`, `taint`, `other`. A pod's GPUs include those its "
        "ResourceClaims ask of a GPU device class (`--dra-device-class`)."
    ),
)

POD_PENDING_GPUS: Final = declare(
    "gpuledger_pod_pending_gpus",
    GAUGE,
    PENDING,
    help="GPUs an unplaced pod requests.",
    labels=("namespace", "pod", "pod_uid", "workload"),
    stability=STABLE,
    rows="pending",
    cap="MAX_PENDING_PODS",
    budget=(Budget(CLUSTER, "10,000", "`MAX_PENDING_PODS`", 10000),),
    meaning="GPUs the unplaced pod requests (sum of container limits of the GPU resources).",
)

POD_PENDING_SINCE_TIMESTAMP_SECONDS: Final = declare(
    "gpuledger_pod_pending_since_timestamp_seconds",
    GAUGE,
    PENDING,
    help="When PodScheduled became False for an unplaced pod (Unix time).",
    labels=("namespace", "pod", "pod_uid", "workload"),
    stability=STABLE,
    rows="pending",
    cap="MAX_PENDING_PODS",
    budget=(Budget(CLUSTER, "10,000", "`MAX_PENDING_PODS`", 10000),),
    meaning="When `PodScheduled` became False (Unix time).",
)

DRA_NODE_GPU_DEVICES: Final = declare(
    "gpuledger_dra_node_gpu_devices",
    GAUGE,
    DRA,
    help="GPU and MIG devices a GPU DRA driver's ResourceSlices publish on a node.",
    labels=("dra_node", "dra_driver_name"),
    stability=EXPERIMENTAL,
    rows="dra_nodes",
    cap="MAX_DRA_NODES",
    budget=(Budget(CLUSTER, "5,000", "`MAX_DRA_NODES` (node, driver)", 5000),),
    meaning=(
        "Devices with a `uuid` attribute (GPUs, MIG devices) that the `resource.k8s.io/v1` "
        "ResourceSlices of a GPU DRA driver (`--dra-driver`) publish on node `dra_node` "
        "(the slices' `spec.nodeName`; `node` is the cluster agent's, as on every series), "
        "counting each pool's newest generation only. kube-state-metrics has no "
        "ResourceSlice series: this is how `GpuLedgerExporterDown` counts a node whose "
        "GPUs only DRA publishes (no `nvidia.com/gpu` capacity) as a GPU node. Nodes "
        "without such devices have no series; all are absent while the slices cannot be "
        "listed (the `dra` source's errors count it, `/ledger.json`'s unknowns say so)."
    ),
)

INFERENCE_POOL_INFO: Final = declare(
    "gpuledger_inference_pool_info",
    INFO,
    GATEWAY,
    help="1 per InferencePool (Gateway API Inference Extension): its endpoint picker.",
    labels=("namespace", "pool", "pool_uid", "picker_service", "failure_mode"),
    stability=EXPERIMENTAL,
    rows="pools",
    cap="MAX_POOLS",
    budget=(Budget(CLUSTER, "1,000", "`MAX_POOLS`", 1000),),
    meaning=(
        "One series per `inference.networking.k8s.io/v1` InferencePool the cluster view "
        "lists. `picker_service`: the Service its `endpointPickerRef` names (empty: none); "
        "`failure_mode`: `FailOpen` or `FailClose`, what the gateway does when the picker "
        "does not answer. A pool with this series and no `gpuledger_inference_pool_member` "
        "of value 1 has no ready endpoint: `GpuLedgerInferencePoolNoReadyEndpoints`."
    ),
)

INFERENCE_POOL_MEMBER: Final = declare(
    "gpuledger_inference_pool_member",
    GAUGE,
    GATEWAY,
    help="1 for a Ready pod an InferencePool's selector matches, 0 for one not Ready.",
    labels=("namespace", "pool", "pod", "pod_uid", "workload"),
    stability=EXPERIMENTAL,
    rows="pool_members",
    cap="MAX_POOL_MEMBERS",
    budget=(Budget(CLUSTER, "10,000", "`MAX_POOL_MEMBERS` (pool, pod)", 10000),),
    meaning=(
        "The model-server pods of the pool (`spec.selector.matchLabels`, the pool's "
        "namespace; terminating pods left out), each an endpoint per target port. Joined "
        "to the node agents' engine series on `pod_uid`: the engines of a pool, and the "
        "pool of an engine. 1 while the pod is Ready (the picker may send to it)."
    ),
)

GATEWAY_PICKER_UP: Final = declare(
    "gpuledger_gateway_picker_up",
    GAUGE,
    GATEWAY,
    help="1 if the last read of this pool's endpoint picker metrics succeeded.",
    labels=("namespace", "pool"),
    stability=EXPERIMENTAL,
    rows="pools",
    cap="MAX_POOLS",
    budget=(Budget(CLUSTER, "1,000", "`MAX_POOLS`", 1000),),
    meaning=(
        "Per pool with an endpoint picker: whether its `/metrics` (the picker Service's "
        "`http-metrics` port, or `--gateway-picker-url`) answered within the deadline and "
        "caps. A picker that fails costs only its own series: the reason is counted in "
        '`gpuledger_source_errors_total{source="picker"}`.'
    ),
)

GATEWAY_QUEUED_REQUESTS: Final = declare(
    "gpuledger_gateway_queued_requests",
    GAUGE,
    GATEWAY,
    help="Requests the pool's endpoint picker holds in its flow-control queue.",
    labels=("namespace", "pool"),
    stability=EXPERIMENTAL,
    rows="pools",
    cap="MAX_POOLS",
    budget=(Budget(CLUSTER, "1,000", "`MAX_POOLS`", 1000),),
    meaning=(
        "The picker's `llm_d_epp_flow_control_queue_size` (or "
        "`inference_extension_flow_control_queue_size`) summed over fairness ids, "
        "priorities and models: requests that reached the gateway and were sent to no "
        "engine yet. Absent while the picker is down or its flow control is off (the "
        "`flowControl` feature gate, off by default upstream: requests then wait nowhere "
        "in the picker). Held while an engine of the workload has headroom is stage "
        "`routing`, reason `gateway_queue`."
    ),
)

GATEWAY_READY_ENDPOINTS: Final = declare(
    "gpuledger_gateway_picker_ready_endpoints",
    GAUGE,
    GATEWAY,
    help="Endpoints the pool's picker counts ready (metrics fresh enough to pick them).",
    labels=("namespace", "pool"),
    stability=EXPERIMENTAL,
    rows="pools",
    cap="MAX_POOLS",
    budget=(Budget(CLUSTER, "1,000", "`MAX_POOLS`", 1000),),
    meaning=(
        "The picker's own count (`llm_d_epp_ready_endpoints`, `inference_pool_ready_pods`"
        "): endpoints whose metrics it read recently. Fewer than the Ready members "
        "(`gpuledger_inference_pool_member`) means the picker cannot read some engines' "
        "metrics and will not send to them."
    ),
)

GATEWAY_POOL_SATURATION: Final = declare(
    "gpuledger_gateway_pool_saturation",
    GAUGE,
    GATEWAY,
    help="How full the pool's picker judges the pool (flow control's saturation, 1 = full).",
    labels=("namespace", "pool"),
    stability=EXPERIMENTAL,
    rows="pools",
    cap="MAX_POOLS",
    budget=(Budget(CLUSTER, "1,000", "`MAX_POOLS`", 1000),),
    meaning=(
        "`llm_d_epp_flow_control_pool_saturation` (`inference_extension_flow_control_pool_"
        "saturation`): at 1 and above the picker holds new requests. Absent where flow "
        "control is off."
    ),
)

ENGINE_UP: Final = declare(
    "gpuledger_engine_up",
    GAUGE,
    ENGINES,
    help="1 if the last scrape of this vLLM engine succeeded.",
    labels=("namespace", "pod", "pod_uid", "workload", "model_name", "engine", "target"),
    stability=STABLE,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "256", "`MAX_ENGINES`", 256),),
    meaning=(
        "1 if the last scrape succeeded. A target that stops answering keeps the "
        "`model_name`/`engine` it last served, with 0; one never seen answers with empty "
        "`model_name` and `engine`."
    ),
)

ENGINE_REQUESTS: Final = declare(
    "gpuledger_engine_requests",
    GAUGE,
    ENGINES,
    help="Requests in the engine: running (in this step's batch) or waiting (queued).",
    labels=("namespace", "pod", "pod_uid", "workload", "model_name", "engine", "target", "state"),
    stability=STABLE,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "2 × 256", "`state`: running, waiting", 512),),
    meaning=(
        '`vllm:num_requests_running` (`state="running"`) and `vllm:num_requests_waiting` '
        '(`state="waiting"`).'
    ),
)

ENGINE_REQUESTS_WAITING_BY_REASON: Final = declare(
    "gpuledger_engine_requests_waiting_by_reason",
    GAUGE,
    ENGINES,
    help="Waiting requests by the engine's reason (vLLM 0.20+: capacity, deferred).",
    labels=("namespace", "pod", "pod_uid", "workload", "model_name", "engine", "target", "reason"),
    stability=EXPERIMENTAL,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "16 × 256", "`MAX_WAITING_REASONS` per engine", 4096),),
    meaning=(
        "`vllm:num_requests_waiting_by_reason` where the engine exposes it (0.20+): "
        "`capacity` (no KV-cache room / `max_num_seqs`) and `deferred`."
    ),
)

ENGINE_KV_CACHE_USAGE_RATIO: Final = declare(
    "gpuledger_engine_kv_cache_usage_ratio",
    GAUGE,
    ENGINES,
    help="Fraction of KV-cache blocks in use, 0-1.",
    labels=("namespace", "pod", "pod_uid", "workload", "model_name", "engine", "target"),
    stability=STABLE,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "256", "`MAX_ENGINES`", 256),),
    meaning=(
        "`vllm:kv_cache_usage_perc` (`vllm:gpu_cache_usage_perc` on older engines); both are 0–1."
    ),
)

ENGINE_PREEMPTIONS: Final = declare(
    "gpuledger_engine_preemptions_total",
    COUNTER,
    ENGINES,
    help="Requests the engine preempted (vllm:num_preemptions_total).",
    labels=("namespace", "pod", "pod_uid", "workload", "model_name", "engine", "target"),
    stability=STABLE,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "256", "`MAX_ENGINES`", 256),),
    meaning="`vllm:num_preemptions_total`.",
)

ENGINE_CONFIG_INFO: Final = declare(
    "gpuledger_engine_config_info",
    INFO,
    ENGINES,
    help="1: the engine's configuration (whitelisted API-server flags and cache config).",
    labels=(
        "namespace",
        "pod",
        "pod_uid",
        "workload",
        "model_name",
        "engine",
        "target",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "max_num_seqs",
        "num_gpu_blocks",
        "block_size",
        "engine_kind",
    ),
    stability=EXPERIMENTAL,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "256", "one per engine", 256),),
    meaning=(
        "1. `engine_kind`: the engine kind that answered (`vllm`, `sglang`; empty while a target of"
        " unknown kind has never answered). Parallelism and `max_num_seqs` from the"
        " whitelisted flags of the API server's command line (the kind's default, vLLM's"
        " `1`, for an absent parallelism flag; empty "
        "`max_num_seqs` when absent); `num_gpu_blocks`/`block_size` from "
        "`vllm:cache_config_info`. Empty when the API server process is not found."
    ),
)

ENGINE_GPUS: Final = declare(
    "gpuledger_engine_gpus",
    GAUGE,
    ENGINES,
    help=(
        "GPUs of one engine: configured (tensor x pipeline parallel size from its flags) "
        "and in_use (distinct GPUs its processes hold, NVML)."
    ),
    labels=("namespace", "pod", "pod_uid", "workload", "model_name", "engine", "target", "state"),
    stability=EXPERIMENTAL,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "2 × 256", "`state`: configured, in_use", 512),),
    meaning=(
        '`state="configured"`: `tensor_parallel_size × pipeline_parallel_size` from the '
        "API server's flags; `state=\"in_use\"`: distinct GPUs the engine's processes hold "
        "(NVML). Numbers, so an alert can compare them (a TP=4 engine on 2 GPUs). Absent "
        "when the engine's processes are not found."
    ),
)

ENGINE_MAX_NUM_SEQS: Final = declare(
    "gpuledger_engine_max_num_seqs",
    GAUGE,
    ENGINES,
    help="The engine's --max-num-seqs: requests one step may batch; absent when not set.",
    labels=("namespace", "pod", "pod_uid", "workload", "model_name", "engine", "target"),
    stability=EXPERIMENTAL,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "256", "`MAX_ENGINES`", 256),),
    meaning=(
        "`--max-num-seqs` from the API server's command line, as a number to compare with"
        " running requests; absent when the flag is not set (vLLM's default differs by "
        "version and hardware, so it is not guessed)."
    ),
)

ENGINE_GPU_INFO: Final = declare(
    "gpuledger_engine_gpu_info",
    INFO,
    ENGINES,
    help="1: a process of the engine (role engine_core or worker, rank) holds this GPU.",
    labels=(
        "namespace",
        "pod",
        "pod_uid",
        "workload",
        "model_name",
        "engine",
        "target",
        "gpu_uuid",
        "role",
        "rank",
    ),
    stability=EXPERIMENTAL,
    rows="engines",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS` (engine, GPU, role, rank)", 1024),),
    meaning=(
        "1: a process of the engine holds this GPU (NVML). `role`: `engine_core` "
        "(`VLLM::EngineCore[_DP<r>]`; with one GPU the model runs there) or `worker` "
        "(`VLLM::Worker[_DP<r>][_PP<p>][_TP<t>]`); `rank` = `pp * tensor_parallel_size + "
        "tp` (0 for engine_core). Left out when two API servers share a pod (or a host) "
        "and cannot be told apart."
    ),
)

ENGINE_GPU_LINK_WEAKEST: Final = declare(
    "gpuledger_engine_gpu_link_weakest",
    STATESET,
    ENGINES,
    help=(
        "1 for the weakest link among the engine's GPUs on this node (NVML topology: "
        "nvlink, internal, single, multiple, hostbridge, node, system, unknown), 0 for the "
        "others."
    ),
    labels=(*ENGINE_LABELS, "link"),
    stability=EXPERIMENTAL,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "8 × 256", "`link` (8 levels) per engine on two GPUs or more", 2048),),
    meaning=(
        "A state set, as kube-state-metrics' `kube_pod_status_phase`: eight series per "
        "engine whose processes hold two GPUs or more here, exactly one of them 1. The "
        "weakest pair of its GPUs sets a tensor-parallel engine's pace: `nvlink` (an active"
        " NVLink joins them, directly or through NVSwitches), else NVML's common ancestor "
        "(`nvmlDeviceGetTopologyCommonAncestor`): `internal` (one board), `single` (one "
        "PCIe switch), `multiple` (several switches), `hostbridge` (the PCIe host bridge), "
        "`node` (across host bridges of one NUMA node), `system` (across NUMA nodes, the "
        "CPU interconnect); `unknown` where NVML did not say for some pair (a call failed, "
        "or past the topology's share of the deadline), unless a known pair is already "
        '`system`. `{link="system"} == 1` finds TP engines whose GPUs meet only across '
        "the CPUs. Absent for an engine on one GPU or whose processes were not found."
    ),
)

ENGINE_RAY_JOB_INFO: Final = declare(
    "gpuledger_engine_ray_job_info",
    INFO,
    ENGINES,
    help=(
        "1: the engine's EngineCore is the driver of this Ray job; its workers are Ray "
        "actors on any node, reported there as gpuledger_ray_worker_info."
    ),
    labels=(
        "namespace",
        "pod",
        "pod_uid",
        "workload",
        "model_name",
        "engine",
        "target",
        "ray_job_id",
        "ray_driver_node_id",
    ),
    stability=EXPERIMENTAL,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "256", "one per engine", 256),),
    meaning=(
        "1: the engine runs on the Ray executor (`--distributed-executor-backend ray`) "
        "and its EngineCore is the driver of this Ray job. `ray_job_id` and "
        "`ray_driver_node_id` (the Ray node the driver runs on) are the engine's identity"
        " on every node ([design.md](design.md#identity-rules), rule 9): each node agent "
        "labels the worker actors on its own node with them "
        "(`gpuledger_ray_worker_info`), so one join gives the engine's footprint across "
        "nodes "
        "(`node_namespace_workload_pod_target_engine:gpuledger_ray_worker_gpus:count`, "
        "[promql.md](promql.md#a-ray-executor-engine-across-nodes)). For such an engine "
        '`gpuledger_engine_gpus{state="in_use"}` is absent (its GPUs are on other nodes '
        'too) and `state="configured"` comes from the API server\'s flags, else from the '
        "GPU bundles of the placement group its workers run in (TP × PP as vLLM asked "
        "Ray). Present on the engine's node only; absent while the Ray source is down."
    ),
)

ENGINE_RAY_WORKERS: Final = declare(
    "gpuledger_engine_ray_workers",
    GAUGE,
    ENGINES,
    help="The engine's Ray worker actors on every node, by state (Ray's view).",
    labels=("namespace", "pod", "pod_uid", "workload", "model_name", "engine", "target", "state"),
    stability=EXPERIMENTAL,
    rows="engines",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "5 × 256", "`state` (4 Ray states + `UNKNOWN`) per engine", 1280),),
    meaning=(
        "The engine's Ray worker actors on every node, by Ray's actor `state` (`ALIVE`, "
        "always present, `PENDING_CREATION`, `RESTARTING`, `DEPENDENCIES_UNREADY`, "
        "`UNKNOWN` for anything else). Absent while Ray's side of the job (its actors, "
        "its placement group) could not be read: `/ledger.json`'s `unknowns` says so."
    ),
)

RAY_NODE_GPUS: Final = declare(
    "gpuledger_ray_node_gpus",
    GAUGE,
    RAY,
    help=(
        "GPUs of a Ray node that is this pod: Ray's logical total and available, and the "
        "GPUs Kubernetes allocated to the pod (state=allocated)."
    ),
    labels=("namespace", "pod", "pod_uid", "ray_node_id", "state"),
    stability=EXPERIMENTAL,
    rows="ray",
    cap="MAX_RAY_NODES",
    budget=(Budget(NODE, "3 × 16", "`MAX_RAY_NODES` × `state` (total, available, allocated)", 48),),
    meaning=(
        "`total`/`available`: Ray's logical GPUs on a Ray node that is this pod "
        "(available from `/api/cluster_status`, which lags a few seconds); `allocated`: "
        "GPUs Kubernetes allocated to that pod (PodResources). `total > allocated` is a "
        "Ray node promising GPUs Kubernetes never gave it (`ray start --num-gpus` wrong, "
        "or double booking)."
    ),
)

RAY_ACTOR_GPUS: Final = declare(
    "gpuledger_ray_actor_gpus",
    GAUGE,
    RAY,
    help="Logical GPUs held (ALIVE) or asked (pending) by Ray actors on this Ray node.",
    labels=("namespace", "pod", "pod_uid", "workload", "class_name", "state"),
    stability=EXPERIMENTAL,
    rows="ray",
    cap="MAX_RAY_ACTOR_CLASSES",
    budget=(
        Budget(
            NODE,
            "16 × 65 × 5",
            (
                "`MAX_RAY_NODES` × (`MAX_RAY_ACTOR_CLASSES` + `_other`) × `state` (4 Ray "
                "states + `UNKNOWN`)"
            ),
            5200,
        ),
    ),
    meaning=(
        "Logical GPUs held (ALIVE) or asked by the actors on that Ray node. `state`: "
        "`ALIVE`, `PENDING_CREATION`, `RESTARTING`, `DEPENDENCIES_UNREADY`, or `UNKNOWN` "
        "for anything else Ray sends. At most 64 classes per Ray node "
        "(`MAX_RAY_ACTOR_CLASSES`), those holding the most GPUs; the rest are summed into"
        ' `class_name="_other"` here and in the two families below, so sums over classes '
        "stay right."
    ),
)

RAY_ACTORS_WITHOUT_GPU_MEMORY: Final = declare(
    "gpuledger_ray_actors_without_gpu_memory",
    GAUGE,
    RAY,
    help="ALIVE Ray actors with num_gpus > 0 whose process holds no GPU memory (NVML).",
    labels=("namespace", "pod", "pod_uid", "workload", "class_name"),
    stability=EXPERIMENTAL,
    rows="ray",
    cap="MAX_RAY_ACTOR_CLASSES",
    budget=(Budget(NODE, "16 × 65", "as above, ALIVE only", 1040),),
    meaning=(
        "ALIVE actors with `num_gpus > 0` whose process holds no GPU memory: Ray counts "
        "the GPU as used, the card does not."
    ),
)

RAY_ACTOR_GPU_MEMORY_USED_BYTES: Final = declare(
    "gpuledger_ray_actor_gpu_memory_used_bytes",
    GAUGE,
    RAY,
    help="GPU memory held by Ray actors' processes (actor PID -> host PID by NSpid -> NVML).",
    labels=("gpu_uuid", "namespace", "pod", "pod_uid", "class_name"),
    stability=EXPERIMENTAL,
    rows="ray",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS` (Ray node, class, GPU)", 1024),),
    meaning=(
        "Physical memory of actor processes: Ray's PID (in the pod's namespace) → host "
        "PID by `NSpid` → NVML. Ray sets `CUDA_VISIBLE_DEVICES` inside the worker after "
        "start, so NVML by PID is the only reliable physical view."
    ),
)

RAY_WORKER_INFO: Final = declare(
    "gpuledger_ray_worker_info",
    INFO,
    RAY,
    help=(
        "1 per vLLM worker actor (RayWorkerProc, RayWorkerWrapper) on this node's Ray "
        "nodes whose process was looked up in NVML; ranks from its name (empty for the "
        "legacy executor), bundle_index its placement group bundle."
    ),
    labels=(
        "namespace",
        "pod",
        "pod_uid",
        "workload",
        "ray_job_id",
        "ray_driver_node_id",
        "class_name",
        "bundle_index",
        "tp_rank",
        "pp_rank",
    ),
    stability=EXPERIMENTAL,
    rows="ray",
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS` vLLM Ray workers (one label set each)", 1024),),
    meaning=(
        "1 per vLLM worker actor (ALIVE, of a RUNNING job) on a Ray node that is a pod "
        "here: `class_name` `RayWorkerProc` (vLLM's RayExecutorV2) or `RayWorkerWrapper` "
        "(the legacy executor); `ray_job_id`, `ray_driver_node_id` its engine's identity "
        "on every node (the engine's own node agent has the same pair on "
        "`gpuledger_engine_ray_job_info`); `tp_rank`/`pp_rank` from the actor name "
        "`vllm_Worker_<instance>_TP<t>[_PP<p>]` (empty for the legacy executor, whose "
        "unnamed workers vLLM ranks by sorting their IPs); `bundle_index` its placement "
        "group bundle. Present only where procfs and NVML are up (its process was looked "
        "up); a worker whose process holds no GPU has no memory series."
    ),
)

RAY_ENGINE_GPU_LINK_WEAKEST: Final = declare(
    "gpuledger_ray_engine_gpu_link_weakest",
    STATESET,
    RAY,
    help=(
        "1 for the weakest link among the GPUs a Ray-executor engine's workers hold on "
        "this Ray node (NVML topology), 0 for the others."
    ),
    labels=(
        "namespace",
        "pod",
        "pod_uid",
        "workload",
        "ray_job_id",
        "ray_driver_node_id",
        "link",
    ),
    stability=EXPERIMENTAL,
    rows="ray",
    cap="MAX_ENGINES",
    budget=(Budget(NODE, "8 × 256", "`link` (8 levels) per (Ray node, engine)", 2048),),
    meaning=(
        "As `gpuledger_engine_gpu_link_weakest`, for an engine on the Ray executor: its "
        "ranks on each node are its worker actors there (`gpuledger_ray_worker_info`), "
        "their GPUs by NVML PID, and the weakest pair of them. Eight series per Ray node "
        "(a pod here) and engine (`ray_job_id`, `ray_driver_node_id`) whose workers hold "
        "two GPUs or more on it, exactly one 1. Pairs across nodes go over the network, "
        "which NVML does not see."
    ),
)

RAY_WORKER_GPU_MEMORY_USED_BYTES: Final = declare(
    "gpuledger_ray_worker_gpu_memory_used_bytes",
    GAUGE,
    RAY,
    help="GPU memory a vLLM Ray worker's process holds (NVML by PID), per GPU.",
    labels=(
        "gpu_uuid",
        "namespace",
        "pod",
        "pod_uid",
        "ray_job_id",
        "ray_driver_node_id",
        "bundle_index",
        "tp_rank",
        "pp_rank",
    ),
    stability=EXPERIMENTAL,
    rows="ray",
    device=True,
    cap="MAX_GPU_ROWS",
    budget=(Budget(NODE, "1,024", "`MAX_GPU_ROWS` (worker, GPU)", 1024),),
    meaning=(
        "GPU memory a vLLM Ray worker's process holds per GPU (actor PID → host PID by "
        "`NSpid` → NVML, as `gpuledger_ray_actor_gpu_memory_used_bytes`): the engine's "
        "memory per rank, and, counted by (`node`, `gpu_uuid`), the GPUs it holds."
    ),
)

RAY_PLACEMENT_GROUPS: Final = declare(
    "gpuledger_ray_placement_groups",
    GAUGE,
    RAY,
    help=(
        "Ray placement groups by state and scheduling state (NO_RESOURCES waits for "
        "resources others hold; INFEASIBLE never fits the cluster)."
    ),
    labels=("namespace", "workload", "state", "scheduling_state"),
    stability=EXPERIMENTAL,
    rows="ray_cluster",
    budget=(
        Budget(
            CLUSTER,
            "6 × 9",
            "Ray's 5 group states + `UNKNOWN` × its 7 scheduling states + empty + `UNKNOWN`",
            54,
        ),
    ),
    meaning=(
        "Cluster mode: placement groups by `state` and `stats.scheduling_state` "
        "(`NO_RESOURCES`: waits for resources others hold; `INFEASIBLE`: never fits this "
        "cluster). Both are Ray's enums; another value reads `UNKNOWN`, an absent "
        "scheduling state is empty."
    ),
)

RAY_PENDING_GPUS: Final = declare(
    "gpuledger_ray_pending_gpus",
    GAUGE,
    RAY,
    help="GPUs asked by Ray work that is not placed: placement groups and actors.",
    labels=("namespace", "workload", "kind"),
    stability=EXPERIMENTAL,
    rows="ray_cluster",
    budget=(Budget(CLUSTER, "2", "`kind`: placement_group, actor", 2),),
    meaning=(
        'Cluster mode: GPUs asked by Ray work not placed: `kind="placement_group"` '
        '(PENDING groups, unplaced bundles of RESCHEDULING ones) and `kind="actor"` '
        "(PENDING_CREATION/RESTARTING actors outside a pending group)."
    ),
)

SERVE_DEPLOYMENT_INFO: Final = declare(
    "gpuledger_serve_deployment_info",
    INFO,
    SERVE,
    help=(
        "1 per Ray Serve deployment with a router or a replica on this node: its status "
        "and max_ongoing_requests (requests one replica takes; the rest wait at the "
        "router)."
    ),
    labels=("namespace", "workload", "application", "deployment", "status", "max_ongoing_requests"),
    stability=EXPERIMENTAL,
    rows="serve",
    cap="MAX_SERVE_DEPLOYMENTS",
    budget=(Budget(NODE, "256", "`MAX_SERVE_DEPLOYMENTS`, one status each", 256),),
    meaning=(
        "1 per Serve deployment with a router or a replica on this node. `status`: "
        "Serve's `HEALTHY`, `UPDATING`, `UPSCALING`, `DOWNSCALING`, `UNHEALTHY`, "
        "`DEPLOY_FAILED`, or `UNKNOWN`; `max_ongoing_requests`: the requests one replica "
        "takes at once (the rest wait at the router)."
    ),
)

SERVE_ROUTER_QUEUED_REQUESTS: Final = declare(
    "gpuledger_serve_router_queued_requests",
    GAUGE,
    SERVE,
    help=(
        "Requests the Serve routers (proxies, deployment handles) on this node's Ray "
        "nodes hold for a deployment, not assigned to a replica yet."
    ),
    labels=("namespace", "workload", "application", "deployment"),
    stability=EXPERIMENTAL,
    rows="serve",
    cap="MAX_SERVE_DEPLOYMENTS",
    budget=(Budget(NODE, "256", "`MAX_SERVE_DEPLOYMENTS`", 256),),
    meaning=(
        "Requests the Serve routers on this node's Ray nodes hold for the deployment, not"
        " assigned to a replica yet, summed over their handles. Absent where no router on"
        " this node reported the deployment. A queue here while no engine of the workload"
        " queues is stage `routing`, reason `serve_router_queue`."
    ),
)

SERVE_ROUTER_REQUESTS_AT_REPLICAS: Final = declare(
    "gpuledger_serve_router_requests_at_replicas",
    GAUGE,
    SERVE,
    help="Requests those routers have assigned to the deployment's replicas, not finished yet.",
    labels=("namespace", "workload", "application", "deployment"),
    stability=EXPERIMENTAL,
    rows="serve",
    cap="MAX_SERVE_DEPLOYMENTS",
    budget=(Budget(NODE, "256", "`MAX_SERVE_DEPLOYMENTS`", 256),),
    meaning=(
        "Requests those routers assigned to the deployment's replicas (on any node) and "
        "have not seen finish."
    ),
)

SERVE_REPLICA_INFO: Final = declare(
    "gpuledger_serve_replica_info",
    INFO,
    SERVE,
    help="1 per Ray Serve replica on this node's Ray nodes: its pod and state.",
    labels=(
        "namespace",
        "pod",
        "pod_uid",
        "workload",
        "application",
        "deployment",
        "replica",
        "state",
    ),
    stability=EXPERIMENTAL,
    rows="serve",
    cap="MAX_SERVE_REPLICAS",
    budget=(Budget(NODE, "1,024", "`MAX_SERVE_REPLICAS`, one state each", 1024),),
    meaning=(
        "1 per Serve replica on a Ray node of this node: its pod and Serve's replica "
        "`state` (`RUNNING`, `STARTING`, `UPDATING`, `RECOVERING`, `STOPPING`, `STOPPED`,"
        " `PENDING_MIGRATION`, or `UNKNOWN`)."
    ),
)

SERVE_REPLICA_ONGOING_REQUESTS: Final = declare(
    "gpuledger_serve_replica_ongoing_requests",
    GAUGE,
    SERVE,
    help="Requests a Ray Serve replica runs now (ray_serve_replica_processing_queries).",
    labels=("namespace", "pod", "pod_uid", "workload", "application", "deployment", "replica"),
    stability=EXPERIMENTAL,
    rows="serve",
    cap="MAX_SERVE_REPLICAS",
    budget=(Budget(NODE, "1,024", "`MAX_SERVE_REPLICAS`", 1024),),
    meaning=(
        "Requests the replica runs now (0 for a replica that has reported none yet). "
        "Absent while its Ray node's metrics are not read."
    ),
)

SOURCE_UP: Final = declare(
    "gpuledger_source_up",
    GAUGE,
    SELF,
    help="1 if the source's last fetch succeeded.",
    labels=("source",),
    stability=STABLE,
    rows="sources",
    budget=(
        Budget(NODE, "7", "the node-mode sources", 7),
        Budget(CLUSTER, "2", "`kubernetes`, `ray`", 2),
    ),
    meaning=(
        "1 when the source's last fetch succeeded, else 0. A down source drops only its "
        "own series. A source not configured on this exporter (no Kubernetes, no vLLM "
        "targets, no Ray address) stays 0 as it always was, so `gpuledger_source_up == 0`"
        " keeps selecting it and existing queries keep their meaning; it is never counted"
        " in `_errors_total`, and `gpuledger_source_state` tells it apart from a down one"
        " (the mixin's `GpuLedgerSourceDown` and the ledger alerts' silencing read "
        '`gpuledger_source_state{state="down"}`, and `gpuledger_source_up == 0` only from'
        " exporters without the state set). Node mode lists all seven sources; cluster "
        "mode lists only the two it uses (`kubernetes`, `ray`)."
    ),
)

SOURCE_STATE: Final = declare(
    "gpuledger_source_state",
    STATESET,
    SELF,
    help=(
        "1 for the source's state (up, down, not_configured: this exporter does not read "
        "it), 0 for the others."
    ),
    labels=("source", "state"),
    stability=EXPERIMENTAL,
    rows="sources",
    budget=(
        Budget(NODE, "7 × 3", "sources × (up, down, not_configured)", 21),
        Budget(CLUSTER, "2 × 3", "sources × states", 6),
    ),
    meaning=(
        "A state set, as kube-state-metrics' `kube_pod_status_phase`: three series per "
        'source, `state="up"`, `"down"` (configured, its last fetch failed) and '
        '`"not_configured"` (this exporter is not set up to read it), exactly one of them'
        " 1. Show a source as not configured rather than down with "
        '`gpuledger_source_state{state="not_configured"} == 1`; the `/ledger` page greys '
        'it and `/ledger.json` says `"state": "not_configured"`.'
    ),
)

SOURCE_DURATION_SECONDS: Final = declare(
    "gpuledger_source_duration_seconds",
    GAUGE,
    SELF,
    help="How long the source's last fetch took.",
    labels=("source",),
    stability=STABLE,
    rows="sources",
    budget=(
        Budget(NODE, "7", "sources", 7),
        Budget(CLUSTER, "2", "sources", 2),
    ),
    meaning="Duration of the source's last fetch (bounded by `--source-deadline`).",
)

SOURCE_CPU_SECONDS: Final = declare(
    "gpuledger_source_cpu_seconds_total",
    COUNTER,
    SELF,
    help="CPU seconds the source's threads have spent since the exporter started.",
    labels=("source",),
    stability=STABLE,
    rows="cpu_seconds_total",
    budget=(
        Budget(NODE, "7", "sources", 7),
        Budget(CLUSTER, "2", "sources", 2),
    ),
    meaning=(
        "CPU the source has cost since start: the thread time of its fetches in their runner"
        " thread, plus the helper threads it runs for them (the engine scrapes) and its own"
        " background thread (the pod informer's watch). Waiting on the network costs"
        " nothing. `rate(...)` × 1000 is the source's millicores; the join and the render"
        " are the collection loop's, no source's."
    ),
)

SOURCE_ERRORS: Final = declare(
    "gpuledger_source_errors_total",
    COUNTER,
    SELF,
    help="Failed fetches by source and reason since the exporter started.",
    labels=("source", "reason"),
    stability=STABLE,
    rows="errors_total",
    budget=(
        Budget(
            NODE,
            "sources × reasons",
            (
                "each source's fixed reasons (a dozen or so, 14 for `serve`), plus "
                "`http_<status>` (100–599) for `vllm`"
            ),
            615,
        ),
        Budget(CLUSTER, "sources × reasons", "fixed reasons", 40),
    ),
    meaning=(
        "Failed fetches since start. `reason` is a short word: `timeout`, `still_running`"
        " (the previous fetch is still hung), `library_not_found`, `driver_not_loaded`, "
        "`no_permission`, `proc_root_missing`, `internal_error`, …"
    ),
)

SOURCE_LAST_SUCCESS_TIMESTAMP_SECONDS: Final = declare(
    "gpuledger_source_last_success_timestamp_seconds",
    GAUGE,
    SELF,
    help="When the source last fetched successfully (Unix time).",
    labels=("source",),
    stability=STABLE,
    rows="last_success",
    budget=(
        Budget(NODE, "7", "sources", 7),
        Budget(CLUSTER, "2", "sources", 2),
    ),
    meaning="Unix time of the source's last successful fetch.",
)

SNAPSHOT_AGE_SECONDS: Final = declare(
    "gpuledger_snapshot_age_seconds",
    GAUGE,
    SELF,
    help="Age of the snapshot this scrape renders; grows when the collection loop is stuck.",
    labels=(),
    stability=STABLE,
    rows="taken_at",
    budget=(
        Budget(NODE, "1", "—", 1),
        Budget(CLUSTER, "1", "—", 1),
    ),
    meaning=(
        "Age of the snapshot this scrape renders. Scrapes never wait for sources; this "
        "grows if the collection loop is stuck."
    ),
)

BUILD_INFO: Final = declare(
    "gpuledger_build_info",
    INFO,
    SELF,
    help=(
        "1; the running gpuledger version; simulated is true under gpuledger demo and "
        "simulate (no real hardware)."
    ),
    labels=("version", "simulated"),
    stability=STABLE,
    rows="simulated",
    budget=(
        Budget(NODE, "1", "—", 1),
        Budget(CLUSTER, "1", "—", 1),
    ),
    meaning=(
        '1. `simulated="true"` when the exporter runs `gpuledger demo` or `simulate` (the'
        " simulator's sources, no real hardware; set by the command through the "
        'pipeline\'s configuration, never guessed), `"false"` under `serve`. '
        '`gpuledger_build_info{simulated="true"}` finds simulated targets: the mixin\'s '
        'dashboards show a "SIMULATED DATA" banner while one is in view.'
    ),
)

# Request spans (docs/spans.md): per engine, from the spans the receiver tied to it.
_REQUEST_BUCKETS = "16"  # store.LATENCY_BOUNDS (13) + +Inf, _sum, _count
ENGINE_REQUEST_QUEUE_SECONDS: Final = declare(
    "gpuledger_engine_request_queue_seconds",
    HISTOGRAM,
    ENGINES,
    help="Seconds finished requests waited in the engine's queue (its spans' "
    "gen_ai.latency.time_in_queue); exemplars carry trace_id.",
    labels=ENGINE_LABELS,
    stability=EXPERIMENTAL,
    rows="requests",
    budget=(Budget(NODE, f"{_REQUEST_BUCKETS} × 64", "`MAX_SENDERS` tied senders", 1024),),
    meaning=(
        "From each finished request's `llm_request` span, with `--otlp-receiver on`: "
        "the engine's own queue time, cumulative since the agent first heard from the "
        "engine's API server. Exemplars (OpenMetrics only) carry the request's `trace_id`, "
        "so a panel links to the trace; no request id is ever a label."
    ),
)
ENGINE_REQUEST_TTFT_SECONDS: Final = declare(
    "gpuledger_engine_request_ttft_seconds",
    HISTOGRAM,
    ENGINES,
    help="Seconds from arrival to the first token of finished requests (their spans' "
    "gen_ai.latency.time_to_first_token); exemplars carry trace_id.",
    labels=ENGINE_LABELS,
    stability=EXPERIMENTAL,
    rows="requests",
    budget=(Budget(NODE, f"{_REQUEST_BUCKETS} × 64", "`MAX_SENDERS` tied senders", 1024),),
    meaning=(
        "As `gpuledger_engine_request_queue_seconds`, for the time to first token "
        "(queue, prefill and the first decode step)."
    ),
)
OTLP_SENDERS: Final = declare(
    "gpuledger_otlp_senders",
    GAUGE,
    SELF,
    help="Processes whose request spans the receiver holds, by the rule that tied them "
    "to an engine (none: not tied).",
    labels=("joined_by",),
    stability=EXPERIMENTAL,
    rows="requests",
    budget=(
        Budget(
            NODE, "5", "the rules: `peer_socket`, `k8s_pod_uid`, `peer_pod`, `host_pid`, `none`", 5
        ),
    ),
    meaning=(
        "With `--otlp-receiver on`. `none` counts senders no rule could tie "
        "(explain --request says why); [design.md](design.md), identity rule 10."
    ),
)
OTLP_REFUSED_TOTAL: Final = declare(
    "gpuledger_otlp_refused_total",
    COUNTER,
    SELF,
    help="Span export requests (or spans) the receiver turned away, by reason.",
    labels=("reason",),
    stability=EXPERIMENTAL,
    rows="requests",
    budget=(Budget(NODE, "5", "`too_large`, `rate`, `malformed`, `media_type`, `senders`", 5),),
    meaning=(
        "`too_large`: over `--otlp-max-body-bytes` (before or after gzip); `rate`: over "
        "the receiver's bytes per second; `malformed`: not OTLP; `media_type`: neither "
        "protobuf nor JSON; `senders` (spans): no room for one more sender."
    ),
)
OTLP_STORED_BYTES: Final = declare(
    "gpuledger_otlp_stored_bytes",
    GAUGE,
    SELF,
    help="Estimated bytes the held spans take (bounded by the receiver's budget).",
    labels=(),
    stability=EXPERIMENTAL,
    rows="requests",
    budget=(Budget(NODE, "1", "one per agent", 1),),
    meaning=(
        "Held spans × their measured size; at most the budget in "
        "[performance.md](performance.md#the-span-receivers-budget)."
    ),
)

SERIES_DROPPED: Final = declare(
    "gpuledger_series_dropped_total",
    COUNTER,
    SELF,
    help=(
        "Series a per-node cardinality cap kept out of a metric family, summed over "
        'snapshots. Ray actor classes past the cap are folded into class_name="_other".'
    ),
    labels=("family",),
    stability=EXPERIMENTAL,
    rows="dropped_total",
    budget=dropped_budget(),
    meaning=(
        "Series a per-node cardinality cap kept out of the metric family `family` (e.g. "
        "`gpuledger_engine_up`), added once per snapshot: a series kept out of ten "
        "snapshots counts ten. Present only once a cap has bitten; "
        "`gpuledger_series_dropped_total > 0` says one did since the exporter started. "
        "Ray actor classes past their cap count here though their values live on in "
        '`class_name="_other"`. The caps and the series budget they give: '
        "[scaling.md](scaling.md#series-budget-per-node)."
    ),
)

# Every family, in docs/metrics.md's order (SERIES_DROPPED last: it counts the others).
FAMILIES: Final[tuple[FamilySpec, ...]] = tuple(_DECLARED)
BY_NAME: Final = {f.name: f for f in FAMILIES}
