"""Where a workload's requests wait: one verdict from the ledger documents. Pure.

The stages, their precedence, each stage's reasons (strongest first) and the thresholds are
defined once, in stages.json next to this module; the mixin's recording rules
(mixin/rules/rules.libsonnet) are rendered from the same file (its copy mixin/lib/stages.json).
A workload is in the first stage whose condition holds, and gets the strongest reason that
holds: each condition below is the one the recording rule
`namespace_workload:gpuledger_stage_reason_code:max` computes, so explain, the /ledger page
and Prometheus agree (tests/mixin/test_stage_differential.py runs both on
the same snapshots).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from gpuledger.document.v1 import (
    EngineDoc,
    PendingDoc,
    PlacementGroupsDoc,
    PodDoc,
    PoolDoc,
    ServeDeploymentDoc,
)
from gpuledger.engines import BY_NAME


@dataclass(frozen=True)
class NextStep:
    """What to do next about a verdict: one line, and the alert whose runbook applies."""

    text: str
    runbook_alert: str | None  # None where no alert pages (serving, idle, ...)

    @property
    def runbook_url(self) -> str | None:
        # The alerts' runbook_url: the same pattern, the alert name in lower case.
        if self.runbook_alert is None:
            return None
        return RUNBOOK_URL_PATTERN % self.runbook_alert.lower()


@dataclass(frozen=True)
class StageDef:
    stage: str
    code: int
    layer: str | None
    text: str
    reasons: tuple[str, ...]
    next_step: NextStep  # the stage's own, the fallback of a reason without one
    by_reason: Mapping[str, NextStep]


def _next_step(raw: Mapping[str, Any]) -> NextStep:
    return NextStep(str(raw["next_step"]), raw.get("runbook_alert"))


def _load_model() -> tuple[dict[str, float], str, tuple[StageDef, ...]]:
    raw = json.loads(resources.files("gpuledger").joinpath("stages.json").read_text())
    stages = tuple(
        StageDef(
            s["stage"],
            int(s["code"]),
            s["layer"],
            s["text"],
            tuple(s["reasons"]),
            _next_step(s),
            {r: _next_step(v) for r, v in s.get("by_reason", {}).items()},
        )
        for s in raw["stages"]
    )
    thresholds = {k: float(v) for k, v in raw["thresholds"].items()}
    return thresholds, str(raw["runbookURLPattern"]), stages


DEFAULTS, RUNBOOK_URL_PATTERN, STAGES = _load_model()
STAGE = {s.stage: s for s in STAGES}


def next_step_for(stage: str, reason: str | None) -> NextStep:
    """The next step of a verdict: its reason's, else its stage's (stages.json)."""
    s = STAGE[stage]
    return s.by_reason.get(reason or "", s.next_step)


@dataclass(frozen=True)
class Thresholds:
    queueing_min_waiting: float = DEFAULTS["queueingMinWaitingRequests"]
    kv_pressure: float = DEFAULTS["kvCachePressureRatio"]
    kv_headroom: float = DEFAULTS["kvCacheHeadroomRatio"]


@dataclass(frozen=True)
class Verdict:
    stage: str  # a stage of stages.json
    reason: str | None  # one of that stage's reasons; None for a stage without reasons
    evidence: tuple[str, ...]

    @property
    def next_step(self) -> NextStep:
        return next_step_for(self.stage, self.reason)

    def to_json(self) -> dict[str, Any]:
        step = self.next_step
        return {
            "stage": self.stage,
            "reason": self.reason,
            "evidence": list(self.evidence),
            "next_step": step.text,
            "runbook_url": step.runbook_url,
        }


def strongest(stage: str, reasons: Iterable[str]) -> str:
    """The reason of `stage` that comes first in stages.json among those that hold. A reason
    the file does not know counts as `other` (the recording rules do the same)."""
    order = STAGE[stage].reasons
    held = {r if r in order else "other" for r in reasons}
    return next(r for r in order if r in held)


def _pct(ratio: float | None) -> str:
    return "?" if ratio is None else f"{ratio * 100:.0f}%"


def _name(engine: EngineDoc) -> str:
    # An engine in no pod (a bare host) by its workload and target.
    where = (
        f"{engine.namespace}/{engine.pod}"
        if engine.pod_uid
        else f"{engine.workload} at {engine.target or engine.url}"
    )
    return f"{where} engine {engine.engine or '?'}"


def bound_flag(engine: EngineDoc) -> str:
    """The flag that sets the engine's batch-slot bound (config `max_num_seqs`) in its
    kind: --max-num-seqs, --max-running-requests, ..."""
    kind = BY_NAME.get(engine.kind)
    flags = [f for f, key in kind.flags.items() if key == "max_num_seqs"] if kind else []
    return flags[0] if flags else "--max-num-seqs"


def _waiting(engine: EngineDoc) -> float:
    return float(engine.requests_waiting or 0)


def _running(engine: EngineDoc) -> float:
    return float(engine.requests_running or 0)


def _kv(engine: EngineDoc) -> float | None:
    kv = engine.kv_cache_usage_ratio
    return None if kv is None else float(kv)


def _max_num_seqs(engine: EngineDoc) -> int | None:
    text = engine.config.get("max_num_seqs", "")
    return int(text) if text.isdigit() else None


def at_max_num_seqs(engine: EngineDoc) -> bool:
    """node_namespace_workload_pod_target_engine:gpuledger_engine_at_max_num_seqs:max:
    False where --max-num-seqs is not set."""
    limit = _max_num_seqs(engine)
    return limit is not None and _running(engine) >= limit


def queueing(engine: EngineDoc, t: Thresholds) -> bool:
    """node_namespace_workload_pod_target_engine:gpuledger_engine_queueing:max: an engine
    that is up has enough requests waiting."""
    return engine.up and _waiting(engine) >= t.queueing_min_waiting


def has_headroom(engine: EngineDoc, t: Thresholds) -> bool:
    """node_namespace_workload_pod_target_engine:gpuledger_engine_headroom:max: up, not
    queueing, KV cache below the headroom ratio, below max_num_seqs."""
    kv = _kv(engine)
    return (
        engine.up
        and not queueing(engine, t)
        and kv is not None
        and kv < t.kv_headroom
        and not at_max_num_seqs(engine)
    )


def _deferred(engine: EngineDoc) -> bool:
    by_reason = engine.waiting_by_reason
    return by_reason.get("deferred", 0) > 0 and by_reason.get("capacity", 0) == 0


def _kv_pressure(engine: EngineDoc, t: Thresholds) -> bool:
    kv = _kv(engine)
    return kv is not None and kv >= t.kv_pressure


def _bound_by_max_num_seqs(engine: EngineDoc, t: Thresholds) -> bool:
    # The alert GpuLedgerEngineQueueingAtMaxNumSeqs: at max_num_seqs with KV headroom.
    kv = _kv(engine)
    return at_max_num_seqs(engine) and kv is not None and kv < t.kv_headroom


# Why a queueing engine queues, per reason of the engine_queueing stage (their order is in
# stages.json): the conditions of
# node_namespace_workload_pod_target_engine:gpuledger_engine_queue_reason_rank:max.
ENGINE_QUEUE_REASONS: dict[str, Callable[[EngineDoc, Thresholds], bool]] = {
    "kv_cache": _kv_pressure,
    "deferred": lambda e, _t: _deferred(e),
    "max_num_seqs": _bound_by_max_num_seqs,
    "other": lambda _e, _t: True,
}


def engine_queue_reason(engine: EngineDoc, t: Thresholds) -> tuple[str, str]:
    """Why one queueing engine queues (the strongest reason that holds), and the evidence."""
    reason = strongest(
        "engine_queueing", (r for r, holds in ENGINE_QUEUE_REASONS.items() if holds(engine, t))
    )
    kv = _kv(engine)
    head = (
        f"{_name(engine)}: {_waiting(engine):g} waiting, {_running(engine):g} running, "
        f"KV cache {_pct(kv)}"
    )
    if reason == "kv_cache":
        preempted = engine.preemptions_total
        extra = f", {preempted:g} preemptions so far" if preempted else ""
        return reason, f"{head} (>= {_pct(t.kv_pressure)}){extra}"
    if reason == "deferred":
        return reason, f"{head}; all waiting requests are deferred by the engine"
    if reason == "max_num_seqs":
        limit = _max_num_seqs(engine)
        return reason, f"{head}; running = {bound_flag(engine)} {limit} with KV headroom"
    return reason, head


def ray_pending_reason(placement_groups: Iterable[PlacementGroupsDoc]) -> str:
    """Ray work that cannot be placed: `ray_infeasible` while a PENDING placement group is
    INFEASIBLE (namespace_workload_scheduling_state:gpuledger_ray_placement_groups_pending:sum),
    else ray_no_resources."""
    infeasible = any(
        g.state == "PENDING" and g.scheduling_state == "INFEASIBLE" and g.count
        for g in placement_groups
    )
    return "ray_infeasible" if infeasible else "ray_no_resources"


def serve_router_queues(deployments: Iterable[ServeDeploymentDoc]) -> dict[tuple[str, str], float]:
    """Requests held by Ray Serve's routers per (application, deployment), summed over the
    nodes' documents (namespace_workload_application_deployment:
    gpuledger_serve_router_queued_requests:sum); only where a router reported."""
    queued: dict[tuple[str, str], float] = {}
    for d in deployments:
        if d.router_queued_requests is not None:
            key = (d.application, d.deployment)
            queued[key] = queued.get(key, 0.0) + float(d.router_queued_requests)
    return queued


MAX_SHOWN = 16  # replicas named in one line of evidence


def _count(value: Any) -> str:
    return "?" if value is None else f"{float(value):g}"


def _serve_evidence(
    deployments: Sequence[ServeDeploymentDoc], app: str, dep: str, queued: float
) -> str:
    """`Serve deployment app/dep: 30 queued at the router, 10 at replicas; replicas (ongoing
    of max_ongoing_requests 5): a 5, b 5; no engine of the workload queues`."""
    rows = [d for d in deployments if (d.application, d.deployment) == (app, dep)]
    assigned = [
        float(d.router_requests_at_replicas)
        for d in rows
        if d.router_requests_at_replicas is not None
    ]
    limit = next((d.max_ongoing_requests for d in rows if d.max_ongoing_requests), "?")
    replicas = [r for d in rows for r in d.replicas]
    text = f"Serve deployment {app}/{dep}: {queued:g} request(s) queued at the router"
    if assigned:
        text += f", {sum(assigned):g} at replicas"
    if replicas:
        shown = ", ".join(f"{r.replica} {_count(r.ongoing_requests)}" for r in replicas[:MAX_SHOWN])
        more = f" and {len(replicas) - MAX_SHOWN} more" if len(replicas) > MAX_SHOWN else ""
        text += f"; replicas (ongoing of max_ongoing_requests {limit}): {shown}{more}"
    return text + "; no engine of the workload queues"


@dataclass(frozen=True)
class _Facts:
    pending: Sequence[PendingDoc]
    pods: Sequence[PodDoc]
    engines: Sequence[EngineDoc]
    t: Thresholds
    serve: Sequence[ServeDeploymentDoc] = ()
    pools: Sequence[PoolDoc] = ()
    up: list[EngineDoc] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "up", [e for e in self.engines if e.up])


def _pending_placement(f: _Facts) -> Verdict | None:
    # Only pods that ask for GPUs: the rules count gpuledger_pod_pending_gpus > 0.
    pending = [p for p in f.pending if p.gpus > 0]
    if not pending:
        return None
    return Verdict(
        "pending_placement",
        strongest("pending_placement", (p.reason or "other" for p in pending)),
        tuple(
            f"pod {p.namespace}/{p.name} not placed: {p.reason or 'other'}"
            f" ({p.gpus} GPU(s) requested)"
            for p in pending
        ),
    )


def _starting(f: _Facts) -> Verdict | None:
    starting = [p for p in f.pods if p.starting]
    down = [e for e in f.engines if not e.up]
    if not starting and not down:
        return None
    reasons = (["pod_not_ready"] if starting else []) + (["engine_not_up"] if down else [])
    evidence = [
        f"pod {p.namespace}/{p.name} placed on {p.node or '?'}, not Ready yet" for p in starting
    ]
    evidence += [
        f"{_name(e)} not answering at {e.url}" + (f" ({e.error_reason})" if e.error_reason else "")
        for e in down
    ]
    return Verdict("starting", strongest("starting", reasons), tuple(evidence))


def gateway_queued(pool: PoolDoc) -> float | None:
    """Requests the pool's endpoint picker holds (gpuledger_gateway_queued_requests):
    None while the picker is down or its flow control is off."""
    picker = pool.picker
    if picker is None or not picker.up or picker.queued_requests is None:
        return None
    return float(picker.queued_requests)


def _pool_evidence(pool: PoolDoc) -> str:
    """`pool llm/pool-a: its endpoint picker (Service pool-a-epp) holds 30 request(s),
    saturation 0.2; 3 of 3 members Ready, 3 endpoints the picker counts ready`."""
    picker = pool.picker
    assert picker is not None
    ready = sum(1 for m in pool.members if m.ready)
    service = f" (Service {pool.picker_service})" if pool.picker_service else ""
    text = f"pool {pool.namespace}/{pool.name}: its endpoint picker{service} holds "
    text += f"{_count(picker.queued_requests)} request(s)"
    if picker.saturation is not None:
        text += f", saturation {picker.saturation:g}"
    text += f"; {ready} of {len(pool.members)} members Ready"
    if picker.ready_endpoints is not None:
        text += f", {_count(picker.ready_endpoints)} endpoint(s) the picker counts ready"
    return text


def _gateway_holds(f: _Facts) -> tuple[str, ...]:
    """The workload's pools whose pickers hold requests, while at least
    queueingMinWaitingRequests are held over all of them and none of its engines queues
    (namespace_workload:gpuledger_gateway_queued_requests:sum)."""
    if any(queueing(e, f.t) for e in f.up):
        return ()
    held = [(p, q) for p in f.pools if (q := gateway_queued(p)) is not None]
    if sum(q for _, q in held) < f.t.queueing_min_waiting:
        return ()
    return tuple(_pool_evidence(p) for p, q in held if q > 0)


def _gateway_queue(f: _Facts) -> tuple[str, ...]:
    """gateway_queue: the pool's picker holds requests while an engine has headroom: they
    wait in the gateway, not for the engines."""
    held = _gateway_holds(f)
    roomy = [e for e in f.up if has_headroom(e, f.t)]
    if not held or not roomy:
        return ()
    return (*held, f"no engine of the workload queues; {len(roomy)} engine(s) have headroom")


def _gateway_saturated(f: _Facts) -> tuple[str, ...]:
    """gateway_saturated: the picker holds requests and every engine that is up is full
    (none has headroom), yet none queues: flow control keeps the queue at the gateway."""
    held = _gateway_holds(f)
    if not held or not f.up or any(has_headroom(e, f.t) for e in f.up):
        return ()
    return (
        *held,
        f"no engine of the workload queues and none of its {len(f.up)} has headroom "
        "(at max_num_seqs or KV cache above the headroom ratio)",
    )


def _router_queue(f: _Facts) -> tuple[str, ...]:
    """serve_router_queue: a Serve router holds at least queueingMinWaitingRequests requests
    for a deployment of the workload while none of its engines queues: they wait in the
    routing layer, not in an engine."""
    if any(queueing(e, f.t) for e in f.up):
        return ()
    held = {k: n for k, n in serve_router_queues(f.serve).items() if n >= f.t.queueing_min_waiting}
    return tuple(_serve_evidence(f.serve, app, dep, n) for (app, dep), n in sorted(held.items()))


def _imbalance(f: _Facts) -> tuple[str, ...]:
    """imbalance: an engine queues while a sibling engine has headroom."""
    queued = [e for e in f.up if queueing(e, f.t)]
    siblings = [e for e in f.up if has_headroom(e, f.t)]
    if not queued or not siblings:
        return ()
    return tuple(engine_queue_reason(e, f.t)[1] for e in queued) + tuple(
        f"{_name(e)}: {_waiting(e):g} waiting, {_running(e):g} running, "
        f"KV cache {_pct(_kv(e))}: has headroom"
        for e in siblings
    )


# The conditions of the routing stage's reasons (their order is in stages.json), each
# giving its evidence, or nothing where it does not hold.
ROUTING_REASONS: dict[str, Callable[[_Facts], tuple[str, ...]]] = {
    "gateway_queue": _gateway_queue,
    "gateway_saturated": _gateway_saturated,
    "serve_router_queue": _router_queue,
    "imbalance": _imbalance,
}


def _routing(f: _Facts) -> Verdict | None:
    found = {r: ev for r, check in ROUTING_REASONS.items() if (ev := check(f))}
    if not found:
        return None
    reason = strongest("routing", found)
    return Verdict("routing", reason, found[reason])


def _engine_queueing(f: _Facts) -> Verdict | None:
    explained = [engine_queue_reason(e, f.t) for e in f.up if queueing(e, f.t)]
    if not explained:
        return None
    reason = strongest("engine_queueing", (r for r, _ in explained))
    return Verdict("engine_queueing", reason, tuple(text for _, text in explained))


def _serving(f: _Facts) -> Verdict | None:
    # Summed over every engine, as namespace_workload:gpuledger_engine_requests_running:sum
    # does; an engine that is down already makes the workload `starting`.
    running = sum(_running(e) for e in f.engines)
    if running <= 0:
        return None
    return Verdict("serving", None, (f"{running:g} request(s) running, none waiting",))


def _idle(f: _Facts) -> Verdict | None:
    if not f.engines:
        return None
    return Verdict("idle", None, ("engines up, no request running or waiting",))


def _no_engine(_f: _Facts) -> Verdict | None:
    # Not an LLM server (a training job, a notebook) or its engine is not discovered: there
    # is no request queue to judge.
    return Verdict("no_engine", None, ("placed and running; no vLLM engine found for it",))


# The condition of each stage; workload_verdict tries them in stages.json's order.
STAGE_CONDITIONS: dict[str, Callable[[_Facts], Verdict | None]] = {
    "pending_placement": _pending_placement,
    "starting": _starting,
    "routing": _routing,
    "engine_queueing": _engine_queueing,
    "serving": _serving,
    "idle": _idle,
    "no_engine": _no_engine,
}


def workload_verdict(
    pending: Sequence[PendingDoc],
    pods: Sequence[PodDoc],
    engines: Sequence[EngineDoc],
    t: Thresholds | None = None,
    serve: Sequence[ServeDeploymentDoc] = (),
    *,
    pools: Sequence[PoolDoc] = (),
) -> Verdict:
    """`serve`: the workload's Ray Serve deployment rows of every node's document;
    `pools`: the InferencePools with a member pod of the workload (the cluster view's)."""
    facts = _Facts(pending, pods, engines, t or Thresholds(), serve, pools)
    for stage in STAGES:
        verdict = STAGE_CONDITIONS[stage.stage](facts)
        if verdict is not None:
            return verdict
    raise AssertionError("stages.json must end with a stage whose condition always holds")
