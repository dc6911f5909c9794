"""Request spans the node agent received over OTLP (docs/design.md, "Request spans"):
only whitelisted attributes, kept in bounded rings per sender."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gpuledger.model.base import frozen_map
from gpuledger.model.bundle import Key

# The span kinds OTLP names (SPAN_KIND_*), lowercased without the prefix.
SpanKind = Literal["unspecified", "internal", "server", "client", "producer", "consumer"]


@dataclass(frozen=True, order=True)
class SpanSender:
    """Who sent a span: the connection's peer and the span's whitelisted resource
    attributes. Two senders never share one ring."""

    peer: str  # the connection's peer IP address ("" when not known, e.g. a test)
    service_name: str  # service.name
    instance_id: str  # service.instance.id (a UUID per process in vLLM's SDK)
    # vllm.process_id: the API server's PID in its own PID namespace.
    process_id: int | None = None
    # Added by an OpenTelemetry Collector's k8sattributes processor; "" without one.
    pod_uid: str = ""
    pod_ip: str = ""


@dataclass(frozen=True, order=True)
class SpanPeer:
    """The TCP connection an export came over, as the receiver saw it: the sender's
    address and port, and the receiver's own port (0: not known). The sending process
    holds the other end of it (docs/design.md, identity rule 10: the peer-socket rule)."""

    address: str
    port: int = 0
    receiver_port: int = 0


@dataclass(frozen=True)
class EngineRequestSpan:
    """One finished request, from vLLM's `llm_request` server span. Latencies are the
    engine's own (gen_ai.latency.*); None where the engine's version does not send them."""

    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    request_id: str  # gen_ai.request.id, e.g. cmpl-req-101-0
    start_ns: int  # the engine's clock: arrival at the API server
    end_ns: int
    queue_seconds: float | None = None
    ttft_seconds: float | None = None
    e2e_seconds: float | None = None
    prefill_seconds: float | None = None
    decode_seconds: float | None = None
    inference_seconds: float | None = None
    scheduler_seconds: float | None = None  # newer vLLM releases only
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    max_tokens: int | None = None
    model_name: str = ""  # gen_ai.response.model, newer releases only


@dataclass(frozen=True)
class RouterSpan:
    """A span of another service (a router: Ray Serve, a gateway) kept so that a request
    can show its router's part when both are in one trace. Only the ids, the kind, the
    times and a whitelisted span name: its attributes are never read."""

    sender: SpanSender
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str  # "" unless the name is one of otlp's KNOWN_ROUTER_SPANS
    kind: SpanKind
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class LatencyCounts:
    """A cumulative histogram of one latency over a sender's lifetime in the agent, with
    the last trace id seen in each bucket (the exemplar)."""

    bounds: tuple[float, ...]  # upper bounds, ascending, +Inf implied
    counts: tuple[int, ...]  # cumulative, len(bounds) + 1
    total: float
    exemplars: Mapping[int, tuple[str, float, float]] = field(default_factory=frozen_map)
    # bucket index -> (trace id, value, unix seconds)


@dataclass(frozen=True)
class SenderSpans:
    """What one sender's ring holds: its most recent and its slowest requests."""

    sender: SpanSender
    recent: tuple[EngineRequestSpan, ...]  # newest last
    slowest: tuple[EngineRequestSpan, ...]  # by e2e, slowest first
    received_total: int
    queue_time: LatencyCounts | None = None
    ttft: LatencyCounts | None = None
    # The connection its last export came over, when both ports are known.
    connection: SpanPeer | None = None


@dataclass(frozen=True)
class SpansSnapshot:
    senders: tuple[SenderSpans, ...] = ()
    routers: tuple[RouterSpan, ...] = ()
    # Spans or requests turned away, by reason (rate, too_large, malformed, senders, ...).
    refused_total: Mapping[str, int] = field(default_factory=frozen_map)
    stored_bytes: int = 0  # the estimate the memory budget is held to


@dataclass(frozen=True)
class IngestAnswer:
    """What the receiver answers one export request."""

    status: int  # HTTP status; the gRPC server maps it to a code
    body: bytes
    content_type: str
    retry_after_seconds: int | None = None


class SpanSink(Protocol):
    """The receiver as the HTTP server sees it (web/ must not import the sources)."""

    @property
    def max_body_bytes(self) -> int: ...

    def admit(self, length: int) -> IngestAnswer | None:
        """None when a body of `length` bytes may be read now; else the refusal."""

    def accept(
        self, body: bytes, content_type: str, content_encoding: str, peer: SpanPeer
    ) -> IngestAnswer: ...


@dataclass(frozen=True)
class GrpcSecurity:
    """What the web config (--web-config-file) asks of the OTLP/gRPC listener too: its
    TLS files (re-read when they change) and its basic auth, as a check of the
    `authorization` metadata."""

    authorized: Callable[[str | None], bool]
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    require_client_cert: bool = False


# This source's snapshot in a cycle's Snapshots.
SPANS: Key[SpansSnapshot] = Key("otlp")
