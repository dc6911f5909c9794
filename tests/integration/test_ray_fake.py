"""The Ray client against the simulated dashboard: auth, faults, filters, limits, size.

The fake's formats are checked here against the captured Ray 2.60 replies, and in
test_ray_real.py against a live cluster.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuledger.ledger.ray import gpu_actor_counts, pending_gpus, placement_group_counts
from gpuledger.model.ray import RaySnapshot
from gpuledger.sim.fake_ray import (
    ACTORS_PATH,
    CLUSTER_STATUS_PATH,
    NODES_PATH,
    PLACEMENT_GROUPS_PATH,
    FakeRayDashboard,
    Fault,
    actor_entry,
    node_entry,
    placement_group_entry,
)
from gpuledger.sources.base import SourceError, SourceRunner
from gpuledger.sources.ray.state import RayStateClient
from tests.json_shape import same_shape

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ray"
TOKEN = "test-token-7f3a"


def reference(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def shape(value: Any) -> Any:
    """Keys and JSON types, recursively; lists by their first element."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


@pytest.fixture
def dash() -> Iterator[FakeRayDashboard]:
    with FakeRayDashboard() as dashboard:
        yield dashboard


HEAD = node_entry("10.0.0.5", gpus=4, cpus=8, is_head=True, node_name="raycluster-head-x7k2p")
WORKER = node_entry("10.0.0.6", gpus=2, cpus=8, node_name="raycluster-gpu-worker-9zz1q")
BIG = placement_group_entry("big", [{"GPU": 8}], scheduling_state="INFEASIBLE")
WAIT = placement_group_entry("wait", [{"GPU": 1}, {"GPU": 1}], scheduling_state="NO_RESOURCES")
DONE = placement_group_entry("done", [{"GPU": 1}], state="CREATED", node_ids=[WORKER["node_id"]])


def populate(dashboard: FakeRayDashboard) -> None:
    dashboard.set_nodes([HEAD, WORKER])
    dashboard.set_actors(
        [
            actor_entry("LLMServer", node_id=HEAD["node_id"], pid=101, name="a"),
            actor_entry("LLMServer", node_id=HEAD["node_id"], pid=102, name="b", num_gpus=2),
            actor_entry("Router", node_id=HEAD["node_id"], pid=103, num_gpus=0, num_cpus=1),
            actor_entry(
                "LLMServer",
                node_id=WORKER["node_id"],
                pid=104,
                name="in-group",
                placement_group_id=DONE["placement_group_id"],
                bundle_index=0,
            ),
            actor_entry("LLMServer", state="PENDING_CREATION", name="pending"),
            actor_entry(
                "LLMServer",
                state="PENDING_CREATION",
                name="pending-in-group",
                placement_group_id=WAIT["placement_group_id"],
            ),
            actor_entry("LLMServer", state="DEAD", node_id=HEAD["node_id"], pid=99, name="old"),
        ]
    )
    dashboard.set_placement_groups([BIG, WAIT, DONE])


# --------------------------------------------------------------------------- format


def test_builders_match_the_captured_rows() -> None:
    ref_node = reference("ray-2.60/nodes_detail.json")["data"]["result"]["result"][0]
    node = node_entry("192.0.2.2", gpus=2, cpus=2, is_head=True)
    assert shape(node) == shape(ref_node)
    assert list(node) == list(ref_node)  # same column order
    assert node["resources_total"].keys() == ref_node["resources_total"].keys()

    ref_actor = reference("ray-2.60/actors.json")["data"]["result"]["result"][0]
    actor = actor_entry("A", node_id=ref_actor["node_id"], pid=12502, name="gpu_actor")
    assert shape(actor) == shape(ref_actor)
    assert list(actor) == list(ref_actor)
    assert actor["required_resources"] == ref_actor["required_resources"]

    ref_group = reference("ray-2.60/placement_groups.json")["data"]["result"]["result"][0]
    group = placement_group_entry("big_pg", [{"GPU": 4}], scheduling_state="INFEASIBLE")
    assert shape(group) == shape(ref_group)
    assert list(group["stats"]) == list(ref_group["stats"])


