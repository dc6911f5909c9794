"""The spans the receiver holds, read once per cycle like any source's snapshot: the
receiver is pushed to, the pipeline still reads one frozen view (docs/design.md)."""

from __future__ import annotations

from gpuledger.model import Snapshots
from gpuledger.model.spans import SPANS, GrpcSecurity, SpansSnapshot
from gpuledger.sources.base import Source
from gpuledger.sources.otlp.grpc_server import start_grpc
from gpuledger.sources.otlp.receiver import (
    DEFAULT_BYTES_PER_SECOND,
    DEFAULT_MAX_BODY_BYTES,
    OtlpReceiver,
)
from gpuledger.sources.otlp.store import SpanStore


class SpansSource(Source[SpansSnapshot]):
    key = SPANS

    def __init__(
        self,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        bytes_per_second: int = DEFAULT_BYTES_PER_SECOND,
    ) -> None:
        self.store = SpanStore()
        self.receiver = OtlpReceiver(
            self.store, max_body_bytes=max_body_bytes, bytes_per_second=bytes_per_second
        )

    def fetch(self, inputs: Snapshots) -> SpansSnapshot:
        return self.store.snapshot()

    def start_grpc(self, listen: tuple[str, int], security: GrpcSecurity) -> int:
        """OTLP/gRPC on `listen` too; the port bound (0: it could not be)."""
        self._grpc, port = start_grpc(self.receiver, listen, security)
        return port

    def close(self) -> None:
        grpc_server = getattr(self, "_grpc", None)
        if grpc_server is not None:
            grpc_server.stop(grace=1)
