"""The Serve source through the simulator: the dashboard's Serve answers and each Ray node's
metrics port (gpuledger/sim/fake_serve.py, in the shapes of the Ray 2.60 capture), the real
pipeline, and how the source degrades on its own."""

from __future__ import annotations

import copy
import time
from typing import Any

from gpuledger.sim.fake_serve import NODES_PREFIX
from tests.conftest import pick, value

UID_HEAD = "5e7e0001-0000-4000-8000-000000000001"
CID_HEAD = "a1" * 32
GPU = "GPU-5e7e0000-0000-4000-8000-000000000000"


def scenario(**serve: Any) -> dict[str, Any]:
    """A KubeRay head pod with Serve's proxy and two replicas of `sleepapp/Sleeper`."""
    cgroup = (
        f"0::/kubepods.slice/kubepods-pod{UID_HEAD.replace('-', '_')}.slice/"
        f"cri-containerd-{CID_HEAD}.scope"
    )
    return {
        "node": "n1",
        "gpus": [{"uuid": GPU}],
        # Replica vh85m4ne holds the GPU; 4ajozisz holds none, so procfs never reads it
        # (it reads NVML's processes and their ancestors).
        "processes": [
            {
                "pid": 8100 + i,
                "ppid": 1,
                "nspid": [8100 + i, 40 + i],
                "cgroup": cgroup,
                "cmdline": "ray::ServeReplica:sleepapp:Sleeper",
                "gpu_memory": {GPU: "1GiB"} if i == 0 else {},
            }
            for i in range(2)
        ],
        "kubernetes": {
            "pods": [
                {
                    "namespace": "serving",
                    "name": "sleepapp-head",
                    "uid": UID_HEAD,
                    "labels": {"ray.io/cluster": "sleepapp"},
                    "containers": [{"name": "ray-head", "id": CID_HEAD}],
                }
            ]
        },
        "ray": {
            "nodes": [{"name": "head", "pod": "serving/sleepapp-head"}],
            "serve": {
                "applications": [
                    {
                        "name": "sleepapp",
                        "deployments": [
                            {
                                "name": "Sleeper",
                                "routers": [{"node": "head", "queued": 30, "at_replicas": 10}],
                                "replicas": [
                                    {"id": "vh85m4ne", "node": "head", "pid": 40, "ongoing": 5},
                                    {"id": "4ajozisz", "node": "head", "pid": 41, "ongoing": 5},
                                ],
                            }
                        ],
                    }
                ],
                **serve,
            },
        },
    }


DEPLOYMENT = {"namespace": "serving", "workload": "sleepapp", "application": "sleepapp"}


def test_router_queue_and_replicas_through_the_real_pipeline(simulate: Any) -> None:
    run = simulate(scenario())
    s = run.settle()
    assert value(s, "gpuledger_source_up", source="serve") == 1
    assert value(s, "gpuledger_serve_router_queued_requests", **DEPLOYMENT) == 30
    assert value(s, "gpuledger_serve_router_requests_at_replicas", **DEPLOYMENT) == 10
    info = pick(s, "gpuledger_serve_deployment_info", **DEPLOYMENT)
    assert [i[1]["max_ongoing_requests"] for i in info] == ["5"]
    ongoing = pick(s, "gpuledger_serve_replica_ongoing_requests", pod="sleepapp-head")
    assert {i[1]["replica"]: i[2] for i in ongoing} == {"vh85m4ne": 5, "4ajozisz": 5}
    published, _ = run.exporter.current()
    assert published.ledger.serve is not None
    host_pids = {r.replica: r.host_pid for r in published.ledger.serve.replicas}
    assert host_pids == {"vh85m4ne": 8100, "4ajozisz": None}


def test_the_dashboards_token_never_reaches_the_metrics_port(simulate: Any) -> None:
    doc = scenario()
    doc["ray"]["token"] = "sekret-serve-token"
    run = simulate(doc)
    s = run.settle()
    assert value(s, "gpuledger_serve_router_queued_requests", **DEPLOYMENT) == 30
    metrics = run.node.ray_metrics["head"]
    assert metrics.requests >= 1 and not metrics.saw_authorization
    body, _ = run.exporter.render(None)
    assert b"sekret-serve-token" not in body


