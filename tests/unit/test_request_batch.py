"""The engine's batch over one request's wait, rebuilt from the spans of its other
requests (explain/batch.py), on the real capture: vLLM 0.32 (CPU) at `--max-num-seqs 2`,
twelve requests at once, ten of which waited (tests/fixtures/vllm-otlp/, made as its
README says). With no sample inside a wait, explain --request still says why it waited."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gpuledger.document.v1 import (
    SCHEMA,
    EngineStateDoc,
    LedgerDocument,
    RequestDoc,
    SpansDoc,
    SpanSenderDoc,
)
from gpuledger.explain.batch import batch_during
from gpuledger.explain.requests import explain_by_request, render_request_text
from gpuledger.export.spans_document import request_doc
from gpuledger.sources.otlp.decode import decode, parse_protobuf

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-otlp"


def captured() -> list[RequestDoc]:
    found = []
    for path in sorted(CAPTURE.glob("otlp_http_*.pb")):
        decoded = decode(parse_protobuf(path.read_bytes()), "127.0.0.1")
        found += [request_doc(span) for _, span in decoded.engine_spans]
    return sorted(found, key=lambda r: r.request_id)


def test_the_capture_ran_two_at_a_time_all_through_each_wait() -> None:
    requests = captured()
    assert len(requests) == 12
    waited = [r for r in requests if r.queue_seconds is not None and r.queue_seconds > 0.01]
    assert len(waited) == 10
    for r in waited:
        batch = batch_during(r, requests, 2)
        assert batch is not None
        # --max-num-seqs 2 ran through each wait; the handovers between one pair and the
        # next are known to a few ms (two processes' clocks of arrival), no more.
        assert (batch.held, batch.running) == (11, 2), r.request_id
        assert batch.full and batch.full_share > 0.95, (r.request_id, batch)
        assert batch.waiting_max == 9
    # Ending slots at the span's end instead (the API server still answering) would
    # count up to 4 running at a limit of 2: the time in the model is what holds a slot.
    assert max(batch_during(r, requests, 2).running_max for r in waited) == 3


def test_a_batch_below_the_limit_is_not_called_full() -> None:
    requests = captured()
    waited = max(requests, key=lambda r: r.queue_seconds or 0.0)
    batch = batch_during(waited, requests, 4)  # had the limit been 4, slots were free
    assert batch is not None and not batch.full
    # A request that did not wait, or no other request held: nothing to rebuild.
    quick = replace(min(requests, key=lambda r: r.queue_seconds or 0.0), queue_seconds=None)
    assert batch_during(quick, requests, 2) is None
    assert batch_during(waited, [waited], 2) is None


def _doc(requests: list[RequestDoc]) -> LedgerDocument:
    sender = SpanSenderDoc(
        peer="127.0.0.1",
        service_name="vllm-tiny-otlp",
        instance_id="i",
        process_id=32132,
        joined_by="host_pid",
        target="127.0.0.1:8000",
        model_name="tiny-otlp",
        engine="0",
        recent=tuple(requests),
        states=(),  # a burst shorter than one cycle: no sample anywhere near it
    )
    return LedgerDocument(
        schema=SCHEMA, node="n1", spans=SpansDoc(receiving=True, senders=(sender,))
    )


def test_without_a_sample_explain_says_the_batch_was_full_from_the_spans() -> None:
    requests = captured()
    last = max(requests, key=lambda r: r.queue_seconds or 0.0)
    rid = last.request_id.removeprefix("cmpl-").removesuffix("-0")
    # No engine in the document, so no configured limit: the batch is shown, no verdict.
    text = render_request_text(explain_by_request([_doc(requests)], rid))
    assert "engine state while it waited: not recorded" in text
    assert "2 running most of the wait (1-3; max_num_seqs unknown)" in text
    assert "why it waited" not in text
    # With the limit known (as a sample carries it), the spans give the reason.
    limited = [replace_states(requests)]
    text = render_request_text(explain_by_request(limited, rid))
    assert "at least max_num_seqs 2 for 96% of it" in text
    assert "why it waited: max_num_seqs" in text and "from its spans" in text


def replace_states(requests: list[RequestDoc]) -> LedgerDocument:
    """The same document with one sample long before the burst, carrying the limit."""
    doc = _doc(requests)
    assert doc.spans is not None
    first = min(r.arrived_at for r in requests)
    early = EngineStateDoc(
        at=first - 600, up=True, running=0, waiting=0, kv_cache_usage_ratio=0.0, max_num_seqs=2
    )
    sender = replace(doc.spans.senders[0], states=(early,))
    return replace(doc, spans=replace(doc.spans, senders=(sender,)))
