"""OTLP trace export bodies → typed spans: the one reader of the wire format's fields.

Protobuf (`application/x-protobuf`) and JSON (`application/json`, OTLP's JSON encoding:
ids in hex) bodies are parsed with opentelemetry-proto's messages; gRPC hands over the
parsed message. Only whitelisted attributes are read, by name, so a prompt or a token in
any other attribute, in an event or in a span name never leaves this module: attribute
values can carry them (docs/design.md, "Request spans").
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gpuledger.engines import KINDS
from gpuledger.engines.kinds import RequestSpans
from gpuledger.model.spans import EngineRequestSpan, RouterSpan, SpanKind, SpanSender

# Router span names kept, by their first word (Ray Serve 2.60 appends the deployment,
# method and route: those words are dropped).
KNOWN_ROUTER_SPANS = frozenset(
    {"proxy_http_request", "proxy_grpc_request", "route_to_replica", "replica_handle_request"}
)
# Each engine kind's request span, by its name (engines/: the attribute names are data).
_ENGINE_SPANS: dict[str, RequestSpans] = {
    k.spans.span_name: k.spans for k in KINDS if k.spans is not None
}
_KINDS: dict[int, SpanKind] = {
    0: "unspecified",
    1: "internal",
    2: "server",
    3: "client",
    4: "producer",
    5: "consumer",
}
# What an identifier kept from a span may look like: a request id, a service name.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}")
_PID = re.compile(r"[0-9]{1,10}")
_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
_IP = re.compile(r"[0-9a-fA-F.:]{2,45}")


class MalformedBody(ValueError):
    """Not an OTLP trace export request. The message never quotes the body."""


@dataclass(frozen=True)
class Decoded:
    engine_spans: tuple[tuple[SpanSender, EngineRequestSpan], ...]
    router_spans: tuple[RouterSpan, ...]
    ignored: int  # spans that are neither (vLLM's start-up spans, other services' own)


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    try:
        message.ParseFromString(body)
    except (DecodeError, ValueError, RecursionError):
        raise MalformedBody("not an OTLP protobuf trace export") from None
    return message


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    """OTLP/JSON: protobuf's JSON mapping except that trace and span ids are hex (the
    mapping's base64 is accepted too, as opentelemetry-proto's MessageToDict writes it)."""
    try:
        tree = json.loads(body)
        for resource in _list(tree, "resourceSpans"):
            for scope in _list(resource, "scopeSpans"):
                for span in _list(scope, "spans"):
                    _hex_ids_to_base64(span)
        message = ExportTraceServiceRequest()
        json_format.ParseDict(tree, message, ignore_unknown_fields=True)
    except (ValueError, TypeError, RecursionError, json_format.ParseError):
        raise MalformedBody("not an OTLP JSON trace export") from None
    return message


def _list(obj: object, key: str) -> list[Any]:
    value = obj.get(key, []) if isinstance(obj, dict) else []
    if not isinstance(value, list):
        raise MalformedBody(f"{key} is not an array")
    return value


def _hex_ids_to_base64(span: object) -> None:
    if not isinstance(span, dict):
        return
    for key, size in (("traceId", 16), ("spanId", 8), ("parentSpanId", 8)):
        value = span.get(key)
        if isinstance(value, str) and len(value) == 2 * size:
            try:
                span[key] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise MalformedBody(f"{key} is not hex") from None


def decode(message: ExportTraceServiceRequest, peer: str) -> Decoded:
    engine: list[tuple[SpanSender, EngineRequestSpan]] = []
    routers: list[RouterSpan] = []
    ignored = 0
    for resource_spans in message.resource_spans:
        sender = _sender(resource_spans.resource.attributes, peer)
        for span in _spans(resource_spans.scope_spans):
            first_word = span.name.split(" ", 1)[0]
            kind = _ENGINE_SPANS.get(span.name)
            if kind is not None and (request := _engine_span(span, kind)) is not None:
                engine.append((sender, request))
            elif first_word in KNOWN_ROUTER_SPANS and (router := _router_span(span, sender)):
                routers.append(router)
            else:
                ignored += 1
    return Decoded(tuple(engine), tuple(routers), ignored)


def _spans(scopes: Sequence[Any]) -> Iterator[Span]:
    for scope in scopes:
        yield from scope.spans


def _sender(attributes: Sequence[KeyValue], peer: str) -> SpanSender:
    values = {kv.key: kv.value for kv in attributes if kv.key in _RESOURCE_KEYS}
    pid = next((p for key in _PROCESS_IDS if (p := _text(values.get(key)))), "")
    pod_uid = _text(values.get("k8s.pod.uid")).lower()
    pod_ip = _text(values.get("k8s.pod.ip"))
    return SpanSender(
        peer=peer if _IP.fullmatch(peer) else "",
        service_name=_safe(_text(values.get("service.name"))),
        instance_id=_safe(_text(values.get("service.instance.id"))),
        process_id=int(pid) if _PID.fullmatch(pid) else None,
        pod_uid=pod_uid if _POD_UID.fullmatch(pod_uid) else "",
        pod_ip=pod_ip if _IP.fullmatch(pod_ip) else "",
    )


_PROCESS_IDS = tuple(dict.fromkeys(s.process_id for s in _ENGINE_SPANS.values()))
_RESOURCE_KEYS = frozenset(
    {"service.name", "service.instance.id", "k8s.pod.uid", "k8s.pod.ip", *_PROCESS_IDS}
)


def _engine_span(span: Span, kind: RequestSpans) -> EngineRequestSpan | None:
    ids = _ids(span)
    if ids is None:
        return None
    values: dict[str, Any] = {}
    request_id = ""
    for kv in span.attributes:
        if (name := kind.latencies.get(kv.key)) is not None:
            values[name] = _number(kv.value)
        elif (name := kind.counts.get(kv.key)) is not None:
            number = _number(kv.value)
            values[name] = None if number is None else int(number)
        elif kv.key == kind.request_id:
            request_id = _safe(_text(kv.value))
        elif kind.model and kv.key == kind.model:
            values["model_name"] = _safe(_text(kv.value))
    if not request_id:
        return None  # nothing to find it by
    trace_id, span_id, parent = ids
    return EngineRequestSpan(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        request_id=request_id,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        **values,
    )


def _router_span(span: Span, sender: SpanSender) -> RouterSpan | None:
    ids = _ids(span)
    if ids is None:
        return None
    return RouterSpan(
        sender=sender,
        trace_id=ids[0],
        span_id=ids[1],
        parent_span_id=ids[2],
        name=span.name.split(" ", 1)[0],
        kind=_KINDS.get(span.kind, "unspecified"),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
    )


def _ids(span: Span) -> tuple[str, str, str] | None:
    if len(span.trace_id) != 16 or len(span.span_id) != 8:
        return None
    parent = span.parent_span_id.hex() if len(span.parent_span_id) == 8 else ""
    return binascii.hexlify(span.trace_id).decode(), span.span_id.hex(), parent


def _text(value: AnyValue | None) -> str:
    if value is None:
        return ""
    if value.HasField("string_value"):
        return value.string_value
    if value.HasField("int_value"):
        return str(value.int_value)
    return ""


def _number(value: AnyValue) -> float | None:
    if value.HasField("double_value"):
        number = value.double_value
    elif value.HasField("int_value"):
        number = float(value.int_value)
    else:
        return None
    return number if math.isfinite(number) and abs(number) < 1e12 else None


def _safe(text: str) -> str:
    """An identifier as sent, or "" when it does not look like one (whitespace, quotes,
    markup, over 128 characters): shown on pages and in explain, never a free text."""
    return text if _SAFE_ID.fullmatch(text) else ""
