"""An engine's batch while one request waited, rebuilt from the spans of its other
requests. Pure.

The engine state history is sampled once a cycle (the agent's clock), so a wait shorter
than the interval has no sample inside it. Each held `llm_request` span says, in the
engine's own clock, when its request arrived, when it was scheduled (arrival + queue
time) and how long it then spent in the model; so at every moment of one request's wait
the requests of the same engine that were running (scheduled, still in the model) and
waiting (arrived, not scheduled) can be counted. The counts are lower bounds: requests
the agent no longer holds (its rings keep the 64 most recent and 16 slowest of each
sender) or that had not finished by the snapshot are missing, so a full batch is
evidence and a free slot is not proof of one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger.document.v1 import RequestDoc

# The share of a wait the batch must have been full for to be called full: the span's
# start is the API server's arrival and its queue time the engine core's, so each
# scheduling moment is known to a few milliseconds, and a slot handed from one request
# to the next can look free (or doubly taken) for that long.
FULL_SHARE = 0.9


@dataclass(frozen=True, kw_only=True)
class BatchShown:
    """The engine's other requests over one request's wait (the engine's clock)."""

    held: int  # the engine's other requests held, with a queue time
    running: int  # the count of running requests that held longest over the wait
    running_min: int
    running_max: int
    waiting_max: int  # others waiting beside it, at most
    max_num_seqs: int | None
    full_share: float  # of the wait, with at least max_num_seqs running (0 without one)
    full: bool  # full_share >= FULL_SHARE: every batch slot taken (nearly) all along


def _scheduled(r: RequestDoc) -> float | None:
    return r.arrived_at + r.queue_seconds if r.queue_seconds is not None else None


def _freed(r: RequestDoc, scheduled: float) -> float:
    """When its batch slot came free: scheduled + its time in the model. The span ends
    later (the API server still detokenises and answers): on the real capture, ending
    slots at the span's end counted up to 4 running at `--max-num-seqs 2`."""
    if r.inference_seconds is not None:
        return scheduled + r.inference_seconds
    return r.finished_at


def batch_during(
    request: RequestDoc, held: Iterable[RequestDoc], max_num_seqs: int | None
) -> BatchShown | None:
    """The batch over `request`'s wait from `held` (its sender's recent and slowest
    requests); None when it did not wait or no other request has a queue time."""
    start, end = request.arrived_at, _scheduled(request)
    if end is None or end <= start:
        return None
    others: dict[str, tuple[float, float, float]] = {}
    for r in held:
        scheduled = _scheduled(r)
        if r.span_id != request.span_id and scheduled is not None:
            others[r.span_id] = (r.arrived_at, scheduled, _freed(r, scheduled))
    if not others:
        return None
    # The counts change only where another request arrives, is scheduled or is done.
    moments = sorted({start} | {t for times in others.values() for t in times if start < t < end})
    spans = [(t, nxt - t) for t, nxt in zip(moments, [*moments[1:], end], strict=True)]
    running: dict[int, float] = {}
    waiting = 0
    for t, length in spans:
        count = sum(s <= t < f for _, s, f in others.values())
        running[count] = running.get(count, 0.0) + length
        waiting = max(waiting, sum(a <= t < s for a, s, _ in others.values()))
    at_limit = sum(v for k, v in running.items() if max_num_seqs is not None and k >= max_num_seqs)
    share = at_limit / (end - start) if max_num_seqs is not None else 0.0
    return BatchShown(
        held=len(others),
        running=max(running, key=lambda k: running[k]),
        running_min=min(running),
        running_max=max(running),
        waiting_max=waiting,
        max_num_seqs=max_num_seqs,
        full_share=round(share, 3),
        full=share >= FULL_SHARE,
    )
