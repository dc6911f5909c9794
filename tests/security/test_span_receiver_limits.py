"""The span receiver is a server: a body over the cap is refused before it is read, a body
that never finishes arriving is given up, exports beyond its own two workers are turned
away at once, and all the while /metrics and /healthz answer (scrapes never wait behind
span exports: they have workers of their own). Against the real HTTP server, in-process."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sources.otlp.receiver import OtlpReceiver
from gpuledger.sources.otlp.store import SpanStore
from gpuledger.web import server as web_server
from gpuledger.web.server import Exporter, GatedHTTPServer, serve
from gpuledger.web.webconfig import load_web_config
from tests.conftest import REPO

BODY = (REPO / "tests" / "fixtures" / "vllm-otlp" / "otlp_http_5.pb").read_bytes()
CAP = 64 * 1024


@pytest.fixture
def agent() -> Iterator[tuple[GatedHTTPServer, OtlpReceiver]]:
    pipeline = Pipeline(PipelineConfig(node="n1"), sources=[])
    exporter = Exporter(pipeline.cycle, 10.0)
    exporter.run_once()
    receiver = OtlpReceiver(SpanStore(), max_body_bytes=CAP, bytes_per_second=10**9)
    httpd = serve(exporter, "127.0.0.1:0", "n1", "node", spans=receiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd, receiver
    httpd.shutdown()
    httpd.server_close()


def port(httpd: GatedHTTPServer) -> int:
    return int(httpd.server_address[1])


def post_head(p: int, length: int, extra: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", p), timeout=10)
    sock.sendall(
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        + f"Content-Length: {length}\r\n\r\n".encode()
        + extra
    )
    return sock


def answer(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def scrape(p: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{p}/metrics", timeout=10) as resp:
        resp.read()
        return int(resp.status)


def test_a_50_mb_body_is_refused_from_its_head_without_being_read(
    agent: tuple[GatedHTTPServer, OtlpReceiver],
) -> None:
    httpd, receiver = agent
    sock = post_head(port(httpd), 50 * 1024 * 1024, b"\0" * 4096)
    # The answer comes while 50 MB are still unsent: the body was never waited for.
    assert answer(sock).startswith(b"HTTP/1.0 413")
    assert receiver.store.snapshot().refused_total == {"too_large": 1}
    assert scrape(port(httpd)) == 200


def test_a_body_that_stops_arriving_is_given_up(
    agent: tuple[GatedHTTPServer, OtlpReceiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    httpd, receiver = agent
    monkeypatch.setattr(web_server, "BODY_DEADLINE_SECONDS", 0.5)
    sock = post_head(port(httpd), len(BODY), BODY[:100])  # the rest never comes
    assert answer(sock).startswith(b"HTTP/1.0 408")
    assert receiver.store.snapshot().senders == ()


def test_the_real_capture_over_http_is_stored_and_answered_as_otlp(
    agent: tuple[GatedHTTPServer, OtlpReceiver],
) -> None:
    httpd, receiver = agent
    request = urllib.request.Request(
        f"http://127.0.0.1:{port(httpd)}/v1/traces",
        data=BODY,
        headers={"Content-Type": "application/x-protobuf"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/x-protobuf"
    (held,) = receiver.store.snapshot().senders
    assert held.sender.peer == "127.0.0.1" and held.received_total == 12


def test_a_flood_of_exports_is_turned_away_while_scrapes_are_answered(
    agent: tuple[GatedHTTPServer, OtlpReceiver],
) -> None:
    httpd, _ = agent
    p = port(httpd)
    # Twenty exports whose bodies hang: at most two are worked on, the rest are told 429.
    hanging = [post_head(p, len(BODY), BODY[:10]) for _ in range(20)]
    statuses: list[bytes] = []
    for sock in hanging:
        sock.settimeout(0.5)
        try:
            statuses.append(sock.recv(64)[:12])
        except TimeoutError:
            statuses.append(b"(working)")
    assert statuses.count(b"HTTP/1.0 429") == 18, statuses
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        scrapes = list(pool.map(lambda _: scrape(p), range(16)))
    assert scrapes == [200] * 16
    for sock in hanging:
        sock.close()


def test_basic_auth_of_the_web_config_guards_the_receiver(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  otel: '{hashed}'\n")
    pipeline = Pipeline(PipelineConfig(node="n1"), sources=[])
    exporter = Exporter(pipeline.cycle, 10.0)
    exporter.run_once()
    receiver = OtlpReceiver(SpanStore())
    httpd = serve(
        exporter, "127.0.0.1:0", "n1", "node", load_web_config(str(config)), spans=receiver
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        sock = post_head(port(httpd), len(BODY), BODY)
        assert answer(sock).startswith(b"HTTP/1.0 401")
        assert receiver.store.snapshot().senders == ()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_without_the_receiver_a_span_export_is_not_found_and_nothing_is_exported() -> None:
    pipeline = Pipeline(PipelineConfig(node="n1"), sources=[])
    exporter = Exporter(pipeline.cycle, 10.0)
    exporter.run_once()
    httpd = serve(exporter, "127.0.0.1:0", "n1", "node")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        sock = post_head(port(httpd), len(BODY), BODY)
        assert answer(sock).startswith(b"HTTP/1.0 404")
        with urllib.request.urlopen(f"http://127.0.0.1:{port(httpd)}/metrics", timeout=10) as r:
            assert b"gpuledger_otlp_" not in r.read()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert [s.name for s in Pipeline(PipelineConfig(node="n1")).sources if s.name == "otlp"] == []
