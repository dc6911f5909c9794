"""`explain --request ID`: one request found in the agents' spans (/ledger.json `spans`),
its timeline in its engine's clock, where it waited, the engine's state while it waited
(the agent's clock) and the reason that state gives, the router's part of its trace, then
the engine's chain down to the GPUs (chain.py). What was not recorded is said, never
guessed (docs/explain.md, "One request")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuledger.document.codec import decode, to_json
from gpuledger.document.v1 import (
    EngineDoc,
    EngineStateDoc,
    LedgerDocument,
    RequestDoc,
    RouterSpanDoc,
    SpanSenderDoc,
)
from gpuledger.explain.batch import BatchShown, batch_during
from gpuledger.explain.chain import (
    EXIT_NOT_FOUND,
    ExplainError,
    Fleet,
    explain,
    printable,
    render_text,
)
from gpuledger.explain.result import ExplainResult
from gpuledger.explain.verdict import Thresholds, engine_queue_reason, queueing

# A request whose queue time is below this did not wait (vLLM records ~0.1 ms).
WAITED_SECONDS = 0.01


@dataclass(frozen=True, kw_only=True)
class StateShown:
    """One sample of the engine's state, placed against the wait."""

    at: float
    when: str  # during the wait | before the wait | after the wait
    offset_seconds: float  # from the request's arrival
    running: float | None
    waiting: float | None
    kv_cache_usage_ratio: float | None
    max_num_seqs: int | None
    reason: str | None  # the engine_queueing reason this state gives, when it queued
    evidence: str


@dataclass(frozen=True, kw_only=True)
class RouterShown:
    node: str
    service_name: str
    name: str
    kind: str
    started_at: float
    finished_at: float
    before_engine_seconds: float  # router start -> engine arrival (in two clocks)


@dataclass(frozen=True, kw_only=True)
class RequestShown:
    node: str
    request: RequestDoc
    service_name: str
    joined_by: str
    untied_reason: str
    target: str
    model_name: str
    engine: str
    scheduled_at: float | None
    first_token_at: float | None
    waited_in: str  # engine_queue | model | not_recorded
    states: tuple[StateShown, ...]
    reason: str | None
    # Where the reason comes from: samples | spans | nearest samples ("" without one).
    reason_from: str
    routers: tuple[RouterShown, ...]
    workload: str  # NAMESPACE/NAME (NAME alone in no namespace) of the engine; "" untied
    batch: BatchShown | None = None  # the engine's other requests over the wait


@dataclass(frozen=True)
class _Found:
    node: str
    sender: SpanSenderDoc
    request: RequestDoc


def request_matches(request: RequestDoc, text: str) -> bool:
    """By vLLM's id (cmpl-req-101-0), the X-Request-Id inside it (req-101), or the trace id."""
    rid = request.request_id
    return (
        text in (rid, request.trace_id)
        or rid == f"cmpl-{text}-0"
        or (rid.startswith(f"cmpl-{text}-") and rid[len(text) + 6 :].isdigit())
        or text.lower() == request.trace_id
    )


def find_requests(docs: Sequence[LedgerDocument], text: str) -> list[_Found]:
    found: dict[tuple[str, str, str], _Found] = {}
    for doc in docs:
        for sender in doc.spans.senders:
            for request in (*sender.recent, *sender.slowest):
                if request_matches(request, text):
                    key = (doc.node, sender.instance_id, request.span_id)
                    found.setdefault(key, _Found(doc.node, sender, request))
    return list(found.values())


def receiving_nodes(docs: Sequence[LedgerDocument]) -> list[str]:
    return sorted(d.node for d in docs if d.spans.receiving)


def _engine_doc(docs: Sequence[LedgerDocument], found: _Found) -> EngineDoc | None:
    s = found.sender
    for doc in docs:
        if doc.node != found.node:
            continue
        for e in doc.engines:
            if (e.target, e.model_name, e.engine) == (s.target, s.model_name, s.engine):
                return e
    return None


