"""The scenario file format (docs/scenarios.md): parsing and validation.

Errors name the file, the path inside it and what was expected, e.g.
`demo.yaml: gpus[2].memory_total: expected a size like 80GiB or an integer, got 'lots'`.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import reprlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpuledger.engines import BY_NAME, DEFAULT_RAY_DRIVER, KINDS
from gpuledger.model import frozen_map
from gpuledger.sim import fake_picker, fake_sglang, fake_vllm

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")
_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SECONDS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
HOST_CGROUP = "0::/system.slice/host-workload.service"
# A scenario file's values counted with aliases expanded: far above any real node (a
# 10,000-pod cluster scenario is a few hundred thousand), far below a YAML alias bomb.
MAX_DOCUMENT_NODES = 5_000_000
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring = 2, 3, 3, 40
NVML_VARIANTS = ("no_v3", "no_memory_v2", "no_nvlink_type")
# A MIG profile as NVML names it: [<compute slices>c.]<GPU slices>g.<memory>gb[+me…].
MIG_PROFILE = re.compile(r"(?:([1-7])c\.)?([1-8])g\.([0-9]{1,4})gb(?:[+-][a-z]+)*")
MAX_MIG_DEVICES = 7  # per GPU, as on A100, H100 and H200


class ScenarioError(ValueError):
    """An invalid scenario file; the message is one line naming file, path and expectation."""


# The keys each object of a scenario file may have: every key the parser reads is here,
# and an unknown one is an error naming these (docs/scenarios.md documents each set;
# tests/unit/test_scenario_doc.py holds the two together).
TOP_KEYS = frozenset(
    {
        "node",
        "description",
        "mode",
        "nvml",
        "gpus",
        "processes",
        "phases",
        "kubernetes",
        "podresources",
        "dra",
        "engines",
        "ray",
        "gateway",
    }
)
NVML_KEYS = frozenset({"library", "variants", "init_error", "driver_version"})
GPU_KEYS = frozenset(
    {
        "uuid",
        "index",
        "name",
        "pci_bus_id",
        "memory_total",
        "memory_reserved",
        "utilization",
        "mig_mode",
        "lost",
        "mig",
        "numa_node",
        "host_bridge",
        "pcie_switches",
        "nvlink_peers",
        "nvswitch",
        "nvlink_error",
    }
)
MIG_KEYS = frozenset(
    {
        "uuid",
        "profile",
        "index",
        "gpu_instance_id",
        "compute_instance_id",
        "memory_total",
        "memory_used",
    }
)
PROCESS_KEYS = frozenset({"pid", "ppid", "nspid", "cmdline", "cgroup", "environ", "gpu_memory"})
KUBERNETES_KEYS = frozenset({"pods", "fault"})
POD_KEYS = frozenset(
    {
        "namespace",
        "name",
        "uid",
        "node",
        "phase",
        "ready",
        "labels",
        "annotations",
        "owner",
        "pod_ip",
        "containers",
        "pending",
        "claims",
    }
)
CONTAINER_KEYS = frozenset({"name", "id", "gpus", "gpu_resource"})
# Each engine kind's simulated exposition styles (its fake's), the default first.
STYLES: Mapping[str, tuple[str, ...]] = {
    fake.KIND: tuple(fake.STYLES) for fake in (fake_vllm, fake_sglang)
}
OWNER_KEYS = frozenset({"kind", "name"})
PENDING_KEYS = frozenset({"reason", "message"})
PODRESOURCES_KEYS = frozenset({"allocations", "dynamic", "fault"})
ALLOCATION_KEYS = frozenset({"namespace", "pod", "container", "resource", "devices"})
TARGET_KEYS = frozenset(
    {"kind", "pod", "name", "engines", "fault", "style", "api_server", "socket", "server_info"}
    | {"requests"}
)
SERVER_INFO_KEYS = frozenset(
    {
        "tp_size",
        "dp_size",
        "pp_size",
        "max_running_requests",
        "effective_max_running_requests",
        "mem_fraction_static",
        "served_model_name",
        "api_key",
        "fault",
    }
)
REQUEST_KEYS = frozenset(
    {"id", "after", "queue", "prefill", "decode", "prompt_tokens", "completion_tokens"}
    | {"trace_id", "router"}
)
DYNAMIC_KEYS = frozenset(
    {
        "namespace",
        "pod",
        "container",
        "claim",
        "claim_namespace",
        "driver",
        "pool",
        "device",
        "share_id",
    }
)
DRA_KEYS = frozenset({"slices", "claims", "fault"})
DRA_SLICE_KEYS = frozenset({"driver", "pool", "node", "devices"})
DRA_DEVICE_KEYS = frozenset({"name", "gpu"})
DRA_CLAIM_KEYS = frozenset(
    {"namespace", "name", "device_class", "count", "allocated", "reserved_for", "deleting"}
)
DRA_FAULTS = ("ok", "not_served")
GATEWAY_KEYS = frozenset({"fault", "pools"})
POOL_KEYS = frozenset({"namespace", "name", "selector", "target_ports", "failure_mode", "picker"})
PICKER_KEYS = frozenset(
    {"service", "names", "flow_control", "queued", "queued_bytes", "saturation"}
    | {"ready_endpoints", "token", "fault"}
)
GATEWAY_FAULTS = ("ok", "not_served")
ENGINE_KEYS = frozenset(
    {
        "model_name",
        "engine",
        "running",
        "waiting",
        "waiting_by_reason",
        "kv_cache_usage",
        "preemptions_total",
        "num_gpu_blocks",
        "block_size",
    }
)
RAY_KEYS = frozenset(
    {
        "workload",
        "token",
        "fault",
        "cluster",
        "nodes",
        "actors",
        "placement_groups",
        "jobs",
        "serve",
    }
)
RAY_NODE_KEYS = frozenset({"name", "pod", "ip", "gpus", "head"})
RAY_ACTOR_KEYS = frozenset(
    {"class_name", "node", "pid", "num_gpus", "state", "placement_group", "count"}
)
PLACEMENT_GROUP_KEYS = frozenset({"name", "bundles", "state", "scheduling_state"})
RAY_JOB_KEYS = frozenset({"id", "driver", "entrypoint", "status", "executor", "workers"})
RAY_DRIVER_KEYS = frozenset({"node", "pid"})
RAY_WORKER_KEYS = frozenset({"node", "pid", "tp", "pp", "state"})
SERVE_KEYS = frozenset({"fault", "metrics_fault", "applications"})
SERVE_APPLICATION_KEYS = frozenset({"name", "deployments"})
SERVE_DEPLOYMENT_KEYS = frozenset({"name", "status", "max_ongoing_requests", "replicas", "routers"})
SERVE_REPLICA_KEYS = frozenset({"id", "node", "pid", "state", "ongoing"})
SERVE_ROUTER_KEYS = frozenset({"node", "queued", "at_replicas"})
PHASE_KEYS = frozenset(
    {
        "name",
        "after",
        "gpus",
        "processes",
        "add_processes",
        "pods",
        "add_pods",
        "allocations",
        "engines",
        "kubernetes_fault",
        "podresources_fault",
        "ray_serve",
        "gateway",
    }
)
# A phase patches an object found by the key that names it, which it cannot change.
GPU_PATCH_KEYS = GPU_KEYS - {"uuid", "index"}
PROCESS_PATCH_KEYS = PROCESS_KEYS - {"pid"}
POD_PATCH_KEYS = POD_KEYS - {"namespace", "name"}
TARGET_PATCH_KEYS = TARGET_KEYS - {"kind", "pod", "name"}
# What a phase may change of a pool: its picker's state (the pool itself, its selector and
# ports, stays; a phase's pods change what the selector finds).
PICKER_PATCH_KEYS = frozenset({"queued", "queued_bytes", "saturation", "ready_endpoints", "fault"})
# Keys older scenario files used, read as their new names.
ALIASES: Mapping[str, str] = {"vllm": "engines"}

# Where each key set applies, as docs/scenarios.md heads its reference tables.
OBJECT_KEYS: Mapping[str, frozenset[str]] = {
    "(top level)": TOP_KEYS,
    "nvml": NVML_KEYS,
    "gpus[]": GPU_KEYS,
    "gpus[].mig[]": MIG_KEYS,
    "processes[]": PROCESS_KEYS,
    "kubernetes": KUBERNETES_KEYS,
    "kubernetes.pods[]": POD_KEYS,
    "kubernetes.pods[].containers[]": CONTAINER_KEYS,
    "kubernetes.pods[].owner": OWNER_KEYS,
    "kubernetes.pods[].pending": PENDING_KEYS,
    "podresources": PODRESOURCES_KEYS,
    "podresources.allocations[]": ALLOCATION_KEYS,
    "engines[]": TARGET_KEYS,
    "engines[].engines[]": ENGINE_KEYS,
    "engines[].server_info": SERVER_INFO_KEYS,
    "engines[].requests[]": REQUEST_KEYS,
    "podresources.dynamic[]": DYNAMIC_KEYS,
    "dra": DRA_KEYS,
    "dra.slices[]": DRA_SLICE_KEYS,
    "dra.slices[].devices[]": DRA_DEVICE_KEYS,
    "dra.claims[]": DRA_CLAIM_KEYS,
    "ray": RAY_KEYS,
    "ray.nodes[]": RAY_NODE_KEYS,
    "ray.actors[]": RAY_ACTOR_KEYS,
    "ray.placement_groups[]": PLACEMENT_GROUP_KEYS,
    "ray.jobs[]": RAY_JOB_KEYS,
    "ray.jobs[].driver": RAY_DRIVER_KEYS,
    "ray.jobs[].workers[]": RAY_WORKER_KEYS,
    "ray.serve": SERVE_KEYS,
    "ray.serve.applications[]": SERVE_APPLICATION_KEYS,
    "ray.serve.applications[].deployments[]": SERVE_DEPLOYMENT_KEYS,
    "ray.serve.applications[].deployments[].replicas[]": SERVE_REPLICA_KEYS,
    "ray.serve.applications[].deployments[].routers[]": SERVE_ROUTER_KEYS,
    "gateway": GATEWAY_KEYS,
    "gateway.pools[]": POOL_KEYS,
    "gateway.pools[].picker": PICKER_KEYS,
    "phases[]": PHASE_KEYS,
    "phases[].gpus.<uuid>": GPU_PATCH_KEYS,
    "phases[].processes.<pid>": PROCESS_PATCH_KEYS,
    "phases[].pods.<namespace/name>": POD_PATCH_KEYS,
    "phases[].engines.<namespace/name>": TARGET_PATCH_KEYS,
    "phases[].gateway.<namespace/pool>": PICKER_PATCH_KEYS,
}


@dataclass(frozen=True)
class SimMig:
    """A MIG device (one compute instance) of a GPU in MIG mode."""

    uuid: str
    profile: str  # e.g. 1g.10gb, 3g.40gb, 1c.3g.40gb, 1g.10gb+me
    index: int  # the MIG device index under its GPU
    gpu_instance_id: int
    compute_instance_id: int
    memory_total: int
    memory_used: int | None = None  # None: its processes' memory summed

    @property
    def slices(self) -> tuple[int, int]:
        """(GPU instance slices, compute instance slices) of the profile."""
        m = MIG_PROFILE.fullmatch(self.profile)
        assert m is not None  # checked when parsed
        return int(m.group(2)), int(m.group(1) or m.group(2))


@dataclass(frozen=True)
class SimGpu:
    uuid: str
    index: int
    name: str
    pci_bus_id: str
    memory_total: int
    memory_reserved: int = 0
    utilization: float = 0.0
    mig_mode: bool = False
    lost: bool = False
    mig: tuple[SimMig, ...] = ()
    # Where it sits (NVML's topology); None: NVML cannot say (NOT_SUPPORTED).
    numa_node: int | None = None
    host_bridge: int = 0
    pcie_switches: tuple[str, ...] = ()  # upstream first
    nvlink_peers: tuple[int, ...] = ()  # GPU indices it has an NVLink to (both ends)
    nvswitch: bool = False  # NVLinks to the node's NVSwitches (an HGX baseboard)
    nvlink_error: int = 0  # an NVML return code every NVLink query of it fails with


@dataclass(frozen=True)
class SimProcess:
    pid: int
    ppid: int
    cmdline: tuple[str, ...]
    cgroup: str = HOST_CGROUP
    nspid: tuple[int, ...] = ()
    environ: Mapping[str, str] = field(default_factory=frozen_map)
    gpu_memory: Mapping[str, int] = field(default_factory=frozen_map)  # gpu uuid -> bytes


@dataclass(frozen=True)
class SimNvml:
    library: str = "present"  # present | missing
    variants: tuple[str, ...] = ()
    init_error: int = 0
    driver_version: str = "550.54.15"


@dataclass(frozen=True)
class SimContainer:
    name: str
    id: str | None  # runtime container ID (64 hex), as in the process's cgroup
    gpus: int = 0  # limit of gpu_resource
    gpu_resource: str = "nvidia.com/gpu"  # e.g. nvidia.com/mig-1g.10gb


@dataclass(frozen=True)
class SimPod:
    namespace: str
    name: str
    uid: str
    node: str  # "" = not placed
    phase: str
    ready: bool
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner: tuple[str, str] | None
    pod_ip: str | None
    containers: tuple[SimContainer, ...]
    pending_reason: str | None  # Unschedulable | SchedulingGated
    pending_message: str
    raw: Mapping[str, Any]  # the document, so a phase can patch it
    claims: tuple[str, ...] = ()  # ResourceClaim names (spec.resourceClaims)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class SimAllocation:
    namespace: str
    pod: str
    container: str
    resource: str
    devices: tuple[str, ...]


@dataclass(frozen=True)
class SimDynamic:
    """A DRA device the kubelet reports for a container (PodResources `dynamic_resources`)."""

    namespace: str
    pod: str
    container: str
    claim: str
    claim_namespace: str
    driver: str
    pool: str
    device: str
    # The kubelet's share of a device several claims hold (Kubernetes 1.35); "" sends none.
    share_id: str = ""


@dataclass(frozen=True)
class SimSliceDevice:
    name: str
    uuid: str  # the GPU or MIG device it is
    parent_uuid: str | None = None
    profile: str | None = None


@dataclass(frozen=True)
class SimSlice:
    driver: str
    pool: str
    node: str
    devices: tuple[SimSliceDevice, ...]


@dataclass(frozen=True)
class SimClaim:
    namespace: str
    name: str
    device_class: str
    count: int
    allocated: bool
    reserved_for: tuple[str, ...]  # pod names
    deleting: bool


@dataclass(frozen=True)
class SimDra:
    slices: tuple[SimSlice, ...]
    claims: tuple[SimClaim, ...]
    fault: str = "ok"


@dataclass(frozen=True)
class SimPicker:
    """A pool's endpoint picker (EPP): its Service and what its `/metrics` reports."""

    service: str  # the Service's name (endpointPickerRef.name)
    names: str  # llm_d_epp | legacy | both (fake_picker.NAMES)
    flow_control: bool  # the flowControl feature gate: its series exist
    queued: int  # requests its flow-control queue holds
    queued_bytes: int
    saturation: float  # flow_control_pool_saturation (1.0 is the gating set point)
    ready_endpoints: int | None  # None: the ready member pods' endpoints
    token: str | None  # its metrics want `Authorization: Bearer <token>`
    fault: str  # fake_picker.FAULTS
    raw: Mapping[str, Any]  # the document, so a phase can patch it


