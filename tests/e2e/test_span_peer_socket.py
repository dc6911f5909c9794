"""Identity rule 10's peer-socket rule on a real kernel: a process that is an engine's API
server (it serves the engine's /metrics and has a `VLLM::EngineCore` child) exports the
real vLLM 0.32 capture's spans (tests/fixtures/vllm-otlp/) to a running `gpuledger serve
--otlp-grpc-listen` over one gRPC channel it keeps open, as vLLM's gRPC exporter does,
with `vllm.process_id` removed from their resource. The agent reads the real /proc: the
API server that holds the sending end of that connection is the sender, so the spans
are tied to its engine (`joined_by: peer_socket`) where no PID rule could have tied them;
once the sender has gone, the same spans are left untied, with the reason."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.security.helpers import Served, free_port

SENDER = Path(__file__).with_name("span_sender.py")
CAPTURE = REPO / "tests" / "fixtures" / "vllm-otlp"
EXPOSITION = REPO / "tests" / "fixtures" / "vllm" / "vllm-0.32.txt"


@pytest.fixture
def grpc_port() -> int:
    return free_port()


@pytest.fixture
def sender(grpc_port: int) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen(
        [sys.executable, str(SENDER), str(EXPOSITION), str(CAPTURE), str(grpc_port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=20)


def held(doc: dict[str, Any]) -> int:
    return sum(len(s["recent"]) for s in doc["spans"]["senders"])


def test_the_api_server_holding_the_connection_is_the_sender(
    tmp_path: Path, grpc_port: int, sender: tuple[subprocess.Popen[str], int]
) -> None:
    proc, metrics_port = sender
    served = Served(
        ["serve", "--otlp-receiver", "on", "--otlp-grpc-listen", f"127.0.0.1:{grpc_port}",
         "--kubernetes", "off", "--vllm-discovery", "off",
         "--vllm-target", f"http://127.0.0.1:{metrics_port}/metrics",
         "--nvml-library", str(tmp_path / "absent.so"), "--interval", "0.3"]
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "sent"
        doc = served.wait(
            lambda d: held(d) == 12 and d["spans"]["senders"][0]["joined_by"] != "none"
        )
        (one,) = doc["spans"]["senders"]
        (engine,) = doc["engines"]
        assert one["process_id"] is None  # nothing but the connection names the sender
        assert (one["joined_by"], one["target"]) == ("peer_socket", engine["target"])
        assert engine["api_server_pid"] == proc.pid
        # The sender goes, and its connection with it: still held, no longer tied.
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=20)
        doc = served.wait(lambda d: d["spans"]["senders"][0]["joined_by"] == "none")
        assert "vllm.process_id" in doc["spans"]["senders"][0]["untied_reason"]
    finally:
        served.close()
        served.remove_log()