def _placed(
    states: Sequence[EngineStateDoc], arrived: float, scheduled: float
) -> list[tuple[str, EngineStateDoc]]:
    """The samples taken during the wait; without one, the last before and the first
    after it (each says when it was taken: the wait is shorter than the interval)."""
    during = [s for s in states if arrived <= s.at <= scheduled]
    if during:
        return [("during the wait", s) for s in during]
    before = [s for s in states if s.at < arrived]
    after = [s for s in states if s.at > scheduled]
    return [
        *(("before the wait", s) for s in before[-1:]),
        *(("after the wait", s) for s in after[:1]),
    ]


def _state_shown(
    when: str, s: EngineStateDoc, arrived: float, engine: EngineDoc | None, t: Thresholds
) -> StateShown:
    reason, evidence = None, ""
    if engine is not None:
        as_then = replace(
            engine,
            up=s.up,
            requests_running=s.running,
            requests_waiting=s.waiting,
            waiting_by_reason=s.waiting_by_reason,
            kv_cache_usage_ratio=s.kv_cache_usage_ratio,
        )
        if queueing(as_then, t):
            reason, evidence = engine_queue_reason(as_then, t)
    return StateShown(
        at=s.at,
        when=when,
        offset_seconds=s.at - arrived,
        running=s.running,
        waiting=s.waiting,
        kv_cache_usage_ratio=s.kv_cache_usage_ratio,
        max_num_seqs=s.max_num_seqs,
        reason=reason,
        evidence=evidence,
    )


def _routers(docs: Sequence[LedgerDocument], request: RequestDoc) -> tuple[RouterShown, ...]:
    spans: list[tuple[str, RouterSpanDoc]] = [
        (doc.node, r) for doc in docs for r in doc.spans.routers if r.trace_id == request.trace_id
    ]
    unique = {(n, r.span_id): (n, r) for n, r in spans}
    return tuple(
        RouterShown(
            node=n,
            service_name=r.service_name,
            name=r.name,
            kind=r.kind,
            started_at=r.started_at,
            finished_at=r.finished_at,
            before_engine_seconds=request.arrived_at - r.started_at,
        )
        for n, r in sorted(unique.values(), key=lambda item: item[1].started_at)
    )


def _waited_in(r: RequestDoc) -> str:
    if r.queue_seconds is None:
        return "not_recorded"
    return "engine_queue" if r.queue_seconds >= WAITED_SECONDS else "model"


def explain_request(
    docs: Sequence[LedgerDocument], found: _Found, t: Thresholds | None = None
) -> RequestShown:
    t = t or Thresholds()
    r, s = found.request, found.sender
    scheduled = r.arrived_at + r.queue_seconds if r.queue_seconds is not None else None
    engine = _engine_doc(docs, found)
    states: tuple[StateShown, ...] = ()
    if scheduled is not None and r.queue_seconds is not None and r.queue_seconds >= WAITED_SECONDS:
        states = tuple(
            _state_shown(when, state, r.arrived_at, engine, t)
            for when, state in _placed(s.states, r.arrived_at, scheduled)
        )
    batch = None
    if r.queue_seconds is not None and r.queue_seconds >= WAITED_SECONDS:
        batch = batch_during(r, (*s.recent, *s.slowest), _limit(engine, s.states))
    reason, reason_from = _reason(states, batch)
    workload = ""
    if engine is not None:
        workload = f"{engine.namespace}/{engine.workload}" if engine.namespace else engine.workload
    return RequestShown(
        node=found.node,
        request=r,
        service_name=s.service_name,
        joined_by=s.joined_by,
        untied_reason=s.untied_reason,
        target=s.target,
        model_name=s.model_name,
        engine=s.engine,
        scheduled_at=scheduled,
        first_token_at=r.arrived_at + r.ttft_seconds if r.ttft_seconds is not None else None,
        waited_in=_waited_in(r),
        states=states,
        reason=reason,
        reason_from=reason_from,
        routers=_routers(docs, r),
        workload=workload,
        batch=batch,
    )


def _limit(engine: EngineDoc | None, states: Sequence[EngineStateDoc]) -> int | None:
    """The engine's max_num_seqs: its configuration, else its latest sample's."""
    text = engine.config.get("max_num_seqs", "") if engine is not None else ""
    if text.isdigit():
        return int(text)
    return next((x.max_num_seqs for x in reversed(states) if x.max_num_seqs is not None), None)