@dataclass(frozen=True)
class SimPool:
    """An InferencePool (inference.networking.k8s.io/v1)."""

    namespace: str
    name: str
    selector: Mapping[str, str]  # spec.selector.matchLabels
    target_ports: tuple[int, ...]
    failure_mode: str  # FailOpen | FailClose
    picker: SimPicker | None  # None: no endpointPickerRef

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selects(self, pod: SimPod) -> bool:
        """A pod of its namespace whose labels carry every matchLabels pair."""
        return pod.namespace == self.namespace and all(
            pod.labels.get(k) == v for k, v in self.selector.items()
        )


@dataclass(frozen=True)
class SimGateway:
    pools: tuple[SimPool, ...]
    fault: str = "ok"  # not_served: no InferencePool CRD (404)


@dataclass(frozen=True)
class SimEngine:
    model_name: str
    engine: int
    running: float
    waiting: float
    waiting_by_reason: Mapping[str, float]
    kv_cache_usage: float
    preemptions_total: float
    num_gpu_blocks: int
    block_size: int


@dataclass(frozen=True)
class SimRequest:
    """One finished request whose `llm_request` span the engine sends to the agent's
    span receiver (sim/fake_spans.py), `after` seconds into its phase."""

    id: str  # the X-Request-Id; vLLM's request id is cmpl-<id>-0
    after: float
    queue: float
    prefill: float
    decode: float
    prompt_tokens: int
    completion_tokens: int
    trace_id: str  # 32 hex digits
    router: bool  # a Ray Serve proxy span in the same trace, its parent


@dataclass(frozen=True)
class SimEngineServer:
    """One engine API server's /metrics: in a pod (`pod: ns/name`) or a static target."""

    kind: str  # an engine kind (gpuledger.engines)
    key: str  # its name, else the pod's ns/name, else static-<n>
    pod: str | None
    engines: tuple[SimEngine, ...]
    fault: str
    style: str
    raw: Mapping[str, Any]
    # The API server process listening on this target's port (None: the only one of
    # its pod, or of the host's processes); whether the agent can read its sockets.
    api_server: int | None = None
    socket: str = "readable"  # readable | unreadable
    # SGLang's /server_info (None: that path answers 404).
    server_info: fake_sglang.FakeServerInfo | None = None
    requests: tuple[SimRequest, ...] = ()


@dataclass(frozen=True)
class SimRayNode:
    name: str
    pod: str | None  # ns/name of the pod this Ray node is
    ip: str | None
    gpus: float
    head: bool


@dataclass(frozen=True)
class SimRayActor:
    class_name: str
    node: str | None  # a SimRayNode name; None while not placed
    pid: int  # in the Ray pod's PID namespace (NSpid's last field)
    num_gpus: float
    state: str
    placement_group: str | None


@dataclass(frozen=True)
class SimPlacementGroup:
    name: str
    bundles: tuple[float, ...]  # GPUs per bundle
    state: str
    scheduling_state: str | None


@dataclass(frozen=True)
class SimServeReplica:
    id: str
    node: str  # a SimRayNode name
    pid: int  # in the Ray pod's PID namespace
    state: str
    ongoing: float  # requests it runs now


@dataclass(frozen=True)
class SimServeRouter:
    node: str  # the Ray node whose router (proxy) holds these
    queued: float  # not assigned to a replica yet
    at_replicas: float


@dataclass(frozen=True)
class SimServeDeployment:
    application: str
    name: str
    status: str
    max_ongoing_requests: int
    replicas: tuple[SimServeReplica, ...]
    routers: tuple[SimServeRouter, ...]


