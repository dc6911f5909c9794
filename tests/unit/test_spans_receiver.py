"""The span receiver on what a real vLLM 0.32 engine sent (tests/fixtures/vllm-otlp/):
protobuf and OTLP/JSON bodies, gzip, refusals, and the bounded rings a flood cannot grow."""

from __future__ import annotations

import base64
import gzip
import json

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gpuledger.model.spans import EngineRequestSpan, SpanPeer, SpanSender
from gpuledger.sources.otlp import store as store_module
from gpuledger.sources.otlp.receiver import OtlpReceiver
from gpuledger.sources.otlp.store import SpanStore, budget_bytes
from tests.conftest import REPO

CAPTURE = REPO / "tests" / "fixtures" / "vllm-otlp"
PROTOBUF = "application/x-protobuf"


def capture_bodies() -> list[bytes]:
    return [p.read_bytes() for p in sorted(CAPTURE.glob("otlp_http_*.pb"))]


def as_otlp_json(body: bytes) -> bytes:
    """The same request in OTLP/JSON: protobuf's JSON mapping with hex ids, as the
    OpenTelemetry SDKs' and the Collector's otlphttp exporters write it."""
    message = ExportTraceServiceRequest()
    message.ParseFromString(body)
    tree = json_format.MessageToDict(message)
    for resource in tree.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64_to_hex(span[key])
    return json.dumps(tree).encode()


def base64_to_hex(text: str) -> str:
    return base64.b64decode(text).hex()


def received(receiver: OtlpReceiver, bodies: list[bytes], media: str = PROTOBUF) -> None:
    for body in bodies:
        answer = receiver.accept(body, media, "", SpanPeer("10.1.2.3"))
        assert answer.status == 200, answer.body


@pytest.mark.parametrize("encoding", ["protobuf", "json", "gzip"])
def test_the_real_engines_twelve_requests_are_held_with_their_latencies(encoding: str) -> None:
    receiver = OtlpReceiver(SpanStore())
    bodies = capture_bodies()
    if encoding == "json":
        received(receiver, [as_otlp_json(b) for b in bodies], "application/json")
    elif encoding == "gzip":
        for body in bodies:
            assert (
                receiver.accept(gzip.compress(body), PROTOBUF, "gzip", SpanPeer("10.1.2.3")).status
                == 200
            )
    else:
        received(receiver, bodies)
    (held,) = receiver.store.snapshot().senders
    assert held.sender == SpanSender(
        peer="10.1.2.3",
        service_name="vllm-tiny-otlp",
        instance_id="878e3061-ee7b-48ad-b005-4a15468fd88a",
        process_id=32132,
    )
    ids = sorted(s.request_id for s in held.recent)
    assert ids == [f"cmpl-req-{n}-0" for n in range(101, 113)]
    first = next(s for s in held.recent if s.request_id == "cmpl-req-101-0")
    assert first.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert first.parent_span_id == "00f067aa0ba902b7"
    assert first.prompt_tokens == 41 and first.completion_tokens == 48
    assert first.scheduler_seconds is None  # 0.32 sends none: tolerated
    waited = [s for s in held.recent if (s.queue_seconds or 0) > 0.01]
    assert len(waited) == 10
    assert held.slowest[0].request_id in ("cmpl-req-111-0", "cmpl-req-112-0")
    assert held.queue_time is not None and held.queue_time.counts[-1] == 12


def test_bodies_that_are_not_otlp_are_refused_and_counted() -> None:
    receiver = OtlpReceiver(SpanStore())
    assert receiver.accept(b"\xff\xff\xff\x0f", PROTOBUF, "", SpanPeer("")).status == 400
    assert receiver.accept(b"{not json", "application/json", "", SpanPeer("")).status == 400
    assert receiver.accept(b"abc", PROTOBUF, "gzip", SpanPeer("")).status == 400
    assert receiver.accept(b"abc", "text/plain", "", SpanPeer("")).status == 415
    assert receiver.accept(b"", PROTOBUF, "br", SpanPeer("")).status == 400
    refused = receiver.store.snapshot().refused_total
    assert refused == {"malformed": 4, "media_type": 1}
    assert receiver.store.snapshot().senders == ()


def test_a_body_over_the_cap_is_refused_before_it_is_read_and_a_gzip_bomb_after_inflating() -> None:
    receiver = OtlpReceiver(SpanStore(), max_body_bytes=64 * 1024)
    assert receiver.admit(50 * 1024 * 1024) is not None
    assert receiver.admit(50 * 1024 * 1024).status == 413  # type: ignore[union-attr]
    bomb = gzip.compress(b"\0" * (10 * 1024 * 1024))
    assert receiver.admit(len(bomb)) is None
    assert receiver.accept(bomb, PROTOBUF, "gzip", SpanPeer("")).status == 413
    assert receiver.store.snapshot().refused_total == {"too_large": 3}


def test_the_rate_bound_refuses_with_retry_after_once_the_burst_is_spent() -> None:
    receiver = OtlpReceiver(SpanStore(), max_body_bytes=1000, bytes_per_second=1000)
    answers = [receiver.admit(1000) for _ in range(5)]
    refused = [a for a in answers if a is not None]
    assert refused, "a burst of twice the rate must run out"
    assert {a.status for a in refused} == {429}
    assert {a.retry_after_seconds for a in refused} == {1}


def span(n: int, e2e: float) -> EngineRequestSpan:
    return EngineRequestSpan(
        trace_id=f"{n:032x}",
        span_id=f"{n:016x}",
        parent_span_id="",
        request_id=f"cmpl-r{n}-0",
        start_ns=n,
        end_ns=n + 1,
        e2e_seconds=e2e,
        queue_seconds=e2e / 2,
    )


def test_a_flood_replaces_what_a_ring_holds_and_keeps_the_slowest() -> None:
    store = SpanStore()
    sender = SpanSender("10.0.0.1", "vllm", "i", 1)
    slow = span(0, 99.0)
    store.add([(sender, slow)], [])
    store.add([(sender, span(n, 0.5)) for n in range(1, 20_001)], [])
    (held,) = store.snapshot().senders
    assert len(held.recent) == store_module.RECENT_PER_SENDER
    assert held.recent[-1].request_id == "cmpl-r20000-0"
    assert len(held.slowest) == store_module.SLOWEST_PER_SENDER
    assert held.slowest[0] == slow
    assert held.received_total == 20_001
    assert store.snapshot().stored_bytes <= budget_bytes()


def test_a_flood_of_new_senders_cannot_push_out_the_engines_already_held() -> None:
    store = SpanStore()
    engine = SpanSender("10.0.0.1", "vllm", "engine", 1)
    store.add([(engine, span(1, 1.0))], [])
    flood = [(SpanSender("10.9.9.9", "x", f"fake-{n}", n), span(n, 1.0)) for n in range(500)]
    refused = store.add(flood, [])
    snapshot = store.snapshot()
    assert len(snapshot.senders) == store_module.MAX_SENDERS
    assert engine in {s.sender for s in snapshot.senders}
    assert refused == 500 - (store_module.MAX_SENDERS - 1)
    assert snapshot.refused_total["senders"] == refused
