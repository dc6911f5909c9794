"""Soak: thousands of cycles of a churning node in compressed time (no sleeps), with the
exporter's memory, threads and open file descriptors sampled.

Every cycle the scenario moves on one generation (a job ends, another starts; the vLLM
engine's queue, the Ray actors and a process's memory change; GPU 2 is lost for 10 of every
100 cycles), the exporter takes a snapshot, and /metrics is scraped over HTTP
(/ledger.json and /ledger every 50 cycles).

Bounds asserted after warm-up (WARM_UP cycles): RSS grows by less than RSS_GROWTH_BOUND;
threads and fds stay within +/- RESOURCE_SLACK of their value at the end of warm-up. The
RSS is the whole test process, the simulated sources included: the bound is generous on
purpose. Measured numbers: docs/reliability.md.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from gpuledger.sim.scenario import parse_scenario
from tests.conftest import REPO, Sample, pick
from tests.reliability.harness import Node, open_fds, rss_bytes, source_up
from tests.reliability.scenarios import soak_node

SOAK_CYCLES = 2000
WARM_UP = 400
SAMPLE_EVERY = 100
RSS_GROWTH_BOUND = 30 * 1024 * 1024
RESOURCE_SLACK = 2
SOURCES = ("nvml", "procfs", "podresources", "kubernetes", "vllm", "ray")


def test_soak(tmp_path: Path) -> None:
    node = Node(soak_node(0), tmp_path / "node", deadline=1.0)
    assert node.sim.apiserver is not None
    node.sim.apiserver.history_limit = 200  # the fake API server's memory, not ours
    # The scenarios are parsed before the clock starts: only the exporter is measured.
    generations = [parse_scenario(soak_node(g), "soak.yaml") for g in range(100)]
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    try:
        node.until(lambda s: all(source_up(s, x) == 1 for x in SOURCES))
        for cycle in range(1, SOAK_CYCLES + 1):
            node.sim.apply(generations[cycle % 100])
            node.cycle()
            status, body, _ = node.get("/metrics")
            assert status == 200 and body
            if cycle % 50 == 0:
                assert node.get("/ledger.json")[0] == 200
                assert node.get("/ledger")[0] == 200
            if cycle % SAMPLE_EVERY == 0:
                samples.append(
                    {
                        "cycle": cycle,
                        "seconds": round(time.monotonic() - started, 1),
                        "rss_mib": round(rss_bytes() / 2**20, 1),
                        "threads": threading.active_count(),
                        "fds": open_fds(),
                    }
                )
        # Still joining correctly at the end: the live jobs and nothing else.
        first = (SOAK_CYCLES % 100) % 97
        live = {f"job-{i}" for i in range(first, first + 3)}

        def converged(current: list[Sample]) -> bool:
            used = {
                labels["pod"]
                for _, labels, _ in pick(current, "gpuledger_container_gpu_processes")
                if labels["pod"] != "worker-0"
            }
            return all(source_up(current, x) == 1 for x in SOURCES) and used == live

        node.until(converged)
    finally:
        node.close()
    report = {
        "cycles": SOAK_CYCLES,
        "seconds": round(time.monotonic() - started, 1),
        "samples": samples,
    }
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "soak.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    after_warm_up = [s for s in samples if s["cycle"] >= WARM_UP]
    base = after_warm_up[0]
    growth = max(s["rss_mib"] for s in after_warm_up) - base["rss_mib"]
    assert growth * 2**20 < RSS_GROWTH_BOUND, report
    for key in ("threads", "fds"):
        values = [s[key] for s in after_warm_up]
        assert max(values) <= base[key] + RESOURCE_SLACK, (key, report)
        assert min(values) >= base[key] - RESOURCE_SLACK, (key, report)
