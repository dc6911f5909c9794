"""Node mode on a dense MIG node (benchmarks/dense_mig_node.py: 8 GPUs x 7 MIG devices, 56
pods each with a process on its MIG device), against the cost of the raw reads alone.

As benchmarks/bench_node.py: the simulated kubelet and API server run in a child process;
this process runs the real pipeline and, alternating with it cycle by cycle, the floor: the
same NVML calls (per GPU, then per MIG device: handle, UUID, name, instance ids, memory,
processes), the same /proc files and the PodResources List/GetAllocatableResources, nothing
parsed, joined or rendered. Then /metrics is scraped from another process, idle and while
cycles run back to back. Cycle CPU is given as millicores at the 10 s default interval
(CPU-ms per cycle / 10).

`--serve` also measures the memory of a real `gpuledger serve` node agent on the same node
(as benchmarks/rss_serve.py does for the dense node): the figure the 100 MB target is for.

    .venv/bin/python benchmarks/bench_mig_node.py [--cycles 30] [--scrapes 500] [--serve]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exporter"))
sys.path.insert(0, str(ROOT))

import grpc
import pynvml

from benchmarks.bench_node import quartiles, rss, scrape_latencies
from benchmarks.rss_serve import IN_NAMESPACE, can_use_namespace, memory
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.protocols.podresources import api_pb2, api_pb2_grpc
from gpuledger.server import Exporter
from gpuledger.sim.fake_nvml import STATE_ENV
from gpuledger.sources.procfs import _read as read_proc_file

CHILD = """
import json, sys
sys.path[:0] = [{exporter!r}, {root!r}]
from benchmarks.dense_mig_node import dense_mig_node
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import parse_scenario
node = SimulatedNode(parse_scenario(dense_mig_node(), "dense-mig.yaml"))
cfg = node.pipeline_config(5.0)
print(json.dumps({{"config": {{k: getattr(cfg, k) for k in (
    "node", "proc_root", "nvml_library", "podresources_socket", "kubeconfig")}},
    "state": str(node.state_file)}}), flush=True)