def _reason(states: Sequence[StateShown], batch: BatchShown | None) -> tuple[str | None, str]:
    """Why it waited, and from what: the samples inside the wait (the verdict's own rule);
    without one, the batch rebuilt from the engine's spans when it was full all along,
    else the nearest samples."""
    inside = [x.reason for x in states if x.reason and x.when == "during the wait"]
    if inside:
        return max(set(inside), key=inside.count), "samples"
    sampled = any(x.when == "during the wait" for x in states)
    if batch is not None and batch.full and not sampled:
        return "max_num_seqs", "spans"
    nearest = [x.reason for x in states if x.reason]
    if nearest:
        return max(set(nearest), key=nearest.count), "nearest samples"
    return None, ""


def _seconds(value: float | None) -> str:
    if value is None:
        return "not recorded"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _clock(at: float | None, arrived: float) -> str:
    return "not recorded" if at is None else f"+{_seconds(at - arrived)}"


def request_lines(shown: RequestShown) -> list[str]:
    r = shown.request
    arrived = r.arrived_at
    lines = [
        f"request {r.request_id}  trace {r.trace_id}  on {shown.node}",
        f"  engine {shown.model_name or '(not tied)'}  target {shown.target or '-'}  "
        f"DP rank {shown.engine or '-'}  tied by {_rule(shown)}",
        "  timeline (the engine's clock, from its arrival):",
        "    arrived      +0 ms",
        f"    scheduled    {_clock(shown.scheduled_at, arrived)}  (queued "
        f"{_seconds(r.queue_seconds)})",
        f"    first token  {_clock(shown.first_token_at, arrived)}",
        f"    finished     +{_seconds(r.finished_at - arrived)}  (in the model "
        f"{_seconds(r.inference_seconds)}: prefill {_seconds(r.prefill_seconds)}, "
        f"decode {_seconds(r.decode_seconds)}; {_count(r.prompt_tokens)} prompt, "
        f"{_count(r.completion_tokens)} generated tokens)",
        f"  waited: {_WAITED[shown.waited_in]}",
    ]
    lines += _state_lines(shown)
    lines += [
        f"  router {x.service_name} {x.name or '(span name not kept)'} on {x.node}: "
        f"started {_seconds(x.before_engine_seconds)} before the engine saw it, "
        f"took {_seconds(x.finished_at - x.started_at)} in all"
        for x in shown.routers
    ] or ["  router: no router span in this trace was received"]
    ahead = max((x.before_engine_seconds for x in shown.routers), default=0.0)
    if ahead >= WAITED_SECONDS:
        lines.append(
            f"  before the engine accepted it: {_seconds(ahead)} from the router's start "
            "(two clocks: the router's and the engine's)"
        )
    return lines


_WAITED = {
    "engine_queue": "in the engine's queue, before it was scheduled",
    "model": "not in the engine's queue: its time went to the model (prefill, decode)",
    "not_recorded": "not recorded (this engine version sends no queue time)",
}
_RULES = {
    "peer_socket": "the API server holding the connection the spans came over",
    "k8s_pod_uid": "k8s.pod.uid + the API server's NSpid",
    "peer_pod": "the sender's pod IP + the API server's NSpid",
    "host_pid": "a host process on loopback + its PID",
}


def _rule(shown: RequestShown) -> str:
    if shown.joined_by == "none":
        return f"no rule: {shown.untied_reason}"
    return _RULES.get(shown.joined_by, shown.joined_by)


def _state_lines(shown: RequestShown) -> list[str]:
    if shown.waited_in != "engine_queue":
        return []
    if not shown.states:
        lines = ["  engine state while it waited: not recorded (no sample that close)"]
    else:
        lines = ["  engine state while it waited (the agent's clock):"]
    for x in shown.states:
        kv = "?" if x.kv_cache_usage_ratio is None else f"{x.kv_cache_usage_ratio:.0%}"
        lines.append(
            f"    {x.when} ({_signed(x.offset_seconds)} from arrival): "
            f"{_count(x.running)} running of max_num_seqs {_count(x.max_num_seqs)}, "
            f"{_count(x.waiting)} waiting, KV cache {kv}"
            + (f" -> {x.reason}" if x.reason else " -> not queueing")
        )
    # The spans' batch adds to samples inside the wait only when it shows the batch full:
    # a partial one (few spans held) would read as contradicting them.
    sampled = any(x.when == "during the wait" for x in shown.states)
    if shown.batch is not None and (shown.batch.full or not sampled):
        lines += _batch_lines(shown.batch)
    if shown.reason:
        lines.append(
            f"  why it waited: {shown.reason} ({_REASON_TEXT[shown.reason]})"
            + _REASON_FROM[shown.reason_from]
        )
    return lines


