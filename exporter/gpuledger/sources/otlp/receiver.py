"""The OTLP trace receiver: what one export request (HTTP or gRPC) is answered, under a
byte cap per request and a rate bound in bytes per second (docs/design.md, "Request
spans"). The HTTP server (web/server.py) reads the body within the cap and hands it here
through model.spans.SpanSink; the gRPC server is grpc_server.py."""

from __future__ import annotations

import logging
import threading
import time
import zlib
from http import HTTPStatus

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from gpuledger.model.spans import IngestAnswer, SpanPeer
from gpuledger.sources.otlp.decode import MalformedBody, decode, parse_json, parse_protobuf
from gpuledger.sources.otlp.store import SpanStore

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# Bytes per second the receiver parses (with a burst of two full requests): a node's
# engines finishing ~1,500 requests a second (a span is ~1.2 KB), and what bounds the CPU
# a flood costs: ~20% of a core (benchmarks/bench_spans.py, docs/performance.md).
DEFAULT_BYTES_PER_SECOND = 2 * 1024 * 1024
_PROTOBUF = "application/x-protobuf"
_JSON = "application/json"


class TokenBucket:
    def __init__(self, rate: float, burst: float) -> None:
        self._rate, self._burst = rate, burst
        self._tokens, self._at = burst, time.monotonic()
        self._lock = threading.Lock()

    def take(self, amount: float) -> bool:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
            self._at = now
            if amount > self._tokens:
                return False
            self._tokens -= amount
            return True


def _text(status: HTTPStatus, message: str, retry: int | None = None) -> IngestAnswer:
    return IngestAnswer(int(status), (message + "\n").encode(), "text/plain", retry)


class OtlpReceiver:
    """model.spans.SpanSink over a SpanStore."""

    def __init__(
        self,
        store: SpanStore,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        bytes_per_second: int = DEFAULT_BYTES_PER_SECOND,
    ) -> None:
        self.store = store
        self._max_body_bytes = max_body_bytes
        self._bucket = TokenBucket(bytes_per_second, 2 * max(bytes_per_second, max_body_bytes))

    @property
    def max_body_bytes(self) -> int:
        return self._max_body_bytes

    def admit(self, length: int) -> IngestAnswer | None:
        if length > self._max_body_bytes:
            self.store.refuse("too_large")
            return _text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body over the receiver's cap")
        if not self._bucket.take(length):
            self.store.refuse("rate")
            return _text(HTTPStatus.TOO_MANY_REQUESTS, "over the receiver's rate", retry=1)
        return None

    def accept(
        self, body: bytes, content_type: str, content_encoding: str, peer: SpanPeer
    ) -> IngestAnswer:
        media = content_type.split(";", 1)[0].strip().lower()
        if media not in (_PROTOBUF, _JSON):
            self.store.refuse("media_type")
            return _text(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"expected {_PROTOBUF} or {_JSON}")
        try:
            raw = self._inflate(body, content_encoding.strip().lower())
            message = parse_json(raw) if media == _JSON else parse_protobuf(raw)
        except InflatedTooLarge:
            self.store.refuse("too_large")
            return _text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "inflated body over the cap")
        except MalformedBody as exc:
            self.store.refuse("malformed")
            log.debug("otlp: refused a body from %s: %s", peer.address, exc)
            return _text(HTTPStatus.BAD_REQUEST, str(exc))
        self.export(message, peer)
        response = ExportTraceServiceResponse()
        if media == _JSON:
            return IngestAnswer(int(HTTPStatus.OK), b"{}", _JSON)
        return IngestAnswer(int(HTTPStatus.OK), response.SerializeToString(), _PROTOBUF)

    def export(self, message: ExportTraceServiceRequest, peer: SpanPeer) -> None:
        """Stores what one parsed request carries (HTTP and gRPC alike)."""
        decoded = decode(message, peer.address)
        self.store.add(decoded.engine_spans, decoded.router_spans, peer)

    def _inflate(self, body: bytes, encoding: str) -> bytes:
        if encoding in ("", "identity"):
            return body
        if encoding != "gzip":
            raise MalformedBody("unsupported Content-Encoding")
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            raw = inflater.decompress(body, self._max_body_bytes + 1)
        except zlib.error:
            raise MalformedBody("not a gzip stream") from None
        if len(raw) > self._max_body_bytes:
            raise InflatedTooLarge
        return raw


class InflatedTooLarge(Exception):
    """A gzip body that inflates past the cap: inflating stopped there."""