sys.stdin.read()
node.close()
"""
PORT = 19403


def nvml_floor() -> list[int]:
    """The NVML calls of one cycle on a MIG node; the PIDs they list."""
    pids: list[int] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        pynvml.nvmlDeviceGetUUID(h)
        pynvml.nvmlDeviceGetName(h)
        pynvml.nvmlDeviceGetPciInfo_v3(h)
        pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        # MIG mode: NVML has no utilization; the exporter asks all the same.
        with contextlib.suppress(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetUtilizationRates(h)
        pynvml.nvmlDeviceGetMigMode(h)
        for m in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, m)
            except pynvml.NVMLError_NotFound:
                continue
            pynvml.nvmlDeviceGetUUID(mig)
            pynvml.nvmlDeviceGetName(mig)
            pynvml.nvmlDeviceGetGpuInstanceId(mig)
            pynvml.nvmlDeviceGetComputeInstanceId(mig)
            pynvml.nvmlDeviceGetMemoryInfo(mig, version=pynvml.nvmlMemory_v2)
            pids += [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)]
    return pids


def floor_cycle(config: PipelineConfig, stub: Any) -> None:
    """The raw reads one gpuledger cycle makes on this node, and nothing else."""
    seen: set[int] = set()
    for pid in nvml_floor():
        current = pid
        while current > 1 and current not in seen:
            seen.add(current)
            base = f"{config.proc_root}/{current}"
            status = read_proc_file(f"{base}/status", 1 << 16)
            if status is None:
                break
            for name in ("cgroup", "cmdline", "environ"):
                read_proc_file(f"{base}/{name}", 1 << 20)
            ppid = [ln for ln in status.split(b"\n") if ln.startswith(b"PPid:")]
            current = int(ppid[0].split()[1]) if ppid else 0
    stub.List(api_pb2.ListPodResourcesRequest(), timeout=5)
    stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=5)


def run(cycles: int, scrapes_wanted: int) -> dict[str, Any]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(exporter=str(ROOT / "exporter"), root=str(ROOT))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        info = json.loads(child.stdout.readline())
        os.environ[STATE_ENV] = info["state"]
        config = PipelineConfig(kubernetes=True, **info["config"])
        rss_before = rss()
        pipeline = Pipeline(config)
        exporter = Exporter(pipeline.cycle, 10.0)
        pipeline.warm_up(30)
        for _ in range(3):  # warm-up: informer synced, caches hot
            exporter.run_once()
        channel = grpc.insecure_channel(f"unix://{config.podresources_socket}")
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        floor_cycle(config, stub)
        walls, cpus, floor_cpus, renders = [], [], [], []
        per_source: dict[str, list[float]] = {}
        for _ in range(cycles):
            w0, c0 = time.perf_counter(), time.process_time()
            published = exporter.run_once()
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            for s in published.ledger.sources:
                per_source.setdefault(s.source, []).append(s.duration_seconds)
            r0 = time.perf_counter()
            body, _ = exporter.render(None)
            renders.append(time.perf_counter() - r0)
            c0 = time.process_time()
            floor_cycle(config, stub)
            floor_cpus.append(time.process_time() - c0)
        scrapes = scrape_latencies(exporter, scrapes_wanted)
        ledger = published.ledger
        rss_after = rss()
        channel.close()
        pipeline.close()
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=30)
    med = statistics.median
    text = body.decode()
    attributed = sum(
        1
        for line in text.splitlines()
        if line.startswith("gpuledger_container_gpu_memory_used_bytes{") and "MIG-" in line
    )
    return {
        "gpus": len(ledger.gpus),
        "mig_devices": sum(len(g.mig_devices) for g in ledger.gpus),
        "pods": len(ledger.pods),
        "processes": len(ledger.processes),
        "mig_usage_series": attributed,
        "down": [s.source for s in ledger.sources if s.state == "down"],
        "series": sum(1 for ln in text.splitlines() if ln and not ln.startswith("#")),
        "bytes": len(body),
        "wall_ms": med(walls) * 1e3,
        "cpu_ms": med(cpus) * 1e3,
        "millicores_at_10s": med(cpus) * 1e3 / 10,
        "cpu_p25_p75_ms": [q * 1e3 for q in quartiles(cpus)],
        "floor_cpu_ms": med(floor_cpus) * 1e3,
        "millicores_above_floor_at_10s": med(c - f for c, f in zip(cpus, floor_cpus, strict=True))
        * 1e3
        / 10,
        "render_ms": med(renders) * 1e3,
        **scrapes,
        "sources_ms": {k: med(v) * 1e3 for k, v in per_source.items()},
        "rss_mb": rss_after / 2**20,
        "rss_growth_mb": (rss_after - rss_before) / 2**20,
    }


def serve_rss(seconds: float) -> dict[str, Any]:
    """Memory of a real `gpuledger serve` on the dense MIG node (in-cluster configuration
    where the machine allows a private mount namespace, else a kubeconfig)."""
    from benchmarks.dense_mig_node import dense_mig_node
    from gpuledger.sim.harness import SimulatedNode
    from gpuledger.sim.scenario import parse_scenario

    in_cluster = can_use_namespace()
    scenario = parse_scenario(dense_mig_node(), "dense-mig.yaml")
    with SimulatedNode(scenario, in_cluster=in_cluster) as node:
        config = node.pipeline_config(5.0)
        serve = [
            sys.executable, "-m", "gpuledger", "serve",
            "--listen", f"127.0.0.1:{PORT}", "--interval", "5",
            "--proc-root", config.proc_root, "--nvml-library", str(config.nvml_library),
            "--node-name", config.node, "--kubernetes", "on",
            "--podresources-socket", str(config.podresources_socket), "--log-level", "warning",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter"), STATE_ENV: str(node.state_file)}
        if in_cluster:
            env |= {**node.service_env, "GL_SA": str(node.service_account_dir)}
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
            command += [IN_NAMESPACE, "sh", *serve]
        else:
            command = [*serve, "--kubeconfig", str(node.kubeconfig)]
        process = subprocess.Popen(command, env=env)
        try:
            time.sleep(seconds)
            for _ in range(5):
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5) as r:
                    r.read()
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/ledger.json", timeout=5) as r:
                document = json.loads(r.read())
            result = memory(process.pid)
        finally:
            process.terminate()
            process.wait(30)
    return {
        "config": "in-cluster" if in_cluster else "kubeconfig",
        "sources_up": sorted(s["source"] for s in document["sources"] if s["up"]),
        "mig_devices": sum(len(g["mig_devices"]) for g in document["gpus"]),
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--serve", action="store_true", help="also the RSS of a real serve")
    parser.add_argument("--seconds", type=float, default=25.0)
    args = parser.parse_args()
    r = run(args.cycles, args.scrapes)
    print(json.dumps(r))
    print(
        f"dense MIG node: {r['gpus']} GPUs, {r['mig_devices']} MIG devices, {r['pods']} GPU pods,"
        f" {r['mig_usage_series']} MIG usage series, {r['series']} series"
        f" | cycle cpu {r['cpu_ms']:.1f} ms = {r['millicores_at_10s']:.1f} millicores at 10 s"
        f" ({r['millicores_above_floor_at_10s']:.1f} above the floor)"
        f" | scrape p99 {r['scrape_idle_p99_ms']:.1f} ms idle,"
        f" {r['scrape_busy_p99_ms']:.1f} ms during a cycle"
        f" | benchmark RSS {r['rss_mb']:.0f} MB | down: {r['down'] or 'none'}",
        flush=True,
    )
    if args.serve:
        s = serve_rss(args.seconds)
        print(json.dumps(s))
        print(
            f"gpuledger serve on the dense MIG node ({s['config']}): RSS {s['VmRSS']:.0f} MB,"
            f" peak {s['VmHWM']:.0f} MB; {s['mig_devices']} MIG devices;"
            f" up: {', '.join(s['sources_up'])}",
            flush=True,
        )


if __name__ == "__main__":
    main()
