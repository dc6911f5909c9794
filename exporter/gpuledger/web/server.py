"""HTTP endpoints and the background collection loop.

The loop publishes a new ledger every interval; handlers only read the latest one, so a
scrape costs a render and never waits on a source.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gzip
import html
import io
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import choose_encoder

from gpuledger import __version__
from gpuledger.document.v1 import LedgerDocument
from gpuledger.export.collector import LedgerCollector
from gpuledger.export.document import document_bytes, ledger_document
from gpuledger.export.exposition import FamilyRenderer, render_text
from gpuledger.export.published import Published
from gpuledger.model.spans import IngestAnswer, SpanPeer, SpanSink
from gpuledger.web.node_page import render_page, simulated_banner
from gpuledger.web.requests_page import request_page, requested
from gpuledger.web.runbooks import runbooks_page
from gpuledger.web.webconfig import TlsContext, WebConfig

log = logging.getLogger(__name__)

MAX_CONCURRENT_REQUESTS = 16
# Span exports get workers of their own, so a flood of them never takes a scrape's.
MAX_CONCURRENT_INGESTS = 2
OTLP_TRACES_PATH = "/v1/traces"
# A body must arrive within this, however it trickles.
BODY_DEADLINE_SECONDS = 10.0
# Liveness fails once no cycle has completed for this many intervals (and at least
# STALL_FLOOR_SECONDS): a stuck collection loop serves ever older data, and a restart is
# the only cure.
STALL_INTERVALS = 5
STALL_FLOOR_SECONDS = 60.0


class Exporter:
    """Owns the latest published state and the loop that refreshes it."""

    def __init__(
        self,
        cycle: Callable[[], Published],
        interval_seconds: float,
        warm_up: Callable[[], None] | None = None,
        *,
        simulated: bool = False,
    ) -> None:
        self._cycle = cycle
        self._simulated = simulated
        self._warm_up = warm_up
        self.interval_seconds = interval_seconds
        self._latest: Published | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(LedgerCollector(self.current))
        # The text exposition of a snapshot is rendered once, when it is published; a
        # scrape appends only the age. OpenMetrics requests render in full.
        self._age = LedgerCollector(self.current, "age")
        self._rendered = b""
        self._renderer = FamilyRenderer()  # the collection loop's: unchanged families kept
        self._gzipped: bytes | None = None  # made on the first gzip scrape of a snapshot
        # /ledger.json and /ledger read the snapshot's document, built once, on the first
        # request of that snapshot: on an agent nobody reads it most cycles.
        self._document: tuple[LedgerDocument, bytes] | None = None
        self._document_of: Published | None = None
        self._document_lock = threading.Lock()  # one build per snapshot, not per request
        self._progress = time.monotonic()  # start, then the end of each completed cycle

    def current(self) -> tuple[Published | None, float]:
        with self._lock:
            return self._latest, time.time()

    @property
    def ready(self) -> bool:
        return self.current()[0] is not None

    @property
    def simulated(self) -> bool:
        """The data comes from gpuledger's simulator (PipelineConfig.simulated): known from
        the start, so the index is marked before the first snapshot too."""
        published = self.current()[0]
        return self._simulated or (published is not None and published.simulated)

    def run_once(self) -> Published:
        published = self._cycle()
        snapshot = LedgerCollector(lambda: (published, time.time()), "snapshot")
        rendered = self._renderer.render(snapshot.families())
        with self._lock:
            self._latest, self._rendered, self._gzipped = published, rendered, None
            self._progress = time.monotonic()
        return published

    def document(self) -> tuple[LedgerDocument, bytes] | None:
        """The last snapshot's ledger document and its /ledger.json body, built on the
        first call for that snapshot and kept until the next one."""
        with self._document_lock:
            published = self.current()[0]
            if published is None:
                return None
            if self._document_of is not published:
                doc = ledger_document(published)
                self._document, self._document_of = (doc, document_bytes(doc)), published
            return self._document

    @property
    def alive(self) -> bool:
        """False when the collection loop has made no progress for several intervals."""
        with self._lock:
            stalled_for = time.monotonic() - self._progress
        return stalled_for <= max(STALL_INTERVALS * self.interval_seconds, STALL_FLOOR_SECONDS)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="collect", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if self._warm_up is not None:
            try:
                self._warm_up()
            except Exception:
                log.exception("warm-up failed")
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception:  # the loop must outlive any bug in one cycle
                log.exception("collection cycle failed")
            elapsed = time.monotonic() - started
            self._stop.wait(max(0.0, self.interval_seconds - elapsed))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def render(self, accept: str | None, gzipped: bool = False) -> tuple[bytes, str]:
        """The exposition. With `gzipped`, a gzip stream: the snapshot's part is
        compressed once per snapshot, and the age is a second gzip member (readers
        decompress concatenated members as one stream, RFC 1952)."""
        encoder, content_type = choose_encoder(accept or "")
        if encoder is not generate_latest:
            body = encoder(self.registry)
            return (gzip.compress(body, 6) if gzipped else body), content_type
        age = render_text(self._age.families())
        with self._lock:
            if not gzipped:
                return self._rendered + age, content_type
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._rendered, 6)
            snapshot_part = self._gzipped
        return snapshot_part + gzip.compress(age, 6), content_type


# /ledger: (status, HTML) from the snapshot's document and the request's query string.
LedgerPage = Callable[[LedgerDocument, str], tuple[int, str]]


def node_ledger_page(doc: LedgerDocument, query: str) -> tuple[int, str]:
    """This node's page, or with `?request=ID` that request explained."""
    request_id = requested(query)
    if request_id is not None:
        return request_page(doc, request_id)
    return HTTPStatus.OK, render_page(doc)


