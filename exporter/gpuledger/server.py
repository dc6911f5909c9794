"""HTTP endpoints and the background collection loop.

The loop publishes a new ledger every interval; handlers only read the latest one, so a
scrape costs a render and never waits on a source.
"""

from __future__ import annotations

import html
import json
import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import choose_encoder

from gpuledger import __version__
from gpuledger.collector import LedgerCollector, Published
from gpuledger.document import ledger_document
from gpuledger.page import render_page

log = logging.getLogger(__name__)

MAX_CONCURRENT_REQUESTS = 16


class Exporter:
    """Owns the latest published state and the loop that refreshes it."""

    def __init__(
        self,
        cycle: Callable[[], Published],
        interval_seconds: float,
        warm_up: Callable[[], None] | None = None,
    ) -> None:
        self._cycle = cycle
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
        self._age_registry = CollectorRegistry(auto_describe=False)
        self._age_registry.register(LedgerCollector(self.current, "age"))
        self._rendered = b""

    def current(self) -> tuple[Published | None, float]:
        with self._lock:
            return self._latest, time.time()

    @property
    def ready(self) -> bool:
        return self.current()[0] is not None

    def run_once(self) -> Published:
        published = self._cycle()
        snapshot = CollectorRegistry(auto_describe=False)
        snapshot.register(LedgerCollector(lambda: (published, time.time()), "snapshot"))
        rendered = generate_latest(snapshot)
        with self._lock:
            self._latest, self._rendered = published, rendered
        return published

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

    def render(self, accept: str | None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept or "")
        if encoder is generate_latest:
            with self._lock:
                rendered = self._rendered
            return rendered + generate_latest(self._age_registry), content_type
        return encoder(self.registry), content_type


LANDING = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuledger</title></head>
<body><h1>gpuledger {version}</h1>
<p>Node <b>{node}</b>, mode <b>{mode}</b>.</p>
<ul>
<li><a href="metrics">/metrics</a> &mdash; Prometheus exposition</li>
<li><a href="ledger">/ledger</a> &mdash; this node's ledger, readable</li>
<li><a href="ledger.json">/ledger.json</a> &mdash; the same as JSON, for gpuledger explain</li>
<li><a href="healthz">/healthz</a> &mdash; process alive</li>
<li><a href="readyz">/readyz</a> &mdash; first snapshot taken</li>
</ul></body></html>
"""


def make_handler(exporter: Exporter, node: str, mode: str) -> type[BaseHTTPRequestHandler]:
    slots = threading.BoundedSemaphore(MAX_CONCURRENT_REQUESTS)

    class Handler(BaseHTTPRequestHandler):
        server_version = f"gpuledger/{__version__}"
        timeout = 10  # a client that stalls mid-request cannot hold a thread forever

        def do_GET(self) -> None:
            if not slots.acquire(blocking=False):
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"too many requests\n", "text/plain")
                return
            try:
                self._route()
            finally:
                slots.release()

        def _route(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, content_type = exporter.render(self.headers.get("Accept"))
                self._send(HTTPStatus.OK, body, content_type)
            elif path == "/healthz":
                self._send(HTTPStatus.OK, b"ok\n", "text/plain")
            elif path == "/readyz":
                if exporter.ready:
                    self._send(HTTPStatus.OK, b"ready\n", "text/plain")
                else:
                    self._send(
                        HTTPStatus.SERVICE_UNAVAILABLE,
                        b"first snapshot not taken yet\n",
                        "text/plain",
                    )
            elif path in ("/ledger.json", "/ledger"):
                published, _ = exporter.current()
                if published is None:
                    self._send(
                        HTTPStatus.SERVICE_UNAVAILABLE,
                        b"first snapshot not taken yet\n",
                        "text/plain",
                    )
                elif path == "/ledger.json":
                    body = json.dumps(ledger_document(published), indent=1).encode()
                    self._send(HTTPStatus.OK, body, "application/json")
                else:
                    html_page = render_page(ledger_document(published)).encode()
                    self._send(HTTPStatus.OK, html_page, "text/html; charset=utf-8")
            elif path == "/":
                page = LANDING.format(
                    version=html.escape(__version__),
                    node=html.escape(node),
                    mode=html.escape(mode),
                )
                self._send(HTTPStatus.OK, page.encode(), "text/html; charset=utf-8")
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

        def _send(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http: " + format, *args)

    return Handler


def parse_listen(value: str) -> tuple[str, int]:
    """`:9402`, `0.0.0.0:9402`, `[::1]:9402` -> (host, port). Raises ValueError."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"--listen {value!r}: expected [HOST]:PORT, e.g. :9402")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"--listen {value!r}: port out of range")
    return host.strip("[]") or "0.0.0.0", port


def serve(exporter: Exporter, listen: str, node: str, mode: str) -> ThreadingHTTPServer:
    host, port = parse_listen(listen)
    httpd = ThreadingHTTPServer((host, port), make_handler(exporter, node, mode))
    httpd.daemon_threads = True
    return httpd
