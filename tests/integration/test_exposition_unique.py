"""No metric family repeats a label set in the exposition of a simulated node: the demo
scenario and the dense benchmark node, through the real pipeline (issue 14, item 4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from benchmarks.dense_node import dense_node

from gpuledger.cli.simulate import demo_scenario_path
from gpuledger.export.collector import snapshot_families
from gpuledger.export.exposition import render_text
from gpuledger.pipeline import Pipeline
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import Scenario, load_scenario, parse_scenario
from tests.unit.ledger_inputs import repeated, series


def exposition_of(scenario: Scenario, workdir: Path) -> str:
    with SimulatedNode(scenario, workdir) as node:
        node.apply(scenario.at_phase(None))
        pipeline = Pipeline(node.pipeline_config(5.0))
        try:
            pipeline.warm_up(5.0)
            published = pipeline.cycle()
        finally:
            pipeline.close()
    return render_text(snapshot_families(published, 0.0)).decode()


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "demo": lambda: load_scenario(demo_scenario_path()),
    "dense": lambda: parse_scenario(dense_node(), "dense.yaml"),
}


@pytest.mark.parametrize("name", ["demo", "dense"])
def test_no_family_repeats_a_label_set(name: str, tmp_path: Path) -> None:
    text = exposition_of(SCENARIOS[name](), tmp_path)
    assert len(series(text)) > 100  # a real node, not an empty ledger
    assert not repeated(text)
    assert "gpuledger_engine_up{" in text
