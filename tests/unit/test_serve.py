"""Ray Serve from the real Ray 2.60 capture (tests/fixtures/ray/ray-2.60-serve/): parsing the
dashboard's applications and a node's metrics, the join to pods, processes and engines,
the exposition and /ledger.json. Pure: no HTTP. The verdict: test_serve_verdict.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuledger.export.collector import dropped_series
from gpuledger.export.document import ledger_document
from gpuledger.export.published import Published
from gpuledger.ledger import Ledger, build_ledger, caps
from gpuledger.model import Snapshots
from gpuledger.model.engines import (
    ENGINES,
    EngineMetrics,
    EngineScrape,
    EnginesSnapshot,
    EngineTarget,
)
from gpuledger.model.kubernetes import PODS
from gpuledger.model.procfs import PROCESSES
from gpuledger.model.ray import RAY_LOCAL, LocalRayNode, RaySnapshot
from gpuledger.model.serve import (
    SERVE,
    ServeDeployment,
    ServeNodeMetrics,
    ServeReplica,
    ServeReplicaLoad,
    ServeRouterQueue,
    ServeSnapshot,
)
from gpuledger.sources.engines.exposition import ExpositionError
from gpuledger.sources.ray.serve import metrics_export_port, parse_applications
from gpuledger.sources.ray.serve_metrics import MAX_SERIES, parse_serve_metrics
from tests.unit.ledger_inputs import exposition, pod, pods, process, procs, ray_node, series
from tests.unit.test_cardinality import within_budget

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ray" / "ray-2.60-serve"
NODE_ID = "7cc0021f8fcc6b248d693dcf14978f1d1aa83da30d5be155e6e4e1df"
# The capture's replicas: Serve's id -> PID (in the pod's namespace).
REPLICAS = {"vh85m4ne": 21326, "4ajozisz": 21331}


def applications(name: str = "under_load") -> tuple[Any, Any]:
    return parse_applications(json.loads((CAPTURE / f"serve_applications_{name}.json").read_text()))


def metrics(name: str) -> tuple[Any, Any]:
    return parse_serve_metrics((CAPTURE / f"ray_serve_metrics_{name}.txt").read_text())


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("name", ["under_load", "after_load"])
def test_the_captured_applications(name: str) -> None:
    deployments, replicas = applications(name)
    assert deployments == (ServeDeployment("sleepapp", "Sleeper", "HEALTHY", 5, 2),)
    assert {(r.replica, r.pid, r.state, r.node_id) for r in replicas} == {
        (rid, pid, "RUNNING", NODE_ID) for rid, pid in REPLICAS.items()
    }
    assert all(r.actor_id and len(r.actor_id) == 32 for r in replicas)


def test_an_empty_serve_instance_and_other_shapes() -> None:
    assert parse_applications({"applications": {}, "proxies": {}}) == ((), ())
    with pytest.raises(Exception, match="not a Serve instance"):
        parse_applications({"applications": []})
    # Unknown fields, a replica without an id, a pid of 0 (not running yet), strings.
    deployments, replicas = parse_applications(
        {
            "applications": {
                "a": {
                    "deployments": {
                        "D": {
                            "status": "UPSCALING",
                            "deployment_config": {"max_ongoing_requests": "7"},
                            "replicas": [{"pid": 1}, {"replica_id": "r", "pid": 0}, "x"],
                            "extra": {"runtime_env": {"env_vars": {"TOKEN": "secret"}}},
                        }
                    }
                }
            }
        }
    )
    assert deployments == (ServeDeployment("a", "D", "UPSCALING", 7, None),)
    assert replicas == (ServeReplica("a", "D", "r", "UNKNOWN", None, None, None),)


def test_the_metrics_export_port_from_a_node_detail() -> None:
    payload = json.loads((CAPTURE / "ray_dashboard_nodes_node_id.json").read_text())
    assert metrics_export_port(payload) == 8090
    assert metrics_export_port({"data": {"detail": {"raylet": {"metricsExportPort": 0}}}}) is None
    assert metrics_export_port({"result": False}) is None


@pytest.mark.parametrize(
    ("name", "queued", "at_replicas", "ongoing"),
    [
        ("idle", 0, 0, {"vh85m4ne": 0, "4ajozisz": 0}),
        ("under_load_1", 36, 4, {"vh85m4ne": 3, "4ajozisz": 1}),
        ("under_load_3", 30, 10, {"vh85m4ne": 5, "4ajozisz": 5}),
        ("after_load", 0, 0, {"vh85m4ne": 0, "4ajozisz": 0}),
    ],
)
def test_the_captured_queues(
    name: str, queued: float, at_replicas: float, ongoing: dict[str, float]
) -> None:
    routers, replicas = metrics(name)
    assert routers == (ServeRouterQueue("sleepapp", "Sleeper", queued, at_replicas),)
    assert {r.replica: r.ongoing for r in replicas} == ongoing
    # ray_serve_request_router_queue_len stays stale after the load: it is never read.
    assert {r.deployment for r in replicas} == {"Sleeper"}


def test_handles_of_one_deployment_add_up() -> None:
    line = 'ray_serve_deployment_queued_queries{{application="a",deployment="D",handle="{}"}} {}'
    text = "\n".join([line.format("h1", 3), line.format("h2", 4), "other_metric 1"]) + "\n"
    routers, _ = parse_serve_metrics(text)
    assert routers == (ServeRouterQueue("a", "D", 7.0, None),)


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>\n",
        'ray_serve_deployment_queued_queries{application="a",deployment="D" 1\n',
        "ray_serve_replica_processing_queries{" + "x" * 10_000 + "} 1\n",
        "".join(
            f'ray_serve_replica_processing_queries{{deployment="D",replica="r{i}"}} 1\n'
            for i in range(MAX_SERIES + 1)
        ),
    ],
    ids=["html", "broken-wanted-line", "long-line", "too-many-series"],
)
def test_what_is_not_a_bounded_exposition_is_refused(text: str) -> None:
    with pytest.raises(ExpositionError):
        parse_serve_metrics(text)


def test_nan_and_series_without_a_deployment_are_skipped() -> None:
    text = (
        'ray_serve_deployment_queued_queries{application="a",deployment="D"} NaN\n'
        'ray_serve_deployment_queued_queries{application="a"} 5\n'
        'ray_serve_replica_processing_queries{application="a",deployment="D"} 2\n'
    )
    assert parse_serve_metrics(text) == ((), ())


# --------------------------------------------------------------------------- the join


def capture_snapshot(name: str = "under_load_3", up: bool = True) -> ServeSnapshot:
    deployments, replicas = applications()
    routers, loads = metrics(name)
    node = ServeNodeMetrics(NODE_ID, "http://127.0.0.1:8090/metrics", up, routers, loads)
    if not up:
        node = ServeNodeMetrics(NODE_ID, node.url, False, error_reason="metrics_timeout")
    return ServeSnapshot(deployments, replicas, (node,), namespace="", workload="ray")


RAY_POD = replace(pod(1, namespace="serving", name="sleepapp-head", ip="10.0.0.5"), ready=True)


def serve_ledger(
    snapshot: ServeSnapshot, *, in_pod: bool = True, vllm: EnginesSnapshot | None = None
) -> Ledger:
    """The capture's node as a Ray pod here: the replicas' processes with NSpid."""
    node = ray_node(NODE_ID, 0.0, ip="10.0.0.5")
    uid = RAY_POD.uid if in_pod else None
    infos = [
        process(
            9000 + i, title="ray::ServeReplica:sleepapp:Sleeper", uid=uid, nspid=(9000 + i, pid)
        )
        for i, pid in enumerate(REPLICAS.values())
    ]
    values: dict[Any, Any] = {
        RAY_LOCAL: (LocalRayNode(RaySnapshot(nodes=(node,)), node, RAY_POD if in_pod else None),),
        SERVE: snapshot,
        PROCESSES: procs(infos),
    }
    if vllm is not None:
        values[ENGINES] = vllm
    if in_pod:
        values[PODS] = pods([RAY_POD])
    return build_ledger(Snapshots(values), node="n1", mode="node", taken_at=0.0)


def test_the_capture_joined_to_its_pod_and_processes() -> None:
    serve = serve_ledger(capture_snapshot()).serve
    assert serve is not None
    (d,) = serve.deployments
    assert (d.namespace, d.workload, d.application, d.deployment) == (
        "serving",
        "sleepapp-head",
        "sleepapp",
        "Sleeper",
    )
    assert (d.router_queued, d.router_at_replicas, d.max_ongoing_requests) == (30.0, 10.0, 5)
    assert {(r.replica, r.pid, r.host_pid, r.ongoing, r.pod) for r in d.replicas} == {
        ("vh85m4ne", 21326, 9000, 5.0, "sleepapp-head"),
        ("4ajozisz", 21331, 9001, 5.0, "sleepapp-head"),
    }


def test_the_families_and_the_document() -> None:
    ledger = serve_ledger(capture_snapshot())
    text = exposition(ledger)
    found = {(name, dict(labels).get("replica", "")): labels for name, labels in series(text)}
    assert ("gpuledger_serve_router_queued_requests", "") in found
    assert dict(found[("gpuledger_serve_deployment_info", "")]) | {"node": "n1"} == {
        "node": "n1",
        "namespace": "serving",
        "workload": "sleepapp-head",
        "application": "sleepapp",
        "deployment": "Sleeper",
        "status": "HEALTHY",
        "max_ongoing_requests": "5",
    }
    assert ("gpuledger_serve_replica_ongoing_requests", "vh85m4ne") in found
    assert "gpuledger_serve_router_queued_requests{" in text and "} 30.0" in text
    serve = ledger_document(Published(ledger)).serve
    assert serve.deployments[0].router_queued_requests == 30.0
    assert [r.host_pid for r in serve.deployments[0].replicas] == [9001, 9000]
    assert serve.unread_ray_nodes == ()


def _engine(waiting: float, kv: float) -> EnginesSnapshot:
    target = EngineTarget(
        "http://10.0.0.5:8000/metrics", "serving", RAY_POD.name, RAY_POD.uid, RAY_POD.workload
    )
    metrics_ = EngineMetrics("m", "0", 8.0, waiting, kv_cache_usage_ratio=kv)
    return EnginesSnapshot((EngineScrape(target, True, None, None, (metrics_,), 0.01),))


def test_the_engine_inside_a_replica() -> None:
    """vLLM's EngineCore under a replica's process is that replica's engine."""
    snapshot = capture_snapshot()
    node = ray_node(NODE_ID, 0.0, ip="10.0.0.5")
    infos = [
        process(
            9000, title="ray::ServeReplica:sleepapp:Sleeper", uid=RAY_POD.uid, nspid=(9000, 21326)
        ),
        process(9002, ppid=9000, title="VLLM::EngineCore", uid=RAY_POD.uid, nspid=(9002, 7)),
    ]
    values: dict[Any, Any] = {
        RAY_LOCAL: (LocalRayNode(RaySnapshot(nodes=(node,)), node, RAY_POD),),
        SERVE: snapshot,
        PROCESSES: procs(infos),
        PODS: pods([RAY_POD]),
        ENGINES: _engine(0, 0.1),
    }
    ledger = build_ledger(Snapshots(values), node="n1", mode="node", taken_at=0.0)
    assert ledger.serve is not None
    engines = {r.replica: r.engines for r in ledger.serve.replicas}
    assert engines == {"vh85m4ne": (("10.0.0.5:8000", "m", "0"),), "4ajozisz": ()}


