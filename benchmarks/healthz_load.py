"""/healthz latency while 200 clients scrape /metrics back to back and 2,000 hold idle
connections (issue 14: p99 under 100 ms), against a real `gpuledger demo` process.

Three processes, so no client competes with another for a GIL: the exporter, a load
process (asyncio: the busy scrapers and the idle holders) and this one, which times
/healthz probes one after another, each on a fresh connection, as the kubelet does.

    .venv/bin/python benchmarks/healthz_load.py [--busy 200] [--idle 2000] [--probes 300]

Prints one JSON object: healthz p50/p99/max in ms, probe failures, and what the busy
clients got (200s, 503s "too many requests", errors).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LOAD = r"""
import asyncio, json, resource, sys
port, busy, idle, seconds = (int(a) for a in sys.argv[1:5])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
counts = {"ok": 0, "busy_503": 0, "error": 0}

async def scraper(stop):
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = await r.read()
            w.close()
            counts["ok" if data.startswith(b"HTTP/1.0 200") else
                   "busy_503" if b" 503 " in data[:20] else "error"] += 1
        except OSError:
            counts["error"] += 1
            await asyncio.sleep(0.01)

async def holder(stop):
    # Idle: connect and say nothing. The server drops a silent connection after its head
    # timeout (5 s); reconnect at once, so about `idle` are held all the time.
    while not stop.is_set():
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            await r.read()
            w.close()
        except OSError:
            await asyncio.sleep(0.1)

async def main():
    stop = asyncio.Event()
    tasks = [asyncio.create_task(holder(stop)) for _ in range(idle)]
    await asyncio.sleep(1.0)
    tasks += [asyncio.create_task(scraper(stop)) for _ in range(busy)]
    print("started", flush=True)
    await asyncio.sleep(seconds)
    stop.set()
    for t in tasks:
        t.cancel()
    print(json.dumps(counts), flush=True)

asyncio.run(main())
"""


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _on_cpu(cpu: int) -> list[str]:
    """The exporter and the load on separate cores where there are two: on one box the
    load generator would otherwise take the exporter's CPU, which Prometheus does not."""
    if (os.cpu_count() or 1) < 2 or not shutil.which("taskset"):
        return []
    return ["taskset", "-c", str(cpu)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the demo exporter did not become ready")


def _probe(port: int) -> float | None:
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except OSError:
        return None
    return time.perf_counter() - started if data.startswith(b"HTTP/1.0 200") else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--busy", type=int, default=200)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--probes", type=int, default=300)
    parser.add_argument(
        "--exporter", default=str(REPO / "exporter"), help="package folder to run (for A/B)"
    )
    args = parser.parse_args()
    _raise_fd_limit()
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": args.exporter}
    exporter = subprocess.Popen(
        [*_on_cpu(0), sys.executable, "-m", "gpuledger", "demo", "--listen", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_ready(port)
        seconds = max(20, args.probes // 10)
        load = subprocess.Popen(
            [
                *_on_cpu(1),
                sys.executable,
                "-c",
                LOAD,
                *map(str, (port, args.busy, args.idle, seconds)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert load.stdout is not None
        load.stdout.readline()  # "started"
        time.sleep(2.0)  # let the busy clients reach full speed
        timings, failures = [], 0
        for _ in range(args.probes):
            took = _probe(port)
            if took is None:
                failures += 1
            else:
                timings.append(took)
            time.sleep(0.05)
        counts = json.loads(load.communicate(timeout=seconds + 60)[0].strip().splitlines()[-1])
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
    timings.sort()
    print(
        json.dumps(
            {
                "busy_clients": args.busy,
                "idle_connections": args.idle,
                "probes": args.probes,
                "probe_failures": failures,
                "healthz_p50_ms": round(statistics.median(timings) * 1000, 1),
                "healthz_p99_ms": round(timings[int(len(timings) * 0.99) - 1] * 1000, 1),
                "healthz_max_ms": round(timings[-1] * 1000, 1),
                "busy_results": counts,
            }
        )
    )


if __name__ == "__main__":
    main()
