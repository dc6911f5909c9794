"""Every client gpuledger runs has a response-size limit and a time limit that holds even
against a server that trickles (each read returns in time, the whole never ends); the HTTP
server bounds the requests it works on at once and keeps answering /healthz.

Clients: the vLLM scraper, the Ray state client, the pod informer's lists (Kubernetes),
the DRA source's ResourceSlice lists,
the kubelet PodResources client (gRPC: one deadline per call, a receive-size limit),
`gpuledger explain --from` (fetch_document), and the fleet page's Prometheus queries.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from gpuledger.explain.chain import ExplainError, fetch_document
from gpuledger.explain.prometheus import PrometheusAccess, PrometheusError
from gpuledger.model.engines import EngineTarget
from gpuledger.sim.fake_kubelet import FakeKubelet
from gpuledger.sources.base import SourceError, SourceRunner
from gpuledger.sources.engines.source import EngineScraper
from gpuledger.sources.kubernetes.dra import MAX_DEVICES, DraSource
from gpuledger.sources.kubernetes.pods import PodInformer
from gpuledger.sources.podresources import PodResourcesSource
from gpuledger.sources.ray.state import RayStateClient
from gpuledger.web.server import MAX_CONCURRENT_REQUESTS
from tests.reliability.harness import Node, StreamServer
from tests.reliability.scenarios import churn_node
from tests.security.helpers import gpuledger

TIMEOUT = 0.5  # each client's own time limit in these tests
CAP = 1024 * 1024  # each client's size limit in these tests, where it can be set
# A client must give up within its limit plus this (one read already waiting finishes).
SLACK = 1.5
TRICKLE = {"size": 4096, "chunk": 1, "pause": 0.05}  # ~200 s to send in full


def vllm_fetch(url: str) -> str | None:
    with EngineScraper(timeout_seconds=TIMEOUT, max_body_bytes=CAP) as scraper:
        result = scraper.scrape_one(EngineTarget(url + "/metrics"))
    return None if result.up else result.error_reason


def ray_fetch(url: str) -> str | None:
    client = RayStateClient(url, timeout_seconds=TIMEOUT, max_response_bytes=CAP)
    try:
        client.fetch_nodes()
    except SourceError as exc:
        return exc.reason
    finally:
        client.close()
    return None


def kubernetes_fetch(url: str) -> str | None:
    configuration = kubernetes.client.Configuration(host=url)
    configuration.retries = 0
    informer = PodInformer(
        "node",
        node_name="n1",
        api_client=kubernetes.client.ApiClient(configuration),
        request_timeout_seconds=TIMEOUT,
        max_list_bytes=CAP,
        backoff_base_seconds=30,  # one attempt is what is measured
    )
    informer.start()
    try:
        while not informer.stats().failures and not informer.stats().lists:
            time.sleep(0.01)
        runner: SourceRunner[Any] = SourceRunner("kubernetes", 5.0)
        _, status = runner.run(informer.fetch)
        runner.close()
    finally:
        informer.stop(timeout=0.1)
    return None if status.up else status.error_reason


def dra_fetch(url: str) -> str | None:
    """The DRA source's list of this node's ResourceSlices (resource.k8s.io/v1)."""
    configuration = kubernetes.client.Configuration(host=url)
    configuration.retries = 0
    source = DraSource(
        "node",
        node_name="n1",
        api_client=kubernetes.client.ApiClient(configuration),
        timeout_seconds=TIMEOUT,
        max_page_bytes=CAP,
    )
    try:
        source.fetch()
    except SourceError as exc:
        return exc.reason
    return None


def prometheus_fetch(url: str) -> str | None:
    """The fleet page's instant query (explain/prometheus.py)."""
    client = PrometheusAccess(url).client(TIMEOUT, max_answer_bytes=CAP)
    try:
        client.query("namespace_workload_stage_reason:gpuledger_stage_reason_code:group")
    except PrometheusError as exc:
        return exc.reason
    return None


CLIENTS: dict[str, Callable[[str], str | None]] = {
    "prometheus": prometheus_fetch,
    "vllm": vllm_fetch,
    "ray": ray_fetch,
    "kubernetes": kubernetes_fetch,
    "dra": dra_fetch,
}
TOO_LARGE = {
    "prometheus": "too_large",
    "vllm": "too_large",
    "ray": "too_large",
    "kubernetes": "too_large",
    "dra": "too_large",
}