_REASON_FROM = {
    "samples": "",
    "spans": "; from its spans: no sample fell inside the wait, and KV usage was not sampled",
    "nearest samples": "; from the samples nearest the wait, none inside it",
}


def _batch_lines(batch: BatchShown | None) -> list[str]:
    if batch is None:
        return []
    if batch.max_num_seqs is None:
        limit = "max_num_seqs unknown"
    else:
        limit = f"at least max_num_seqs {batch.max_num_seqs} for {batch.full_share:.0%} of it"
    verdict = (
        "every batch slot taken"
        if batch.full
        else "not shown full (requests the agent no longer holds are not counted)"
    )
    return [
        f"  the batch from the engine's spans ({batch.held} of its other requests held, "
        "its clock):",
        f"    {batch.running} running most of the wait ({batch.running_min}-"
        f"{batch.running_max}; {limit}), up to {batch.waiting_max} others waiting"
        f" -> {verdict}",
    ]


_REASON_TEXT = {
    "max_num_seqs": "every batch slot was taken while KV memory was free",
    "kv_cache": "the KV cache was full",
    "deferred": "the engine deferred the waiting requests",
    "other": "the engine queued for no reason its metrics name",
}


def _count(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + _seconds(abs(seconds))


def not_found_text(text: str, receiving: Iterable[str]) -> str:
    nodes = list(receiving)
    if not nodes:
        return (
            f"request {text!r} not recorded: no agent read has its span receiver on "
            "(--otlp-receiver on, and the engines' --otlp-traces-endpoint)"
        )
    return (
        f"request {text!r} not recorded on {', '.join(nodes)}: it aged out of the "
        "agents' rings, has not finished, or its engine does not send spans here"
    )


def explain_by_request(
    docs: Sequence[LedgerDocument], text: str, t: Thresholds | None = None
) -> dict[str, Any]:
    """explain --json for `--request`: `requests` (RequestShown each), and the chain of
    their engines' workloads as any explain result has it. ExplainError when no agent read
    holds the request."""
    found = find_requests(docs, text)
    if not found:
        raise ExplainError(EXIT_NOT_FOUND, not_found_text(text, receiving_nodes(docs)))
    shown = [explain_request(docs, f, t) for f in found]
    workloads = sorted({s.workload for s in shown if s.workload})
    # The chain of the engine's workload; none for a request no rule tied (or, never
    # seen so far, one id in two workloads' engines: both requests are shown).
    if len(workloads) == 1:
        result = explain(docs, t, workload=workloads[0])
    else:
        result = _without_chain(docs)
    result["query"] = {"request": text}
    result["requests"] = [to_json(s) for s in shown]
    return result


def _without_chain(docs: Sequence[LedgerDocument]) -> dict[str, Any]:
    fleet = Fleet(docs)
    result: dict[str, Any] = to_json(
        ExplainResult(
            query={},
            workloads=(),
            unknowns=tuple(fleet.unknowns),
            not_configured={n: tuple(s) for n, s in fleet.not_configured.items() if s},
            simulated=tuple(fleet.simulated),
        )
    )
    return result


def render_request_text(result: Mapping[str, Any]) -> str:
    chain = render_text(result).splitlines()
    banner = chain[:1] if chain and chain[0].startswith("SIMULATED") else []
    shown = [decode(RequestShown, r) for r in result.get("requests", ())]
    lines = [line for one in shown for line in request_lines(one)]
    return "\n".join([*banner, *(printable(x) for x in lines), *chain[len(banner) :]]) + "\n"
