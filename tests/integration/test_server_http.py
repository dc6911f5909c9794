"""What a scraper and a kubelet probe see of the HTTP server (gpuledger/web/server.py):
gzip when asked, HEAD answered, liveness tied to the collection loop, a busy port."""

from __future__ import annotations

import gzip
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuledger.export.published import Published
from gpuledger.web import server
from gpuledger.web.server import Exporter, serve
from tests.reliability.harness import Node
from tests.reliability.scenarios import churn_node
from tests.security.helpers import gpuledger


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(churn_node(4), tmp_path / "node", deadline=2.0)
    made.cycle()
    yield made
    made.close()


def fetch(url: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_gzip_when_asked_is_the_same_exposition_and_much_smaller(node: Node) -> None:
    status, headers, plain = fetch(node.base + "/metrics")
    assert status == 200 and "Content-Encoding" not in headers
    status, headers, packed = fetch(node.base + "/metrics", **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    unpacked = gzip.decompress(packed).decode()

    # The age line differs between two scrapes; every other line is the same.
    def steady(text: str) -> list[str]:
        return [line for line in text.splitlines() if "snapshot_age" not in line]

    assert steady(unpacked) == steady(plain.decode())
    assert len(plain) >= 5 * len(packed), (len(plain), len(packed))


def test_gzip_refused_with_q_zero_is_not_sent(node: Node) -> None:
    _, headers, _ = fetch(node.base + "/metrics", **{"Accept-Encoding": "gzip;q=0, identity"})
    assert "Content-Encoding" not in headers


@pytest.mark.parametrize(
    "path", ["/metrics", "/healthz", "/readyz", "/ledger.json", "/runbooks", "/"]
)
def test_head_is_answered_without_a_body(node: Node, path: str) -> None:
    status, headers, body = fetch(node.base + path, method="HEAD")
    assert status == 200 and body == b""
    if path != "/healthz":
        assert int(headers["Content-Length"]) > 0


def test_liveness_fails_when_the_collection_loop_stops_progressing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "STALL_FLOOR_SECONDS", 0.0)
    stuck = threading.Event()
    release = threading.Event()

    def hung_cycle() -> Published:
        stuck.set()
        release.wait(30)  # a source call that never returns
        raise RuntimeError("released")

    exporter = Exporter(hung_cycle, interval_seconds=0.1)
    httpd = serve(exporter, "127.0.0.1:0", "n1", "node")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/healthz"
    try:
        assert fetch(url)[0] == 200  # just started: not stalled yet
        exporter.start()
        assert stuck.wait(10)
        # Stalled once STALL_INTERVALS intervals (0.5 s) pass with the cycle still hung.
        give_up = time.monotonic() + 20
        answers = [fetch(url)]
        while answers[-1][0] == 200 and time.monotonic() < give_up:
            answers.append(fetch(url))
        status, _, body = answers[-1]
        assert (status, body) == (503, b"collection loop made no progress\n")
    finally:
        release.set()
        exporter.stop()
        httpd.shutdown()
        httpd.server_close()


def test_a_busy_address_is_one_line_and_exit_2() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = gpuledger(
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--nvml-library",
            "/nonexistent.so",
            timeout=60,
        )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert (
        lines[-1] == f"gpuledger: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("simulated", [True, False])
def test_the_index_says_simulated_before_the_first_snapshot(simulated: bool) -> None:
    def never_published() -> Published:
        raise AssertionError("no cycle runs in this test")

    exporter = Exporter(never_published, interval_seconds=10, simulated=simulated)
    httpd = serve(exporter, "127.0.0.1:0", "sim-node", "node")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        status, _, body = fetch(f"http://127.0.0.1:{httpd.server_address[1]}/")
        assert status == 200
        assert (b"SIMULATED DATA: node sim-node" in body) is simulated
    finally:
        httpd.shutdown()
        httpd.server_close()