@pytest.fixture
def stream() -> Iterator[Callable[..., StreamServer]]:
    made: list[StreamServer] = []

    def start(**kwargs: Any) -> StreamServer:
        server = StreamServer(**kwargs)
        made.append(server)
        return server

    yield start
    for server in made:
        server.close()


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "streamed"])
def test_response_size_limit(
    client: str, declared: bool, stream: Callable[..., StreamServer]
) -> None:
    # Well-formed exposition lines: the vLLM scraper refuses an endless line (or any
    # malformed one) before the cap, so the cap is what stops this answer.
    server = stream(size=4 * CAP, chunk=64 * 1024, declare_length=declared, fill=b"a 1\n")
    started = time.monotonic()
    assert CLIENTS[client](server.url) == TOO_LARGE[client]
    assert time.monotonic() - started < TIMEOUT + SLACK


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_time_limit_holds_against_a_trickling_server(
    client: str, stream: Callable[..., StreamServer]
) -> None:
    server = stream(**TRICKLE)
    started = time.monotonic()
    assert CLIENTS[client](server.url) == "timeout"
    took = time.monotonic() - started
    assert took < TIMEOUT + SLACK, f"{client} took {took:.1f}s against a {TIMEOUT}s limit"


def _slices_server(body: bytes) -> Any:
    """An API server answering every request with `body` (a ResourceSlice list page)."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"items": [{"spec": ', "bad_response"),  # cut off mid-object
        (b"<html>proxy error</html>", "bad_response"),
        (b'{"kind": "ResourceSliceList"}', "bad_response"),  # no items
        (b"[" * 100_000 + b"]" * 100_000, "bad_response"),  # deep nesting
    ],
    ids=["truncated", "html", "no-items", "deep-nesting"],
)
def test_dra_source_malformed_slice_lists_are_a_one_line_error(body: bytes, reason: str) -> None:
    server = _slices_server(body)
    try:
        found = dra_fetch(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert found == reason


def test_dra_source_refuses_a_flood_of_devices() -> None:
    # One slice naming more GPU devices than a node can have: refused whole, not cut.
    device = {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}}}
    item = {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": "n1"}, "nodeName": "n1",
                     "devices": [device] * (MAX_DEVICES + 1)}}  # fmt: skip
    body = json.dumps({"items": [item], "metadata": {}}).encode()
    server = _slices_server(body)
    try:
        found = dra_fetch(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert found == "too_large"


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    short = Path("/tmp") / f"gls-{time.monotonic_ns() % 10**8}"
    with FakeKubelet(short / "kubelet.sock") as fake:
        yield fake


def test_podresources_size_and_time_limits(kubelet: FakeKubelet) -> None:
    source = PodResourcesSource(kubelet.socket_path, timeout_seconds=TIMEOUT)
    try:
        kubelet.set_fault("huge")  # 17 MiB against the 16 MiB receive limit
        with pytest.raises(SourceError) as too_large:
            source.fetch()
        assert too_large.value.reason == "resource_exhausted"
        kubelet.set_fault("hang")
        started = time.monotonic()
        with pytest.raises(SourceError) as hung:
            source.fetch()
        assert hung.value.reason == "timeout"
        # One deadline for both calls (List, GetAllocatableResources): never two.
        assert time.monotonic() - started < TIMEOUT + SLACK
    finally:
        source.close()


def test_explain_document_size_limit(stream: Callable[..., StreamServer]) -> None:
    server = stream(size=64 * 1024 * 1024 + 1, chunk=1024 * 1024, declare_length=False)
    with pytest.raises(ExplainError, match="larger than 64 MiB"):
        fetch_document(server.url, timeout=5.0)


def test_explain_time_limit_holds_against_a_trickling_server(
    stream: Callable[..., StreamServer],
) -> None:
    server = stream(**{**TRICKLE, "size": 200}, limit=4.0)  # gives up itself after 4 s
    started = time.monotonic()
    with contextlib.suppress(Exception):  # how it fails is the next test's business
        fetch_document(server.url, timeout=TIMEOUT)
    assert time.monotonic() - started < TIMEOUT + SLACK


def test_explain_cut_off_document_is_a_one_line_error(
    stream: Callable[..., StreamServer],
) -> None:
    # Declares 2,000 bytes, sends about 200, then closes.
    server = stream(size=2000, chunk=10, pause=0.01, limit=0.2)
    result = gpuledger("explain", "--from", server.url, "--pod", "ns/pod")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2, result.stderr


# ------------------------------------------------------------------- the HTTP server


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(churn_node(0), tmp_path / "node", deadline=2.0)
    made.cycle()
    yield made
    made.close()


def test_slow_requests_are_bounded_and_the_rest_get_503(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renders that do not finish (a CPU-starved exporter): at most MAX_CONCURRENT_REQUESTS
    are worked on at once, every other request is turned away at once with 503, and all is
    well once the renders finish."""
    real_render = node.exporter.render
    release = threading.Event()
    in_flight = [0]
    most = [0]
    lock = threading.Lock()

    def stuck_render(accept: str | None, gzipped: bool = False) -> tuple[bytes, str]:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        try:
            release.wait(30)
            return real_render(accept, gzipped)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(node.exporter, "render", stuck_render)
    statuses: list[int] = []
    times: list[float] = []

    def scrape() -> None:
        status, _, took = node.get("/metrics", timeout=60)
        with lock:
            statuses.append(status)
            times.append(took)

    clients = [threading.Thread(target=scrape) for _ in range(3 * MAX_CONCURRENT_REQUESTS)]
    for client in clients:
        client.start()
    # Everyone past the limit is answered while the first ones are still stuck.
    rejected_count = 2 * MAX_CONCURRENT_REQUESTS
    give_up = time.monotonic() + 30
    while len(statuses) < rejected_count and time.monotonic() < give_up:
        time.sleep(0.05)
    assert statuses == [503] * rejected_count, statuses
    # Liveness does not queue behind stuck scrapes.
    assert node.get("/healthz", timeout=5)[:2] == (200, b"ok\n")
    # Each was refused without waiting for a slot (connecting may wait on the backlog).
    assert max(times) < 5.0, times
    while most[0] < MAX_CONCURRENT_REQUESTS and time.monotonic() < give_up:
        time.sleep(0.05)  # the last slot holders may still be on their way in
    assert most[0] == MAX_CONCURRENT_REQUESTS
    release.set()
    for client in clients:
        client.join(60)
    assert statuses.count(200) == MAX_CONCURRENT_REQUESTS, statuses
    monkeypatch.setattr(node.exporter, "render", real_render)
    assert node.get("/healthz")[:2] == (200, b"ok\n")
    assert node.get("/metrics")[0] == 200


