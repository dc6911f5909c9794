"""Prometheus text format 0.0.4, as prometheus_client's generate_latest writes it.

The exporter renders a snapshot once, when it is published, and a scrape sends those bytes
(web/server.py). The library's renderer is used as it is, one family at a time, and
`FamilyRenderer` keeps each family's text while its samples stay equal: most families
(device and pod info, a cluster's pending pods) do not change from cycle to cycle, and
rendering 3,000 series with generate_latest costs ~20 ms a cycle, comparing them ~1 ms.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class _Families(Collector):
    """Hands generate_latest families already built, without a registry of their own."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


def render_text(metrics: Iterable[Metric]) -> bytes:
    """The text exposition of `metrics`, in order."""
    return generate_latest(_Families(metrics))


class FamilyRenderer:
    """render_text, reusing a family's text from the previous call while the family
    (name, type, help, unit, samples) is equal: generate_latest writes each family on its
    own, so the joined texts are what one call over all of them writes."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Metric, bytes]] = {}

    def render(self, metrics: Iterable[Metric]) -> bytes:
        kept: dict[str, tuple[Metric, bytes]] = {}
        parts = []
        for metric in metrics:
            previous = self._last.get(metric.name)
            if previous is not None and previous[0] == metric:
                text = previous[1]
            else:
                text = generate_latest(_Families((metric,)))
            kept[metric.name] = (metric, text)
            parts.append(text)
        self._last = kept  # only this snapshot's families: a gone family is let go
        return b"".join(parts)