LANDING = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuledger</title></head>
<body><h1>gpuledger {version}</h1>
<p>Node <b>{node}</b>, mode <b>{mode}</b>.</p>
{banner}
<ul>
<li><a href="metrics">/metrics</a> &mdash; Prometheus exposition</li>
<li><a href="ledger">/ledger</a> &mdash; {ledger_what}, readable</li>
<li><a href="ledger.json">/ledger.json</a> &mdash; the same as JSON, for gpuledger explain</li>
<li><a href="runbooks">/runbooks</a> &mdash; what to do about each gpuledger alert</li>
<li><a href="healthz">/healthz</a> &mdash; process alive</li>
<li><a href="readyz">/readyz</a> &mdash; first snapshot taken</li>
</ul></body></html>
"""


@dataclass(frozen=True)
class Answer:
    status: HTTPStatus
    body: bytes
    content_type: str
    encoding: str | None = None


_HTML = "text/html; charset=utf-8"
_ROUTED_HEADERS = ("Accept", "Accept-Encoding")
_NOT_YET = Answer(HTTPStatus.SERVICE_UNAVAILABLE, b"first snapshot not taken yet\n", "text/plain")


@dataclass(frozen=True)
class Routes:
    """What each path answers, from the latest published snapshot; no I/O but the page's
    own (the cluster page reads the agents)."""

    exporter: Exporter
    node: str
    mode: str
    ledger_page: LedgerPage = node_ledger_page

    def answer(self, path: str, query: str, headers: Mapping[str, str]) -> Answer:
        if path == "/metrics":
            gzipped = _wants_gzip(headers.get("Accept-Encoding"))
            body, content_type = self.exporter.render(headers.get("Accept"), gzipped)
            return Answer(HTTPStatus.OK, body, content_type, "gzip" if gzipped else None)
        if path == "/healthz":
            return Answer(HTTPStatus.OK, b"ok\n", "text/plain")
        if path == "/readyz":
            return (
                Answer(HTTPStatus.OK, b"ready\n", "text/plain") if self.exporter.ready else _NOT_YET
            )
        if path in ("/ledger.json", "/ledger"):
            return self._ledger(path, query)
        if path == "/runbooks":
            return Answer(HTTPStatus.OK, runbooks_page(), _HTML)
        if path == "/":
            return Answer(HTTPStatus.OK, self._landing().encode(), _HTML)
        return Answer(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def _ledger(self, path: str, query: str) -> Answer:
        document = self.exporter.document()
        if document is None:
            return _NOT_YET
        if path == "/ledger.json":
            return Answer(HTTPStatus.OK, document[1], "application/json")
        status, page = self.ledger_page(document[0], query)
        return Answer(HTTPStatus(status), page.encode(), _HTML)

    def _landing(self) -> str:
        return LANDING.format(
            version=html.escape(__version__),
            node=html.escape(self.node),
            mode=html.escape(self.mode),
            ledger_what=(
                "every workload in the cluster, from every node agent"
                if self.mode == "cluster"
                else "this node's ledger"
            ),
            banner=simulated_banner([self.node] if self.exporter.simulated else []),
        )


def make_handler(
    exporter: Exporter,
    node: str,
    mode: str,
    web: WebConfig | None = None,
    *,
    ledger_page: LedgerPage = node_ledger_page,
    spans: SpanSink | None = None,
) -> type[BaseHTTPRequestHandler]:
    """`spans`: the span receiver answering POST /v1/traces, when it is on."""
    routes = Routes(exporter, node, mode, ledger_page)

    class Handler(BaseHTTPRequestHandler):
        server_version = f"gpuledger/{__version__}"
        timeout = 10  # writing the answer to a client that stopped reading

        def setup(self) -> None:
            super().setup()
            # The gate already read the whole request head without a thread.
            self.rfile = io.BytesIO(_prefetched.head)

        def do_GET(self) -> None:
            self._route()

        def do_HEAD(self) -> None:
            self._route()

        def do_POST(self) -> None:
            path = self.path.partition("?")[0]
            if spans is None or path != OTLP_TRACES_PATH:
                self._send(Answer(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain"))
                return
            if web is not None and not web.authorized(path, self.headers.get("Authorization")):
                self._refuse()
                return
            answer, whole = ingest(self, spans)
            self.close_connection = self.close_connection or not whole
            extra = tuple(web.headers) if web is not None else ()
            if answer.retry_after_seconds is not None:
                extra += (("Retry-After", str(answer.retry_after_seconds)),)
            self._send(Answer(HTTPStatus(answer.status), answer.body, answer.content_type), extra)

        def _route(self) -> None:
            path, _, query = self.path.partition("?")
            if web is not None and not web.authorized(path, self.headers.get("Authorization")):
                self._refuse()
                return
            # Only the headers a route reads (the message object is case-insensitive).
            headers = {n: v for n in _ROUTED_HEADERS if (v := self.headers.get(n)) is not None}
            self._send(routes.answer(path, query, headers))

        def _send(self, answer: Answer, extra: tuple[tuple[str, str], ...] = ()) -> None:
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type or "text/plain")
            if answer.encoding is not None:
                self.send_header("Content-Encoding", answer.encoding)
                self.send_header("Vary", "Accept-Encoding")
            self.send_header("Content-Length", str(len(answer.body)))
            for name, value in extra or (web.headers if web is not None else ()):
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer.body)

        def _refuse(self) -> None:
            body = b"unauthorized\n"
            self.send_response(HTTPStatus.UNAUTHORIZED)
            self.send_header("WWW-Authenticate", 'Basic realm="gpuledger"')
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http: " + format, *args)

    return Handler


def ingest(handler: BaseHTTPRequestHandler, sink: SpanSink) -> tuple[IngestAnswer, bool]:
    """One span export request: its answer, and whether its body was read whole (else the
    connection must close: unread bytes are no next request)."""
    length_text = handler.headers.get("Content-Length", "")
    if handler.headers.get("Transfer-Encoding") or not length_text.isdigit():
        return IngestAnswer(HTTPStatus.LENGTH_REQUIRED, b"Content-Length required\n", ""), False
    length = int(length_text)
    refused = sink.admit(length)
    if refused is not None:
        return refused, False
    body = _read_body(handler.rfile, handler.connection, length)
    if body is None:
        return IngestAnswer(HTTPStatus.REQUEST_TIMEOUT, b"body incomplete\n", ""), False
    address, port = handler.client_address[:2] if handler.client_address else ("", 0)
    peer = SpanPeer(str(address), int(port), int(handler.connection.getsockname()[1]))
    content_type = handler.headers.get("Content-Type", "")
    encoding = handler.headers.get("Content-Encoding", "")
    return sink.accept(body, content_type, encoding, peer), True


def _read_body(buffered: Any, sock: socket.socket, length: int) -> bytes | None:
    """The request's `length` bytes: those the gate read with the head, then the rest from
    the socket until BODY_DEADLINE_SECONDS pass (None: it did not all arrive). The caller
    admitted `length` against the cap, so no more is ever held."""
    body = bytearray(buffered.read(length))
    deadline = time.monotonic() + BODY_DEADLINE_SECONDS
    while len(body) < length:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(1 << 16, length - len(body)))
        except OSError:
            return None
        if not chunk:
            return None
        body += chunk
    return bytes(body)


def _wants_gzip(accept_encoding: str | None) -> bool:
    """Whether the client accepts gzip (and did not refuse it with q=0)."""
    for part in (accept_encoding or "").split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() in ("gzip", "*"):
            q = params.strip().removeprefix("q=").strip()
            return not q or (q.replace(".", "", 1).isdigit() and float(q) > 0)
    return False


def parse_listen(value: str) -> tuple[str, int]:
    """`:9402`, `0.0.0.0:9402`, `[::1]:9402` -> (host, port). Raises ValueError."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"--listen {value!r}: expected [HOST]:PORT, e.g. :9402")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"--listen {value!r}: port out of range")
    return host.strip("[]") or "0.0.0.0", port