def test_placement_group_actor_resources_match_the_local_capture() -> None:
    captured = reference("ray-2.60-local/actors_detail.json")["data"]["result"]["result"]
    real = next(a for a in captured if a["name"] == "inpg")
    pg_id = real["placement_group_id"]
    built = actor_entry("Gpu", state="PENDING_CREATION", num_gpus=1, placement_group_id=pg_id)
    assert built["required_resources"] == real["required_resources"]


@pytest.mark.parametrize(
    ("path", "fixture", "detail"),
    [
        (NODES_PATH, "ray-2.60/nodes.json", False),
        (NODES_PATH, "ray-2.60/nodes_detail.json", True),
        (ACTORS_PATH, "ray-2.60/actors.json", True),
        (ACTORS_PATH, "ray-2.60-local/actors.json", False),
        (PLACEMENT_GROUPS_PATH, "ray-2.60/placement_groups.json", True),
        (PLACEMENT_GROUPS_PATH, "ray-2.60-local/placement_groups.json", False),
    ],
)
def test_fake_answers_in_the_captured_shape(
    dash: FakeRayDashboard, path: str, fixture: str, detail: bool
) -> None:
    ref = reference(fixture)
    node = node_entry("192.0.2.2", gpus=2, cpus=2, is_head=True)
    dash.set_nodes([node])
    dash.set_actors([actor_entry("A", node_id=node["node_id"], pid=12502)])
    dash.set_placement_groups([placement_group_entry("big_pg", [{"GPU": 4}])])
    query = {"detail": "true"} if detail else {}
    got = requests.get(dash.url + path, params=query, timeout=5).json()
    same_shape(got, ref)


def test_fake_cluster_status_shape(dash: FakeRayDashboard) -> None:
    ref = reference("ray-2.60/cluster_status.json")
    node = node_entry("192.0.2.2", gpus=2, cpus=2, is_head=True)
    dash.set_nodes([node])
    dash.set_actors([actor_entry("A", node_id=node["node_id"], pid=p, name=str(p)) for p in (1, 2)])
    dash.set_placement_groups([placement_group_entry("big_pg", [{"GPU": 4}])])
    got = requests.get(dash.url + CLUSTER_STATUS_PATH, timeout=5).json()
    assert shape(got["data"]).keys() == shape(ref["data"]).keys()
    got_status, ref_status = got["data"]["clusterStatus"], ref["data"]["clusterStatus"]
    assert got_status.keys() == ref_status.keys()
    assert got_status["autoscalerReport"].keys() == ref_status["autoscalerReport"].keys()
    got_report, ref_report = got_status["loadMetricsReport"], ref_status["loadMetricsReport"]
    assert got_report.keys() == ref_report.keys()
    # Camel-cased resource names, [used, total] pairs, same numbers for the same cluster.
    (got_usage,) = got_report["usageByNode"].values()
    (ref_usage,) = ref_report["usageByNode"].values()
    assert got_usage == ref_usage
    assert got_report["pgDemand"] == ref_report["pgDemand"]


# --------------------------------------------------------------------------- happy path


def test_fetch_cluster(dash: FakeRayDashboard) -> None:
    populate(dash)
    client = RayStateClient(dash.url)
    snap = client.fetch_cluster()
    assert snap.warnings == ()
    head, worker = snap.nodes
    assert (head.is_head, head.gpus_total, head.gpus_available) == (True, 4.0, 1.0)
    assert (worker.gpus_total, worker.gpus_available) == (2.0, 1.0)  # one bundle reserved
    assert worker.hostname == "raycluster-gpu-worker-9zz1q"
    assert "old" not in {a.name for a in snap.actors}  # DEAD filtered by the server
    assert gpu_actor_counts(snap) == {
        ("LLMServer", "ALIVE"): 4.0,
        ("LLMServer", "PENDING_CREATION"): 2.0,
    }
    assert pending_gpus(snap) == {"placement_group": 10.0, "actor": 1.0}
    assert placement_group_counts(snap) == {
        ("PENDING", "INFEASIBLE"): 1,
        ("PENDING", "NO_RESOURCES"): 1,
        ("CREATED", "FINISHED"): 1,
    }
    by_name = {a.name: a for a in snap.actors}
    assert by_name["a"].pid == 101 and by_name["a"].node_id == HEAD["node_id"]
    assert by_name["in-group"].num_gpus == 1.0
    assert by_name["pending"].pid is None


