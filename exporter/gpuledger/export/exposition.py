"""Prometheus text format 0.0.4, as prometheus_client's generate_latest writes it.

The exporter renders a snapshot once, when it is published, and a scrape sends those bytes
(web/server.py): rendering 3,117 series costs a few milliseconds once per cycle, so the
library's renderer is used as it is.
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
