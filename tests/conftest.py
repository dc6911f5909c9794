"""Shared helpers: run the real pipeline against a simulated node and read its exposition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.pipeline import Pipeline
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import Scenario, parse_scenario
from gpuledger.web.server import Exporter

REPO = Path(__file__).resolve().parent.parent


Sample = tuple[str, dict[str, str], float]


def samples(exposition: str) -> list[Sample]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
    ]


def pick(all_samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [
        s for s in all_samples if s[0] == name and all(s[1].get(k) == v for k, v in labels.items())
    ]


def value(all_samples: list[Sample], name: str, **labels: str) -> float:
    found = pick(all_samples, name, **labels)
    assert len(found) == 1, f"expected one {name}{labels}, found {found}"
    return found[0][2]


class Run:
    """A simulated node plus the real pipeline, cycled on demand."""

    def __init__(self, scenario: Scenario, tmp: Path) -> None:
        self.scenario = scenario
        self.node = SimulatedNode(scenario, tmp)
        self.pipeline = Pipeline(self.node.pipeline_config(deadline_seconds=3.0))
        self.exporter = Exporter(self.pipeline.cycle, interval_seconds=1.0)

    def scrape(self, phase: str | None = None) -> list[Sample]:
        if phase is not None:
            self.node.apply(self.scenario.at_phase(phase))
        self.exporter.run_once()
        body, _ = self.exporter.render(None)
        return samples(body.decode())

    def settle(self, phase: str | None = None, timeout: float = 15.0) -> list[Sample]:
        """Scrape until every configured source is up (the informer syncs in the background)."""
        import time

        deadline = time.monotonic() + timeout
        current = self.scrape(phase)
        while True:
            down = [
                s
                for s in pick(current, "gpuledger_source_up")
                if s[2] == 0 and s[1]["source"] in self.expected_up
            ]
            if not down or time.monotonic() > deadline:
                return current
            time.sleep(0.1)
            current = self.scrape()

    @property
    def expected_up(self) -> set[str]:
        config = self.pipeline.config
        wanted = {"kubernetes"} if config.kubernetes else set()
        if config.ray_address and self.scenario.ray and self.scenario.ray.fault == "ok":
            wanted.add("ray")
            serve = self.scenario.ray.serve
            if config.mode == "node" and (
                serve is None or serve.fault == serve.metrics_fault == "ok"
            ):
                wanted.add("serve")
        if config.mode == "node":
            wanted |= {"nvml", "procfs"}
            if config.podresources_socket and self.scenario.podresources_fault == "ok":
                wanted.add("podresources")
            if self.scenario.engines:
                wanted.add("vllm")
        return wanted

    def close(self) -> None:
        self.pipeline.close()
        self.node.close()


@pytest.fixture
def simulate(tmp_path: Path) -> Iterator[Any]:
    runs: list[Run] = []

    def start(doc: dict[str, Any]) -> Run:
        run = Run(parse_scenario(doc, "test.yaml"), tmp_path / f"node{len(runs)}")
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.close()


@pytest.fixture(autouse=True, scope="module")
def no_pod_informer_outlives_its_module() -> Iterator[None]:
    """A Pipeline left open keeps its pod informer relisting (a closed fake API server)
    into later tests, whose memory checks then find its frames: name the module that left
    it, once its own fixtures are torn down."""
    import threading
    import time

    before = set(threading.enumerate())
    yield
    give_up = time.monotonic() + 5
    while True:
        left = [
            t.name
            for t in threading.enumerate()
            if t not in before and t.name.startswith("pod-informer") and t.is_alive()
        ]
        if not left or time.monotonic() > give_up:
            break
        time.sleep(0.05)
    assert not left, f"a test here left {left} running: close its Pipeline (pipeline.close())"