def idle_connections(node: Node, count: int) -> list[socket.socket]:
    """Clients that connect and then send nothing (or half a request line)."""
    held = []
    for i in range(count):
        conn = socket.create_connection(("127.0.0.1", node.port), timeout=5)
        if i % 2:
            conn.sendall(b"GET /metr")
        held.append(conn)
        # Let the server accept: its listen backlog is 5, and a burst past it waits for
        # SYN retransmits (1 s, 3 s, ...), which would only measure the kernel.
        time.sleep(0.005)
    return held


def test_healthz_answers_while_many_clients_hold_idle_connections(node: Node) -> None:
    held = idle_connections(node, 100)
    try:
        time.sleep(0.2)
        status, body, took = node.get("/healthz", timeout=5)
        assert (status, body) == (200, b"ok\n") and took < 2.0
        assert node.get("/metrics", timeout=5)[0] == 200
    finally:
        for conn in held:
            conn.close()
    assert node.get("/healthz")[:2] == (200, b"ok\n")


def test_idle_connections_cost_a_bounded_number_of_threads(node: Node) -> None:
    before = threading.active_count()
    held = idle_connections(node, 100)
    try:
        time.sleep(0.5)
        grown = threading.active_count() - before
    finally:
        for conn in held:
            conn.close()
    assert grown <= MAX_CONCURRENT_REQUESTS + 4, f"{grown} threads for 100 idle connections"
