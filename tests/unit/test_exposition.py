"""render_text writes exactly what prometheus_client's generate_latest writes."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar, NativeHistogram, Timestamp

from gpuledger.collector import LedgerCollector
from gpuledger.exposition import Family, render_text

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
NUMBERS = [
    0,
    1,
    -1,
    0.0,
    -0.0,
    1.5,
    -2.25,
    1e-9,
    5e-324,
    123456,
    1234567,
    1e6,
    999999.9,
    1e21,
    1.7976931348623157e308,
    -1e21,
    2**53 + 1,
    80 * 1024**3,
    10**25,
    math.inf,
    -math.inf,
    math.nan,
    True,
    False,
]


class _Families(Collector):
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


def assert_same(metrics: list[Metric]) -> None:
    """Equal bytes, or the same exception type where generate_latest refuses the input."""
    try:
        expected = generate_latest(_Families(metrics))
    except Exception as exc:
        with pytest.raises(type(exc)):
            render_text(metrics)
        return
    assert render_text(metrics) == expected


def hand_built() -> list[Metric]:
    labelled = GaugeMetricFamily("g_labelled", "Gauge with labels.", labels=["pod", "a", "zeta"])
    for i, text in enumerate(HOSTILE):
        labelled.add_metric([text, HOSTILE[-1 - i], str(i)], NUMBERS[i % len(NUMBERS)])
    numbers = GaugeMetricFamily("g_numbers", "Every value shape.", labels=["i"])
    for i, number in enumerate(NUMBERS):
        numbers.add_metric([str(i)], number)
    counter = CounterMetricFamily("c_requests", "Counter; the name gets _total.", labels=["b", "a"])
    for i, number in enumerate(NUMBERS):
        counter.add_metric([HOSTILE[i % len(HOSTILE)], str(i)], number)
    return [
        labelled,
        numbers,
        counter,
        CounterMetricFamily("c_named_total", "Suffix given already.", value=7),
        GaugeMetricFamily("g_bare", "No labels.", value=3.25),
        GaugeMetricFamily("g_empty", "No samples at all.", labels=["x"]),
        GaugeMetricFamily("g_help", 'Help with back\\slash,\nnewline and "quotes"', value=1),
        GaugeMetricFamily("g_unit", "A unit joins the name.", value=2, unit="bytes"),
        GaugeMetricFamily("ns:g_colon", "Colons are legacy too.", value=-4),
    ]


def test_hand_built_families() -> None:
    assert_same(hand_built())


@pytest.mark.parametrize("metric", hand_built(), ids=lambda m: m.name)
def test_each_family_alone(metric: Metric) -> None:
    assert_same([metric])


def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(registry: Any) -> bytes:
        raise AssertionError(f"fell back for {list(registry.collect())}")

    monkeypatch.setattr("gpuledger.exposition.generate_latest", refuse)


def test_gauges_and_counters_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = generate_latest(_Families(hand_built()))
    no_fallback(monkeypatch)
    assert render_text(hand_built()) == expected


def test_timestamps() -> None:
    gauge = GaugeMetricFamily("g_ts", "Timestamps in seconds become milliseconds.", labels=["k"])
    for i, ts in enumerate([0, 1.0005, 1_700_000_000.123456, -5.5, Timestamp(12, 345_678_901)]):
        gauge.add_metric([str(i)], i, timestamp=ts)
    counter = CounterMetricFamily("c_ts", "Counter with timestamp.", labels=["k"])
    counter.add_metric(["v"], 3, timestamp=1_700_000_000)
    assert_same([gauge, counter])


def test_label_names_in_any_order_and_subsets() -> None:
    gauge = GaugeMetricFamily("g_order", "Labels sort by name.", labels=["zz", "mm", "aa"])
    gauge.add_metric(["1", "2", "3"], 1)
    gauge.add_metric(["1", "2"], 2)  # zip drops the missing name: another key set
    gauge.add_sample("g_order", {"aa": "x", "zz": "y"}, 3)
    gauge.add_sample("g_order", {"single": 'o"ne'}, 4)
    gauge.add_sample("g_order", {}, 5)
    assert_same([gauge])


def fallback_families() -> list[Metric]:
    info = InfoMetricFamily("i_build", "Info family.", labels=["node"])
    info.add_metric(["n1"], {"version": 'v"1', "commit": "abc\\"})
    stateset = StateSetMetricFamily("s_state", "State set.", labels=["node"])
    stateset.add_metric(["n1"], {"a": True, "b": False})
    created = CounterMetricFamily("c_created", "Counter with created.", labels=["k"])
    created.add_metric(["x"], 5, created=1_700_000_000.5)
    created.add_metric(["y\n"], 6, created=1_700_000_001)
    histogram = HistogramMetricFamily(
        "h_latency", "Histogram.", buckets=[("0.5", 1), ("+Inf", 3)], sum_value=2.5
    )
    summary = SummaryMetricFamily("s_size", "Summary.", count_value=3, sum_value=9.0)
    unknown = UnknownMetricFamily("u_thing", "Untyped.", value=1)
    exemplar = CounterMetricFamily("c_exemplar", "Counter with an exemplar.", labels=["k"])
    exemplar.add_metric(["v"], 1, exemplar=Exemplar({"trace_id": "abc"}, 1.0))
    bad_label = GaugeMetricFamily("g_bad_label", "Label names generate_latest escapes.", labels=[])
    bad_label.add_sample("g_bad_label", {"bad-name": "1", "ok": "2"}, 1)
    bad_label.add_sample("g_bad_label", {"__reserved": "1"}, 2)
    bad_label.add_sample("g_bad_label", {"ünï": "1"}, 3)
    other_sample = GaugeMetricFamily("g_gsum", "A gauge carrying an OpenMetrics sample.", value=1)
    other_sample.add_sample("g_gsum_gsum", {}, 4)
    other_sample.add_sample("g_gsum_other", {"k": "v"}, 5)
    native = Metric("n_hist", "Native histogram sample.", "histogram")
    native.add_sample("n_hist", {}, 0, native_histogram=NativeHistogram(3, 6.0, 0, 0.0, 1))
    return [
        info,
        stateset,
        created,
        histogram,
        summary,
        unknown,
        exemplar,
        bad_label,
        other_sample,
        native,
    ]


@pytest.mark.parametrize("metric", fallback_families(), ids=lambda m: m.name)
def test_fallback_family(metric: Metric) -> None:
    assert_same([metric])


def test_fallback_families_keep_their_place_among_fast_ones() -> None:
    mixed: list[Metric] = []
    for fast, slow in zip(hand_built(), fallback_families(), strict=False):
        mixed += [slow, fast]
    assert_same(mixed)


def test_refused_inputs_raise_like_generate_latest() -> None:
    not_a_string = GaugeMetricFamily("g_int_label", "Label value is no string.", labels=["k"])
    not_a_string.add_metric([5], 1)  # type: ignore[list-item]
    too_big = GaugeMetricFamily("g_too_big", "Overflows float.", value=10**400)
    no_value = GaugeMetricFamily("g_none", "No value.", labels=[])
    no_value.add_sample("g_none", {}, None)  # type: ignore[arg-type]
    surrogate = GaugeMetricFamily("g_surrogate", "Not encodable.", labels=["k"])
    surrogate.add_metric(["\ud800"], 1)
    bad_ts = GaugeMetricFamily("g_bad_ts", "Timestamp inf.", labels=[])
    bad_ts.add_metric([], 1, timestamp=math.inf)
    for metric, error in (
        (not_a_string, AttributeError),
        (too_big, OverflowError),
        (no_value, TypeError),
        (surrogate, UnicodeEncodeError),
        (bad_ts, OverflowError),
    ):
        with pytest.raises(error):
            generate_latest(_Families([metric]))
        with pytest.raises(error):
            render_text([metric])


# -- property: random gauge and counter families ------------------------------------------

legacy_metric_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True).filter(
    lambda name: name != "_total"  # a counter would strip it to an empty name
)
label_names = st.one_of(
    st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True),
    st.text(max_size=5),  # reserved (__x), invalid or empty names: the fallback path
)
values = st.one_of(
    st.floats(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from(NUMBERS),
    st.booleans(),
)
timestamps = st.one_of(
    st.none(),
    st.floats(min_value=-1e12, max_value=1e12),
    st.integers(min_value=0, max_value=2**40),
)
label_values = st.one_of(st.text(), st.sampled_from(HOSTILE))


@st.composite
def families(draw: st.DrawFn) -> Metric:
    kind = draw(st.sampled_from(["gauge", "counter"]))
    name = draw(legacy_metric_names)
    doc = draw(st.text())
    names = draw(st.lists(label_names, max_size=6, unique=True))
    metric: Metric
    if kind == "gauge":
        metric = GaugeMetricFamily(name, doc, labels=names)
    else:
        metric = CounterMetricFamily(name, doc, labels=names)
    for _ in range(draw(st.integers(0, 5))):
        row = [draw(label_values) for _ in names]
        value, timestamp = draw(values), draw(timestamps)
        if isinstance(metric, CounterMetricFamily):
            created = draw(st.one_of(st.none(), st.floats(0, 2e9)))
            metric.add_metric(row, value, created=created, timestamp=timestamp)
        else:
            metric.add_metric(row, value, timestamp=timestamp)
    return metric


@settings(max_examples=300, deadline=None)
@given(st.lists(families(), max_size=5))
def test_random_families_match_generate_latest(metrics: list[Metric]) -> None:
    assert_same(metrics)


# -- end to end: the demo scenario's real ledger ------------------------------------------


def test_demo_ledger_renders_identically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuledger.cli import demo_scenario_path
    from gpuledger.pipeline import Pipeline
    from gpuledger.sim.harness import SimulatedNode
    from gpuledger.sim.scenario import load_scenario

    scenario = load_scenario(demo_scenario_path())
    with SimulatedNode(scenario, tmp_path / "node") as node:
        node.apply(scenario.at_phase(None))
        pipeline = Pipeline(node.pipeline_config(5.0))
        try:
            pipeline.warm_up(5.0)
            published = pipeline.cycle()
        finally:
            pipeline.close()
    now = time.time()
    current: Any = lambda: (published, now)  # noqa: E731
    collector = LedgerCollector(current, "all")
    expected = generate_latest(_Families(collector.collect()))
    no_fallback(monkeypatch)  # every family collector.py builds takes the fast path
    assert render_text(collector.collect()) == expected
    assert render_text(collector.families()) == expected  # what the exporter renders
    assert expected.count(b"\n") > 100  # a real ledger, not an empty one


# -- Family: collector.py's own rows, rendered without prometheus_client's Samples ----------


def assert_family_same(families: list[Family]) -> None:
    """A Family renders as generate_latest renders its to_metric(), or fails the same way."""
    try:
        expected = generate_latest(_Families([f.to_metric() for f in families]))
    except Exception as exc:
        with pytest.raises(type(exc)):
            render_text(families)
        return
    assert render_text(families) == expected


def test_hand_built_families_as_rows() -> None:
    labelled = Family("g_labelled", "Gauge with labels.", ["pod", "a", "zeta"], "gauge")
    for i, text in enumerate(HOSTILE):
        labelled.add_metric([text, HOSTILE[-1 - i], str(i)], NUMBERS[i % len(NUMBERS)])
    counter = Family("c_requests", "Counter; the name gets _total.", ["b", "a"], "counter")
    for i, number in enumerate(NUMBERS):
        counter.add_metric([HOSTILE[i % len(HOSTILE)], str(i)], number)
    bare = Family("g_bare", 'No labels; help with \\ and "quotes"\n.', [], "gauge")
    bare.add_metric([], 3.25)
    suffixed = Family("c_named_total", "Suffix given already.", ["x"], "counter")
    suffixed.add_metric(["y"], 7)
    empty = Family("g_empty", "No rows.", ["x"], "gauge")
    assert_family_same([labelled, counter, bare, suffixed, empty])
    assert b'c_requests_total{a="0",b=""} 0' in render_text([counter])


def test_families_prometheus_client_would_reshape_fall_back() -> None:
    duplicate = Family(
        "g_dup", "Duplicate label names: a dict keeps the last.", ["a", "a"], "gauge"
    )
    duplicate.add_metric(["first", "second"], 1)
    short = Family("g_short", "A row shorter than the label names.", ["a", "b"], "gauge")
    short.add_metric(["only"], 1)
    odd = Family("g_odd", "An invalid label name.", ["ok", "not ok"], "gauge")
    odd.add_metric(["1", "2"], 1)
    assert_family_same([duplicate, short, odd])
    with pytest.raises(ValueError, match="gauge or a counter"):
        Family("h", "doc", [], "histogram")


@st.composite
def row_families(draw: st.DrawFn) -> Family:
    family = Family(
        draw(legacy_metric_names),
        draw(st.text()),
        draw(st.lists(label_names, max_size=6)),
        draw(st.sampled_from(["gauge", "counter"])),
    )
    for _ in range(draw(st.integers(0, 5))):
        family.add_metric([draw(label_values) for _ in family.labels], draw(values))
    return family


@settings(max_examples=300, deadline=None)
@given(st.lists(row_families(), max_size=5))
def test_random_row_families_match_generate_latest(families: list[Family]) -> None:
    assert_family_same(families)
