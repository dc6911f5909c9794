"""Received spans, held within a fixed budget: per sender a ring of its most recent
requests and a short list of its slowest, at most MAX_SENDERS senders, and one ring of
router spans. A flood replaces what is held; it never grows it (docs/performance.md,
"The span receiver's budget")."""

from __future__ import annotations

import bisect
import heapq
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuledger.model.base import frozen_map
from gpuledger.model.spans import (
    EngineRequestSpan,
    LatencyCounts,
    RouterSpan,
    SenderSpans,
    SpanPeer,
    SpanSender,
    SpansSnapshot,
)

MAX_SENDERS = 64
RECENT_PER_SENDER = 64
SLOWEST_PER_SENDER = 16
MAX_ROUTER_SPANS = 1024
# A sender not heard from for this long gives its place to a new one when all are taken.
SENDER_IDLE_SECONDS = 600.0
# What one held span costs, measured with tracemalloc (benchmarks/bench_spans.py): the
# estimate the budget below is reported in.
SPAN_BYTES = 1100
# Seconds; the buckets of the queue-time and time-to-first-token histograms.
LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def budget_bytes() -> int:
    """The most the held spans can cost, whatever arrives."""
    per_sender = RECENT_PER_SENDER + SLOWEST_PER_SENDER
    return (MAX_SENDERS * per_sender + MAX_ROUTER_SPANS) * SPAN_BYTES


def _duration(span: EngineRequestSpan) -> float:
    return span.e2e_seconds if span.e2e_seconds is not None else (span.end_ns - span.start_ns) / 1e9


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))
    total: float = 0.0
    exemplars: dict[int, tuple[str, float, float]] = field(default_factory=dict)

    def observe(self, value: float, trace_id: str, at: float) -> None:
        bucket = bisect.bisect_left(LATENCY_BOUNDS, value)
        self.counts[bucket] += 1
        self.total += value
        self.exemplars[bucket] = (trace_id, value, at)

    def frozen(self) -> LatencyCounts:
        cumulative, running = [], 0
        for count in self.counts:
            running += count
            cumulative.append(running)
        return LatencyCounts(
            LATENCY_BOUNDS, tuple(cumulative), self.total, frozen_map(dict(self.exemplars))
        )


@dataclass
class _Ring:
    recent: deque[EngineRequestSpan] = field(
        default_factory=lambda: deque(maxlen=RECENT_PER_SENDER)
    )
    # (duration, sequence, span): a min-heap, so the fastest of the slowest goes first.
    slowest: list[tuple[float, int, EngineRequestSpan]] = field(default_factory=list)
    received: int = 0
    last_seen: float = 0.0
    queue_time: _Histogram = field(default_factory=_Histogram)
    ttft: _Histogram = field(default_factory=_Histogram)
    connection: SpanPeer | None = None  # the last export's, when both its ports are known

    def add(self, span: EngineRequestSpan, sequence: int, now: float) -> None:
        self.recent.append(span)
        entry = (_duration(span), sequence, span)
        if len(self.slowest) < SLOWEST_PER_SENDER:
            heapq.heappush(self.slowest, entry)
        elif entry[0] > self.slowest[0][0]:
            heapq.heapreplace(self.slowest, entry)
        self.received += 1
        self.last_seen = now
        at = span.end_ns / 1e9
        if span.queue_seconds is not None:
            self.queue_time.observe(span.queue_seconds, span.trace_id, at)
        if span.ttft_seconds is not None:
            self.ttft.observe(span.ttft_seconds, span.trace_id, at)

    def held(self) -> int:
        return len(self.recent) + len(self.slowest)


class SpanStore:
    """Thread-safe: the receiver's threads add, the pipeline's source reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rings: dict[SpanSender, _Ring] = {}
        self._routers: deque[RouterSpan] = deque(maxlen=MAX_ROUTER_SPANS)
        self._refused: Counter[str] = Counter()
        self._sequence = 0

    def add(
        self,
        engine_spans: Sequence[tuple[SpanSender, EngineRequestSpan]],
        routers: Sequence[RouterSpan],
        peer: SpanPeer | None = None,
    ) -> int:
        """Stores the spans that came over `peer`; returns how many were refused (no room
        for a new sender)."""
        connection = peer if peer is not None and peer.port and peer.receiver_port else None
        now = time.monotonic()
        refused = 0
        with self._lock:
            self._routers.extend(routers)
            for sender, span in engine_spans:
                ring = self._ring(sender, now)
                if ring is None:
                    refused += 1
                    continue
                self._sequence += 1
                ring.add(span, self._sequence, now)
                ring.connection = connection
            if refused:
                self._refused["senders"] += refused
        return refused

    def _ring(self, sender: SpanSender, now: float) -> _Ring | None:
        ring = self._rings.get(sender)
        if ring is not None:
            return ring
        if len(self._rings) >= MAX_SENDERS:
            idlest = min(self._rings, key=lambda s: self._rings[s].last_seen)
            if now - self._rings[idlest].last_seen < SENDER_IDLE_SECONDS:
                return None  # a flood of new senders must not push out the engines
            del self._rings[idlest]
        ring = self._rings[sender] = _Ring()
        return ring

    def refuse(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self._refused[reason] += count

    def snapshot(self) -> SpansSnapshot:
        with self._lock:
            senders = tuple(
                SenderSpans(
                    sender=sender,
                    recent=tuple(ring.recent),
                    slowest=tuple(s for _, _, s in sorted(ring.slowest, reverse=True)),
                    received_total=ring.received,
                    queue_time=ring.queue_time.frozen(),
                    ttft=ring.ttft.frozen(),
                    connection=ring.connection,
                )
                for sender, ring in sorted(self._rings.items())
            )
            held = sum(r.held() for r in self._rings.values()) + len(self._routers)
            return SpansSnapshot(
                senders=senders,
                routers=tuple(self._routers),
                refused_total=frozen_map(dict(self._refused)),
                stored_bytes=held * SPAN_BYTES,
            )
