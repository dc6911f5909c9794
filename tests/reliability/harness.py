"""A simulated node, the real pipeline and the real HTTP server, driven cycle by cycle.

Unlike tests/conftest.py's `Run`, scrapes go over HTTP to the exporter's own server (the
path Prometheus takes), the source deadline is short, and the pipeline configuration can
be changed before it starts (to point a source at something absent).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import Scenario, parse_scenario
from gpuledger.web.server import Exporter, serve
from tests.conftest import Sample, pick, samples

# Families that describe the exporter itself: they change every cycle by design.
SELF_MONITORING = frozenset(
    {
        "gpuledger_source_up",
        "gpuledger_source_duration_seconds",
        "gpuledger_source_cpu_seconds_total",
        "gpuledger_source_errors_total",
        "gpuledger_source_last_success_timestamp_seconds",
        "gpuledger_snapshot_age_seconds",
        "gpuledger_build_info",
    }
)

Series = frozenset[tuple[str, tuple[tuple[str, str], ...]]]


def _steady(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    # An engine's `target` holds its fake engine's port, new on every simulated node: the
    # address part still tells engines apart, the port would make two nodes' series differ.
    if "target" in labels:
        labels = {**labels, "target": labels["target"].rsplit(":", 1)[0] + ":PORT"}
        # An engine in no pod without a systemd unit is the workload `<node>:<port>`
        # (docs/design.md, identity rule 7): the same port.
        host, sep, port = labels.get("workload", "").rpartition(":")
        if not labels.get("pod_uid") and sep and port.isdigit():
            labels = {**labels, "workload": f"{host}:PORT"}
    return tuple(sorted(labels.items()))


def series(all_samples: Iterable[Sample], exclude: Iterable[str] = SELF_MONITORING) -> Series:
    """Every (name, labels) pair, without the self-monitoring families."""
    skip = set(exclude)
    return frozenset((name, _steady(labels)) for name, labels, _ in all_samples if name not in skip)


class Node:
    """One simulated node with its exporter, served on an ephemeral loopback port."""

    def __init__(
        self,
        doc: dict[str, Any] | Scenario,
        workdir: Path,
        deadline: float = 0.5,
        warm_up: float = 5.0,
        healthy: Scenario | None = None,
        adjust: Callable[[PipelineConfig], PipelineConfig] | None = None,
        **config: Any,
    ) -> None:
        self.scenario = doc if isinstance(doc, Scenario) else parse_scenario(doc, "test.yaml")
        # What restore() goes back to: the scenario without any fault set on it.
        self.healthy = healthy if healthy is not None else self.scenario
        self.deadline = deadline
        self.sim = SimulatedNode(self.scenario, workdir)
        self.config = dataclasses.replace(self.sim.pipeline_config(deadline), **config)
        if adjust is not None:  # e.g. a source pointed at a hostile proxy in front of the sim
            self.config = adjust(self.config)
        self.pipeline = Pipeline(self.config)
        self.exporter = Exporter(self.pipeline.cycle, interval_seconds=deadline)
        self.httpd = serve(self.exporter, "127.0.0.1:0", self.config.node, self.config.mode)
        self.port = int(self.httpd.server_address[1])
        self._http = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._http.start()
        self.last_scrape_seconds = 0.0
        self.last_cycle_seconds = 0.0
        # State a test's fault actions keep between starting and ending a fault.
        self.extra: dict[str, Any] = {}
        # The worst seen over the node's life, for reports.
        self.max_scrape_seconds = 0.0
        self.max_cycle_seconds = 0.0
        if warm_up > 0:
            self.pipeline.warm_up(warm_up)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes, float]:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(self.base + path, timeout=timeout) as resp:
                return resp.status, resp.read(), time.monotonic() - started
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), time.monotonic() - started

    def cycle(self) -> float:
        started = time.monotonic()
        self.exporter.run_once()
        self.last_cycle_seconds = time.monotonic() - started
        self.max_cycle_seconds = max(self.max_cycle_seconds, self.last_cycle_seconds)
        return self.last_cycle_seconds

    def scrape(self) -> list[Sample]:
        status, body, took = self.get("/metrics")
        assert status == 200, (status, body[:200])
        self.last_scrape_seconds = took
        return samples(body.decode())

    def cycle_and_scrape(self) -> list[Sample]:
        """One cycle, with a scrape taken while it runs: a scrape never waits on sources."""
        during: list[float] = []

        def scrape_meanwhile() -> None:
            status, _, took = self.get("/metrics")
            assert status in (200, 503)
            during.append(took)

        scraper = threading.Thread(target=scrape_meanwhile)
        scraper.start()
        self.cycle()
        scraper.join(30)
        current = self.scrape()
        self.last_scrape_seconds = max(self.last_scrape_seconds, *during)
        self.max_scrape_seconds = max(self.max_scrape_seconds, self.last_scrape_seconds)
        return current

    def until(
        self, done: Callable[[list[Sample]], bool], timeout: float = 15.0, pause: float = 0.05
    ) -> list[Sample]:
        """Cycle and scrape until `done(samples)`, or fail after `timeout` seconds."""
        give_up = time.monotonic() + timeout
        while True:
            current = self.cycle_and_scrape()
            if done(current):
                return current
            assert time.monotonic() < give_up, (
                f"condition not reached in {timeout}s: {status_of(current)}"
            )
            time.sleep(pause)

    def restore(self) -> None:
        """Make every simulated source healthy again (faults off, original state)."""
        self.sim.apply(self.healthy)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.pipeline.close()
        self.sim.close()


def source_up(current: list[Sample], source: str) -> float | None:
    found = pick(current, "gpuledger_source_up", source=source)
    return found[0][2] if found else None


def errors(current: list[Sample], source: str) -> dict[str, float]:
    return {
        labels["reason"]: v
        for name, labels, v in current
        if name == "gpuledger_source_errors_total" and labels.get("source") == source
    }


def status_of(current: list[Sample]) -> dict[str, Any]:
    """Sources' up and error counters, for assertion messages."""
    return {
        labels["source"]: (v, errors(current, labels["source"]))
        for name, labels, v in current
        if name == "gpuledger_source_up"
    }