def test_the_metrics_port_is_found_once_and_again_after_a_failure(simulate: Any) -> None:
    run = simulate(scenario())
    run.settle()
    for _ in range(3):
        run.scrape()
    assert run.node.ray is not None

    def lookups() -> int:
        seen = run.node.ray.requests_seen  # type: ignore[union-attr]
        return sum(1 for r in seen if r.path.startswith(NODES_PREFIX))

    assert lookups() == 1
    run.node.ray_metrics["head"].set_fault("refuse")
    run.scrape()
    run.node.ray_metrics["head"].set_fault("ok")
    s = run.scrape()
    assert lookups() == 2
    assert value(s, "gpuledger_source_up", source="serve") == 1


def test_a_metrics_port_that_fails_leaves_the_rest_and_says_what_is_unknown(simulate: Any) -> None:
    run = simulate(scenario())
    baseline = run.settle()
    ray_series = pick(baseline, "gpuledger_ray_node_gpus")
    for fault, reason in [
        ("refuse", "metrics_unreachable"),
        ("http_500", "metrics_http_error"),
        ("garbage", "metrics_bad_response"),
    ]:
        run.node.ray_metrics["head"].set_fault(fault)
        s = run.scrape()
        assert value(s, "gpuledger_source_up", source="serve") == 0
        assert value(s, "gpuledger_source_state", source="serve", state="down") == 1
        assert value(s, "gpuledger_source_errors_total", source="serve", reason=reason) >= 1
        assert not pick(s, "gpuledger_serve_router_queued_requests")
        # Ray, NVML and procfs do not notice.
        for source in ("ray", "nvml", "procfs", "kubernetes"):
            assert value(s, "gpuledger_source_up", source=source) == 1
        assert pick(s, "gpuledger_ray_node_gpus") == ray_series
        published, _ = run.exporter.current()
        assert any("no Ray Serve" in u for u in published.ledger.unknowns)
    run.node.ray_metrics["head"].set_fault("ok")
    assert value(run.scrape(), "gpuledger_source_up", source="serve") == 1


def test_a_hung_metrics_port_costs_one_deadline(simulate: Any) -> None:
    run = simulate(scenario())
    run.settle()
    run.node.ray_metrics["head"].set_fault("hang")
    started = time.monotonic()
    s = run.scrape()
    assert time.monotonic() - started < 3.0 + 1.5  # the pipeline's 3 s source deadline
    assert value(s, "gpuledger_source_errors_total", source="serve", reason="metrics_timeout") == 1
    run.node.ray_metrics["head"].set_fault("ok")


def test_the_dashboard_failing_serve_only(simulate: Any) -> None:
    run = simulate(scenario(fault="http_500"))
    s = run.settle()
    assert value(s, "gpuledger_source_up", source="ray") == 1
    assert value(s, "gpuledger_source_up", source="serve") == 0
    assert value(s, "gpuledger_source_errors_total", source="serve", reason="http_error") >= 1


def test_ray_down_means_serve_unknown_not_empty(simulate: Any) -> None:
    run = simulate(scenario())
    run.settle()
    assert run.node.ray is not None
    run.node.ray.set_fault("http_500", path="/api/v0/nodes")
    s = run.scrape()
    assert value(s, "gpuledger_source_up", source="ray") == 0
    assert value(s, "gpuledger_source_errors_total", source="serve", reason="ray_down") == 1
    assert not pick(s, "gpuledger_serve_deployment_info")


def test_a_dashboard_without_serve_is_no_serve(simulate: Any) -> None:
    doc = scenario()
    del doc["ray"]["serve"]
    run = simulate(doc)
    s = run.settle()
    assert value(s, "gpuledger_source_up", source="serve") == 1
    assert not [x for x in s if x[0].startswith("gpuledger_serve_")]


def test_no_ray_address_is_not_configured(simulate: Any) -> None:
    doc = copy.deepcopy(scenario())
    del doc["ray"]
    s = simulate(doc).settle()
    assert value(s, "gpuledger_source_state", source="serve", state="not_configured") == 1
    assert not pick(s, "gpuledger_source_errors_total", source="serve")
