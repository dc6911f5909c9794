"""Node mode on a dense simulated node, against the cost of the raw reads alone.

The simulated sources run in a child process (as the real kubelet, API server, engines and
Ray dashboard would); this process runs the real pipeline and, for the floor, performs only
the same raw reads: the same NVML calls, the same /proc files, the same HTTP GETs and gRPC
List — no parsing, joining or rendering.

Then `/metrics` is served by the real HTTP server and scraped from another process, first
while the exporter is idle (a scrape sends the cached render), then while collection cycles
run back to back (every scrape overlaps a cycle: the worst case, one in ~50 at a 10 s
interval on the dense node at 16x).

Cycle CPU is also given as millicores at the 10 s default interval: CPU-ms per cycle / 10.

    .venv/bin/python benchmarks/bench_node.py [--scale 1 4 16] [--cycles 30] [--scrapes 500]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exporter"))
sys.path.insert(0, str(ROOT))

import grpc
import pynvml
import requests

from benchmarks.scrape_latency import Scraper, p99
from gpuledger.export.published import Published
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.protocols.podresources import api_pb2, api_pb2_grpc
from gpuledger.sim.fake_nvml import STATE_ENV
from gpuledger.sources.procfs.source import _read as read_proc_file
from gpuledger.web.server import Exporter, serve

CHILD = """
import json, sys
sys.path[:0] = [{exporter!r}, {root!r}]
from benchmarks.{module} import {module}
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import parse_scenario
node = SimulatedNode(parse_scenario({module}({args}), {name!r}))
cfg = node.pipeline_config(5.0)
print(json.dumps({{"config": {{k: getattr(cfg, k) for k in {fields!r}}},
    "state": str(node.state_file)}}), flush=True)
sys.stdin.read()
node.close()
"""


@contextlib.contextmanager
def simulated_node(
    module: str, args: str, name: str, fields: tuple[str, ...]
) -> Iterator[dict[str, Any]]:
    """The simulated node `benchmarks.<module>.<module>(<args>)` served by a child process
    (as the real kubelet, API server, engines and Ray dashboard would be): yields the
    `fields` of its PipelineConfig, with the fake NVML's state file set in os.environ."""
    code = CHILD.format(
        exporter=str(ROOT / "exporter"),
        root=str(ROOT),
        module=module,
        args=args,
        name=name,
        fields=fields,
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        info = json.loads(child.stdout.readline())
        os.environ[STATE_ENV] = info["state"]
        yield info["config"]
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=30)


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def nvml_gpu_floor(index: int) -> Any:
    """The NVML calls of one cycle for the GPU at `index`, its processes aside: its handle."""
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    pynvml.nvmlDeviceGetUUID(h)
    pynvml.nvmlDeviceGetName(h)
    pynvml.nvmlDeviceGetPciInfo_v3(h)
    pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    # In MIG mode NVML has no utilization; the exporter asks all the same.
    with contextlib.suppress(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(h)
    pynvml.nvmlDeviceGetMigMode(h)
    return h


def local_floor(config: PipelineConfig, pids: list[int], stub: Any) -> None:
    """The /proc files of these PIDs and their ancestors, and PodResources List and
    GetAllocatableResources: the node-local reads of one cycle after NVML's."""
    seen: set[int] = set()
    for pid in pids:
        current = pid
        while current > 1 and current not in seen:
            seen.add(current)
            base = f"{config.proc_root}/{current}"
            # The exporter's own reader: the cheapest read is the floor's as well.
            status = read_proc_file(f"{base}/status", 1 << 16)
            if status is None:
                break
            for name in ("cgroup", "cmdline", "environ"):
                read_proc_file(f"{base}/{name}", 1 << 20)
            ppid = [ln for ln in status.split(b"\n") if ln.startswith(b"PPid:")]
            current = int(ppid[0].split()[1]) if ppid else 0
    stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
    stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=5)


