"""Where a workload's requests wait: one verdict from the ledger documents. Pure.

The stage precedence is the mixin's (`gpuledger:workload_stage`): pending_placement >
starting > engine_queueing > serving > idle; `routing` replaces engine_queueing when some
engines of the workload queue while a sibling has headroom, because the fix is then in the
router, not the engine. Thresholds default to the mixin's config.libsonnet values.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Doc = Mapping[str, Any]


@dataclass(frozen=True)
class Thresholds:
    queueing_min_waiting: float = 1
    kv_pressure: float = 0.9
    kv_headroom: float = 0.8


@dataclass(frozen=True)
class Verdict:
    # pending_placement | starting | engine_queueing | routing | serving | idle | no_engine
    stage: str
    reason: str | None
    evidence: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "reason": self.reason, "evidence": list(self.evidence)}


def _pct(ratio: float | None) -> str:
    return "?" if ratio is None else f"{ratio * 100:.0f}%"


def _name(engine: Doc) -> str:
    return f"{engine['namespace']}/{engine['pod']} engine {engine['engine'] or '?'}"


def engine_queue_reason(engine: Doc, t: Thresholds) -> tuple[str, str]:
    """Why one queueing engine queues: kv_cache, max_num_seqs, deferred or other."""
    waiting = engine.get("requests_waiting") or 0
    running = engine.get("requests_running") or 0
    kv = engine.get("kv_cache_usage_ratio")
    by_reason = engine.get("waiting_by_reason") or {}
    max_seqs = (engine.get("config") or {}).get("max_num_seqs", "")
    head = f"{_name(engine)}: {waiting:g} waiting, {running:g} running, KV cache {_pct(kv)}"
    preempted = engine.get("preemptions_total")
    if kv is not None and kv >= t.kv_pressure:
        extra = f", {preempted:g} preemptions so far" if preempted else ""
        return "kv_cache", f"{head} (>= {_pct(t.kv_pressure)}){extra}"
    if by_reason and by_reason.get("deferred", 0) > 0 and by_reason.get("capacity", 0) == 0:
        return "deferred", f"{head}; all waiting requests are deferred by the engine"
    if max_seqs.isdigit() and running >= int(max_seqs):
        return "max_num_seqs", f"{head}; running = --max-num-seqs {max_seqs} with KV headroom"
    return "other", head


def _has_headroom(engine: Doc, t: Thresholds) -> bool:
    if not engine.get("up") or (engine.get("requests_waiting") or 0) > 0:
        return False
    kv = engine.get("kv_cache_usage_ratio")
    max_seqs = (engine.get("config") or {}).get("max_num_seqs", "")
    below_seqs = not max_seqs.isdigit() or (engine.get("requests_running") or 0) < int(max_seqs)
    return kv is not None and kv < t.kv_headroom and below_seqs


def workload_verdict(
    pending: Sequence[Doc],
    pods: Sequence[Doc],
    engines: Sequence[Doc],
    t: Thresholds | None = None,
) -> Verdict:
    t = t or Thresholds()
    if pending:
        reasons = Counter(str(p.get("reason") or "other") for p in pending)
        reason = reasons.most_common(1)[0][0]
        return Verdict(
            "pending_placement",
            reason,
            tuple(
                f"pod {p['namespace']}/{p['name']} not placed: {p.get('reason') or 'other'}"
                f" ({p.get('gpus', 0)} GPU(s) requested)"
                for p in pending
            ),
        )
    starting = [p for p in pods if p.get("starting")]
    down = [e for e in engines if not e.get("up")]
    if starting or down:
        evidence = [
            f"pod {p['namespace']}/{p['name']} placed on {p.get('node') or '?'}, not Ready yet"
            for p in starting
        ]
        evidence += [
            f"{_name(e)} not answering at {e.get('url')}"
            + (f" ({e['reason']})" if e.get("reason") else "")
            for e in down
        ]
        return Verdict(
            "starting", "pod_not_ready" if starting else "engine_not_up", tuple(evidence)
        )
    up = [e for e in engines if e.get("up")]
    queueing = [e for e in up if (e.get("requests_waiting") or 0) >= t.queueing_min_waiting]
    if queueing:
        idle_siblings = [e for e in up if e not in queueing and _has_headroom(e, t)]
        explained = [engine_queue_reason(e, t) for e in queueing]
        if idle_siblings:
            evidence = [text for _, text in explained] + [
                f"{_name(e)}: 0 waiting, {e.get('requests_running') or 0:g} running, "
                f"KV cache {_pct(e.get('kv_cache_usage_ratio'))}: has headroom"
                for e in idle_siblings
            ]
            return Verdict("routing", "imbalance", tuple(evidence))
        reason = Counter(r for r, _ in explained).most_common(1)[0][0]
        return Verdict("engine_queueing", reason, tuple(text for _, text in explained))
    running = sum(e.get("requests_running") or 0 for e in up)
    if running > 0:
        return Verdict("serving", None, (f"{running:g} request(s) running, none waiting",))
    if not engines:
        # Not an LLM server (a training job, a notebook) or its engine is not discovered:
        # there is no request queue to judge.
        return Verdict("no_engine", None, ("placed and running; no vLLM engine found for it",))
    return Verdict("idle", None, ("engines up, no request running or waiting",))
