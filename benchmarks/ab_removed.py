"""What issue 13's removals cost, measured pairwise in one process on the dense node.

* Rendering: the hand-written `Family` renderer (loaded from git at BEFORE) against
  prometheus_client's generate_latest, on the same snapshot, alternating.
* Runtime tuning: the interpreter settings the collection loop used to apply (start-up
  objects frozen out of the GC, young-generation threshold 50,000, 20 ms thread switch
  interval) against Python's defaults, alternating cycle by cycle.

Alternating in one process puts the shared machine's drift on both sides of each pair.

    .venv/bin/python benchmarks/ab_removed.py [--scale 16] [--cycles 30]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "exporter"), str(ROOT)]

from benchmarks.bench_node import CHILD
from gpuledger.export.collector import LedgerCollector
from gpuledger.export.exposition import render_text
from gpuledger.export.published import Published
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sim.fake_nvml import STATE_ENV
from gpuledger.web.server import Exporter

BEFORE = "e15957a"  # the last commit with the Family renderer and the tuning


def _old_module(name: str, path: str, imports: dict[str, str]) -> ModuleType:
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BEFORE}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for old, new in imports.items():
        source = source.replace(old, new)
    module = ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def _tuned(on: bool) -> None:
    if on:  # what server.tune_runtime did at BEFORE
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 10, 10)
        sys.setswitchinterval(0.02)
    else:
        gc.unfreeze()
        gc.set_threshold(700, 10, 10)
        sys.setswitchinterval(0.005)


def _cpu(work: Any) -> tuple[float, Any]:
    started = time.process_time()
    result = work()
    return time.process_time() - started, result


def run(scale: int, cycles: int) -> dict[str, float]:
    old_exposition = _old_module("old_exposition", "exporter/gpuledger/export/exposition.py", {})
    old_collector = _old_module(
        "old_collector",
        "exporter/gpuledger/export/collector.py",
        {"from gpuledger.export.exposition import": "from old_exposition import"},
    )
    code = CHILD.format(exporter=str(ROOT / "exporter"), root=str(ROOT), scale=scale)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    info = json.loads(child.stdout.readline())
    os.environ[STATE_ENV] = info["state"]
    pipeline = Pipeline(PipelineConfig(kubernetes=True, engine_discovery=True, **info["config"]))
    exporter = Exporter(pipeline.cycle, 10.0)
    try:
        pipeline.warm_up(30)
        for _ in range(3):
            exporter.run_once()
        tuning, render = [], []
        for i in range(cycles):
            cpu: dict[bool, float] = {}
            for on in (True, False) if i % 2 else (False, True):
                _tuned(on)
                cpu[on], published = _cpu(exporter.run_once)
            tuning.append(cpu[False] - cpu[True])
            _tuned(False)

            def snapshot(
                published: Published = published, now: float = time.time()
            ) -> tuple[Published, float]:
                return published, now

            new, body = _cpu(lambda: render_text(LedgerCollector(snapshot, "snapshot").families()))
            old, old_body = _cpu(
                lambda: old_exposition.render_text(
                    old_collector.LedgerCollector(snapshot, "snapshot").families()
                )
            )
            assert body == old_body, "the two renderers disagree"
            render.append(new - old)
    finally:
        child.stdin.close()
        pipeline.close()
        child.wait(30)
    med = statistics.median
    # CPU-seconds per cycle at a 10 s interval, in millicores: ms / 10.
    return {
        "scale": scale,
        "generate_latest_minus_family_ms": med(render) * 1e3,
        "generate_latest_millicores": med(render) * 1e2,
        "untuned_minus_tuned_ms": med(tuning) * 1e3,
        "tuning_millicores": med(tuning) * 1e2,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=16)
    parser.add_argument("--cycles", type=int, default=30)
    args = parser.parse_args()
    print(json.dumps(run(args.scale, args.cycles)), flush=True)


if __name__ == "__main__":
    main()