def test_fetch_local_fills_in_only_the_picked_node_and_sees_table_changes(
    dash: FakeRayDashboard,
) -> None:
    populate(dash)
    client = RayStateClient(dash.url)
    offered: list[tuple[str, ...]] = []

    def pick_worker(nodes: tuple[Any, ...]) -> list[str]:
        offered.append(tuple(n.hostname for n in nodes))
        return [WORKER["node_id"]]

    snap = client.fetch_local(pick_worker)
    by_id = {n.node_id: n for n in snap.nodes}
    assert by_id[WORKER["node_id"]].gpus_available == 1.0  # one bundle reserved
    assert by_id[HEAD["node_id"]].gpus_available is None  # not this node's to report
    assert {a.name for a in snap.actors} == {"in-group"}
    # The node table is cached on its bytes: the same answer twice parses once, and a
    # changed table (a node replaced) is seen on the very next fetch.
    again = client.fetch_local(pick_worker)
    assert again.nodes == snap.nodes
    replacement = node_entry("10.0.0.7", gpus=8, cpus=8, node_name="raycluster-gpu-worker-new")
    dash.set_nodes([HEAD, replacement])
    changed = client.fetch_local(pick_worker)
    assert [n.hostname for n in changed.nodes] == [
        "raycluster-head-x7k2p",
        "raycluster-gpu-worker-new",
    ]
    assert offered[-1] == ("raycluster-head-x7k2p", "raycluster-gpu-worker-new")
    client.close()


def test_requests_carry_detail_limit_and_filters(dash: FakeRayDashboard) -> None:
    populate(dash)
    RayStateClient(dash.url, timeout_seconds=2.5, limit=500).fetch_cluster(node_id="abc")
    seen = {r.path: r.query for r in dash.requests_seen}
    assert set(seen) == {NODES_PATH, ACTORS_PATH, PLACEMENT_GROUPS_PATH, CLUSTER_STATUS_PATH}
    actors = seen[ACTORS_PATH]
    assert actors["detail"] == ["true"] and actors["limit"] == ["500"]
    assert actors["timeout"] == ["3"]  # the server's own deadline, whole seconds
    assert actors["filter_keys"] == ["state", "node_id"]
    assert actors["filter_predicates"] == ["!=", "="]
    assert actors["filter_values"] == ["DEAD", "abc"]
    assert seen[PLACEMENT_GROUPS_PATH]["filter_values"] == ["REMOVED"]
    assert "detail" not in seen[NODES_PATH]


def test_filters(dash: FakeRayDashboard) -> None:
    populate(dash)
    client = RayStateClient(dash.url)
    on_head = client.fetch_actors(node_id=HEAD["node_id"])
    assert {a.name for a in on_head} == {"a", "b", None, "old"}
    pending = client.fetch_actors(state="PENDING_CREATION")
    assert {a.name for a in pending} == {"pending", "pending-in-group"}
    assert client.fetch_actors(state="pending_creation") == pending  # case-insensitive, as Ray
    assert client.fetch_actors(node_id=WORKER["node_id"], state="DEAD") == ()
    assert len(client.fetch_placement_groups()) == 3
    assert len(client.fetch_nodes()) == 2


def test_unsupported_filter_is_rays_400(dash: FakeRayDashboard) -> None:
    reply = requests.get(
        dash.url + ACTORS_PATH,
        params={"filter_keys": "bogus", "filter_predicates": "=", "filter_values": "x"},
        timeout=5,
    )
    assert reply.status_code == 400
    assert reply.json()["result"] is False
    assert "The given filter column bogus is not supported" in reply.json()["msg"]


# --------------------------------------------------------------------------- auth


def test_token_auth(dash: FakeRayDashboard) -> None:
    populate(dash)
    dash.set_token(TOKEN)
    with pytest.raises(SourceError) as missing:
        RayStateClient(dash.url).fetch_cluster()
    assert missing.value.reason == "unauthorized"
    assert "401" in missing.value.message
    assert "--ray-token-file" in missing.value.message
    assert "RAY_AUTH_MODE=disabled" in missing.value.message

    with pytest.raises(SourceError) as wrong:
        RayStateClient(dash.url, token="not-it").fetch_cluster()
    assert wrong.value.reason == "unauthorized"
    assert "403" in wrong.value.message and "not-it" not in wrong.value.message

    snap = RayStateClient(dash.url, token=f"{TOKEN}\n").fetch_cluster()  # as read from a file
    assert len(snap.nodes) == 2
    assert all(r.had_authorization for r in list(dash.requests_seen)[-4:])


