"""Ray Serve end to end: `gpuledger simulate` of tests/fixtures/scenarios/serve-router-queue.yaml
scraped by a real Prometheus running the mixin's rules (every `for` 0s; the `for` boundaries
are promtool's, mixin/tests/serve.jsonnet).

As the scenario moves through its phases, the workload `serving/llm` must be:
a router queue while the replicas idle -> stage routing (serve_router_queue) and only
GpuLedgerServeRouterQueueing (layer routing) fires; the engines queue too -> engine_queueing
and only the engine alerts (layer engine); drained -> idle, nothing fires.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import REPO
from tests.e2e.prom_harness import (
    Prometheus,
    Simulated,
    free_port,
    mixin_config,
    prometheus_binary,
    zero_for_rules,
)

pytestmark = pytest.mark.slow

SCENARIO = REPO / "tests" / "fixtures" / "scenarios" / "serve-router-queue.yaml"
REASON_SERIES = (
    'namespace_workload_stage_reason:gpuledger_stage_reason_code:group{namespace="serving"}'
)
ALERTS = 'ALERTS{alertstate="firing", namespace="serving"}'


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    prometheus_binary()
    assert mixin_config()["gpuledgerNodeSelector"] == 'job="gpuledger-node"'
    port = free_port()
    started: list[Any] = []
    try:
        server = Prometheus(
            tmp_path_factory.mktemp("prometheus"),
            [
                {
                    "job_name": "gpuledger-node",
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
                }
            ],
            zero_for_rules(),
        )
        started.append(server)
        server.wait_ready()
        node = Simulated(SCENARIO, port)
        started.append(node)
        node.wait_ready()
        yield server
    finally:
        for thing in reversed(started):
            thing.close()


def _state(prom: Prometheus) -> tuple[set[tuple[str, str]], list[dict[str, str]]]:
    stages = {
        (s["metric"]["stage"], s["metric"].get("reason", "")) for s in prom.query(REASON_SERIES)
    }
    return stages, [a["metric"] for a in prom.query(ALERTS)]


def _holds(prom: Prometheus, stage: tuple[str, str], alerts: set[tuple[str, str]]) -> bool:
    stages, firing = _state(prom)
    return stages == {stage} and {(a["alertname"], a["layer"]) for a in firing} == alerts


def _steady(prom: Prometheus, stage: tuple[str, str], alerts: set[tuple[str, str]]) -> None:
    """Until the workload is in `stage` with exactly `alerts` firing, and still is after
    two more evaluations of every rule group."""
    prom.wait_for(f"{stage} with {alerts}", lambda: _holds(prom, stage, alerts), timeout=45)
    for _ in range(2):
        prom.wait_next_evaluation()
        assert _holds(prom, stage, alerts), _state(prom)


def test_router_queue_pages_routing_and_engine_queues_page_the_engine_layer(
    prom: Prometheus,
) -> None:
    started = time.monotonic()
    routing = {("GpuLedgerServeRouterQueueing", "routing")}
    _steady(prom, ("routing", "serve_router_queue"), routing)
    (alert,) = [a for a in prom.alerts() if a["labels"].get("namespace") == "serving"]
    assert (alert["labels"]["application"], alert["labels"]["deployment"]) == ("llm", "LLMServer")
    assert alert["annotations"]["description"].startswith(
        "30 request(s) for Ray Serve deployment llm/LLMServer of workload serving/llm"
    )
    engine = {("GpuLedgerEngineQueueingKvCachePressure", "engine")}
    _steady(prom, ("engine_queueing", "kv_cache"), engine)
    _steady(prom, ("idle", ""), set())
    assert time.monotonic() - started < 120