@dataclass(frozen=True)
class SimServe:
    fault: str  # the dashboard's /api/serve/applications/
    metrics_fault: str  # every Ray node's metrics endpoint
    deployments: tuple[SimServeDeployment, ...]


@dataclass(frozen=True)
class SimRayWorker:
    """A vLLM worker actor of a Ray job, one per placement group bundle."""

    node: str  # a SimRayNode name
    pid: int  # in the Ray pod's PID namespace (NSpid's last field)
    tp: int
    pp: int
    state: str


@dataclass(frozen=True)
class SimRayJob:
    """A vLLM engine on the Ray executor: its EngineCore is the driver of this job."""

    id: str  # Ray's job id, 8 hex digits
    driver_node: str  # a SimRayNode name
    driver_pid: int  # the EngineCore's PID in its Ray pod's namespace
    entrypoint: str  # the driver's title: its kind's engine core, e.g. with a DP rank
    status: str  # RUNNING | SUCCEEDED | FAILED | STOPPED
    executor: str  # ray (RayWorkerProc, RayExecutorV2) | legacy (RayWorkerWrapper)
    workers: tuple[SimRayWorker, ...]


@dataclass(frozen=True)
class SimRay:
    workload: str | None
    token: str | None
    fault: str
    nodes: tuple[SimRayNode, ...]
    actors: tuple[SimRayActor, ...]
    placement_groups: tuple[SimPlacementGroup, ...]
    serve: SimServe | None = None
    # Seeds the Ray ids: node agents' scenarios naming one Ray cluster share its ids.
    cluster: str | None = None
    jobs: tuple[SimRayJob, ...] = ()


@dataclass(frozen=True)
class Phase:
    name: str
    after_seconds: float
    gpus: Mapping[str, Mapping[str, Any]]
    processes: Mapping[int, Mapping[str, Any] | None]
    add_processes: tuple[SimProcess, ...]
    pods: Mapping[str, Mapping[str, Any] | None] = field(default_factory=frozen_map)
    add_pods: tuple[Mapping[str, Any], ...] = ()
    allocations: tuple[SimAllocation, ...] | None = None
    engines: Mapping[str, Mapping[str, Any]] = field(default_factory=frozen_map)
    kubernetes_fault: str | None = None
    podresources_fault: str | None = None
    # A whole `ray.serve` that replaces the scenario's from this phase on.
    ray_serve: SimServe | None = None
    # Pool namespace/name -> a patch of its picker (PICKER_PATCH_KEYS).
    gateway: Mapping[str, Mapping[str, Any]] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class Scenario:
    source: str  # file name, for messages
    node: str
    description: str
    nvml: SimNvml
    gpus: tuple[SimGpu, ...]
    processes: tuple[SimProcess, ...]
    phases: tuple[Phase, ...] = ()
    mode: str = "node"
    # None: that simulated source is not stood up (the exporter reports it disabled).
    pods: tuple[SimPod, ...] | None = None
    kubernetes_fault: str = "ok"
    allocations: tuple[SimAllocation, ...] | None = None
    podresources_fault: str = "ok"
    engines: tuple[SimEngineServer, ...] = ()
    dynamic: tuple[SimDynamic, ...] = ()
    dra: SimDra | None = None
    ray: SimRay | None = None
    gateway: SimGateway | None = None

    def at_phase(self, name: str | None) -> Scenario:
        """This scenario with every phase up to and including `name` applied."""
        if name is None:
            return self
        names = [p.name for p in self.phases]
        if name not in names:
            raise ScenarioError(
                f"{self.source}: phases: no phase named {name!r} "
                f"(have: {', '.join(names) or 'none'})"
            )
        state = self
        for phase in self.phases[: names.index(name) + 1]:
            state = _apply(state, phase)
        return state


class _Path:
    """Where we are inside the document, for error messages."""

    def __init__(self, source: str, parts: tuple[str, ...] = ()) -> None:
        self.source, self.parts = source, parts

    def __truediv__(self, part: str | int) -> _Path:
        text = f"[{part}]" if isinstance(part, int) else (f".{part}" if self.parts else part)
        return _Path(self.source, (*self.parts, text))

    def fail(self, expected: str, got: object) -> ScenarioError:
        where = "".join(self.parts) or "(top level)"
        # Containers through reprlib: a YAML alias bomb must not be expanded to be shown.
        shown = _SHOW.repr(got) if isinstance(got, list | dict | tuple | set) else repr(got)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return ScenarioError(f"{self.source}: {where}: expected {expected}, got {shown}")


def parse_size(value: object, at: _Path) -> int:
    if isinstance(value, bool):
        raise at.fail("a size like 80GiB or an integer number of bytes", value)
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and (m := _SIZE.match(value)):
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    raise at.fail("a size like 80GiB or an integer number of bytes", value)


def parse_duration(value: object, at: _Path) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str) and (m := _DURATION.match(value)):
        return float(m.group(1)) * _SECONDS[m.group(2)]
    raise at.fail("a duration like 30s, 5m or a number of seconds", value)


def _mapping(value: object, at: _Path, what: str = "a mapping") -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise at.fail(what, value)
    return value


def _list(value: object, at: _Path) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise at.fail("a list", value)
    return value


def _str(value: object, at: _Path, what: str = "a string") -> str:
    if not isinstance(value, str) or not value or "\n" in value:
        raise at.fail(what, value)
    return value


