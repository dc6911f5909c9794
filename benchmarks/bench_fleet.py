"""The fleet page over 1,000 simulated nodes: read from Prometheus, against the agent fan-out.

A real Prometheus holds the fleet's series (benchmarks/fleet.py: promtool backfill, the
mixin's rules evaluated by Prometheus itself); one server answers /ledger.json as every
node agent at its own loopback address and counts the reads. Measured:

* the overview (`FleetPage`, no reuse between loads): wall time median / p95, queries, the
  memory one load allocates at its peak (tracemalloc), agents read;
* opening one workload: wall time, agents read;
* a real `gpuledger serve --mode cluster --prometheus-url` after `--loads` page loads
  over HTTP: its RSS and peak RSS (VmHWM), and the page's time as a browser sees it;
* with `--fanout`, the same page without Prometheus: every agent read (cluster_page).

    .venv/bin/python benchmarks/bench_fleet.py [--nodes 1000] [--loads 200] [--fanout]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exporter"))
sys.path.insert(0, str(ROOT))

from benchmarks.fleet import AgentFarm, Fleet, FleetPrometheus
from gpuledger.explain.prometheus import PrometheusAccess
from gpuledger.web import cluster_page
from gpuledger.web.fleet_page import FleetPage

DEADLINE = 5.0


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.1f} ms, p95 {_p95(values) * 1000:.1f} ms"


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def overview(page: FleetPage, own: object, loads: int) -> None:
    times = []
    for _ in range(loads):
        page._overview = None  # every load queries Prometheus (no reuse)
        started = time.perf_counter()
        status, html = page(own, "")  # type: ignore[arg-type]
        times.append(time.perf_counter() - started)
        assert status == 200 and 'id="prometheus-error"' not in html
    info = page.overview()
    assert not isinstance(info, str)
    print(f"overview: {len(info.rows)} workloads, {info.queries} queries, {_ms(times)}")
    tracemalloc.start()
    page._overview = None
    page(own, "")  # type: ignore[arg-type]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"overview: one load allocates {peak / 2**20:.1f} MiB at its peak; {len(html)} bytes")


def workload(page: FleetPage, farm: AgentFarm, own: object, loads: int) -> None:
    times, reads = [], []
    for k in range(loads):
        farm.reads.clear()
        name = f"team-{k % 20:02d}%2Fllm-{k:04d}"
        started = time.perf_counter()
        status, _ = page(own, f"workload={name}")  # type: ignore[arg-type]
        times.append(time.perf_counter() - started)
        assert status == 200
        reads.append(sum(farm.reads.values()))
    print(f"workload opened: {_ms(times)}; agents read {min(reads)}-{max(reads)} (of the fleet's)")


def real_serve(url: str, loads: int) -> None:
    port = 19500 + os.getpid() % 400
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuledger",
            "serve",
            "--mode=cluster",
            "--kubernetes=off",
            f"--listen=127.0.0.1:{port}",
            f"--source-deadline={DEADLINE:g}",
            "--log-level=warning",
            f"--prometheus-url={url}",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT / "exporter")},
        stdout=subprocess.DEVNULL,
    )
    try:
        times = []
        for i in range(loads + 1):
            started = time.perf_counter()
            try:
                # A different query string each time: the page's 10 s reuse does not apply.
                target = f"http://127.0.0.1:{port}/ledger?load={i}"
                with urllib.request.urlopen(target, timeout=30) as r:
                    r.read()
            except OSError:
                time.sleep(0.5)
                continue
            times.append(time.perf_counter() - started)
        print(
            f"serve: {len(times)} loads over HTTP (reused for 10 s): {_ms(times)}; "
            f"RSS {_status(proc.pid, 'VmRSS') / 2**20:.0f} MiB, "
            f"peak {_status(proc.pid, 'VmHWM') / 2**20:.0f} MiB"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def fanout(farm: AgentFarm, fleet: Fleet, own: object, loads: int) -> None:
    urls = [f"http://{fleet.instance(i)}" for i in range(fleet.nodes)]
    page = cluster_page.for_cluster_view(
        urls, kubernetes=False, kubeconfig=None, deadline_seconds=DEADLINE
    )
    times, read = [], []
    for _ in range(loads):
        page.reader._cache.clear()  # every agent read again
        farm.reads.clear()
        started = time.perf_counter()
        page(own, "")  # type: ignore[arg-type]
        times.append(time.perf_counter() - started)
        read.append(len(farm.reads))
    print(
        f"fan-out (no Prometheus): {_ms(times)}; agents answered {min(read)}-{max(read)} "
        f"of {fleet.nodes} within the {DEADLINE:g} s deadline"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--loads", type=int, default=200)
    parser.add_argument("--fanout", action="store_true")
    args = parser.parse_args()
    farm = AgentFarm()
    fleet = Fleet(args.nodes, farm.port, farm.cluster_instance)
    farm.fleet = fleet
    for i in range(fleet.nodes):
        farm.body(i)  # documents built before anything is measured
    with tempfile.TemporaryDirectory() as workdir:
        started = time.monotonic()
        prometheus = FleetPrometheus(fleet, Path(workdir))
        try:
            prometheus.wait_judged(len(fleet.expected()))
            print(
                f"{args.nodes} nodes, {prometheus.series} series backfilled and judged "
                f"in {time.monotonic() - started:.1f} s"
            )
            own = fleet.cluster_document()
            page = FleetPage(PrometheusAccess(prometheus.url), deadline_seconds=DEADLINE)
            overview(page, own, args.loads)
            workload(page, farm, own, min(args.loads, 100))
            real_serve(prometheus.url, args.loads)
            if args.fanout:
                fanout(farm, fleet, own, 3)
        finally:
            prometheus.close()
            farm.close()


if __name__ == "__main__":
    main()
