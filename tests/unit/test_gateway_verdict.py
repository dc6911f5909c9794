"""Routing's gateway reasons on typed ledger documents: a node agent's three vLLM engines
and the cluster view's InferencePool over them (the shapes of
tests/fixtures/gateway/README.md: llm-d-router v0.10.0's picker, GIE v1.6.0's pool).
The same cases run through the recording rules in mixin/tests/gateway.jsonnet."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuledger.document.v1 import (
    SCHEMA,
    EngineDoc,
    GatewayDoc,
    LedgerDocument,
    PickerDoc,
    PodDoc,
    PoolDoc,
    PoolMemberDoc,
)
from gpuledger.explain.chain import ExplainError, explain, render_text, verdicts
from gpuledger.explain.recorded import FleetOverview, WorkloadRow
from gpuledger.explain.verdict import Thresholds
from gpuledger.web.cluster_page import gateway_table
from gpuledger.web.fleet_page import render_fleet

PODS = ("vllm-a-x", "vllm-a-y", "vllm-a-z")
KEY = ("llm", "vllm-a")


def _engine(pod: str, waiting: float, running: float, kv: float = 0.4) -> EngineDoc:
    return EngineDoc(
        namespace="llm",
        pod=pod,
        pod_uid=f"uid-{pod}",
        workload="vllm-a",
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        engine="0",
        url=f"http://10.0.0.{PODS.index(pod) + 11}:8000/metrics",
        origin="annotation",
        up=True,
        requests_running=running,
        requests_waiting=waiting,
        waiting_by_reason={"capacity": waiting},
        kv_cache_usage_ratio=kv,
        preemptions_total=0.0,
        config={"max_num_seqs": "8", "tensor_parallel_size": "1"},
        gpus=(),
        gpus_configured=1,
        gpus_in_use=1,
    )


def node_doc(waiting: float, running: float) -> LedgerDocument:
    pods = tuple(
        PodDoc(
            namespace="llm",
            name=p,
            uid=f"uid-{p}",
            workload="vllm-a",
            phase="Running",
            ready=True,
            starting=False,
            gpu_requests=1,
            node="gpu-node-1",
        )
        for p in PODS
    )
    engines = tuple(_engine(p, waiting, running) for p in PODS)
    return LedgerDocument(
        schema="gpuledger.ledger/v1", node="gpu-node-1", pods=pods, engines=engines
    )


def cluster_doc(
    queued: float | None, *, picker_up: bool = True, ready: bool = True
) -> LedgerDocument:
    members = tuple(
        PoolMemberDoc(
            uid=f"uid-{p}",
            name=p,
            workload="vllm-a",
            node="gpu-node-1",
            pod_ip=f"10.0.0.{i + 11}",
            ready=ready,
        )
        for i, p in enumerate(PODS)
    )
    picker = PickerDoc(
        url="http://10.96.0.50:9090/metrics",
        up=picker_up,
        error_reason=None if picker_up else "timeout",
        names="llm_d_epp",
        queued_requests=queued,
        ready_endpoints=3.0,
        saturation=0.2,
        endpoint_queues={f"{p}-rank-0": 0.0 for p in PODS},
    )
    pool = PoolDoc(
        namespace="llm",
        name="pool-a",
        uid="uid-pool-a",
        selector={"app": "vllm-a"},
        target_ports=(8000,),
        picker_service="pool-a-epp",
        failure_mode="FailOpen",
        members=members,
        picker=picker,
    )
    return LedgerDocument(
        schema=SCHEMA,
        node="gpuledger-cluster",
        mode="cluster",
        gateway=GatewayDoc(pools=(pool,)),
    )


def _judge(node: LedgerDocument, cluster: LedgerDocument) -> tuple[str, str | None]:
    v = verdicts([node, cluster])[KEY]
    return v.stage, v.reason


def test_a_picker_queue_while_engines_have_headroom_is_the_gateway_with_the_pool_named() -> None:
    v = verdicts([node_doc(0, 4), cluster_doc(30)])[KEY]
    assert (v.stage, v.reason) == ("routing", "gateway_queue")
    assert v.evidence[0].startswith(
        "pool llm/pool-a: its endpoint picker (Service pool-a-epp) holds 30 request(s)"
    )
    assert v.evidence[-1] == "no engine of the workload queues; 3 engine(s) have headroom"
    assert v.next_step.runbook_alert == "GpuLedgerGatewayQueueing"


def test_engines_at_max_num_seqs_behind_a_passing_picker_are_engine_queueing() -> None:
    assert _judge(node_doc(10, 8), cluster_doc(0)) == ("engine_queueing", "max_num_seqs")


def test_engines_that_queue_stay_engine_queueing_whatever_the_picker_holds() -> None:
    assert _judge(node_doc(10, 8), cluster_doc(30)) == ("engine_queueing", "max_num_seqs")


def test_a_picker_queue_in_front_of_full_engines_is_saturation_not_paged() -> None:
    v = verdicts([node_doc(0, 8), cluster_doc(30)])[KEY]
    assert (v.stage, v.reason) == ("routing", "gateway_saturated")
    assert v.next_step.runbook_alert is None


def test_a_picker_below_the_threshold_down_or_without_flow_control_holds_nothing() -> None:
    assert _judge(node_doc(0, 4), cluster_doc(0)) == ("serving", None)
    assert _judge(node_doc(0, 4), cluster_doc(None)) == ("serving", None)
    assert _judge(node_doc(0, 4), cluster_doc(30, picker_up=False)) == ("serving", None)
    raised = Thresholds(queueing_min_waiting=31)
    assert verdicts([node_doc(0, 4), cluster_doc(30)], raised)[KEY].stage == "serving"


def test_without_the_node_agents_the_pool_still_names_its_workload() -> None:
    # The cluster view alone: the members name the workload; no engine was read.
    assert _judge(replace(node_doc(0, 0), pods=(), engines=()), cluster_doc(30)) == (
        "no_engine",
        None,
    )


def test_explain_prints_the_request_path_pool_picker_endpoint_engine() -> None:
    text = render_text(explain([node_doc(0, 4), cluster_doc(30)], workload="llm/vllm-a"))
    assert (
        "  gateway: InferencePool llm/pool-a  picker Service pool-a-epp (FailOpen): 30 held by "
        "flow control, saturation 0.2, 3 endpoint(s) ready"
    ) in text
    assert (
        "    endpoint 10.0.0.11:8000  pod llm/vllm-a-x  Ready  picker sees 0 queued  -> engine "
        "vllm meta-llama/Llama-3.1-8B-Instruct DP 0 on gpu-node-1: 0 waiting, 4 running"
    ) in text
    assert "verdict: ROUTING" in text and "gateway_queue" in text


def test_a_pool_without_ready_members_says_so_on_its_endpoints() -> None:
    docs = [node_doc(0, 0), cluster_doc(0, ready=False)]
    text = render_text(explain(docs, workload="llm/vllm-a"))
    assert text.count("NOT READY") == 3


def test_the_cluster_page_shows_each_pools_queue_beside_its_engines_queues() -> None:
    empty = replace(cluster_doc(0).gateway.pools[0], name="pool-empty", members=(), picker=None)
    cluster = cluster_doc(30)
    cluster = replace(cluster, gateway=GatewayDoc(pools=(*cluster.gateway.pools, empty)))
    html = gateway_table([node_doc(2, 8), cluster])
    assert "<h2>Gateway: InferencePools</h2>" in html
    row_a, row_empty = html.split("<tr><td>llm/")[1:]
    assert "30, saturation 0.2" in row_a and "3 of 3 Ready" in row_a
    assert "3 engine(s): 6 waiting, 24 running" in row_a
    assert '<a href="ledger?workload=llm%2Fvllm-a">llm/vllm-a</a>' in row_a
    assert "no ready endpoint" in row_empty and "picker not read" in row_empty
    assert gateway_table([node_doc(0, 0)]) == ""  # no pools: no table


def test_explain_pool_shows_the_workloads_behind_it_with_their_path() -> None:
    docs = [node_doc(0, 4), cluster_doc(30)]
    text = render_text(explain(docs, pool="llm/pool-a"))
    assert text.startswith("workload llm/vllm-a\n")
    assert "  gateway: InferencePool llm/pool-a  picker Service pool-a-epp" in text
    assert text.count("    endpoint 10.0.0.") == 3 and "verdict: ROUTING" in text


def test_explain_pool_of_a_pool_selecting_nothing_shows_the_pool_alone() -> None:
    empty = replace(cluster_doc(0).gateway.pools[0], name="pool-empty", members=(), picker=None)
    cluster = replace(cluster_doc(0), gateway=GatewayDoc(pools=(empty,)))
    result = explain([node_doc(0, 0), cluster], pool="llm/pool-empty")
    assert result["workloads"] == [] and result["pool"]["name"] == "pool-empty"
    text = render_text(result)
    assert "  gateway: InferencePool llm/pool-empty" in text and "  it selects no pod" in text


def test_explain_pool_names_a_near_miss_and_where_pools_come_from() -> None:
    with pytest.raises(ExplainError, match="did you mean llm/pool-a"):
        explain([node_doc(0, 4), cluster_doc(30)], pool="llm/pool-b")
    with pytest.raises(ExplainError, match="the cluster view reads them"):
        explain([node_doc(0, 4)], pool="llm/pool-a")


def test_the_fleet_page_shows_each_pools_queue_beside_its_workloads_recorded_queues() -> None:
    """With --prometheus-url no node agent is read: the pool table's engines' column is
    the recording rules' count of its workloads' engines, and the workload row says what
    the pickers hold in front of them."""
    row = WorkloadRow(
        "llm", "vllm-a", "routing", "gateway_queue",
        engines_up=3, engines=3, waiting=6, running=24, gateway_queued=30,
    )  # fmt: skip
    overview = FleetOverview(rows=(row,), queries=4, problems=(), seconds=0.01)
    html = render_fleet(cluster_doc(30), overview, "http://prometheus:9090")
    pool_row = html.split('<table id="pools">')[1]
    assert "30, saturation 0.2" in pool_row
    assert "3 engine(s) of its workloads: 6 waiting, 24 running" in pool_row
    assert "gateway holds 30" in html.split('<table id="pools">')[0]