def all_up(sources: Iterable[str]) -> Callable[[list[Sample]], bool]:
    wanted = tuple(sources)
    return lambda current: all(source_up(current, s) == 1 for s in wanted)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def cg(uid: str, cid: str) -> str:
    """A systemd-driver cgroup v2 line for a container of a pod."""
    return (
        f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    )


class BodyServer:
    """An HTTP server on 127.0.0.1 answering every GET with whatever it is told to:
    a stand-in for a broken or hostile vLLM engine, Ray dashboard or API server."""

    def __init__(self) -> None:
        owner = self
        self.status = 200
        self.body = b""
        self.headers: dict[str, str] = {}
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                owner.requests += 1
                self.send_response(owner.status)
                for key, val in owner.headers.items():
                    self.send_header(key, val)
                if "Content-Length" not in owner.headers:
                    self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(owner.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def serve(self, body: bytes, status: int = 200, **headers: str) -> None:
        self.body, self.status = body, status
        self.headers = {k.replace("_", "-"): v for k, v in headers.items()}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class StreamServer:
    """An HTTP server that streams `size` bytes of `fill` in `chunk`-byte pieces, `pause`
    seconds apart, with or without a Content-Length: a huge answer, or one that trickles
    (every read returns in time; the whole never does). It gives up after `limit` seconds
    or when the client goes away."""

    def __init__(
        self,
        size: int,
        chunk: int,
        pause: float = 0.0,
        declare_length: bool = True,
        limit: float = 15.0,
        prefix: bytes = b"",
        fill: bytes = b"x",
    ) -> None:
        owner = self
        self.stopped = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if declare_length:
                    self.send_header("Content-Length", str(len(prefix) + size))
                else:
                    self.send_header("Connection", "close")
                self.end_headers()
                give_up = time.monotonic() + limit
                with contextlib.suppress(OSError):
                    self.wfile.write(prefix)
                    self.wfile.flush()
                    sent = 0
                    piece = (fill * (chunk // len(fill) + 1))[:chunk]
                    while sent < size and time.monotonic() < give_up:
                        if owner.stopped.wait(pause) if pause else owner.stopped.is_set():
                            return
                        self.wfile.write(piece[: size - sent])
                        self.wfile.flush()
                        sent += chunk

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.stopped.set()
        self.httpd.shutdown()
        self.httpd.server_close()