_prefetched = threading.local()
HEAD_TIMEOUT_SECONDS = 5.0
MAX_HEAD_BYTES = 16 * 1024
# Idle connections cost a file descriptor each, not a thread: thousands are fine.
MAX_WAITING_CONNECTIONS = 4096
_ALIVE = (
    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 3\r\nConnection: close\r\n\r\nok\n"
)
_STALLED = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 33\r\nConnection: close\r\n\r\ncollection loop made no progress\n"
)
_BUSY_INGEST = (
    b"HTTP/1.0 429 Too Many Requests\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
    b"Content-Length: 18\r\nConnection: close\r\n\r\ntoo many requests\n"
)
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 18\r\nConnection: close\r\n\r\ntoo many requests\n"
)


class GatedHTTPServer(HTTPServer):
    """An HTTP server whose threads work only on complete requests.

    One gate thread reads request heads from every connection without blocking, so an
    idle or slow client costs a file descriptor for HEAD_TIMEOUT_SECONDS, not a thread.
    A complete request goes to one of MAX_CONCURRENT_REQUESTS workers, or is answered 503
    at once when all are busy.
    """

    # The kernel's accept queue: a burst of scrapes and probes waits there instead of
    # being refused (the socketserver default is 5).
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        alive: Callable[[], bool] = lambda: True,
        tls: TlsContext | None = None,
    ) -> None:
        self._ingest_slots = threading.BoundedSemaphore(MAX_CONCURRENT_INGESTS)
        self._ingesters = concurrent.futures.ThreadPoolExecutor(
            MAX_CONCURRENT_INGESTS, thread_name_prefix="otlp"
        )
        self._closing = threading.Event()
        self._alive = alive
        self._tls = tls
        super().__init__(address, handler)  # binds: raises OSError on a busy address
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_REQUESTS)
        self._workers = concurrent.futures.ThreadPoolExecutor(
            MAX_CONCURRENT_REQUESTS, thread_name_prefix="http"
        )
        self._selector = selectors.DefaultSelector()
        self._arrivals: queue.SimpleQueue[tuple[socket.socket, Any]] = queue.SimpleQueue()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        self._gate = threading.Thread(target=self._gate_loop, name="http-gate", daemon=True)
        self._gate.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._arrivals.put((request, client_address))
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"\0")

    def _gate_loop(self) -> None:
        waiting: dict[socket.socket, tuple[Any, bytearray, float]] = {}
        while not self._closing.is_set():
            # Woken by an arrival or by close (the wake socket), else when the first
            # waiting head runs out of time: an idle agent does not poll.
            until = min((u for _, _, u in waiting.values()), default=None)
            timeout = None if until is None else max(0.0, until - time.monotonic()) + 0.01
            for key, _ in self._selector.select(timeout=timeout):
                if key.fileobj is self._wake_reader:
                    with contextlib.suppress(OSError):
                        self._wake_reader.recv(4096)
                    self._admit(waiting)
                else:
                    self._read_head(key.fileobj, waiting)  # type: ignore[arg-type]
            now = time.monotonic()
            for sock in [s for s, (_, _, until) in waiting.items() if until < now]:
                self._drop(sock, waiting)
        for sock in list(waiting):
            self._drop(sock, waiting)

    def _admit(self, waiting: dict[socket.socket, tuple[Any, bytearray, float]]) -> None:
        while True:
            try:
                sock, address = self._arrivals.get_nowait()
            except queue.Empty:
                return
            if len(waiting) >= MAX_WAITING_CONNECTIONS:
                self.shutdown_request(sock)
                continue
            sock.setblocking(False)
            if self._tls is not None:
                # The handshake runs inside the gate's non-blocking reads (OpenSSL accepts
                # on the first read), so a slow TLS client holds no thread either.
                sock = self._tls.current().wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                )
            self._selector.register(sock, selectors.EVENT_READ, None)
            waiting[sock] = (address, bytearray(), time.monotonic() + HEAD_TIMEOUT_SECONDS)

    def _read_head(
        self, sock: socket.socket, waiting: dict[socket.socket, tuple[Any, bytearray, float]]
    ) -> None:
        address, head, _ = waiting[sock]
        try:
            data = sock.recv(4096)
            while isinstance(sock, ssl.SSLSocket) and sock.pending() and len(data) < MAX_HEAD_BYTES:
                data += sock.recv(4096)  # decrypted bytes the selector cannot see
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:  # reset, or a TLS handshake that failed (plain HTTP on a TLS port)
            data = b""
        head += data
        # A POST's body may follow its head in the same reads: only the head is capped.
        ends = [i for i in (head.find(b"\r\n\r\n"), head.find(b"\n\n")) if i >= 0]
        complete = bool(ends) and min(ends) <= MAX_HEAD_BYTES
        if not data or (len(head) > MAX_HEAD_BYTES and not complete):
            self._drop(sock, waiting)
        elif complete:
            self._selector.unregister(sock)
            del waiting[sock]
            sock.setblocking(True)
            sock.settimeout(10)
            if head.startswith((b"GET /healthz ", b"GET /healthz?")):
                # Liveness never waits for a worker: stuck scrapes must not get us killed.
                with contextlib.suppress(OSError):
                    sock.sendall(_ALIVE if self._alive() else _STALLED)
                self.shutdown_request(sock)
            elif head.startswith(b"POST "):
                self._dispatch_ingest(sock, address, bytes(head))
            elif self._slots.acquire(blocking=False):
                self._workers.submit(self._work, sock, address, bytes(head), self._slots)
            else:
                with contextlib.suppress(OSError):
                    sock.sendall(_BUSY)
                self.shutdown_request(sock)

    def _dispatch_ingest(self, sock: socket.socket, address: Any, head: bytes) -> None:
        if self._ingest_slots.acquire(blocking=False):
            self._ingesters.submit(self._work, sock, address, head, self._ingest_slots)
            return
        with contextlib.suppress(OSError):
            sock.sendall(_BUSY_INGEST)  # OTLP exporters retry a 429 after Retry-After
        self.shutdown_request(sock)

    def _drop(
        self, sock: socket.socket, waiting: dict[socket.socket, tuple[Any, bytearray, float]]
    ) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        waiting.pop(sock, None)
        self.shutdown_request(sock)

    def _work(
        self, sock: socket.socket, address: Any, head: bytes, slots: threading.BoundedSemaphore
    ) -> None:
        try:
            _prefetched.head = head
            self.RequestHandlerClass(sock, address, self)  # type: ignore[arg-type]
        except Exception:  # one broken request must not cost the worker
            log.debug("request failed", exc_info=True)
        finally:
            self.shutdown_request(sock)
            slots.release()

    def server_close(self) -> None:
        if not hasattr(self, "_gate"):  # binding failed: only the socket to close
            super().server_close()
            return
        self._closing.set()
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"\0")
        self._gate.join(timeout=5)
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._ingesters.shutdown(wait=False, cancel_futures=True)
        self._selector.close()
        self._wake_reader.close()
        self._wake_writer.close()
        super().server_close()


def serve(
    exporter: Exporter,
    listen: str,
    node: str,
    mode: str,
    web: WebConfig | None = None,
    *,
    ledger_page: LedgerPage = node_ledger_page,
    spans: SpanSink | None = None,
) -> GatedHTTPServer:
    """`ledger_page` renders /ledger: this node's page, or the cluster view's (cluster_page).
    `spans`: the span receiver for POST /v1/traces (off: None)."""
    host, port = parse_listen(listen)
    return GatedHTTPServer(
        (host, port),
        make_handler(exporter, node, mode, web, ledger_page=ledger_page, spans=spans),
        lambda: exporter.alive,
        tls=web.tls if web is not None else None,
    )