def floor_cycle(
    config: PipelineConfig,
    engine_urls: list[str],
    ray_node_ids: list[str],
    session: requests.Session,
    stub: Any,
) -> None:
    """The raw reads one gpuledger cycle makes, and nothing else."""
    pids: list[int] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = nvml_gpu_floor(i)
        pids += [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    local_floor(config, pids, stub)
    for url in engine_urls:
        session.get(url, timeout=5).content
    dashboard = config.ray_address
    session.get(f"{dashboard}/api/v0/nodes?limit=10000&timeout=5", timeout=5).content
    session.get(f"{dashboard}/api/cluster_status", timeout=5).content
    for node_id in ray_node_ids:
        session.get(
            f"{dashboard}/api/v0/actors?detail=true&limit=10000&timeout=5"
            f"&filter_keys=state&filter_predicates=%21%3D&filter_values=DEAD"
            f"&filter_keys=node_id&filter_predicates=%3D&filter_values={node_id}",
            timeout=5,
        ).content


def scrape_latencies(exporter: Exporter, count: int) -> dict[str, float]:
    """p50/p99 of `count` scrapes with the exporter idle, and while cycles run."""
    server = serve(exporter, "127.0.0.1:0", "bench", "node")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with Scraper(server.server_address[1], count) as idle:
            pass
        with Scraper(server.server_address[1], max(count // 5, 100)) as busy:
            while not busy.done():
                exporter.run_once()
    finally:
        server.shutdown()
        server.server_close()
    med = statistics.median
    return {
        "scrape_idle_p50_ms": med(idle.seconds) * 1e3,
        "scrape_idle_p99_ms": p99(idle.seconds) * 1e3,
        "scrape_busy_p50_ms": med(busy.seconds) * 1e3,
        "scrape_busy_p99_ms": p99(busy.seconds) * 1e3,
    }


def podresources_stub(config: PipelineConfig) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"unix://{config.podresources_socket}")
    return channel, api_pb2_grpc.PodResourcesListerStub(channel)


def warm_exporter(config: PipelineConfig) -> tuple[Pipeline, Exporter]:
    """The real pipeline and exporter, warmed up: informer synced, engines known, caches
    hot."""
    pipeline = Pipeline(config)
    exporter = Exporter(pipeline.cycle, 10.0)
    pipeline.warm_up(30)
    for _ in range(3):
        exporter.run_once()
    return pipeline, exporter


def measure_cycles(
    exporter: Exporter, floor: Callable[[], None], cycles: int
) -> tuple[Published, bytes, dict[str, Any]]:
    """`cycles` of gpuledger's cycle and the floor, alternating, so drift in the machine's
    load (it is shared) affects both alike: the last cycle, its render, and the figures."""
    walls, cpus, renders, floor_walls, floor_cpus = [], [], [], [], []
    per_source: dict[str, list[float]] = {}
    per_source_cpu: dict[str, list[float]] = {}
    for _ in range(cycles):
        w0, c0 = time.perf_counter(), time.process_time()
        published = exporter.run_once()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        for s in published.ledger.sources:
            per_source.setdefault(s.source, []).append(s.duration_seconds)
            per_source_cpu.setdefault(s.source, []).append(s.cpu_seconds)
        r0 = time.perf_counter()
        body, _ = exporter.render(None)
        renders.append(time.perf_counter() - r0)
        w0, c0 = time.perf_counter(), time.process_time()
        floor()
        floor_walls.append(time.perf_counter() - w0)
        floor_cpus.append(time.process_time() - c0)
    med = statistics.median
    return (
        published,
        body,
        {
            "wall_ms": med(walls) * 1e3,
            "cpu_ms": med(cpus) * 1e3,
            # CPU-seconds per cycle / 10 s interval * 1000.
            "millicores_at_10s": med(cpus) * 1e3 / 10,
            "millicores_above_floor_at_10s": med(
                c - f for c, f in zip(cpus, floor_cpus, strict=True)
            )
            * 1e3
            / 10,
            "cpu_p25_p75_ms": [q * 1e3 for q in quartiles(cpus)],
            "floor_wall_ms": med(floor_walls) * 1e3,
            "floor_cpu_ms": med(floor_cpus) * 1e3,
            "floor_cpu_p25_p75_ms": [q * 1e3 for q in quartiles(floor_cpus)],
            # Per pair of runs, so a noisy moment counts against both sides of one ratio.
            "ratio_median_of_pairs": med(c / f for c, f in zip(cpus, floor_cpus, strict=True)),
            "render_ms": med(renders) * 1e3,
            "sources_ms": {k: med(v) * 1e3 for k, v in per_source.items()},
            # The thread CPU of each source (gpuledger_source_cpu_seconds_total per cycle);
            # the rest of the cycle's CPU is the join, the render and the document.
            "sources_cpu_ms": {k: med(v) * 1e3 for k, v in per_source_cpu.items()},
            "sources_cpu_p25_p75_ms": {
                k: [q * 1e3 for q in quartiles(v)] for k, v in per_source_cpu.items()
            },
        },
    )


def run(scale: int, cycles: int, scrapes_wanted: int) -> dict[str, Any]:
    fields = ("node", "proc_root", "nvml_library", "podresources_socket", "kubeconfig")
    with simulated_node("dense_node", str(scale), "dense.yaml", (*fields, "ray_address")) as cfg:
        config = PipelineConfig(kubernetes=True, engine_discovery=True, **cfg)
        rss_before = rss()
        pipeline, exporter = warm_exporter(config)
        session = requests.Session()
        channel, stub = podresources_stub(config)
        published = exporter.run_once()
        engines = [e.url for e in published.ledger.engines]
        ray_ids = (
            [v.node.node_id for v in published.ledger.ray.nodes] if published.ledger.ray else []
        )
        floor_cycle(config, engines, ray_ids, session, stub)  # warm its connections too
        published, body, figures = measure_cycles(
            exporter, lambda: floor_cycle(config, engines, ray_ids, session, stub), cycles
        )
        scrapes = scrape_latencies(exporter, scrapes_wanted)
        down = [s.source for s in published.ledger.sources if not s.up]
        series = sum(1 for ln in body.decode().splitlines() if ln and not ln.startswith("#"))
        rss_after = rss()
        channel.close()
        pipeline.close()
    return {
        "scale": scale,
        "down": down,
        "series": series,
        "bytes": len(body),
        "processes": len(published.ledger.processes),
        "pods": len(published.ledger.pods),
        **figures,
        **scrapes,
        "rss_mb": rss_after / 2**20,
        "rss_growth_mb": (rss_after - rss_before) / 2**20,
    }


# Issue 22's budgets: millicores at the 10 s interval, by scale.
BUDGETS_MILLICORES = {1: 4.0, 16: 15.0}


def print_run(r: dict[str, Any]) -> None:
    print(json.dumps(r))
    print(
        f"scale {r['scale']:>2}: {r['processes']} procs, {r['pods']} GPU pods, "
        f"{r['series']} series | cycle wall {r['wall_ms']:.1f} ms cpu {r['cpu_ms']:.1f} ms"
        f" | floor wall {r['floor_wall_ms']:.1f} ms cpu {r['floor_cpu_ms']:.1f} ms"
        f" | ratio cpu {r['cpu_ms'] / r['floor_cpu_ms']:.2f}"
        f" (median of pairs {r['ratio_median_of_pairs']:.2f})"
        f" | {r['millicores_at_10s']:.1f} millicores at 10 s"
        f" ({r['millicores_above_floor_at_10s']:.1f} above the floor)"
        f" | scrape p99 {r['scrape_idle_p99_ms']:.1f} ms idle,"
        f" {r['scrape_busy_p99_ms']:.1f} ms during a cycle"
        f" | render {r['render_ms']:.1f} ms | RSS {r['rss_mb']:.0f} MB"
        f" | down: {r['down'] or 'none'}",
        flush=True,
    )
    cpu, wall = r["sources_cpu_ms"], r["sources_ms"]
    print(
        "  per source, CPU ms a cycle (wall ms): "
        + ", ".join(f"{k} {cpu[k]:.2f} ({wall[k]:.0f})" for k in cpu)
        + f"; the rest (join, render, document, loop) {r['cpu_ms'] - sum(cpu.values()):.2f}",
        flush=True,
    )


def verdict(runs: list[dict[str, Any]]) -> bool:
    """Each budgeted scale's runs against its budget; True when every one is met."""
    met = True
    for scale, budget in BUDGETS_MILLICORES.items():
        figures = [r["millicores_at_10s"] for r in runs if r["scale"] == scale]
        down = sorted({d for r in runs if r["scale"] == scale for d in r["down"]})
        if not figures:
            continue
        ok = max(figures) <= budget and not down
        met = met and ok
        print(
            f"budget {scale}x: {' · '.join(f'{f:.1f}' for f in figures)} millicores at 10 s"
            f" (budget {budget:g}){f', down: {down}' if down else ''}:"
            f" {'met' if ok else 'NOT MET'}",
            flush=True,
        )
    load = os.getloadavg()
    print(
        f"load average during the runs: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
        f" on {os.cpu_count()} CPUs (budgets hold only on a quiet machine)",
        flush=True,
    )
    return met


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, nargs="+", default=[1])
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--runs", type=int, default=1, help="runs of each scale")
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        for scale in args.scale:
            runs.append(run(scale, args.cycles, args.scrapes))
            print_run(runs[-1])
    sys.exit(0 if verdict(runs) else 1)


if __name__ == "__main__":
    main()
