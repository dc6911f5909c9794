"""The gateway's view (Gateway API Inference Extension): InferencePools, the model-server
pods their selectors pick, and what each pool's endpoint picker (EPP) says it holds.

Facts from upstream source, versions named in tests/fixtures/gateway/README.md:
InferencePool `inference.networking.k8s.io/v1` (GIE v1.6.0) selects pods of its own
namespace by `spec.selector.matchLabels` only; each pod is an endpoint per
`spec.targetPorts[].number`; `spec.endpointPickerRef` names the picker's Service. The
picker (llm-d-router v0.10.0, GIE v1.5.0 before it) serves Prometheus metrics on the
Service's `http-metrics` port (9090), one picker per pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuledger.model.base import frozen_map
from gpuledger.model.bundle import Key


@dataclass(frozen=True)
class PoolMember:
    """A pod the pool's selector matches (same namespace), with what routing needs."""

    uid: str
    name: str
    workload: str
    node_name: str | None
    pod_ip: str | None
    ready: bool  # the pod's Ready condition: the endpoints a picker may send to


@dataclass(frozen=True)
class PickerRef:
    """spec.endpointPickerRef of a pool: the Service in front of its endpoint picker."""

    service: str
    port: int | None  # the ext-proc port the gateway calls (9002), not the metrics port
    failure_mode: str  # FailOpen or FailClose (the CRD's default)


@dataclass(frozen=True)
class InferencePool:
    """One InferencePool, its selector resolved to member pods."""

    namespace: str
    name: str
    uid: str
    selector: Mapping[str, str]  # spec.selector.matchLabels
    target_ports: tuple[int, ...]
    picker: PickerRef | None  # None: no endpointPickerRef (optional since GIE v1.6.0)
    # Where the picker's metrics are read: the configured URL, else the Service's
    # `http-metrics` port (9090 when it names none); None when there is no picker.
    picker_metrics_url: str | None
    members: tuple[PoolMember, ...]
    # Why the members are not known this cycle (an error reason); members then empty.
    members_error: str | None = None
    # status.parents[].conditions Accepted, the first parent's: True/False/Unknown, None.
    accepted: str | None = None


@dataclass(frozen=True)
class PoolsSnapshot:
    pools: tuple[InferencePool, ...]  # sorted by namespace, name


# The InferencePool source's snapshot in a cycle's Snapshots (cluster mode).
INFERENCE_POOLS: Key[PoolsSnapshot] = Key("inferencepools")


@dataclass(frozen=True)
class PickerReading:
    """What one pool's endpoint picker reported, or why it could not be read."""

    namespace: str
    pool: str
    url: str  # safe to show: no userinfo or query
    up: bool
    error_reason: str | None = None
    error_message: str | None = None
    # Which metric names it serves: "llm_d_epp" (llm-d-router v0.9.0+, also emits the
    # legacy twins) or "legacy" (GIE v1.x: inference_pool_*, inference_extension_*).
    names: str | None = None
    # Requests its flow control holds (flow_control_queue_size summed over fairness,
    # priority and model); None when flow control is off (no such series).
    queued_requests: float | None = None
    queued_bytes: float | None = None
    # Its own view of the pool: endpoints with fresh metrics, averages over them.
    ready_endpoints: float | None = None
    average_queue_size: float | None = None
    average_kv_cache_utilization: float | None = None
    # flow_control_pool_saturation (0..1 and above): how full it judges the pool.
    saturation: float | None = None
    # Per endpoint (`<pod>-rank-<i>`, i the index in targetPorts): its queue as the picker
    # last read it from the engine.
    endpoint_queues: Mapping[str, float] = field(default_factory=frozen_map)
    duration_seconds: float = 0.0


@dataclass(frozen=True)
class PickersSnapshot:
    readings: tuple[PickerReading, ...]  # one per pool with a picker, sorted


# The picker source's snapshot (cluster mode; it needs INFERENCE_POOLS).
PICKERS: Key[PickersSnapshot] = Key("picker")
