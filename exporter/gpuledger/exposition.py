"""Prometheus text format 0.0.4, byte for byte what prometheus_client's generate_latest writes.

collector.py builds `Family` objects (rows of label values, no per-sample dicts); they
render here directly, and become prometheus_client Metrics only for its other encoders.

generate_latest validates and escapes every label name and value of every sample through
several Python calls and `str.format`. For gauge and counter families with legacy names
(all that collector.py builds) a metric name needs checking once per family, a set of label
names once per process, and a label value needs escaping only when it holds a backslash,
newline or double quote. Anything else is rendered by generate_latest itself, one family
at a time, so the output never differs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# Legacy names, which generate_latest writes as they are. Anything else (even a name its
# looser check would pass, such as one ending in a newline) takes the fallback path.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# Untyped upstream; the exact value text generate_latest writes (+Inf, 1e+06, ...).
_float_text: Callable[[float], str] = floatToGoString

# Families whose text-format name and TYPE differ from Metric.name/.type only by this.
_FAST_TYPES = {"gauge": "", "counter": "_total"}


# (label part of a sample line as a %-template, getter of the label values in name order).
class _Fallback(Exception):
    """The family needs generate_latest's general path."""


class _One(Collector):
    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self._metric]


class Family:
    """A gauge or counter family: label names once, then one tuple of values per series.

    What collector.py builds each cycle. A prometheus_client Metric makes a Sample and a
    label dict per series; this makes one tuple, and renders without them.
    """

    __slots__ = ("documentation", "labels", "name", "rows", "type")

    def __init__(self, name: str, documentation: str, labels: Sequence[str], typ: str) -> None:
        if typ not in _FAST_TYPES:
            raise ValueError(f"a Family is a gauge or a counter, not {typ!r}")
        # A counter's name is its family name: the renderer adds `_total`.
        self.name = name.removesuffix("_total") if typ == "counter" else name
        self.documentation = documentation
        self.labels = tuple(labels)
        self.type = typ
        self.rows: list[tuple[tuple[str, ...], float]] = []

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.rows.append((tuple(labels), value))

    def to_metric(self) -> Metric:
        """The same family as prometheus_client builds it (for OpenMetrics, and tests)."""
        cls = CounterMetricFamily if self.type == "counter" else GaugeMetricFamily
        metric = cls(self.name, self.documentation, labels=list(self.labels))
        for values, value in self.rows:
            metric.add_metric(list(values), value)
        return metric


def _value_text(value: float, int_text: dict[int, str]) -> str:
    # Integer values repeat (0, 1, GPU counts, memory sizes); floats (-0.0, NaN) are not
    # safe dict keys for their text.
    if type(value) is int:
        text = int_text.get(value)
        if text is None:
            text = int_text[value] = _float_text(value)
        return text
    return _float_text(value)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _template(keys: tuple[str, ...]) -> str:
    """The label part of a sample line, names sorted as generate_latest sorts them."""
    for key in keys:
        if _LABEL_NAME.fullmatch(key) is None:
            raise _Fallback  # generate_latest would escape the name
    # Names are legacy (no '%'), so only the values are substituted.
    return "{" + ",".join(f'{k}="%s"' for k in sorted(keys)) + "} "


def _as_family(metric: Metric) -> Family:
    """A prometheus_client gauge or counter as a Family, when that renders the same."""
    if metric.type not in _FAST_TYPES:
        raise _Fallback
    name = metric.name + _FAST_TYPES[metric.type]
    samples = metric.samples
    keys = tuple(samples[0].labels) if samples else ()
    family = Family(metric.name, metric.documentation, keys, metric.type)
    for sample in samples:
        # Another name (_created, _gsum, ...) goes to a separate family in generate_latest;
        # timestamps, exemplars, native histograms and mixed label sets are left to it too.
        if (
            sample.name != name
            or sample.timestamp is not None
            or sample.exemplar is not None
            or sample.native_histogram is not None
            or len(sample.labels) != len(keys)
        ):
            raise _Fallback
        family.add_metric([sample.labels[k] for k in keys], sample.value)  # KeyError: mixed
    return family


_RowPlan = tuple[str, Callable[[tuple[str, ...]], tuple[str, ...]]]
# Label sets repeat across families and cycles; validating and sorting them is a fifth of
# the work. Bounded, since names come from callers; a lost race only recomputes an entry.
_ROW_PLANS: dict[tuple[str, ...], _RowPlan] = {}
_MAX_PLANS = 4096


def _row_plan(labels: tuple[str, ...]) -> _RowPlan:
    """How to write rows whose values follow `labels`: sorted by label name, as
    generate_latest sorts a sample's label dict."""
    plan = _ROW_PLANS.get(labels)
    if plan is None:
        if len(set(labels)) != len(labels):
            raise _Fallback  # a label dict would keep only the last of duplicates
        template = _template(labels)
        order = sorted(range(len(labels)), key=labels.__getitem__)
        getter: Callable[[tuple[str, ...]], tuple[str, ...]]
        if len(order) == 1:
            (only,) = order
            getter = lambda values: (values[only],)  # noqa: E731
        else:
            getter = itemgetter(*order)
        plan = (template, getter)
        if len(_ROW_PLANS) >= _MAX_PLANS:
            _ROW_PLANS.clear()
        _ROW_PLANS[labels] = plan
    return plan


def _rows(family: Family, out: list[str], int_text: dict[int, str]) -> None:
    """Append the text of one Family; raises when it must fall back."""
    name = family.name + _FAST_TYPES[family.type]
    if _METRIC_NAME.fullmatch(name) is None:
        raise _Fallback
    doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n"]
    if family.labels:
        template, getter = _row_plan(family.labels)
        head = name + template
    else:
        head, getter = name + " ", None
    for values, value in family.rows:
        if len(values) != len(family.labels):
            raise _Fallback  # prometheus_client zips them: let it decide
        if getter is None:
            prefix = head
        else:
            ordered = getter(values)
            joined = "".join(ordered)  # TypeError for a non-str value: fall back
            if "\\" in joined or "\n" in joined or '"' in joined:
                ordered = tuple(_escape(v) for v in ordered)
            prefix = head % ordered
        lines.append(prefix + _value_text(value, int_text) + "\n")
    out.extend(lines)


def render_text(metrics: Iterable[Metric | Family]) -> bytes:
    """The text exposition of `metrics`, equal to generate_latest of a registry yielding
    them (Families as their `to_metric()`)."""
    out: list[str] = []
    int_text: dict[int, str] = {}
    for metric in metrics:
        try:
            _rows(metric if isinstance(metric, Family) else _as_family(metric), out, int_text)
        except Exception:
            # Includes malformed families: generate_latest renders them or raises its own error.
            as_metric = metric.to_metric() if isinstance(metric, Family) else metric
            out.append(generate_latest(_One(as_metric)).decode("utf-8"))
    return "".join(out).encode("utf-8")
