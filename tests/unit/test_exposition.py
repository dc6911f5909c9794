"""The text exposition: rendered by prometheus_client once per snapshot, served as bytes."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.export.exposition import FamilyRenderer, render_text
from gpuledger.export.published import Published
from gpuledger.web.server import Exporter

HOSTILE = [
    "",
    "plain",
    'say "hi"',
    "back\\slash",
    "new\nline",
    '\\"\n',
    "\\n",
    "trailing\\",
    "ünïcödé ✓ 日本語 🚀",
    "\t tab and \r cr",
    "{braces}=,",
    "%s %d %%",
    "\x00nul",
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Published:
    """One cycle of the demo scenario's real pipeline."""
    from gpuledger.cli.simulate import demo_scenario_path
    from gpuledger.pipeline import Pipeline
    from gpuledger.sim.harness import SimulatedNode
    from gpuledger.sim.scenario import load_scenario

    scenario = load_scenario(demo_scenario_path())
    with SimulatedNode(scenario, tmp_path_factory.mktemp("node")) as node:
        node.apply(scenario.at_phase(None))
        pipeline = Pipeline(node.pipeline_config(5.0))
        try:
            pipeline.warm_up(5.0)
            return pipeline.cycle()
        finally:
            pipeline.close()


def without_age(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "snapshot_age_seconds" not in line]


def test_cached_render_plus_age_is_the_full_exposition(demo: Published) -> None:
    exporter = Exporter(lambda: demo, 10.0)
    exporter.run_once()
    body, content_type = exporter.render(None)
    assert content_type.startswith("text/plain")
    assert without_age(body) == without_age(generate_latest(exporter.registry))
    families = list(text_string_to_metric_families(body.decode()))
    assert families[-1].name == "gpuledger_snapshot_age_seconds"
    assert {f.type for f in families} == {"gauge", "counter", "histogram"}
    assert sum(len(f.samples) for f in families) > 100  # a real ledger, not an empty one


def test_scrapes_never_rebuild_the_snapshot(
    demo: Published, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = Exporter(lambda: demo, 10.0)
    exporter.run_once()
    first, _ = exporter.render(None)

    def refuse(*args: object) -> None:
        raise AssertionError("a text scrape built the snapshot's families")

    monkeypatch.setattr("gpuledger.export.collector.snapshot_families", refuse)
    again, _ = exporter.render("text/plain")
    assert without_age(again) == without_age(first)
    with pytest.raises(AssertionError):  # OpenMetrics renders in full, as it always did
        exporter.render(OPENMETRICS)


def test_hostile_label_values_and_help_round_trip() -> None:
    gauge = GaugeMetricFamily(
        "g_hostile", 'Help with back\\slash,\nnewline, "quotes"', labels=["k"]
    )
    for i, text in enumerate(HOSTILE):
        gauge.add_metric([text], i)
    counter = CounterMetricFamily("c_requests", "The name gets _total.", labels=["pod", "i"])
    for i, text in enumerate(HOSTILE):
        counter.add_metric([text, str(i)], i * 1.5)
    parsed = {
        f.name: f for f in text_string_to_metric_families(render_text([gauge, counter]).decode())
    }
    assert parsed["g_hostile"].documentation == 'Help with back\\slash,\nnewline, "quotes"'
    assert [s.labels["k"] for s in parsed["g_hostile"].samples] == HOSTILE
    assert [s.labels["pod"] for s in parsed["c_requests"].samples] == HOSTILE
    assert [s.name for s in parsed["c_requests"].samples] == ["c_requests_total"] * len(HOSTILE)


def test_values_keep_their_meaning() -> None:
    numbers = [0, -1, 1.5, 1e-9, 80 * 1024**3, 2**53 + 1, math.inf, -math.inf]
    gauge = GaugeMetricFamily("g_numbers", "Every value shape.", labels=["i"])
    for i, number in enumerate(numbers):
        gauge.add_metric([str(i)], number)
    gauge.add_metric(["nan"], math.nan)
    (parsed,) = text_string_to_metric_families(render_text([gauge]).decode())
    assert [s.value for s in parsed.samples[:-1]] == [float(n) for n in numbers]
    assert math.isnan(parsed.samples[-1].value)


def test_families_render_in_the_order_given() -> None:
    names = ["z_last_alphabetically", "a_first", "m_middle"]
    text = render_text(GaugeMetricFamily(name, "doc", value=1) for name in names).decode()
    assert [f.name for f in text_string_to_metric_families(text)] == names


def _families(values: dict[str, float]) -> list[GaugeMetricFamily]:
    out = []
    for name, value in values.items():
        family = GaugeMetricFamily(name, f"help of {name}", labels=["node"])
        family.add_metric(["n1"], value)
        out.append(family)
    return out


def test_the_family_renderer_writes_what_generate_latest_writes_as_families_change() -> None:
    """A kept family's text is reused; a changed, new or reordered one is rendered anew,
    and a family gone from the snapshot is gone from the text."""
    renderer = FamilyRenderer()
    snapshots = [
        {"a": 1.0, "b": 2.0, "c": 3.0},
        {"a": 1.0, "b": 2.5, "c": 3.0},  # b changed
        {"c": 3.0, "a": 1.0, "d": 4.0},  # b gone, d new, order changed
        {"c": 3.0, "a": 1.0, "d": 4.0},  # nothing changed
    ]
    for values in snapshots:
        assert renderer.render(_families(values)) == render_text(_families(values))
