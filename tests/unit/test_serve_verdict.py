"""The routing stage's `serve_router_queue` on the real Ray 2.60 capture: a Serve router
queue while no engine of the workload queues is routing; engines that queue are theirs."""

from __future__ import annotations

import pytest

from gpuledger.explain.chain import verdicts
from gpuledger.export.document import ledger_document
from gpuledger.export.published import Published
from tests.unit.test_serve import _engine, capture_snapshot, serve_ledger


def test_a_router_queue_with_no_engine_queueing_is_routing() -> None:
    doc = ledger_document(Published(serve_ledger(capture_snapshot())))
    verdict = verdicts([doc])[("serving", "sleepapp-head")]
    assert (verdict.stage, verdict.reason) == ("routing", "serve_router_queue")
    (evidence,) = verdict.evidence
    assert evidence.startswith("Serve deployment sleepapp/Sleeper: 30 request(s) queued")
    assert "10 at replicas" in evidence and "max_ongoing_requests 5" in evidence
    assert verdict.next_step.runbook_alert == "GpuLedgerServeRouterQueueing"


@pytest.mark.parametrize("name", ["idle", "after_load"])
def test_no_router_queue_no_routing_verdict(name: str) -> None:
    doc = ledger_document(Published(serve_ledger(capture_snapshot(name))))
    verdict = verdicts([doc])[("serving", "sleepapp-head")]
    assert verdict.stage == "no_engine"  # the Sleeper has no vLLM engine to judge


def test_engines_that_queue_make_it_engine_queueing_not_routing() -> None:
    ledger = serve_ledger(capture_snapshot(), vllm=_engine(12, 0.95))
    verdict = verdicts([ledger_document(Published(ledger))])[("serving", "sleepapp-head")]
    assert (verdict.stage, verdict.reason) == ("engine_queueing", "kv_cache")
    idle = serve_ledger(capture_snapshot(), vllm=_engine(0, 0.1))
    verdict = verdicts([ledger_document(Published(idle))])[("serving", "sleepapp-head")]
    assert (verdict.stage, verdict.reason) == ("routing", "serve_router_queue")
