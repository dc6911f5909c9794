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
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exporter"))
sys.path.insert(0, str(ROOT))

import pynvml

from benchmarks.bench_node import (
    local_floor,
    measure_cycles,
    nvml_gpu_floor,
    podresources_stub,
    rss,
    scrape_latencies,
    simulated_node,
    warm_exporter,
)
from benchmarks.rss_serve import serve_memory
from gpuledger.pipeline import PipelineConfig

PORT = 19403


def nvml_floor() -> list[int]:
    """The NVML calls of one cycle on a MIG node; the PIDs they list."""
    pids: list[int] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = nvml_gpu_floor(i)
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


def run(cycles: int, scrapes_wanted: int) -> dict[str, Any]:
    fields = ("node", "proc_root", "nvml_library", "podresources_socket", "kubeconfig")
    with simulated_node("dense_mig_node", "", "dense-mig.yaml", fields) as cfg:
        config = PipelineConfig(kubernetes=True, **cfg)
        rss_before = rss()
        pipeline, exporter = warm_exporter(config)
        channel, stub = podresources_stub(config)
        local_floor(config, nvml_floor(), stub)
        published, body, figures = measure_cycles(
            exporter, lambda: local_floor(config, nvml_floor(), stub), cycles
        )
        scrapes = scrape_latencies(exporter, scrapes_wanted)
        ledger = published.ledger
        rss_after = rss()
        channel.close()
        pipeline.close()
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
        **figures,
        **scrapes,
        "rss_mb": rss_after / 2**20,
        "rss_growth_mb": (rss_after - rss_before) / 2**20,
    }


def serve_rss(seconds: float) -> dict[str, Any]:
    """Memory of a real `gpuledger serve` on the dense MIG node (in-cluster configuration
    where the machine allows a private mount namespace, else a kubeconfig)."""
    from benchmarks.dense_mig_node import dense_mig_node
    from gpuledger.sim.scenario import parse_scenario

    scenario = parse_scenario(dense_mig_node(), "dense-mig.yaml")
    configuration, document, result = serve_memory(scenario, seconds, PORT)
    return {
        "config": configuration,
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
