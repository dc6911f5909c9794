"""Cluster mode at scale: 10,000 pods of which 1,000 are unplaced.

Measures what the issue asks: per-cycle time, memory, and /metrics render time, with the
real `kubernetes` client against the simulated API server (list + watch). The API server
runs in a child process, as a real one would: in this process its 10,000 pods' objects
made every full garbage collection walk them (0.2-0.45 s each), which is the simulator's
cost, not the exporter's.

    .venv/bin/python benchmarks/bench_cluster.py [--pods 10000] [--pending 1000] [--cycles 50]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exporter"))

from collections.abc import Iterator

from gpuledger.export.published import Published
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sim.fake_apiserver import FakeApiServer, make_pod, pod_scheduled_false
from gpuledger.web.server import Exporter

NO_TRACE = "--no-trace" in sys.argv

MESSAGE = (
    "0/64 nodes are available: 12 node(s) didn't match Pod's node affinity/selector, "
    "52 Insufficient nvidia.com/gpu. preemption: 0/64 nodes are available: "
    "64 No preemption victims found for incoming pod."
)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def populate(api: FakeApiServer, pods: int, pending: int) -> None:
    for i in range(pods):
        unplaced = i < pending
        api.add_pod(
            make_pod(
                f"team-{i % 50}",
                f"worker-{i}",
                node=None if unplaced else f"gpu-node-{i % 64}",
                phase="Pending" if unplaced else "Running",
                owner=("StatefulSet", f"model-{i % 200}"),
                labels={"app": f"model-{i % 200}", "team": f"team-{i % 50}"},
                containers=[("server", 1 + i % 8, None if unplaced else f"containerd://{i:064x}")],
                conditions=[pod_scheduled_false("Unschedulable", MESSAGE)] if unplaced else None,
                pod_ip=None if unplaced else f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            )
        )


CHILD = """
import sys
sys.path[:0] = [{exporter!r}, {root!r}]
from benchmarks.bench_cluster import populate
from gpuledger.sim.fake_apiserver import FakeApiServer
with FakeApiServer() as api:
    populate(api, {pods}, {pending})
    print(api.kubeconfig({path!r}), flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def api_server(pods: int, pending: int) -> Iterator[Path]:
    """The simulated API server with its pods, in a child process: its kubeconfig."""
    code = CHILD.format(
        exporter=str(ROOT / "exporter"),
        root=str(ROOT),
        pods=pods,
        pending=pending,
        path="/tmp/gpuledger-bench-kubeconfig",
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        yield Path(child.stdout.readline().strip())
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--pending", type=int, default=1_000)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--no-trace", action="store_true", help="skip tracemalloc (timings)")
    args = parser.parse_args()

    with api_server(args.pods, args.pending) as kubeconfig:
        gc.collect()
        rss_before = rss_bytes()
        if not NO_TRACE:
            tracemalloc.start()
        pipeline = Pipeline(
            PipelineConfig(
                node="cluster", mode="cluster", kubernetes=True, kubeconfig=str(kubeconfig)
            )
        )
        joins: list[float] = []

        def cycle() -> Published:
            t0 = time.perf_counter()
            try:
                return pipeline.cycle()
            finally:
                joins.append(time.perf_counter() - t0)

        exporter = Exporter(cycle, 10.0)
        started = time.perf_counter()
        pipeline.warm_up(60)
        sync_seconds = time.perf_counter() - started
        cycles, renders, cpus = [], [], []
        source_cpu: dict[str, list[float]] = {}
        for _ in range(args.cycles):
            t0, c0 = time.perf_counter(), time.process_time()
            latest = exporter.run_once()
            cycles.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            for s in latest.ledger.sources:
                source_cpu.setdefault(s.source, []).append(s.cpu_seconds)
            t0 = time.perf_counter()
            body, _ = exporter.render(None)
            renders.append(time.perf_counter() - t0)
        traced_current, traced_peak = tracemalloc.get_traced_memory()
        held_by_gpuledger = 0
        if not NO_TRACE:
            # What the exporter itself keeps (the simulator's own objects excluded).
            snapshot = tracemalloc.take_snapshot()
            held_by_gpuledger = sum(
                stat.size
                for stat in snapshot.statistics("filename")
                if "/gpuledger/" in stat.traceback[0].filename
                and "/sim/" not in stat.traceback[0].filename
            )
            tracemalloc.stop()
        gc.collect()
        rss_after = rss_bytes()
        published, _ = exporter.current()
        assert published is not None
        series = sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
        pipeline.close()

    p95 = statistics.quantiles(cycles, n=20)[18] if len(cycles) >= 20 else max(cycles)
    print(f"pods in cluster            {args.pods}")
    print(f"unplaced (cached)          {len(published.ledger.pending)}")
    print(f"first list (sync)          {sync_seconds * 1000:.0f} ms")
    print(
        f"cycle median / p95         {statistics.median(cycles) * 1000:.2f} / {p95 * 1000:.2f} ms"
    )
    med = statistics.median
    print(
        f"of which the pipeline      {med(joins) * 1000:.2f} ms (sources and the join; the rest"
        " renders the exposition and builds /ledger.json)"
    )
    print(f"cycle CPU median           {med(cpus) * 1000:.2f} ms (this process, all threads)")
    print(
        "per source, CPU ms a cycle "
        + ", ".join(f"{k} {med(v) * 1000:.2f}" for k, v in source_cpu.items())
    )
    print(
        f"/metrics render median     {statistics.median(renders) * 1000:.2f} ms "
        f"({len(body)} bytes, {series} series)"
    )
    print(
        f"python heap live / peak    {traced_current / 2**20:.1f} / {traced_peak / 2**20:.1f} MiB"
    )
    print(f"allocated in gpuledger/    {held_by_gpuledger / 2**20:.1f} MiB (excl. the simulator)")
    print(f"RSS growth                 {(rss_after - rss_before) / 2**20:.1f} MiB")
    print(f"RSS (with the simulator)   {rss_after / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
