"""A stand-in engine API server for test_span_peer_socket.py, as a process of its own: it
serves a captured vLLM 0.32 exposition on /metrics, has a child titled
`VLLM::EngineCore` (what makes it an API server to the procfs source), and exports the
real capture's spans (tests/fixtures/vllm-otlp/) over one OTLP/gRPC channel it keeps
open, as vLLM's gRPC exporter does. The spans' resource loses `vllm.process_id`: only the
connection can say who sent them. Prints the metrics port, then "sent"; exits when its
stdin closes.

    python span_sender.py EXPOSITION CAPTURE_DIR AGENT_GRPC_PORT
"""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def serve_metrics(body: bytes) -> ThreadingHTTPServer:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def messages(capture: Path) -> list[ExportTraceServiceRequest]:
    found = []
    for path in sorted(capture.glob("otlp_http_*.pb")):
        message = ExportTraceServiceRequest()
        message.ParseFromString(path.read_bytes())
        for resource_spans in message.resource_spans:
            attributes = resource_spans.resource.attributes
            kept = [kv for kv in attributes if kv.key != "vllm.process_id"]
            del attributes[:]
            attributes.extend(kept)
        found.append(message)
    return found


def main() -> None:
    exposition, capture, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    metrics = serve_metrics(exposition.read_bytes())
    # Its own stdio: a child holding our stdout would keep the test's pipe open.
    engine = subprocess.Popen(
        ["VLLM::EngineCore", "600"],
        executable="sleep",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        print(metrics.server_address[1], flush=True)
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
        for message in messages(capture):
            stub.Export(message, timeout=60, wait_for_ready=True)  # the agent may be starting
        print("sent", flush=True)
        sys.stdin.read()  # the test closes it when done
    finally:
        channel.close()
        engine.kill()
        metrics.shutdown()


if __name__ == "__main__":
    main()