def test_outside_kubernetes_rows_carry_the_configured_workload() -> None:
    ledger = serve_ledger(capture_snapshot(), in_pod=False)
    assert ledger.serve is not None
    (d,) = ledger.serve.deployments
    assert (d.namespace, d.workload) == ("", "ray")
    assert {r.host_pid for r in d.replicas} == {9000, 9001}


def test_unread_metrics_leave_the_replicas_and_say_so() -> None:
    ledger = serve_ledger(capture_snapshot(up=False))
    assert ledger.serve is not None
    (d,) = ledger.serve.deployments
    assert d.router_queued is None and {r.ongoing for r in d.replicas} == {None}
    assert any("no Serve metrics from Ray node 7cc0021f8fcc" in u for u in ledger.unknowns)
    text = exposition(ledger)
    assert "gpuledger_serve_replica_info{" in text
    assert "gpuledger_serve_router_queued_requests" not in text


def test_lingering_and_foreign_series_are_dropped() -> None:
    """A router gauge of a deployment Serve no longer lists, and a replica on another Ray
    node, are not this node's to report."""
    base = capture_snapshot()
    node = base.nodes[0]
    stale = ServeRouterQueue("gone", "Old", 9.0, 0.0)
    foreign = ServeReplica("sleepapp", "Sleeper", "elsewhere", "RUNNING", "f" * 56, 5)
    snapshot = replace(
        base,
        nodes=(replace(node, routers=(*node.routers, stale)),),
        replicas=(*base.replicas, foreign),
    )
    serve = serve_ledger(snapshot).serve
    assert serve is not None
    assert [d.application for d in serve.deployments] == ["sleepapp"]
    assert "elsewhere" not in {r.replica for r in serve.replicas}


