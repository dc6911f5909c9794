"""A real vLLM engine (the CPU build) sending its request spans to a real agent, opt-in.

Run it as test_vllm_real.py is run (``GPULEDGER_VLLM_BIN=/path/to/venv/bin/vllm``; without
it the module is skipped, and CI never collects tests/optin). What the capture in
tests/fixtures/vllm-otlp/ was made from, end to end through gpuledger: vLLM with
``--otlp-traces-endpoint`` pointed at ``gpuledger serve --otlp-receiver on``, which scrapes
the same engine; twelve requests at once against ``--max-num-seqs 2``, the first with a
``traceparent``. Checked: every request's span reaches the agent and is tied to the engine
(over gRPC by the peer-socket rule: the API server holds the channel's end; over HTTP by
the host-process rule: loopback, the API server's PID), the continued trace id, the waits
read against the engine's sampled state (``max_num_seqs``) and against its batch rebuilt
from its spans, the exemplars, and that the server's API key and HF token reach no output.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO
from tests.optin.test_vllm_real import Server, _free_port, _wait_for, vllm_server

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# 64 long completions at --max-num-seqs 2: the queue lasts seconds, so the agent's samples
# (a cycle every 0.2 s, or as long as a cycle takes) fall inside the later waits. With
# twelve of 48 tokens (the capture's), or sixteen of 180, the burst was over within one
# cycle on a 2-core machine: explain then rightly read "not queueing" from the samples
# before and after each wait.
REQUESTS = 64
MAX_TOKENS = 180


@pytest.fixture(scope="module", params=["http/protobuf", "grpc"])
def engine_and_agent(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Server, str, str]]:
    """The engine exporting over OTLP/HTTP to the agent's --listen, then over OTLP/gRPC
    to its --otlp-grpc-listen (vLLM's own exporters, chosen by the protocol variable)."""
    tmp = tmp_path_factory.mktemp("spans")
    agent_port, grpc_port = _free_port(), _free_port()
    protocol = str(request.param)
    grpc = protocol == "grpc"
    endpoint = (
        f"http://127.0.0.1:{grpc_port}" if grpc else f"http://127.0.0.1:{agent_port}/v1/traces"
    )
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "true",
        "OTEL_SERVICE_NAME": "vllm-optin",
    }
    grpc_args = ["--otlp-grpc-listen", f"127.0.0.1:{grpc_port}"] if grpc else []
    with vllm_server(tmp, ["--otlp-traces-endpoint", endpoint], env, max_num_seqs=2) as server:
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpuledger", "serve", "--listen", f"127.0.0.1:{agent_port}",
             "--otlp-receiver", "on", *grpc_args, "--vllm-target", server.metrics_url,
             "--kubernetes", "off", "--nvml-library", str(tmp / "absent.so"),
             "--interval", "0.2"],
            env={"PYTHONPATH": str(REPO / "exporter"), "PATH": "/usr/bin:/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        base = f"http://127.0.0.1:{agent_port}"
        try:
            _wait_for(lambda: _ledger(base) is not None, 60, "the agent")
            yield server, base, protocol
        finally:
            agent.terminate()
            agent.communicate(timeout=20)


def _ledger(base: str) -> dict[str, object] | None:
    try:
        answer = requests.get(base + "/ledger.json", timeout=2)
    except requests.RequestException:
        return None
    return answer.json() if answer.status_code == 200 else None


def _send(server: Server, i: int) -> int:
    headers = {"Authorization": f"Bearer {server.api_key}", "X-Request-Id": f"req-{101 + i}"}
    if i == 0:
        headers["traceparent"] = TRACEPARENT
    answer = requests.post(
        f"{server.base}/v1/completions",
        json={
            "model": "tiny",
            "prompt": [1] + [5] * 40,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
        },
        headers=headers,
        timeout=240,
    )
    return answer.status_code


def _explain(base: str, *query: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "gpuledger", "explain", "--from", base, *query],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO / "exporter"), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_real_engines_spans_are_tied_to_it_and_explain_its_waits(
    engine_and_agent: tuple[Server, str, str],
) -> None:
    server, base, protocol = engine_and_agent
    with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:
        assert list(pool.map(lambda i: _send(server, i), range(REQUESTS))) == [200] * REQUESTS

    def all_received() -> dict[str, object] | None:
        doc = _ledger(base)
        senders = doc["spans"]["senders"] if doc else []  # type: ignore[index]
        got = {r["request_id"] for s in senders for r in s["recent"]}
        return doc if len(got) >= REQUESTS else None

    try:
        doc = _wait_for(all_received, 60, "the spans of every request")
    except pytest.fail.Exception:
        spans = (_ledger(base) or {}).get("spans", {})
        held = {
            s["service_name"]: (s["received_total"], s["joined_by"])  # type: ignore[index]
            for s in spans.get("senders", ())  # type: ignore[union-attr]
        }
        pytest.fail(f"not every span arrived: held {held}, refused {spans.get('refused_total')}")
    (sender,) = [s for s in doc["spans"]["senders"] if s["service_name"] == "vllm-optin"]
    assert sender["process_id"] == server.pid
    # gRPC keeps its channel open: the API server holds its end of it. OTLP/HTTP's
    # connection ends with each export (the agent answers HTTP/1.0): the loopback PID rule.
    rule = "peer_socket" if protocol == "grpc" else "host_pid"
    assert (sender["joined_by"], sender["model_name"]) == (rule, "tiny")
    first = _explain(base, "--request", "req-101")
    assert "trace 4bf92f3577b34da6a3ce929d0e0e4736" in first
    waited = [
        _explain(base, "--request", f"req-{n}") for n in range(101 + REQUESTS - 8, 101 + REQUESTS)
    ]
    assert any("why it waited: max_num_seqs" in text for text in waited), waited[-1]
    # The batch from the engine's own spans: two running through the waits.
    assert any("of max_num_seqs 2" in t and "every batch slot taken" in t for t in waited), waited
    openmetrics = requests.get(
        base + "/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        timeout=10,
    ).text
    assert '# {trace_id="' in openmetrics
    everything = json.dumps(doc) + first + "".join(waited) + openmetrics
    assert server.api_key not in everything and server.hf_token not in everything
    Path(REPO / "test-artifacts").mkdir(exist_ok=True)
    (REPO / "test-artifacts" / "vllm-spans-ledger.json").write_text(json.dumps(doc, indent=1))
