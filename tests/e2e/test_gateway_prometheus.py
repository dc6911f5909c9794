"""The gateway end to end, in a real Prometheus (issue 23's "Done when").

A node agent (tests/fixtures/scenarios/gateway-node.yaml: three vLLM engines of workload
llm/vllm-a, `--max-num-seqs 8`) and the cluster view (gateway-cluster.yaml: InferencePool
pool-a over them, its endpoint picker holding 30 requests; pool-empty selecting nothing;
pool-down whose only pod is not Ready), both `gpuledger simulate` processes, scraped by a
real Prometheus evaluating the mixin's rules with every `for` at 0s (prom_harness.py). At
60 s both scenarios move on together: the picker passes requests through
(`passing-through`) and the engines fill to max_num_seqs with requests waiting
(`engines-full`).

While the picker queues only the gateway alert fires for the workload; once the engines
queue only the engine alert does; the pools without a ready endpoint page for the pool,
and pool-down's unplaced pod the placement layer, throughout. The routing and engine
alerts never fire together.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpuledger.document.v1 import SCHEMA, LedgerDocument
from gpuledger.explain.prometheus import PrometheusAccess
from gpuledger.explain.recorded import read_overview
from gpuledger.web.fleet_page import render_fleet
from tests.conftest import REPO
from tests.e2e.prom_harness import (
    Prometheus,
    Simulated,
    free_port,
    mixin_config,
    prometheus_binary,
    substitute,
    zero_for_rules,
)

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
WAITING = REPO / "mixin" / "rendered" / "dashboards" / "gpuledger-where-waiting.json"
# The Where-waiting dashboard's gateway row (mixin/dashboards/waiting.libsonnet).
GATEWAY_PANELS = frozenset(
    {
        "Gateway: held by the picker vs waiting in its engines",
        "Gateway: ready endpoints, the picker's and Kubernetes'",
        "Gateway: pool saturation",
    }
)
NODE_SCENARIO = SCENARIOS / "gateway-node.yaml"
CLUSTER_SCENARIO = SCENARIOS / "gateway-cluster.yaml"
PHASE_AT = 60.0  # both scenarios' second phase (engines-full, passing-through)
ENGINES = {"vllm-a-5d8c7b9f4-2xk9p", "vllm-a-5d8c7b9f4-7hq2m", "vllm-a-5d8c7b9f4-wn4tz"}
# Throughout: the pools without a ready endpoint page for the pool, and pool-down's only
# pod, which the scheduler cannot place, pages the placement layer for its own workload.
STEADY = {
    ("GpuLedgerInferencePoolNoReadyEndpoints", "pool-empty"),
    ("GpuLedgerInferencePoolNoReadyEndpoints", "pool-down"),
    ("GpuLedgerPodsPendingPlacement", "vllm-down"),
}


@dataclass
class Stack:
    prom: Prometheus
    started: float  # monotonic time the scenarios' phase clocks started


def _scrape(job: str, target: str, cluster_label: str) -> dict[str, object]:
    return {
        "job_name": job,
        "static_configs": [{"targets": [target], "labels": {cluster_label: "gateway"}}],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus_binary()
    cluster_label = mixin_config()["clusterLabel"]
    ports = {"node": free_port(), "cluster": free_port()}
    prom = Prometheus(
        tmp_path_factory.mktemp("prometheus-gateway"),
        [
            _scrape("gpuledger-node", f"127.0.0.1:{ports['node']}", cluster_label),
            _scrape("gpuledger-cluster", f"127.0.0.1:{ports['cluster']}", cluster_label),
        ],
        zero_for_rules(),
    )
    started: list[Prometheus | Simulated] = [prom]
    try:
        prom.wait_ready()
        began = time.monotonic()
        for name, scenario in (("node", NODE_SCENARIO), ("cluster", CLUSTER_SCENARIO)):
            started.append(Simulated(scenario, ports[name]))
        for exporter in started[1:]:
            assert isinstance(exporter, Simulated)
            exporter.wait_ready()
        yield Stack(prom, began)
    finally:
        for thing in reversed(started):
            thing.close()


def _firing(prom: Prometheus) -> set[tuple[str, str]]:
    """(alert, the object it names: pod, pool or workload) of every firing alert."""
    out = set()
    for alert in prom.alerts("firing"):
        labels = alert["labels"]
        named = labels.get("pod") or labels.get("pool") or labels.get("workload", "")
        out.add((labels["alertname"], named))
    return out


def _stage(prom: Prometheus) -> tuple[str, str | None] | None:
    found = prom.query(
        'namespace_workload_stage_reason:gpuledger_stage_reason_code:group{namespace="llm",'
        ' workload="vllm-a"}'
    )
    if len(found) != 1:
        return None
    metric = found[0]["metric"]
    return metric["stage"], metric.get("reason")


def _wait(
    stack: Stack, what: str, want: set[tuple[str, str]], stage: tuple[str, str | None]
) -> None:
    seen: list[object] = []

    def holds() -> bool:
        seen[:] = [_firing(stack.prom), _stage(stack.prom)]
        return seen == [want, stage]

    try:
        stack.prom.wait_for(what, holds, timeout=PHASE_AT + 60)
    except AssertionError:
        raise AssertionError(f"{what}: expected {want} in {stage}, got {seen}") from None


def test_while_the_picker_queues_only_the_gateway_alert_fires(stack: Stack) -> None:
    want = {("GpuLedgerGatewayQueueing", "vllm-a"), *STEADY}
    _wait(stack, "the gateway alert", want, ("routing", "gateway_queue"))
    assert time.monotonic() - stack.started < PHASE_AT, "the first phase ended before it held"
    # It stays so over more evaluations while the first phase lasts.
    for _ in range(3):
        stack.prom.wait_next_evaluation()
        if time.monotonic() - stack.started > PHASE_AT - 5:
            break
        assert _firing(stack.prom) == want
    queued = stack.prom.query(
        'namespace_workload:gpuledger_gateway_queued_requests:sum{workload="vllm-a"}'
    )
    assert [s["value"][1] for s in queued] == ["30"]
    # The fleet page read from Prometheus says it too, beside the engines' queues.
    client = PrometheusAccess(stack.prom.base).client(10.0)
    overview = read_overview(client, 10.0)
    (row,) = [r for r in overview.rows if (r.namespace, r.name) == ("llm", "vllm-a")]
    assert (row.stage, row.reason, row.gateway_queued) == ("routing", "gateway_queue", 30)
    own = LedgerDocument(schema=SCHEMA, node="gpuledger-cluster", mode="cluster")
    assert "gateway holds 30" in render_fleet(own, overview, "Prometheus")


def test_once_engines_queue_behind_a_passing_picker_only_the_engine_alert_fires(
    stack: Stack,
) -> None:
    want = {("GpuLedgerEngineQueueingAtMaxNumSeqs", pod) for pod in ENGINES} | STEADY
    _wait(stack, "the engine alert", want, ("engine_queueing", "max_num_seqs"))
    for _ in range(3):
        stack.prom.wait_next_evaluation()
        assert _firing(stack.prom) == want


def test_the_dashboards_gateway_row_shows_the_pools_and_their_engines(stack: Stack) -> None:
    """Every query of the Where-waiting dashboard's gateway row, with its variables at All,
    answers with data for pool-a (tests/e2e/test_prometheus.py leaves them to this stack)."""
    panels = [
        p
        for row in json.loads(WAITING.read_text())["panels"]
        for p in [row, *row.get("panels", [])]
        if p.get("title") in GATEWAY_PANELS
    ]
    assert {p["title"] for p in panels} == GATEWAY_PANELS
    for panel in panels:
        for target in panel["targets"]:
            found = stack.prom.query(substitute(target["expr"], {}))
            pools = {s["metric"].get("pool") for s in found}
            assert "pool-a" in pools, (panel["title"], target["expr"], found)
