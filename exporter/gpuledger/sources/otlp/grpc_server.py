"""OTLP/gRPC (`opentelemetry.proto.collector.trace.v1.TraceService/Export`) on its own
port: the same receiver, bounds and whitelist as OTLP/HTTP. gRPC refuses a message over
the byte cap while reading it (max_receive_message_length), at most two exports run at
once (maximum_concurrent_rpcs: the rest are refused RESOURCE_EXHAUSTED), and the web
config's TLS files and basic auth apply (docs/spans.md)."""

from __future__ import annotations

import concurrent.futures
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import cast

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from gpuledger.model.spans import GrpcSecurity, SpanPeer
from gpuledger.sources.otlp.receiver import OtlpReceiver

log = logging.getLogger(__name__)

MAX_CONCURRENT_EXPORTS = 2


def parse_peer(peer: str, receiver_port: int = 0) -> SpanPeer:
    """gRPC's `ipv4:10.0.0.5:41234` / `ipv6:[::1]:41234` -> that address and port (an
    address "" and port 0 for anything else, e.g. `unix:`)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return SpanPeer("")
    host, _, port = rest.rpartition(":")
    return SpanPeer(host.strip("[]"), int(port) if port.isdigit() else 0, receiver_port)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver, security: GrpcSecurity) -> None:
        self._receiver = receiver
        self._security = security
        self.port = 0  # the one it listens on, once bound

    def Export(
        self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ExportTraceServiceResponse:
        metadata = dict(context.invocation_metadata())
        authorization = metadata.get("authorization")
        if not self._security.authorized(authorization if isinstance(authorization, str) else None):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unauthorized")
        refused = self._receiver.admit(request.ByteSize())
        if refused is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused.body.decode().strip())
        self._receiver.export(request, parse_peer(context.peer(), self.port))
        return ExportTraceServiceResponse()


def _certificates(security: GrpcSecurity) -> grpc.ServerCertificateConfiguration:
    assert security.cert_file and security.key_file
    key, cert = Path(security.key_file).read_bytes(), Path(security.cert_file).read_bytes()
    ca = Path(security.client_ca_file).read_bytes() if security.client_ca_file else None
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)


def _credentials(security: GrpcSecurity) -> grpc.ServerCredentials:
    """TLS that follows its files when they are replaced (cert-manager rotates in place)."""
    stamp: list[float] = [0.0]

    def mtime() -> float:
        files = [security.cert_file, security.key_file, security.client_ca_file]
        return sum(os.stat(f).st_mtime for f in files if f)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        try:
            now = mtime()
            if now == stamp[0]:
                return None
            stamp[0] = now
            return _certificates(security)
        except OSError:
            return None  # a half-written rotation: keep the previous certificate

    stamp[0] = mtime()
    # grpc's stub types the fetcher without its documented None ("no change").
    fetcher = cast("Callable[[], grpc.ServerCertificateConfiguration]", fetch)
    return grpc.dynamic_ssl_server_credentials(
        _certificates(security), fetcher, require_client_authentication=security.require_client_cert
    )


def start_grpc(
    receiver: OtlpReceiver, listen: tuple[str, int], security: GrpcSecurity
) -> tuple[grpc.Server, int]:
    """Starts the listener; the server and the port it bound. Raises RuntimeError when
    the address cannot be bound."""
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(
            MAX_CONCURRENT_EXPORTS, thread_name_prefix="otlp-grpc"
        ),
        options=[
            ("grpc.max_receive_message_length", receiver.max_body_bytes),
            ("grpc.max_send_message_length", 1024),
        ],
        maximum_concurrent_rpcs=MAX_CONCURRENT_EXPORTS,
    )
    # opentelemetry-proto ships no stubs for its generated gRPC module.
    service = _TraceService(receiver, security)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        service, server
    )
    host, port = listen
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if security.cert_file:
        bound = server.add_secure_port(address, _credentials(security))
    else:
        bound = server.add_insecure_port(address)
    service.port = bound
    server.start()
    log.info("receiving OTLP/gRPC spans on %s", address)
    return server, bound
