"""explain --request on documents built here: how a request is found, how the engine's
samples are placed against its wait (during it, else the nearest before and after, each
labelled), and what is said when nothing was recorded or no rule tied the span."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger.document.v1 import (
    SCHEMA,
    EngineStateDoc,
    LedgerDocument,
    RequestDoc,
    RouterSpanDoc,
    SpansDoc,
    SpanSenderDoc,
)
from gpuledger.explain.chain import ExplainError
from gpuledger.explain.requests import (
    explain_by_request,
    find_requests,
    render_request_text,
    request_matches,
)

T0 = 1_796_000_000.0


def request(rid: str = "cmpl-req-7-0", queue: float | None = 3.0) -> RequestDoc:
    return RequestDoc(
        request_id=rid,
        trace_id="ab" * 16,
        span_id="cd" * 8,
        parent_span_id="",
        arrived_at=T0,
        finished_at=T0 + 4,
        queue_seconds=queue,
        ttft_seconds=None if queue is None else queue + 0.1,
        inference_seconds=0.9,
    )


def state(at: float, running: float = 8, waiting: float = 5) -> EngineStateDoc:
    return EngineStateDoc(
        at=at, up=True, running=running, waiting=waiting, kv_cache_usage_ratio=0.4, max_num_seqs=8
    )


def doc(*states: EngineStateDoc, r: RequestDoc | None = None, tied: bool = True) -> LedgerDocument:
    sender = SpanSenderDoc(
        peer="10.0.0.1",
        service_name="vllm",
        instance_id="i",
        process_id=1,
        joined_by="peer_pod" if tied else "none",
        untied_reason="" if tied else "2 API servers in the sender's pod have PID 1",
        target="10.0.0.1:8000" if tied else "",
        model_name="m" if tied else "",
        engine="0" if tied else "",
        recent=(r or request(),),
        states=states,
    )
    return LedgerDocument(
        schema=SCHEMA, node="n1", spans=SpansDoc(receiving=True, senders=(sender,))
    )


@pytest.mark.parametrize("text", ["req-7", "cmpl-req-7-0", "ab" * 16, ("AB" * 16)])
def test_a_request_is_found_by_its_x_request_id_vllms_id_or_its_trace(text: str) -> None:
    assert request_matches(request(), text)
    assert len(find_requests([doc()], text)) == 1


def test_an_id_that_only_starts_alike_is_not_the_request() -> None:
    assert not request_matches(request(), "req-")
    assert not request_matches(request(), "req-70")


def test_samples_outside_a_short_wait_are_shown_as_before_and_after_it() -> None:
    d = doc(state(T0 - 20), state(T0 - 5), state(T0 + 9), state(T0 + 30))
    (shown,) = explain_by_request([d], "req-7")["requests"]
    assert [(s["when"], s["offset_seconds"]) for s in shown["states"]] == [
        ("before the wait", -5.0),
        ("after the wait", 9.0),
    ]


def test_the_samples_inside_the_wait_are_the_ones_read() -> None:
    d = doc(state(T0 - 5, running=2), state(T0 + 1), state(T0 + 2))
    (shown,) = explain_by_request([d], "req-7")["requests"]
    assert [s["when"] for s in shown["states"]] == ["during the wait"] * 2
    # No engine document on this node: the samples are shown, no reason is claimed.
    assert shown["reason"] is None


def test_no_sample_and_no_queue_time_are_said_not_recorded() -> None:
    text = render_request_text(explain_by_request([doc()], "req-7"))
    assert "engine state while it waited: not recorded" in text
    old = render_request_text(explain_by_request([doc(r=request(queue=None))], "req-7"))
    assert "waited: not recorded (this engine version sends no queue time)" in old
    assert "scheduled    not recorded" in old


def test_an_untied_request_says_why_and_claims_no_engine() -> None:
    text = render_request_text(explain_by_request([doc(tied=False)], "req-7"))
    assert "engine (not tied)" in text
    assert "tied by no rule: 2 API servers in the sender's pod have PID 1" in text
    assert "workload " not in text


def test_a_request_no_agent_holds_is_not_recorded() -> None:
    with pytest.raises(ExplainError, match="not recorded on n1: it aged out"):
        explain_by_request([doc()], "req-8")
    off = LedgerDocument(schema=SCHEMA, node="n2")
    with pytest.raises(ExplainError, match="no agent read has its span receiver on"):
        explain_by_request([off], "req-7")


def test_time_at_the_router_before_the_engine_saw_it_is_said() -> None:
    d = doc()
    router = RouterSpanDoc(
        service_name="ray-serve-proxy",
        peer="10.0.0.9",
        name="proxy_http_request",
        kind="server",
        trace_id="ab" * 16,
        span_id="ef" * 8,
        parent_span_id="",
        started_at=T0 - 2.5,
        finished_at=T0 + 4.1,
    )
    routed = replace(d, spans=replace(d.spans, routers=(router,)))
    text = render_request_text(explain_by_request([routed], "req-7"))
    assert "router ray-serve-proxy proxy_http_request on n1: started 2.50 s before" in text
    assert "before the engine accepted it: 2.50 s from the router's start" in text
    assert "before the engine accepted it" not in render_request_text(
        explain_by_request([d], "req-7")
    )