# --------------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("refuse", "unreachable"),
        ("hang", "timeout"),
        ("stall", "timeout"),  # headers sent, the body stops half-way
        ("http_500", "http_error"),
        ("result_false", "api_error"),
        ("garbage", "bad_response"),
        ("truncated", "bad_response"),
        ("huge", "too_large"),
    ],
)
def test_faults_become_source_errors(dash: FakeRayDashboard, fault: Fault, reason: str) -> None:
    populate(dash)
    client = RayStateClient(dash.url, timeout_seconds=0.5)
    dash.set_fault(fault)
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        client.fetch_cluster()
    assert caught.value.reason == reason
    assert time.monotonic() - started < 5
    assert "\n" not in caught.value.message
    if fault == "result_false":
        assert "Failed to query the data source" in caught.value.message
    # Recovery: the same client works once the dashboard does.
    dash.set_fault("ok")
    assert len(client.fetch_cluster().nodes) == 2


def test_partial_failure_is_a_warning(dash: FakeRayDashboard) -> None:
    populate(dash)
    dash.set_fault("partial_failure", path=ACTORS_PATH)
    snap = RayStateClient(dash.url).fetch_cluster()
    assert len(snap.actors) == 6
    assert any(
        w.startswith("actors: partial failure: The returned data may") for w in snap.warnings
    )
    assert all(w.startswith("actors") for w in snap.warnings)


@pytest.mark.parametrize("fault", ["http_500", "hang", "garbage"])
def test_cluster_status_is_optional(dash: FakeRayDashboard, fault: Fault) -> None:
    populate(dash)
    dash.set_fault(fault, path=CLUSTER_STATUS_PATH)
    snap = RayStateClient(dash.url, timeout_seconds=0.5).fetch_cluster()
    assert all(n.resources_available is None for n in snap.nodes)
    assert len(snap.actors) == 6
    (warning,) = snap.warnings
    assert warning.startswith("cluster_status: ")


def test_limit_is_reported_and_rays_maximum_enforced(dash: FakeRayDashboard) -> None:
    populate(dash)
    snap = RayStateClient(dash.url, limit=2).fetch_cluster()
    assert len(snap.actors) == 2
    assert "actors: limit reached, 2 of 6 returned" in snap.warnings
    with pytest.raises(SourceError) as caught:
        RayStateClient(dash.url, limit=20000).fetch_nodes()
    assert caught.value.reason == "api_error"
    assert "exceeds the supported limit 10000" in caught.value.message


def test_big_responses(dash: FakeRayDashboard) -> None:
    dash.set_nodes([HEAD])
    many = [
        actor_entry("Replica", node_id=HEAD["node_id"], pid=1000 + i, name=f"r{i}", num_gpus=0.01)
        for i in range(5000)
    ]
    dash.set_actors(many)
    started = time.monotonic()
    snap = RayStateClient(dash.url).fetch_cluster()
    assert len(snap.actors) == 5000
    assert gpu_actor_counts(snap)[("Replica", "ALIVE")] == pytest.approx(50.0)
    assert time.monotonic() - started < 10
    with pytest.raises(SourceError) as caught:
        RayStateClient(dash.url, max_response_bytes=256 * 1024).fetch_cluster()
    assert caught.value.reason == "too_large"


def test_through_the_source_runner(dash: FakeRayDashboard) -> None:
    populate(dash)
    client = RayStateClient(dash.url, timeout_seconds=0.5)
    runner: SourceRunner[RaySnapshot] = SourceRunner("ray", deadline_seconds=5.0)
    try:
        snap, status = runner.run(client.fetch_cluster)
        assert status.up and snap is not None and len(snap.nodes) == 2
        dash.set_fault("refuse")
        snap, status = runner.run(client.fetch_cluster)
        assert snap is None
        assert (status.up, status.error_reason) == (False, "unreachable")
        dash.set_fault("ok")
        snap, status = runner.run(client.fetch_cluster)
        assert status.up
    finally:
        runner.close()
        client.close()
