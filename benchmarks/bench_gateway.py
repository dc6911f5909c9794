"""The gateway's cost in the cluster view: InferencePools with their member pods and their
endpoint pickers, listed and read every cycle.

The simulated API server and pickers run in a child process (as real ones would); this
process runs the real cluster-mode pipeline against them and reports, per cycle, the wall
time and the thread CPU of each source (gpuledger_source_cpu_seconds_total), as millicores
at the 10 s default interval, and the /metrics render.

    .venv/bin/python benchmarks/bench_gateway.py [--pools 50] [--members 8] [--cycles 30]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "exporter"))
sys.path.insert(0, str(ROOT))

from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.web.server import Exporter


def gateway_cluster(pools: int, members: int) -> dict[str, Any]:
    """A cluster view's scenario: `pools` pools of `members` running pods each, every
    picker holding requests (flow control on), llm-d-router v0.10.0's names."""
    pods = [
        {
            "namespace": "llm",
            "name": f"model-{p}-{m}",
            "node": f"gpu-node-{(p * members + m) % 64}",
            "labels": {"app": f"model-{p}"},
            "owner": {"kind": "ReplicaSet", "name": f"model-{p}-5d8c7b9f4"},
            "containers": [{"name": "vllm", "gpus": 1}],
        }
        for p in range(pools)
        for m in range(members)
    ]
    return {
        "node": "gpuledger-cluster",
        "mode": "cluster",
        "kubernetes": {"pods": pods},
        "gateway": {
            "pools": [
                {
                    "namespace": "llm",
                    "name": f"pool-{p}",
                    "selector": {"app": f"model-{p}"},
                    "picker": {"queued": p % 7, "saturation": 0.3},
                }
                for p in range(pools)
            ]
        },
    }


CHILD = """
import dataclasses, json, sys
sys.path[:0] = [{exporter!r}, {root!r}]
from benchmarks.bench_gateway import gateway_cluster
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import parse_scenario
node = SimulatedNode(parse_scenario(gateway_cluster({pools}, {members}), "bench-gateway"))
print(json.dumps(dataclasses.asdict(node.pipeline_config(5.0))), flush=True)
sys.stdin.read()
node.close()
"""


@contextlib.contextmanager
def simulated(pools: int, members: int) -> Iterator[PipelineConfig]:
    code = CHILD.format(
        exporter=str(ROOT / "exporter"), root=str(ROOT), pools=pools, members=members
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        raw = json.loads(child.stdout.readline())
        tuples = {f.name for f in dataclasses.fields(PipelineConfig) if "tuple" in str(f.type)}
        raw = {
            k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if k in tuples else v
            for k, v in raw.items()
        }
        yield PipelineConfig(**raw)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def run(pools: int, members: int, cycles: int) -> dict[str, Any]:
    with simulated(pools, members) as config:
        pipeline = Pipeline(config)
        exporter = Exporter(pipeline.cycle, interval_seconds=10.0)
        try:
            pipeline.warm_up(10.0)
            for _ in range(3):  # the informer syncs, the Services are read once
                exporter.run_once()
            walls, renders = [], []
            cpu: dict[str, list[float]] = {}
            for _ in range(cycles):
                started = time.perf_counter()
                published = exporter.run_once()
                walls.append(time.perf_counter() - started)
                for status in published.ledger.sources:
                    cpu.setdefault(status.source, []).append(status.cpu_seconds)
                started = time.perf_counter()
                exporter.render(None)
                renders.append(time.perf_counter() - started)
            ledger = published.ledger
            readings = [p.picker for p in ledger.pools if p.picker is not None]
            held = sum(1 for r in readings if r.up)
            failed = sorted({r.error_reason or "" for r in readings if not r.up})
            reads = sorted(r.duration_seconds for r in readings if r.up)
        finally:
            pipeline.close()
    return {
        "pools": pools,
        "members": pools * members,
        "pickers_read": held,
        "picker_failures": failed,
        "picker_read_ms_median": statistics.median(reads) * 1000 if reads else None,
        "cycle_wall_ms_median": statistics.median(walls) * 1000,
        "cycle_wall_ms_p95": sorted(walls)[int(0.95 * (len(walls) - 1))] * 1000,
        # CPU-ms per cycle at one cycle per 10 s = millicores.
        "millicores": {s: statistics.median(v) * 1000 / 10 for s, v in sorted(cpu.items())},
        "render_ms_median": statistics.median(renders) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=30)
    args = parser.parse_args()
    for pools in args.pools:
        print(json.dumps(run(pools, args.members, args.cycles)), flush=True)


if __name__ == "__main__":
    main()