def test_a_replica_that_reported_nothing_runs_nothing() -> None:
    base = capture_snapshot()
    node = replace(
        base.nodes[0], replicas=(ServeReplicaLoad("sleepapp", "Sleeper", "vh85m4ne", 2.0),)
    )
    serve = serve_ledger(replace(base, nodes=(node,))).serve
    assert serve is not None
    assert {r.replica: r.ongoing for r in serve.replicas} == {"vh85m4ne": 2.0, "4ajozisz": 0.0}


# --------------------------------------------------------------------------- caps


def test_serve_rows_are_capped_and_the_rest_counted() -> None:
    deployments = tuple(
        ServeDeployment("app", f"D{i:04d}", "HEALTHY", 5, 8)
        for i in range(caps.MAX_SERVE_DEPLOYMENTS + 10)
    )
    replicas = tuple(
        ServeReplica("app", d.deployment, f"r{j}", "RUNNING", NODE_ID, None)
        for d in deployments
        for j in range(8)
    )
    routers = tuple(ServeRouterQueue("app", d.deployment, 1.0, 0.0) for d in deployments)
    node = ServeNodeMetrics(NODE_ID, "", True, routers, ())
    ledger = serve_ledger(ServeSnapshot(deployments, replicas, (node,), workload="ray"))
    assert ledger.serve is not None
    assert len(ledger.serve.deployments) == caps.MAX_SERVE_DEPLOYMENTS
    assert len(ledger.serve.replicas) == caps.MAX_SERVE_REPLICAS
    counts = within_budget(exposition(ledger), "node")
    assert counts["gpuledger_serve_replica_info"] == caps.MAX_SERVE_REPLICAS
    dropped = dropped_series(ledger)
    assert dropped["gpuledger_serve_deployment_info"] == 10
    assert dropped["gpuledger_serve_replica_info"] == len(replicas) - caps.MAX_SERVE_REPLICAS


def test_unknown_states_and_statuses_read_unknown() -> None:
    base = capture_snapshot()
    snapshot = replace(
        base,
        deployments=(replace(base.deployments[0], status="WEIRD"),),
        replicas=tuple(replace(r, state="ALSO_WEIRD") for r in base.replicas),
    )
    serve = serve_ledger(snapshot).serve
    assert serve is not None
    assert serve.deployments[0].status == "UNKNOWN"
    assert {r.state for r in serve.replicas} == {"UNKNOWN"}