def _int(value: object, at: _Path, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise at.fail(f"an integer >= {minimum}", value)
    return value


def _bool(value: object, at: _Path) -> bool:
    if not isinstance(value, bool):
        raise at.fail("true or false", value)
    return value


def _ratio(value: object, at: _Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise at.fail("a ratio between 0 and 1", value)
    return float(value)


def _check_keys(doc: Mapping[str, Any], allowed: frozenset[str], at: _Path) -> None:
    for key in doc:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise (at / str(key)).fail(f"one of the keys {', '.join(sorted(allowed))}{hint}", key)


def _default_bus_id(index: int) -> str:
    # 14 slots per PCI domain keeps the bus byte two hex digits for any index.
    return f"{index // 14:08X}:{0x18 + (index % 14) * 0x10:02X}:00.0"


def _mig(doc: object, at: _Path, position: int) -> SimMig:
    d = _mapping(doc, at)
    _check_keys(d, MIG_KEYS, at)
    uuid = _str(d.get("uuid"), at / "uuid", "a MIG device UUID like MIG-6f2d…")
    if not uuid.startswith("MIG-") or " " in uuid:
        raise (at / "uuid").fail("a MIG device UUID starting with MIG-", uuid)
    profile = _str(d.get("profile"), at / "profile", "a MIG profile like 1g.10gb")
    m = MIG_PROFILE.fullmatch(profile)
    if m is None or int(m.group(1) or m.group(2)) > int(m.group(2)):
        raise (at / "profile").fail("a MIG profile like 1g.10gb, 3g.40gb or 1c.3g.40gb", profile)
    index = _int(d.get("index", position), at / "index")
    if index >= MAX_MIG_DEVICES:
        raise (at / "index").fail(f"a MIG device index below {MAX_MIG_DEVICES}", index)
    used = d.get("memory_used")
    return SimMig(
        uuid=uuid,
        profile=profile,
        index=index,
        gpu_instance_id=_int(d.get("gpu_instance_id", index + 1), at / "gpu_instance_id"),
        compute_instance_id=_int(d.get("compute_instance_id", 0), at / "compute_instance_id"),
        # The profile's size in GiB by default: NVML rounds the instance's memory to it.
        memory_total=parse_size(d.get("memory_total", f"{m.group(3)}GiB"), at / "memory_total"),
        memory_used=None if used is None else parse_size(used, at / "memory_used"),
    )


def _migs(value: object, at: _Path) -> tuple[SimMig, ...]:
    migs = tuple(_mig(m, at / i, i) for i, m in enumerate(_list(value, at)))
    if len(migs) > MAX_MIG_DEVICES:
        raise at.fail(f"at most {MAX_MIG_DEVICES} MIG devices", len(migs))
    _unique([m.index for m in migs], at, "MIG device indices")
    _unique([(m.gpu_instance_id, m.compute_instance_id) for m in migs], at, "instance ids")
    return migs


def _gpu(doc: object, at: _Path, position: int) -> SimGpu:
    d = _mapping(doc, at)
    _check_keys(d, GPU_KEYS, at)
    uuid = _str(d.get("uuid"), at / "uuid", "a GPU UUID like GPU-3f1c2a6e-…")
    if not uuid.startswith(("GPU-", "MIG-")) or " " in uuid:
        raise (at / "uuid").fail("a GPU UUID starting with GPU- or MIG-", uuid)
    index = _int(d.get("index", position), at / "index")
    migs = _migs(d.get("mig"), at / "mig")
    # MIG devices exist only in MIG mode, which they imply unless it is said otherwise.
    mig_mode = _bool(d.get("mig_mode", bool(migs)), at / "mig_mode")
    if migs and not mig_mode:
        raise (at / "mig").fail("no MIG devices on a GPU with mig_mode: false", "mig")
    return SimGpu(
        uuid=uuid,
        index=index,
        name=_str(d.get("name", "NVIDIA H100 80GB HBM3"), at / "name"),
        pci_bus_id=_str(d.get("pci_bus_id", _default_bus_id(index)), at / "pci_bus_id"),
        memory_total=parse_size(d.get("memory_total", "80GiB"), at / "memory_total"),
        memory_reserved=parse_size(d.get("memory_reserved", 0), at / "memory_reserved"),
        utilization=_ratio(d.get("utilization", 0.0), at / "utilization"),
        mig_mode=mig_mode,
        lost=_bool(d.get("lost", False), at / "lost"),
        mig=migs,
        **_placement(d, at),
    )


def _placement(d: Mapping[str, Any], at: _Path) -> dict[str, Any]:
    """A GPU's topology keys (docs/scenarios.md, "Topology")."""
    numa = d.get("numa_node")
    switches = _list(d.get("pcie_switches"), at / "pcie_switches")
    return {
        "numa_node": None if numa is None else _int(numa, at / "numa_node"),
        "host_bridge": _int(d.get("host_bridge", 0), at / "host_bridge"),
        "pcie_switches": tuple(
            _str(x, at / "pcie_switches" / i, "a PCIe switch name") for i, x in enumerate(switches)
        ),
        "nvlink_peers": tuple(
            _int(x, at / "nvlink_peers" / i)
            for i, x in enumerate(_list(d.get("nvlink_peers"), at / "nvlink_peers"))
        ),
        "nvswitch": _bool(d.get("nvswitch", False), at / "nvswitch"),
        "nvlink_error": _int(d.get("nvlink_error", 0), at / "nvlink_error"),
    }


def _gpu_doc(gpu: SimGpu) -> dict[str, Any]:
    """A parsed GPU as a document again, for a phase's patch to merge into."""
    doc: dict[str, Any] = {k: v for k, v in gpu.__dict__.items() if k != "mig"}
    for key in ("pcie_switches", "nvlink_peers"):
        doc[key] = list(doc[key])
    if doc["numa_node"] is None:
        del doc["numa_node"]
    doc["mig"] = [
        {k: v for k, v in m.__dict__.items() if v is not None or k != "memory_used"}
        for m in gpu.mig
    ]
    return doc


def mig_devices(gpus: tuple[SimGpu, ...]) -> dict[str, tuple[SimGpu, SimMig]]:
    """MIG device UUID -> (its GPU, the device)."""
    return {m.uuid: (g, m) for g in gpus for m in g.mig}


def _gpu_memory(value: object, at: _Path, gpus: tuple[SimGpu, ...]) -> dict[str, int]:
    by_index = {str(g.index): g.uuid for g in gpus}
    # On a GPU in MIG mode processes run on its MIG devices, which they name instead.
    known = {g.uuid for g in gpus if not g.mig_mode} | set(mig_devices(gpus))
    out: dict[str, int] = {}
    for key, size in _mapping(value or {}, at).items():
        uuid = by_index.get(str(key), str(key))
        if uuid not in known:
            raise (at / str(key)).fail(
                "the UUID or index of a GPU under gpus without MIG mode, or a MIG device UUID",
                key,
            )
        out[uuid] = parse_size(size, at / str(key))
    return out


def _process(doc: object, at: _Path, gpus: tuple[SimGpu, ...]) -> SimProcess:
    d = _mapping(doc, at)
    _check_keys(d, PROCESS_KEYS, at)
    raw_cmd = d.get("cmdline", ["python3"])
    if isinstance(raw_cmd, str):
        raw_cmd = [raw_cmd]
    cmdline = tuple(str(a) for a in _list(raw_cmd, at / "cmdline"))
    if not cmdline or any("\0" in a for a in cmdline):
        raise (at / "cmdline").fail("a non-empty list of arguments without NUL bytes", raw_cmd)
    environ = {}
    for key, value in _mapping(d.get("environ") or {}, at / "environ").items():
        environ[_str(key, at / "environ", "a variable name")] = str(value)
    nspid = tuple(
        _int(p, at / "nspid" / i, 1) for i, p in enumerate(_list(d.get("nspid"), at / "nspid"))
    )
    return SimProcess(
        pid=_int(d.get("pid"), at / "pid", 2),
        ppid=_int(d.get("ppid", 1), at / "ppid"),
        cmdline=cmdline,
        cgroup=str(d.get("cgroup", HOST_CGROUP)),
        nspid=nspid,
        environ=frozen_map(environ),
        gpu_memory=frozen_map(_gpu_memory(d.get("gpu_memory"), at / "gpu_memory", gpus)),
    )


KUBERNETES_FAULTS = ("ok", "refuse", "http_500", "forbidden", "unauthorized", "hang")
PODRESOURCES_FAULTS = ("ok", "unavailable", "hang", "missing")
ENGINE_FAULTS = ("ok", "hang", "refuse", "http_500", "garbage", "truncated", "huge", "slow")


def _str_map(value: object, at: _Path) -> dict[str, str]:
    return {_str(k, at, "a name"): str(v) for k, v in _mapping(value or {}, at).items()}


def _pod(doc: object, at: _Path, node: str) -> SimPod:
    d = _mapping(doc, at)
    _check_keys(d, POD_KEYS, at)
    namespace = _str(d.get("namespace", "default"), at / "namespace")
    name = _str(d.get("name"), at / "name", "a pod name")
    containers = []
    for i, c in enumerate(_list(d.get("containers") or [{"name": "main"}], at / "containers")):
        cm = _mapping(c, at / "containers" / i)
        _check_keys(cm, CONTAINER_KEYS, at / "containers" / i)
        cid = cm.get("id")
        containers.append(
            SimContainer(
                name=_str(cm.get("name"), at / "containers" / i / "name"),
                id=None if cid is None else _str(cid, at / "containers" / i / "id"),
                gpus=_int(cm.get("gpus", 0), at / "containers" / i / "gpus"),
                gpu_resource=_str(
                    cm.get("gpu_resource", "nvidia.com/gpu"), at / "containers" / i / "gpu_resource"
                ),
            )
        )
    pending = _mapping(d.get("pending") or {}, at / "pending")
    _check_keys(pending, PENDING_KEYS, at / "pending")
    reason = pending.get("reason")
    if reason not in (None, "Unschedulable", "SchedulingGated"):
        raise (at / "pending" / "reason").fail("Unschedulable or SchedulingGated", reason)
    owner = d.get("owner")
    owner_pair = None
    if owner is not None:
        om = _mapping(owner, at / "owner")
        _check_keys(om, OWNER_KEYS, at / "owner")
        owner_pair = (
            _str(om.get("kind"), at / "owner" / "kind"),
            _str(om.get("name"), at / "owner" / "name"),
        )
    default_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpuledger-sim/{namespace}/{name}"))
    return SimPod(
        namespace=namespace,
        name=name,
        uid=_str(d.get("uid", default_uid), at / "uid"),
        node="" if reason else str(d.get("node", node)),
        phase=_str(d.get("phase", "Pending" if reason else "Running"), at / "phase"),
        ready=_bool(d.get("ready", not reason), at / "ready"),
        labels=frozen_map(_str_map(d.get("labels"), at / "labels")),
        annotations=frozen_map(_str_map(d.get("annotations"), at / "annotations")),
        owner=owner_pair,
        pod_ip=None if d.get("pod_ip") is None else _str(d.get("pod_ip"), at / "pod_ip"),
        containers=tuple(containers),
        pending_reason=reason,
        pending_message=str(pending.get("message", "")),
        raw=frozen_map(d),
        claims=tuple(
            _str(c, at / "claims" / i, "a ResourceClaim name")
            for i, c in enumerate(_list(d.get("claims") or [], at / "claims"))
        ),
    )


def _allocation(doc: object, at: _Path) -> SimAllocation:
    d = _mapping(doc, at)
    _check_keys(d, ALLOCATION_KEYS, at)
    return SimAllocation(
        namespace=_str(d.get("namespace", "default"), at / "namespace"),
        pod=_str(d.get("pod"), at / "pod", "a pod name"),
        container=_str(d.get("container", "main"), at / "container"),
        resource=_str(d.get("resource", "nvidia.com/gpu"), at / "resource"),
        devices=tuple(
            _str(x, at / "devices" / i, "a device id like GPU-…")
            for i, x in enumerate(_list(d.get("devices"), at / "devices"))
        ),
    )


def _number(value: object, at: _Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise at.fail("a number >= 0", value)
    return float(value)


def _engine(doc: object, at: _Path) -> SimEngine:
    d = _mapping(doc, at)
    _check_keys(d, ENGINE_KEYS, at)
    return SimEngine(
        model_name=_str(d.get("model_name", "meta-llama/Llama-3.1-8B-Instruct"), at / "model_name"),
        engine=_int(d.get("engine", 0), at / "engine"),
        running=_number(d.get("running", 0), at / "running"),
        waiting=_number(d.get("waiting", 0), at / "waiting"),
        waiting_by_reason={
            k: _number(v, at / "waiting_by_reason" / k)
            for k, v in _mapping(d.get("waiting_by_reason") or {}, at / "waiting_by_reason").items()
        },
        kv_cache_usage=_ratio(d.get("kv_cache_usage", 0.0), at / "kv_cache_usage"),
        preemptions_total=_number(d.get("preemptions_total", 0), at / "preemptions_total"),
        num_gpu_blocks=_int(d.get("num_gpu_blocks", 8192), at / "num_gpu_blocks"),
        block_size=_int(d.get("block_size", 16), at / "block_size", 1),
    )


def _aliased(d: Mapping[str, Any], at: _Path) -> Mapping[str, Any]:
    """`d` with older keys (ALIASES) under their new names."""
    found = {old: new for old, new in ALIASES.items() if old in d}
    for old, new in found.items():
        if new in d:
            raise (at / old).fail(f"only one of {old} and {new} (the same list)", d[old])
    return {found.get(k, k): v for k, v in d.items()}


def _engine_server(doc: object, at: _Path, position: int, kind: str | None) -> SimEngineServer:
    """An `engines` entry; `kind` is given for the alias's entries, which have none."""
    d = _mapping(doc, at)
    _check_keys(d, TARGET_KEYS, at)
    kind = kind or _str(d.get("kind"), at / "kind", f"one of {', '.join(BY_NAME)}")
    if kind not in BY_NAME:
        raise (at / "kind").fail(f"one of {', '.join(BY_NAME)}", kind)
    pod = d.get("pod")
    if pod is not None and (not isinstance(pod, str) or pod.count("/") != 1):
        raise (at / "pod").fail("namespace/name of a pod under kubernetes.pods", pod)
    fault = d.get("fault", "ok")
    if fault not in ENGINE_FAULTS:
        raise (at / "fault").fail(f"one of {', '.join(ENGINE_FAULTS)}", fault)
    styles = STYLES[kind]
    style = str(d.get("style", styles[0]))
    if style not in styles:
        raise (at / "style").fail(f"one of {', '.join(styles)} for {kind}", style)
    engines = tuple(
        _engine(e, at / "engines" / i)
        for i, e in enumerate(_list(d.get("engines") or [{}], at / "engines"))
    )
    name = None if d.get("name") is None else _str(d.get("name"), at / "name", "a name")
    api_server = d.get("api_server")
    socket = d.get("socket", "readable")
    if socket not in ("readable", "unreadable"):
        raise (at / "socket").fail("readable or unreadable", socket)
    info = d.get("server_info")
    if info is not None and kind != fake_sglang.KIND:
        raise (at / "server_info").fail("only on an sglang entry", info)
    if d.get("requests") and BY_NAME[kind].spans is None:
        raise (at / "requests").fail("only on an entry of a kind that sends request spans", kind)
    return SimEngineServer(
        kind=kind,
        key=name or (pod if isinstance(pod, str) else f"static-{position}"),
        pod=pod if isinstance(pod, str) else None,
        engines=engines,
        fault=fault,
        style=style,
        raw=frozen_map(d),
        api_server=None if api_server is None else _int(api_server, at / "api_server", 2),
        socket=socket,
        server_info=None if info is None else _server_info(info, at / "server_info"),
        requests=tuple(
            _request(r, at / "requests" / i)
            for i, r in enumerate(_list(d.get("requests"), at / "requests"))
        ),
    )


def _server_info(doc: object, at: _Path) -> fake_sglang.FakeServerInfo:
    d = _mapping(doc, at)
    _check_keys(d, SERVER_INFO_KEYS, at)
    fault = d.get("fault", "ok")
    if fault not in ENGINE_FAULTS:
        raise (at / "fault").fail(f"one of {', '.join(ENGINE_FAULTS)}", fault)
    asked = d.get("max_running_requests")
    effective = d.get("effective_max_running_requests", asked if asked is not None else 4096)
    return fake_sglang.FakeServerInfo(
        tp_size=_int(d.get("tp_size", 1), at / "tp_size", 1),
        dp_size=_int(d.get("dp_size", 1), at / "dp_size", 1),
        pp_size=_int(d.get("pp_size", 1), at / "pp_size", 1),
        max_running_requests=None if asked is None else _int(asked, at / "max_running_requests", 1),
        effective_max_running_requests=_int(effective, at / "effective_max_running_requests", 1),
        mem_fraction_static=_ratio(d.get("mem_fraction_static", 0.88), at / "mem_fraction_static"),
        served_model_name=_str(d.get("served_model_name", "tiny"), at / "served_model_name"),
        api_key=None if d.get("api_key") is None else _str(d.get("api_key"), at / "api_key"),
        fault=fault,
    )


_TRACE_ID = re.compile(r"[0-9a-f]{32}")


def _request(doc: object, at: _Path) -> SimRequest:
    d = _mapping(doc, at)
    _check_keys(d, REQUEST_KEYS, at)
    request_id = _str(d.get("id"), at / "id", "a request id")
    trace_id = d.get("trace_id", hashlib.sha256(request_id.encode()).hexdigest()[:32])
    if not isinstance(trace_id, str) or not _TRACE_ID.fullmatch(trace_id):
        raise (at / "trace_id").fail("32 lowercase hex digits", trace_id)
    return SimRequest(
        id=request_id,
        after=parse_duration(d.get("after", 0), at / "after"),
        queue=parse_duration(d.get("queue", 0), at / "queue"),
        prefill=parse_duration(d.get("prefill", 0.05), at / "prefill"),
        decode=parse_duration(d.get("decode", 0.5), at / "decode"),
        prompt_tokens=_int(d.get("prompt_tokens", 128), at / "prompt_tokens"),
        completion_tokens=_int(d.get("completion_tokens", 64), at / "completion_tokens"),
        trace_id=trace_id,
        router=_bool(d.get("router", False), at / "router"),
    )


def _kubernetes(doc: object, at: _Path, node: str) -> tuple[tuple[SimPod, ...], str]:
    d = _mapping(doc, at)
    _check_keys(d, KUBERNETES_KEYS, at)
    fault = d.get("fault", "ok")
    if fault not in KUBERNETES_FAULTS:
        raise (at / "fault").fail(f"one of {', '.join(KUBERNETES_FAULTS)}", fault)
    pods = tuple(
        _pod(p, at / "pods" / i, node) for i, p in enumerate(_list(d.get("pods"), at / "pods"))
    )
    _unique([p.key for p in pods], at / "pods", "namespace/name pairs")
    return pods, fault


def _podresources(
    doc: object, at: _Path, node: str
) -> tuple[tuple[SimAllocation, ...], str, tuple[SimDynamic, ...]]:
    d = _mapping(doc, at)
    _check_keys(d, PODRESOURCES_KEYS, at)
    fault = d.get("fault", "ok")
    if fault not in PODRESOURCES_FAULTS:
        raise (at / "fault").fail(f"one of {', '.join(PODRESOURCES_FAULTS)}", fault)
    allocations = tuple(
        _allocation(a, at / "allocations" / i)
        for i, a in enumerate(_list(d.get("allocations"), at / "allocations"))
    )
    dynamic = tuple(
        _dynamic(x, at / "dynamic" / i, node)
        for i, x in enumerate(_list(d.get("dynamic") or [], at / "dynamic"))
    )
    return allocations, fault, dynamic


def _dynamic(doc: object, at: _Path, node: str) -> SimDynamic:
    d = _mapping(doc, at)
    _check_keys(d, DYNAMIC_KEYS, at)
    namespace = _str(d.get("namespace", "default"), at / "namespace")
    return SimDynamic(
        namespace=namespace,
        pod=_str(d.get("pod"), at / "pod", "a pod name"),
        container=_str(d.get("container", "main"), at / "container"),
        claim=_str(d.get("claim"), at / "claim", "a ResourceClaim name"),
        claim_namespace=_str(d.get("claim_namespace", namespace), at / "claim_namespace"),
        driver=_str(d.get("driver", "gpu.nvidia.com"), at / "driver"),
        pool=_str(d.get("pool", node), at / "pool"),
        device=_str(d.get("device"), at / "device", "a device name like gpu-0"),
        share_id=_str(d["share_id"], at / "share_id") if "share_id" in d else "",
    )


def _dra(
    doc: object, at: _Path, node: str, gpus: tuple[SimGpu, ...], remote: bool = False
) -> SimDra:
    d = _mapping(doc, at)
    _check_keys(d, DRA_KEYS, at)
    fault = d.get("fault", "ok")
    if fault not in DRA_FAULTS:
        raise (at / "fault").fail(f"one of {', '.join(DRA_FAULTS)}", fault)
    slices = tuple(
        _slice(x, at / "slices" / i, node, gpus, remote)
        for i, x in enumerate(_list(d.get("slices") or [], at / "slices"))
    )
    claims = tuple(
        _claim(x, at / "claims" / i)
        for i, x in enumerate(_list(d.get("claims") or [], at / "claims"))
    )
    return SimDra(slices=slices, claims=claims, fault=str(fault))


def _slice(
    doc: object, at: _Path, node: str, gpus: tuple[SimGpu, ...], remote: bool = False
) -> SimSlice:
    """One slice; `remote` (a cluster-mode scenario): its devices are any GPU or MIG UUID."""
    d = _mapping(doc, at)
    _check_keys(d, DRA_SLICE_KEYS, at)
    migs = mig_devices(gpus)
    whole = {g.uuid for g in gpus}
    devices = []
    for i, x in enumerate(_list(d.get("devices"), at / "devices")):
        where = at / "devices" / i
        dm = _mapping(x, where)
        _check_keys(dm, DRA_DEVICE_KEYS, where)
        gpu = _str(dm.get("gpu"), where / "gpu", "the UUID of a GPU or MIG device under gpus")
        if remote and not gpu.startswith(("GPU-", "MIG-")):
            raise (where / "gpu").fail("a GPU-… or MIG-… UUID", gpu)
        if not remote and gpu not in whole and gpu not in migs:
            raise (where / "gpu").fail("the UUID of a GPU or MIG device under gpus", gpu)
        parent, mig = migs.get(gpu, (None, None))
        devices.append(
            SimSliceDevice(
                name=_str(dm.get("name"), where / "name", "a device name like gpu-0"),
                uuid=gpu,
                parent_uuid=parent.uuid if parent else None,
                profile=mig.profile if mig else None,
            )
        )
    return SimSlice(
        driver=_str(d.get("driver", "gpu.nvidia.com"), at / "driver"),
        pool=_str(d.get("pool", node), at / "pool"),
        node=_str(d.get("node", node), at / "node"),
        devices=tuple(devices),
    )


def _claim(doc: object, at: _Path) -> SimClaim:
    d = _mapping(doc, at)
    _check_keys(d, DRA_CLAIM_KEYS, at)
    return SimClaim(
        namespace=_str(d.get("namespace", "default"), at / "namespace"),
        name=_str(d.get("name"), at / "name", "a ResourceClaim name"),
        device_class=_str(d.get("device_class", "gpu.nvidia.com"), at / "device_class"),
        count=_int(d.get("count", 1), at / "count", 1),
        allocated=_bool(d.get("allocated", False), at / "allocated"),
        reserved_for=tuple(
            _str(p, at / "reserved_for" / i, "a pod name")
            for i, p in enumerate(_list(d.get("reserved_for") or [], at / "reserved_for"))
        ),
        deleting=_bool(d.get("deleting", False), at / "deleting"),
    )


FAILURE_MODES = ("FailClose", "FailOpen")
MAX_SELECTOR_LABELS = 64  # spec.selector.matchLabels, as the CRD bounds it
MAX_TARGET_PORTS = 8
DEFAULT_TARGET_PORT = 8000
BYTES_PER_QUEUED = 2048  # queued_bytes when not given: a short prompt per request


def _gateway(doc: object, at: _Path) -> SimGateway:
    d = _mapping(doc, at)
    _check_keys(d, GATEWAY_KEYS, at)
    fault = d.get("fault", "ok")
    if fault not in GATEWAY_FAULTS:
        raise (at / "fault").fail(f"one of {', '.join(GATEWAY_FAULTS)}", fault)
    pools = tuple(
        _pool(p, at / "pools" / i) for i, p in enumerate(_list(d.get("pools"), at / "pools"))
    )
    _unique([p.key for p in pools], at / "pools", "namespace/name pairs")
    services = [(p.namespace, p.picker.service) for p in pools if p.picker is not None]
    _unique(services, at / "pools", "picker Services per namespace (one picker per pool)")
    return SimGateway(pools=pools, fault=str(fault))


def _pool(doc: object, at: _Path) -> SimPool:
    d = _mapping(doc, at)
    _check_keys(d, POOL_KEYS, at)
    name = _str(d.get("name"), at / "name", "an InferencePool name")
    selector = _mapping(d.get("selector"), at / "selector", "a mapping of labels (matchLabels)")
    if not 1 <= len(selector) <= MAX_SELECTOR_LABELS:
        raise (at / "selector").fail(f"1 to {MAX_SELECTOR_LABELS} labels", selector)
    labels = {
        _str(k, at / "selector", "a label name"): _str(v, at / "selector" / str(k), "a value")
        for k, v in selector.items()
    }
    raw_ports = d.get("target_ports", [DEFAULT_TARGET_PORT])
    ports = tuple(
        _port(x, at / "target_ports" / i)
        for i, x in enumerate(_list(raw_ports, at / "target_ports"))
    )
    if not 1 <= len(ports) <= MAX_TARGET_PORTS:
        raise (at / "target_ports").fail(f"1 to {MAX_TARGET_PORTS} ports", raw_ports)
    _unique(list(ports), at / "target_ports", "port numbers")
    mode = d.get("failure_mode", "FailClose")
    if mode not in FAILURE_MODES:
        raise (at / "failure_mode").fail(f"one of {', '.join(FAILURE_MODES)}", mode)
    picker = d.get("picker")
    return SimPool(
        namespace=_str(d.get("namespace", "default"), at / "namespace"),
        name=name,
        selector=frozen_map(labels),
        target_ports=ports,
        failure_mode=str(mode),
        picker=None if picker is None else _picker(picker, at / "picker", name),
    )


def _port(value: object, at: _Path) -> int:
    number = _int(value, at, 1)
    if number > 65535:
        raise at.fail("a port number from 1 to 65535", value)
    return number


def _picker(doc: object, at: _Path, pool: str) -> SimPicker:
    d = _mapping(doc, at)
    _check_keys(d, PICKER_KEYS, at)
    names = d.get("names", "both")
    if names not in fake_picker.NAMES:
        raise (at / "names").fail(f"one of {', '.join(fake_picker.NAMES)}", names)
    fault = d.get("fault", "ok")
    if fault not in fake_picker.FAULTS:
        raise (at / "fault").fail(f"one of {', '.join(fake_picker.FAULTS)}", fault)
    queued = _int(d.get("queued", 0), at / "queued")
    ready = d.get("ready_endpoints")
    token = d.get("token")
    return SimPicker(
        service=_str(d.get("service", f"{pool}-epp"), at / "service", "a Service name"),
        names=str(names),
        flow_control=_bool(d.get("flow_control", True), at / "flow_control"),
        queued=queued,
        queued_bytes=parse_size(
            d.get("queued_bytes", queued * BYTES_PER_QUEUED), at / "queued_bytes"
        ),
        saturation=_number(d.get("saturation", 0), at / "saturation"),
        ready_endpoints=None if ready is None else _int(ready, at / "ready_endpoints"),
        token=None if token is None else _str(token, at / "token", "a bearer token"),
        fault=str(fault),
        raw=frozen_map(d),
    )


def _check_phase_gateway(phases: tuple[Phase, ...], gateway: SimGateway | None, at: _Path) -> None:
    """A phase's `gateway` patches name pools of the scenario that have a picker, and
    give values a picker takes (checked on the first state, as GPU patches are)."""
    pools = {p.key: p for p in gateway.pools} if gateway is not None else {}
    for i, phase in enumerate(phases):
        for key, patch in phase.gateway.items():
            where = at / "phases" / i / "gateway" / key
            pool = pools.get(key)
            if pool is None or pool.picker is None:
                raise where.fail("namespace/name of a pool under gateway.pools with a picker", key)
            _picker({**pool.picker.raw, **patch}, where, pool.name)


RAY_FAULTS = ("ok", "refuse", "hang", "http_500", "garbage", "result_false")
RAY_EXECUTORS = ("ray", "legacy")
_JOB_ID = re.compile(r"^[0-9a-f]{8}$")


def _ray_jobs(value: object, at: _Path, names: set[str]) -> tuple[SimRayJob, ...]:
    jobs = tuple(_ray_job(j, at / i, names, i) for i, j in enumerate(_list(value, at)))
    _unique([j.id for j in jobs], at, "job ids")
    return jobs


def _ray_node_name(value: object, at: _Path, names: set[str]) -> str:
    if value not in names:
        raise at.fail("the name of a node under ray.nodes", value)
    return str(value)


def _ray_job(doc: object, at: _Path, names: set[str], position: int) -> SimRayJob:
    d = _mapping(doc, at)
    _check_keys(d, RAY_JOB_KEYS, at)
    job_id = _str(d.get("id", (position + 1).to_bytes(4, "little").hex()), at / "id")
    if not _JOB_ID.match(job_id):
        raise (at / "id").fail("Ray's job id: 8 hex digits like 01000000", job_id)
    driver = _mapping(d.get("driver"), at / "driver", "a mapping with node and pid")
    _check_keys(driver, RAY_DRIVER_KEYS, at / "driver")
    executor = d.get("executor", "ray")
    if executor not in RAY_EXECUTORS:
        raise (at / "executor").fail(f"one of {', '.join(RAY_EXECUTORS)}", executor)
    workers = []
    for i, w in enumerate(_list(d.get("workers"), at / "workers")):
        where = at / "workers" / i
        wm = _mapping(w, where)
        _check_keys(wm, RAY_WORKER_KEYS, where)
        workers.append(
            SimRayWorker(
                node=_ray_node_name(wm.get("node"), where / "node", names),
                pid=_int(wm.get("pid"), where / "pid", 1),
                tp=_int(wm.get("tp", i), where / "tp"),
                pp=_int(wm.get("pp", 0), where / "pp"),
                state=_str(wm.get("state", "ALIVE"), where / "state"),
            )
        )
    return SimRayJob(
        id=job_id,
        driver_node=_ray_node_name(driver.get("node"), at / "driver" / "node", names),
        driver_pid=_int(driver.get("pid"), at / "driver" / "pid", 1),
        entrypoint=_str(d.get("entrypoint", DEFAULT_RAY_DRIVER), at / "entrypoint"),
        status=_str(d.get("status", "RUNNING"), at / "status"),
        executor=executor,
        workers=tuple(workers),
    )


def _ray(doc: object, at: _Path) -> SimRay:
    d = _mapping(doc, at)
    _check_keys(d, RAY_KEYS, at)
    fault = d.get("fault", "ok")
    if fault not in RAY_FAULTS:
        raise (at / "fault").fail(f"one of {', '.join(RAY_FAULTS)}", fault)
    nodes = []
    for i, n in enumerate(_list(d.get("nodes"), at / "nodes")):
        where = at / "nodes" / i
        nm = _mapping(n, where)
        _check_keys(nm, RAY_NODE_KEYS, where)
        nodes.append(
            SimRayNode(
                name=_str(nm.get("name", f"node-{i}"), where / "name"),
                pod=None if nm.get("pod") is None else _str(nm.get("pod"), where / "pod"),
                ip=None if nm.get("ip") is None else _str(nm.get("ip"), where / "ip"),
                gpus=_number(nm.get("gpus", 0), where / "gpus"),
                head=_bool(nm.get("head", i == 0), where / "head"),
            )
        )
    names = {n.name for n in nodes}
    actors = []
    for i, a in enumerate(_list(d.get("actors"), at / "actors")):
        where = at / "actors" / i
        am = _mapping(a, where)
        _check_keys(am, RAY_ACTOR_KEYS, where)
        node = am.get("node")
        if node is not None and node not in names:
            raise (where / "node").fail("the name of a node under ray.nodes", node)
        actor = SimRayActor(
            class_name=_str(am.get("class_name", "Worker"), where / "class_name"),
            node=node,
            pid=_int(am.get("pid", 0), where / "pid"),
            num_gpus=_number(am.get("num_gpus", 1), where / "num_gpus"),
            state=_str(am.get("state", "ALIVE" if node else "PENDING_CREATION"), where / "state"),
            placement_group=am.get("placement_group"),
        )
        actors.extend([actor] * _int(am.get("count", 1), where / "count", 1))
    groups = []
    for i, g in enumerate(_list(d.get("placement_groups"), at / "placement_groups")):
        where = at / "placement_groups" / i
        gm = _mapping(g, where)
        _check_keys(gm, PLACEMENT_GROUP_KEYS, where)
        groups.append(
            SimPlacementGroup(
                name=_str(gm.get("name", f"pg-{i}"), where / "name"),
                bundles=tuple(
                    _number(b, where / "bundles" / j)
                    for j, b in enumerate(_list(gm.get("bundles"), where / "bundles"))
                ),
                state=_str(gm.get("state", "PENDING"), where / "state"),
                scheduling_state=gm.get("scheduling_state"),
            )
        )
    serve = None
    if d.get("serve") is not None:
        serve = _serve(d.get("serve"), at / "serve", names)
    return SimRay(
        workload=d.get("workload"),
        token=d.get("token"),
        fault=fault,
        nodes=tuple(nodes),
        actors=tuple(actors),
        placement_groups=tuple(groups),
        serve=serve,
        cluster=None if d.get("cluster") is None else _str(d.get("cluster"), at / "cluster"),
        jobs=_ray_jobs(d.get("jobs"), at / "jobs", names),
    )


SERVE_FAULTS = ("ok", "refuse", "hang", "http_500", "garbage")


def _serve(doc: object, at: _Path, nodes: set[str] | None) -> SimServe:
    """`ray.serve`; `nodes`: the Ray node names (None in a phase: checked once parsed)."""
    d = _mapping(doc, at)
    _check_keys(d, SERVE_KEYS, at)
    faults = {k: d.get(k, "ok") for k in ("fault", "metrics_fault")}
    for key, fault in faults.items():
        if fault not in SERVE_FAULTS:
            raise (at / key).fail(f"one of {', '.join(SERVE_FAULTS)}", fault)
    deployments = []
    for i, a in enumerate(_list(d.get("applications"), at / "applications")):
        where = at / "applications" / i
        am = _mapping(a, where)
        _check_keys(am, SERVE_APPLICATION_KEYS, where)
        app = _str(am.get("name", f"app-{i}"), where / "name")
        for j, dep in enumerate(_list(am.get("deployments"), where / "deployments")):
            deployments.append(_serve_deployment(app, dep, where / "deployments" / j, nodes))
    _unique([(x.application, x.name) for x in deployments], at / "applications", "deployments")
    return SimServe(faults["fault"], faults["metrics_fault"], tuple(deployments))


def _serve_node(value: object, at: _Path, nodes: set[str] | None) -> str:
    if nodes is None:
        return _str(value, at, "the name of a node under ray.nodes")
    if value not in nodes:
        raise at.fail("the name of a node under ray.nodes", value)
    return str(value)


def _serve_deployment(
    app: str, doc: object, at: _Path, nodes: set[str] | None
) -> SimServeDeployment:
    d = _mapping(doc, at)
    _check_keys(d, SERVE_DEPLOYMENT_KEYS, at)
    replicas = []
    for i, r in enumerate(_list(d.get("replicas"), at / "replicas")):
        where = at / "replicas" / i
        rm = _mapping(r, where)
        _check_keys(rm, SERVE_REPLICA_KEYS, where)
        replicas.append(
            SimServeReplica(
                id=_str(rm.get("id", f"replica{i}"), where / "id"),
                node=_serve_node(rm.get("node"), where / "node", nodes),
                pid=_int(rm.get("pid", 0), where / "pid"),
                state=_str(rm.get("state", "RUNNING"), where / "state"),
                ongoing=_number(rm.get("ongoing", 0), where / "ongoing"),
            )
        )
    routers = []
    for i, r in enumerate(_list(d.get("routers"), at / "routers")):
        where = at / "routers" / i
        rm = _mapping(r, where)
        _check_keys(rm, SERVE_ROUTER_KEYS, where)
        routers.append(
            SimServeRouter(
                node=_serve_node(rm.get("node"), where / "node", nodes),
                queued=_number(rm.get("queued", 0), where / "queued"),
                at_replicas=_number(rm.get("at_replicas", 0), where / "at_replicas"),
            )
        )
    return SimServeDeployment(
        application=app,
        name=_str(d.get("name", "Deployment"), at / "name"),
        status=_str(d.get("status", "HEALTHY"), at / "status"),
        max_ongoing_requests=_int(d.get("max_ongoing_requests", 5), at / "max_ongoing_requests", 1),
        replicas=tuple(replicas),
        routers=tuple(routers),
    )


def _nvml(doc: object, at: _Path) -> SimNvml:
    d = _mapping(doc or {}, at)
    _check_keys(d, NVML_KEYS, at)
    library = d.get("library", "present")
    if library not in ("present", "missing"):
        raise (at / "library").fail("present or missing", library)
    variants = tuple(str(v) for v in _list(d.get("variants"), at / "variants"))
    for i, v in enumerate(variants):
        if v not in NVML_VARIANTS:
            raise (at / "variants" / i).fail(f"one of {', '.join(NVML_VARIANTS)}", v)
    return SimNvml(
        library=library,
        variants=variants,
        init_error=_int(d.get("init_error", 0), at / "init_error"),
        driver_version=_str(d.get("driver_version", "550.54.15"), at / "driver_version"),
    )


def _patch(value: object, at: _Path, keys: frozenset[str]) -> Mapping[str, Any] | None:
    """One phase's patch of one object, or None (the object goes). Its keys are checked
    here: a typo must fail when the file is read, not when the phase comes due."""
    if value is None:
        return None
    patch = _mapping(value, at, "a mapping or null")
    _check_keys(patch, keys, at)
    return patch


def _phase_fault(d: Mapping[str, Any], key: str, faults: tuple[str, ...], at: _Path) -> str | None:
    fault = d.get(key)
    if fault is not None and fault not in faults:
        raise (at / key).fail(f"one of {', '.join(faults)}", fault)
    return fault


def _phase(doc: object, at: _Path, gpus: tuple[SimGpu, ...]) -> Phase:
    d = _aliased(_mapping(doc, at), at)
    _check_keys(d, PHASE_KEYS, at)
    gpu_patches: dict[str, Mapping[str, Any]] = {}
    known = {g.uuid: g for g in gpus}
    for gpu_uuid, patch in _mapping(d.get("gpus") or {}, at / "gpus").items():
        where = at / "gpus" / str(gpu_uuid)
        if gpu_uuid not in known:
            raise where.fail("the UUID of a GPU listed under gpus", gpu_uuid)
        patch_map = _mapping(patch, where)
        _check_keys(patch_map, GPU_PATCH_KEYS, where)
        # Its values too (a MIG device's keys are nested): checked on the first state.
        base = known[gpu_uuid]
        _gpu({**_gpu_doc(base), **patch_map}, where, base.index)
        gpu_patches[gpu_uuid] = patch_map
    proc_patches = {
        _int(pid, at / "processes" / str(pid), 2): _patch(
            patch, at / "processes" / str(pid), PROCESS_PATCH_KEYS
        )
        for pid, patch in _mapping(d.get("processes") or {}, at / "processes").items()
    }
    pod_patches = {
        str(key): _patch(patch, at / "pods" / str(key), POD_PATCH_KEYS)
        for key, patch in _mapping(d.get("pods") or {}, at / "pods").items()
    }
    engine_patches = {
        str(key): _mapping(patch, at / "engines" / str(key))
        for key, patch in _mapping(d.get("engines") or {}, at / "engines").items()
    }
    for key, patch in engine_patches.items():
        _check_keys(patch, TARGET_PATCH_KEYS, at / "engines" / key)
    picker_patches = {
        str(key): _mapping(patch, at / "gateway" / str(key))
        for key, patch in _mapping(d.get("gateway") or {}, at / "gateway").items()
    }
    for key, patch in picker_patches.items():
        _check_keys(patch, PICKER_PATCH_KEYS, at / "gateway" / key)
    allocations = None
    if "allocations" in d:
        allocations = tuple(
            _allocation(a, at / "allocations" / i)
            for i, a in enumerate(_list(d.get("allocations"), at / "allocations"))
        )
    add_pods = tuple(
        _mapping(p, at / "add_pods" / i)
        for i, p in enumerate(_list(d.get("add_pods"), at / "add_pods"))
    )
    for i, pod in enumerate(add_pods):
        _check_keys(pod, POD_KEYS, at / "add_pods" / i)
    return Phase(
        name=_str(d.get("name"), at / "name"),
        after_seconds=parse_duration(d.get("after", 0), at / "after"),
        gpus=frozen_map(gpu_patches),
        processes=frozen_map(proc_patches),
        add_processes=tuple(
            _process(p, at / "add_processes" / i, gpus)
            for i, p in enumerate(_list(d.get("add_processes"), at / "add_processes"))
        ),
        pods=frozen_map(pod_patches),
        add_pods=add_pods,
        allocations=allocations,
        engines=frozen_map(engine_patches),
        kubernetes_fault=_phase_fault(d, "kubernetes_fault", KUBERNETES_FAULTS, at),
        podresources_fault=_phase_fault(d, "podresources_fault", PODRESOURCES_FAULTS, at),
        ray_serve=_serve(d["ray_serve"], at / "ray_serve", None) if d.get("ray_serve") else None,
        gateway=frozen_map(picker_patches),
    )


def _apply(state: Scenario, phase: Phase) -> Scenario:
    at = _Path(state.source) / "phases" / phase.name
    gpus = []
    for gpu in state.gpus:
        patch = phase.gpus.get(gpu.uuid)
        merged = {**_gpu_doc(gpu), **patch} if patch else None
        gpus.append(_gpu(merged, at / "gpus" / gpu.uuid, gpu.index) if merged else gpu)
    processes = []
    for proc in state.processes:
        if proc.pid in phase.processes:
            patch = phase.processes[proc.pid]
            if patch is None:
                continue  # the process exited
            merged = {
                "pid": proc.pid,
                "ppid": proc.ppid,
                "cmdline": list(proc.cmdline),
                "cgroup": proc.cgroup,
                "nspid": list(proc.nspid),
                "environ": dict(proc.environ),
                "gpu_memory": dict(proc.gpu_memory),
                **patch,
            }
            processes.append(_process(merged, at / "processes" / str(proc.pid), tuple(gpus)))
        else:
            processes.append(proc)
    processes.extend(phase.add_processes)
    _check_devices(processes, tuple(gpus), at / "processes")
    pods = state.pods
    if pods is not None and (phase.pods or phase.add_pods):
        patched = []
        for pod in pods:
            if pod.key in phase.pods:
                patch = phase.pods[pod.key]
                if patch is None:
                    continue  # deleted
                pod = _pod({**pod.raw, **patch}, at / "pods" / pod.key, state.node)  # noqa: PLW2901
            patched.append(pod)
        patched.extend(
            _pod(p, at / "add_pods" / i, state.node) for i, p in enumerate(phase.add_pods)
        )
        pods = tuple(patched)
    engines = tuple(
        _engine_server({**v.raw, **phase.engines[v.key]}, at / "engines" / v.key, i, v.kind)
        if v.key in phase.engines
        else v
        for i, v in enumerate(state.engines)
    )
    return replace(
        state,
        gpus=tuple(gpus),
        processes=tuple(processes),
        pods=pods,
        engines=engines,
        allocations=phase.allocations if phase.allocations is not None else state.allocations,
        kubernetes_fault=phase.kubernetes_fault or state.kubernetes_fault,
        podresources_fault=phase.podresources_fault or state.podresources_fault,
        ray=replace(state.ray, serve=phase.ray_serve)
        if state.ray is not None and phase.ray_serve is not None
        else state.ray,
        gateway=_apply_gateway(state.gateway, phase, at / "gateway"),
    )


def _apply_gateway(gateway: SimGateway | None, phase: Phase, at: _Path) -> SimGateway | None:
    if gateway is None or not phase.gateway:
        return gateway
    pools = []
    for pool in gateway.pools:
        patch = phase.gateway.get(pool.key)
        if patch is not None and pool.picker is not None:
            picker = _picker({**pool.picker.raw, **patch}, at / pool.key, pool.name)
            pool = replace(pool, picker=picker)  # noqa: PLW2901
        pools.append(pool)
    return replace(gateway, pools=tuple(pools))


def parse_scenario(doc: object, source: str) -> Scenario:
    at = _Path(source)
    given = _mapping(doc, at, "a YAML mapping with keys node, gpus, processes, …")
    d = _aliased(given, at)
    _check_keys(d, TOP_KEYS, at)
    node = _str(d.get("node", "sim-node"), at / "node")
    mode = d.get("mode", "node")
    if mode not in ("node", "cluster"):
        raise (at / "mode").fail("node or cluster", mode)
    gpus = tuple(
        _gpu(g, at / "gpus" / i, i) for i, g in enumerate(_list(d.get("gpus"), at / "gpus"))
    )
    _unique([g.uuid for g in gpus], at / "gpus", "GPU UUIDs")
    _unique([g.uuid for g in gpus] + list(mig_devices(gpus)), at / "gpus", "GPU and MIG UUIDs")
    _unique([g.index for g in gpus], at / "gpus", "GPU indices")
    processes = tuple(
        _process(p, at / "processes" / i, gpus)
        for i, p in enumerate(_list(d.get("processes"), at / "processes"))
    )
    _unique([p.pid for p in processes], at / "processes", "PIDs")
    phases = tuple(
        _phase(p, at / "phases" / i, gpus)
        for i, p in enumerate(_list(d.get("phases"), at / "phases"))
    )
    _unique([p.name for p in phases], at / "phases", "phase names")
    pods, k8s_fault = (None, "ok")
    if d.get("kubernetes") is not None:
        pods, k8s_fault = _kubernetes(d.get("kubernetes"), at / "kubernetes", node)
    allocations, pr_fault = None, "ok"
    dynamic: tuple[SimDynamic, ...] = ()
    if d.get("podresources") is not None:
        allocations, pr_fault, dynamic = _podresources(
            d.get("podresources"), at / "podresources", node
        )
    # The cluster view's slices are other nodes': their devices are no GPUs of this one.
    remote = mode == "cluster"
    dra = _dra(d["dra"], at / "dra", node, gpus, remote) if d.get("dra") is not None else None
    # The alias's entries are vLLM's, which they were before other kinds.
    alias_kind = KINDS[0].name if "engines" not in given else None
    engines = tuple(
        _engine_server(v, at / "engines" / i, i, alias_kind)
        for i, v in enumerate(_list(d.get("engines"), at / "engines"))
    )
    known_pods = {p.key for p in pods or ()}
    for i, v in enumerate(engines):
        if v.pod is not None and v.pod not in known_pods:
            raise (at / "engines" / i / "pod").fail(
                "namespace/name of a pod under kubernetes.pods", v.pod
            )
        if v.api_server is not None and v.api_server not in {p.pid for p in processes}:
            raise (at / "engines" / i / "api_server").fail("the PID of a process", v.api_server)
    # Two targets of one pod need names: phases find an entry by it.
    _unique([v.key for v in engines], at / "engines", "entries per pod (name the others)")
    ray = _ray(d.get("ray"), at / "ray") if d.get("ray") is not None else None
    for i, rn in enumerate(ray.nodes if ray else ()):
        if rn.pod is not None and rn.pod not in known_pods:
            raise (at / "ray" / "nodes" / i / "pod").fail(
                "namespace/name of a pod under kubernetes.pods", rn.pod
            )
    _check_phase_serve(phases, ray, at)
    gateway = None
    if d.get("gateway") is not None:
        if pods is None:
            raise (at / "gateway").fail("a scenario with kubernetes (the pools' pods)", "gateway")
        gateway = _gateway(d["gateway"], at / "gateway")
    _check_phase_gateway(phases, gateway, at)
    return Scenario(
        gateway=gateway,
        ray=ray,
        mode=mode,
        pods=pods,
        kubernetes_fault=k8s_fault,
        allocations=allocations,
        podresources_fault=pr_fault,
        engines=engines,
        dynamic=dynamic,
        dra=dra,
        source=source,
        node=node,
        description=str(d.get("description", "")),
        nvml=_nvml(d.get("nvml"), at / "nvml"),
        gpus=gpus,
        processes=processes,
        phases=phases,
    )


def _check_phase_serve(phases: tuple[Phase, ...], ray: SimRay | None, at: _Path) -> None:
    """A phase's ray_serve names Ray nodes of the scenario, which must have `ray`."""
    names = {n.name for n in ray.nodes} if ray is not None else set()
    for i, phase in enumerate(phases):
        if phase.ray_serve is None:
            continue
        where = at / "phases" / i / "ray_serve"
        if ray is None:
            raise where.fail("a scenario with ray", "ray_serve")
        for d in phase.ray_serve.deployments:
            for node in [r.node for r in d.replicas] + [r.node for r in d.routers]:
                if node not in names:
                    raise where.fail("Ray nodes named under ray.nodes", node)


def _check_devices(processes: list[SimProcess], gpus: tuple[SimGpu, ...], at: _Path) -> None:
    """After a phase: every process's memory is on a device that is still there (a phase
    may take a MIG device away, or turn MIG mode on, under a process it does not patch)."""
    known = {g.uuid for g in gpus if not g.mig_mode} | set(mig_devices(gpus))
    _unique([g.uuid for g in gpus] + list(mig_devices(gpus)), at, "GPU and MIG UUIDs")
    for proc in processes:
        for device in proc.gpu_memory:
            if device not in known:
                raise (at / str(proc.pid) / "gpu_memory").fail(
                    "a GPU without MIG mode, or a MIG device, that is still there", device
                )


def _unique(values: list[Any], at: _Path, what: str) -> None:
    seen = set()
    for value in values:
        if value in seen:
            raise at.fail(f"unique {what}", value)
        seen.add(value)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{p.name}: byte {exc.start}: not UTF-8 text") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(unknown line)"
        raise ScenarioError(f"{p.name}: {where}: not valid YAML") from None
    except RecursionError:
        raise ScenarioError(f"{p.name}: nested too deeply to be a scenario") from None
    _check_size(doc, p.name)
    return parse_scenario(doc, p.name)


def _check_size(doc: object, source: str) -> None:
    """Refuse documents that expand past MAX_DOCUMENT_NODES (YAML aliases share nodes,
    so a few lines can stand for billions: every later step would walk them all)."""
    stack = [doc]
    seen = 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_DOCUMENT_NODES:
            raise ScenarioError(
                f"{source}: more than {MAX_DOCUMENT_NODES} values once YAML aliases are "
                "expanded: not a scenario"
            )
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
