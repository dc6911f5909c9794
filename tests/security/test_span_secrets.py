"""Span attributes can carry prompts and tokens: a canary in a span attribute, a resource
attribute, a span name, an event, a link, a status message, an identifier that is not
one, or a malformed body reaches no output of the agent (/metrics in both formats,
/ledger.json, /ledger, /, the log at debug level, the receiver's own answers, and
`explain --request`/`--workload` in text and JSON), while the same spans' whitelisted
fields do."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from tests.conftest import REPO
from tests.security.helpers import Served, gpuledger
from tests.security.test_secrets import http_channels

MARK = "SpAnCaNaRy"
DEMO = REPO / "exporter" / "gpuledger" / "sim" / "scenarios" / "demo.yaml"
KEPT_ID = "cmpl-kept-1-0"


def kv(key: str, value: str | float) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def canary_request() -> bytes:
    span = Span(
        trace_id=bytes(range(16)),
        span_id=bytes(range(8)),
        name="llm_request",
        kind=Span.SpanKind.SPAN_KIND_SERVER,
        start_time_unix_nano=1_796_000_000_000_000_000,
        end_time_unix_nano=1_796_000_001_000_000_000,
        attributes=[
            kv("gen_ai.request.id", KEPT_ID),
            kv("gen_ai.latency.time_in_queue", 0.5),
            kv("gen_ai.prompt", f"tell me the {MARK}-prompt"),
            kv("gen_ai.completion", f"{MARK}-completion"),
            kv("http.request.header.authorization", f"Bearer {MARK}-token"),
        ],
        events=[Span.Event(name=f"{MARK}-event", attributes=[kv("text", f"{MARK}-ev")])],
        links=[Span.Link(trace_id=bytes(16), span_id=bytes(8), attributes=[kv("x", MARK)])],
        status=Status(message=f"{MARK}-status"),
    )
    others = [
        Span(trace_id=bytes(range(16)), span_id=b"\1" * 8, name=f"{MARK}-span-name"),
        Span(trace_id=bytes(range(16)), span_id=b"\2" * 8, name=f"proxy_http_request {MARK}"),
        Span(
            trace_id=bytes(range(16)),
            span_id=b"\3" * 8,
            name="llm_request",
            attributes=[kv("gen_ai.request.id", f"cmpl-{MARK} with spaces-0")],
        ),
    ]
    resource = Resource(
        attributes=[
            kv("service.name", f"svc {MARK}"),
            kv("service.instance.id", "i-1"),
            kv("process.command_args", f"--api-key {MARK}-res"),
            kv("vllm.process_id", f"{MARK}"),
        ]
    )
    message = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=[span, *others])])
        ]
    )
    return message.SerializeToString()


MALFORMED = [
    ("application/x-protobuf", f"\x0a\xff\xff{MARK}".encode()),
    ("application/json", f'{{"resourceSpans": "{MARK}"}}'.encode()),
    ("application/json", json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": f"{MARK * 3}00", "name": "llm_request"}]}]}]}).encode()),
    ("application/json", f"{MARK} not json".encode()),
    ("text/plain", MARK.encode()),
]  # fmt: skip


def post(base: str, body: bytes, content_type: str) -> tuple[int, str]:
    request = urllib.request.Request(
        base + "/v1/traces", data=body, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode("latin-1")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("latin-1")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path: Path = tmp_path_factory.mktemp("spans") / "demo.yaml"
    doc: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    path.write_text(yaml.safe_dump({**doc, "phases": []}))
    agent = Served(["simulate", str(path), "--interval", "0.5", "--log-level", "debug"])
    try:
        agent.wait(lambda d: d["spans"]["receiving"])
        yield agent
    finally:
        agent.close()
        agent.remove_log()


def test_a_canary_in_any_unread_part_of_a_span_reaches_no_output(served: Served) -> None:
    answers = {"export": post(served.base, canary_request(), "application/x-protobuf")}
    for i, (content_type, body) in enumerate(MALFORMED):
        answers[f"malformed {i}"] = post(served.base, body, content_type)
    assert answers["export"][0] == 200
    assert sorted(status for status, _ in answers.values()) == [200, 400, 400, 400, 400, 415]
    doc = served.wait(
        lambda d: any(
            r["request_id"] == KEPT_ID for s in d["spans"]["senders"] for r in s["recent"]
        )
    )
    assert doc["spans"]["refused_total"] == {"malformed": 4, "media_type": 1}
    channels = {name: body for name, (_, body) in answers.items()}
    channels.update(http_channels(served.base))
    for query in (["--request", KEPT_ID], ["--request", "kept-1"], ["--workload", "llm/llama-8b"]):
        for output in ("text", "json"):
            result = gpuledger("explain", "--from", served.base, *query, "--output", output)
            assert result.returncode == 0, result.stderr
            channels[" ".join(query) + output] = result.stdout + result.stderr
    channels["log"] = served.log()
    assert KEPT_ID in channels["/ledger.json"] and KEPT_ID in channels["--request kept-1text"]
    assert "gpuledger_otlp_refused_total" in channels["/metrics"]
    for name, text in channels.items():
        assert MARK not in text, f"the canary reached {name}"
