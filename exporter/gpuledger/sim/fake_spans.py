"""What a simulated engine sends the agent's span receiver: one OTLP export request per
engine API server, its `llm_request` spans shaped as vLLM 0.32 sends them (the capture in
tests/fixtures/vllm-otlp/), and for a request behind a router a Ray Serve proxy span of
the same trace, as its parent. Sent over OTLP/HTTP from the engine's own address (its
pod's IP), as a real engine would, or handed to the receiver directly (settled_document).
"""

from __future__ import annotations

import hashlib
import http.client
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from gpuledger.engines.kinds import EngineKind
from gpuledger.sim.scenario import SimRequest

SERVE_PROXY_SERVICE = "ray-serve-proxy"
# The proxy starts routing this long before the engine sees the request, and answers
# this long after the engine finished.
ROUTER_LEAD_SECONDS = 0.004
ROUTER_TAIL_SECONDS = 0.002


@dataclass(frozen=True)
class SpanBatch:
    """One export request, and the address it is sent from."""

    source_host: str
    body: bytes


def _kv(key: str, value: str | int | float) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def _span_id(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:8]


def _engine_span(r: SimRequest, arrived_ns: int, name: str) -> Span:
    ttft = r.queue + r.prefill
    e2e = ttft + r.decode
    parent = _span_id(f"router/{r.id}") if r.router else b""
    return Span(
        trace_id=bytes.fromhex(r.trace_id),
        span_id=_span_id(f"engine/{r.id}"),
        parent_span_id=parent,
        name=name,
        kind=Span.SpanKind.SPAN_KIND_SERVER,
        start_time_unix_nano=arrived_ns,
        end_time_unix_nano=arrived_ns + int(e2e * 1e9),
        attributes=[
            _kv("gen_ai.latency.time_to_first_token", ttft),
            _kv("gen_ai.latency.e2e", e2e),
            _kv("gen_ai.latency.time_in_queue", r.queue),
            _kv("gen_ai.usage.prompt_tokens", r.prompt_tokens),
            _kv("gen_ai.usage.completion_tokens", r.completion_tokens),
            _kv("gen_ai.latency.time_in_model_prefill", r.prefill),
            _kv("gen_ai.latency.time_in_model_decode", r.decode),
            _kv("gen_ai.latency.time_in_model_inference", r.prefill + r.decode),
            _kv("gen_ai.request.id", f"cmpl-{r.id}-0"),
            _kv("gen_ai.request.max_tokens", r.completion_tokens),
        ],
    )


def _router_span(r: SimRequest, arrived_ns: int) -> Span:
    e2e = r.queue + r.prefill + r.decode
    return Span(
        trace_id=bytes.fromhex(r.trace_id),
        span_id=_span_id(f"router/{r.id}"),
        name="proxy_http_request llm POST /v1/completions",
        kind=Span.SpanKind.SPAN_KIND_SERVER,
        start_time_unix_nano=arrived_ns - int(ROUTER_LEAD_SECONDS * 1e9),
        end_time_unix_nano=arrived_ns + int((e2e + ROUTER_TAIL_SECONDS) * 1e9),
    )


def _resource(service: str, instance: str, process_id: tuple[str, int] | None) -> Resource:
    attributes = [_kv("service.name", service), _kv("service.instance.id", instance)]
    if process_id is not None:
        attributes.append(_kv(process_id[0], str(process_id[1])))
    return Resource(attributes=attributes)


def export_body(
    requests: Sequence[SimRequest],
    phase_start_ns: int,
    *,
    kind: EngineKind,
    process_id: int | None,
) -> bytes:
    """The engine's export request for `requests`, arrivals counted from phase_start_ns;
    its service name is the kind's name (vLLM's default OTEL_SERVICE_NAME)."""
    assert kind.spans is not None, kind.name
    service, names = kind.name, kind.spans
    engine = [
        _engine_span(r, phase_start_ns + int(r.after * 1e9), names.span_name) for r in requests
    ]
    routed = [_router_span(r, phase_start_ns + int(r.after * 1e9)) for r in requests if r.router]
    instance = hashlib.sha256(service.encode()).hexdigest()[:32]
    message = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=_resource(
                    service,
                    instance,
                    None if process_id is None else (names.process_id, process_id),
                ),
                scope_spans=[ScopeSpans(spans=engine)],
            )
        ]
    )
    if routed:
        message.resource_spans.append(
            ResourceSpans(
                resource=_resource(SERVE_PROXY_SERVICE, "proxy-" + instance[:8], None),
                scope_spans=[ScopeSpans(spans=routed)],
            )
        )
    return message.SerializeToString()


def post(endpoint: str, batch: SpanBatch, timeout_seconds: float = 5.0) -> int:
    """POSTs one export request from batch.source_host, as protobuf; the HTTP status."""
    url = urlsplit(endpoint)
    conn = http.client.HTTPConnection(
        url.hostname or "127.0.0.1",
        url.port or 80,
        timeout=timeout_seconds,
        source_address=(batch.source_host, 0),
    )
    try:
        conn.request(
            "POST",
            url.path or "/v1/traces",
            body=batch.body,
            headers={"Content-Type": "application/x-protobuf"},
        )
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()
