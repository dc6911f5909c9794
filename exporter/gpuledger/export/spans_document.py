"""/ledger.json's `spans`: the requests each sender's ring holds, the engine they were
tied to and that engine's recent states (document/v1.py, SpansDoc)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuledger.document.v1 import (
    EngineStateDoc,
    RequestDoc,
    RouterSpanDoc,
    SpansDoc,
    SpanSenderDoc,
)
from gpuledger.ledger.node import Ledger
from gpuledger.ledger.spans import EngineHistory, EngineSample, RequestSender
from gpuledger.model.spans import EngineRequestSpan, RouterSpan

# ledger.engines.identity's order: namespace, pod, pod_uid, workload, model_name,
# engine, target.
_MODEL, _RANK, _TARGET = 4, 5, 6


def request_doc(span: EngineRequestSpan) -> RequestDoc:
    return RequestDoc(
        request_id=span.request_id,
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        arrived_at=span.start_ns / 1e9,
        finished_at=span.end_ns / 1e9,
        queue_seconds=span.queue_seconds,
        ttft_seconds=span.ttft_seconds,
        e2e_seconds=span.e2e_seconds,
        prefill_seconds=span.prefill_seconds,
        decode_seconds=span.decode_seconds,
        inference_seconds=span.inference_seconds,
        scheduler_seconds=span.scheduler_seconds,
        prompt_tokens=span.prompt_tokens,
        completion_tokens=span.completion_tokens,
        max_tokens=span.max_tokens,
    )


def _state(s: EngineSample) -> EngineStateDoc:
    return EngineStateDoc(
        at=s.at,
        up=s.up,
        running=s.running,
        waiting=s.waiting,
        waiting_by_reason=dict(s.waiting_by_reason),
        kv_cache_usage_ratio=s.kv_cache_usage_ratio,
        max_num_seqs=s.max_num_seqs,
    )


def _sender(held: RequestSender, history: Mapping[tuple[str, ...], EngineHistory]) -> SpanSenderDoc:
    engine = held.engine or ()
    samples = history[engine].samples if engine in history else ()
    return SpanSenderDoc(
        peer=held.sender.peer,
        service_name=held.sender.service_name,
        instance_id=held.sender.instance_id,
        process_id=held.sender.process_id,
        pod_uid=held.sender.pod_uid,
        joined_by=held.joined_by,
        untied_reason=held.untied_reason,
        target=engine[_TARGET] if engine else "",
        model_name=engine[_MODEL] if engine else "",
        engine=engine[_RANK] if engine else "",
        received_total=held.received_total,
        recent=tuple(request_doc(s) for s in held.recent),
        slowest=tuple(request_doc(s) for s in held.slowest),
        states=tuple(_state(s) for s in samples),
    )


def _router(span: RouterSpan) -> RouterSpanDoc:
    return RouterSpanDoc(
        service_name=span.sender.service_name,
        peer=span.sender.peer,
        name=span.name,
        kind=span.kind,
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        started_at=span.start_ns / 1e9,
        finished_at=span.end_ns / 1e9,
    )


def spans_doc(ledger: Ledger) -> SpansDoc:
    requests = ledger.requests
    if requests is None:
        return SpansDoc()
    history = {h.engine: h for h in ledger.engine_history}
    routers: Sequence[RouterSpan] = requests.routers
    return SpansDoc(
        receiving=True,
        senders=tuple(_sender(s, history) for s in requests.senders),
        routers=tuple(_router(r) for r in routers),
        refused_total=dict(requests.refused_total),
        stored_bytes=requests.stored_bytes,
    )
