"""OTLP/gRPC into a running `gpuledger serve --otlp-receiver on --otlp-grpc-listen`: the
real capture's requests are stored as over HTTP, with the connection's peer as sender; a
message over --otlp-max-body-bytes is refused while gRPC reads it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.conftest import REPO
from tests.security.helpers import Served, free_port

CAPTURE = REPO / "tests" / "fixtures" / "vllm-otlp"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, int]]:
    proc_root: Path = tmp_path_factory.mktemp("proc")
    grpc_port = free_port()
    served = Served(
        ["serve", "--otlp-receiver", "on", "--otlp-grpc-listen", f"127.0.0.1:{grpc_port}",
         "--otlp-max-body-bytes", "65536", "--kubernetes", "off", "--vllm-discovery", "off",
         "--proc-root", str(proc_root), "--nvml-library", str(proc_root / "absent.so"),
         "--interval", "0.3"]
    )  # fmt: skip
    try:
        served.wait(lambda d: d["spans"]["receiving"])
        yield served, grpc_port
    finally:
        served.close()
        served.remove_log()


def export(port: int, message: ExportTraceServiceRequest) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.Export(message, timeout=10)


def test_the_real_capture_over_grpc_is_held_with_its_sender(agent: tuple[Served, int]) -> None:
    served, port = agent
    for body in sorted(CAPTURE.glob("otlp_http_*.pb")):
        message = ExportTraceServiceRequest()
        message.ParseFromString(body.read_bytes())
        export(port, message)
    doc = served.wait(lambda d: sum(len(s["recent"]) for s in d["spans"]["senders"]) == 12)
    (sender,) = doc["spans"]["senders"]
    assert (sender["peer"], sender["process_id"], sender["service_name"]) == (
        "127.0.0.1",
        32132,
        "vllm-tiny-otlp",
    )
    # No engine here has that PID: kept, not tied, and says why.
    assert sender["joined_by"] == "none" and "API servers" in sender["untied_reason"]


def test_a_message_over_the_cap_is_refused(agent: tuple[Served, int]) -> None:
    _, port = agent
    message = ExportTraceServiceRequest()
    message.ParseFromString((CAPTURE / "otlp_http_5.pb").read_bytes())
    big = ExportTraceServiceRequest()
    while big.ByteSize() <= 65536:
        big.resource_spans.extend(message.resource_spans)
    with pytest.raises(grpc.RpcError) as refused:
        export(port, big)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
