"""Ray state API parsing and the pure helpers, over real captures and field variants.

Fixtures: tests/fixtures/ray/README.md says where each one came from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuledger.identity.raynodes import node_for_pod
from gpuledger.ledger.ray import gpu_actor_counts, pending_gpus, placement_group_counts
from gpuledger.model.ray import RayActor, RayBundle, RayNode, RayPlacementGroup, RaySnapshot
from gpuledger.net.httpclient import safe_url
from gpuledger.sources.base import SourceError
from gpuledger.sources.ray.state import (
    MAX_MESSAGE_CHARS,
    RayStateClient,
    gpus_requested,
    list_rows,
    one_line,
    parse_actor,
    parse_node,
    parse_placement_group,
    usage_by_node,
    with_available,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ray"
REFERENCE_NODE = "39d9b13da8de9c25f639bcdf92820db27ef6eb37796f54049e97daf8"
LOCAL_NODE = "5aa47d1d8563525da9c674b3c7c82efddd380e25bcfe7cfcd9eea856"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def rows(name: str) -> list[Any]:
    return list_rows(load(name), name)[0]


def snapshot_from(directory: str) -> RaySnapshot:
    """What fetch_cluster builds, from a directory of captured replies."""
    usage = usage_by_node(load(f"{directory}/cluster_status.json"))
    nodes = tuple(
        with_available(n, usage)
        for n in (parse_node(r) for r in rows(f"{directory}/nodes_detail.json"))
        if n is not None
    )
    actors = tuple(
        a for a in (parse_actor(r) for r in rows(f"{directory}/actors_detail.json")) if a
    )
    groups = tuple(
        g
        for g in (
            parse_placement_group(r) for r in rows(f"{directory}/placement_groups_detail.json")
        )
        if g
    )
    return RaySnapshot(nodes=nodes, actors=actors, placement_groups=groups)


# --------------------------------------------------------------------------- reference 2.60


def test_reference_actors() -> None:
    actors = [parse_actor(r) for r in rows("ray-2.60/actors.json")]
    assert actors == [
        RayActor(
            actor_id="b862393aba307848a41d497101000000",
            class_name="A",
            state="ALIVE",
            pid=12502,
            node_id=REFERENCE_NODE,
            num_gpus=1.0,
            job_id="01000000",
            placement_group_id=None,
            ray_namespace="64d2d39c-0f21-4401-ba23-e326062c3856",
            name="gpu_actor",
        ),
        RayActor(
            actor_id="df91b91de8862d9dac80bff201000000",
            class_name="A",
            state="ALIVE",
            pid=12503,
            node_id=REFERENCE_NODE,
            num_gpus=1.0,
            job_id="01000000",
            placement_group_id=None,
            ray_namespace="64d2d39c-0f21-4401-ba23-e326062c3856",
            name="gpu_actor2",
        ),
    ]


@pytest.mark.parametrize("name", ["ray-2.60/nodes.json", "ray-2.60/nodes_detail.json"])
def test_reference_nodes(name: str) -> None:
    (node,) = [parse_node(r) for r in rows(name)]
    assert node is not None
    assert node.node_id == REFERENCE_NODE
    assert (node.node_ip, node.hostname, node.state, node.is_head) == (
        "192.0.2.2",
        "192.0.2.2",
        "ALIVE",
        True,
    )
    assert node.gpus_total == 2.0
    assert node.resources_total["CPU"] == 2.0
    assert node.labels == {"ray.io/node-id": REFERENCE_NODE}
    # The state API has totals only; availability comes from cluster_status.
    assert node.resources_available is None and node.gpus_available is None


def test_reference_placement_group_is_infeasible() -> None:
    (group,) = [parse_placement_group(r) for r in rows("ray-2.60/placement_groups.json")]
    assert group == RayPlacementGroup(
        pg_id="f4dc2a195a974b2a104d1f53be3201000000",
        name="big_pg",
        state="PENDING",
        scheduling_state="INFEASIBLE",
        strategy=None,  # not a state API column in 2.60
        bundles=(RayBundle(index=0, gpus=4.0, node_id=None),),
        creator_job_id="01000000",
        is_detached=False,
        created_timestamp_seconds=1795939529.358947745,
    )
    assert group.gpus == 4.0


def test_reference_cluster_status_gives_availability() -> None:
    usage = usage_by_node(load("ray-2.60/cluster_status.json"))
    assert usage[REFERENCE_NODE]["GPU"] == (2.0, 2.0)
    (node,) = [parse_node(r) for r in rows("ray-2.60/nodes.json")]
    assert node is not None
    filled = with_available(node, usage)
    assert filled.gpus_available == 0.0
    assert filled.resources_available is not None
    assert filled.resources_available["CPU"] == 2.0
    # Camel-cased in the report, matched back to the state API's names.
    assert filled.resources_available["object_store_memory"] == 7433347891.0
    assert filled.resources_available["node:__internal_head__"] == 1.0


def test_reference_snapshot_helpers() -> None:
    nodes = tuple(n for n in (parse_node(r) for r in rows("ray-2.60/nodes.json")) if n)
    actors = tuple(a for a in (parse_actor(r) for r in rows("ray-2.60/actors.json")) if a)
    groups = tuple(
        g for g in (parse_placement_group(r) for r in rows("ray-2.60/placement_groups.json")) if g
    )
    snap = RaySnapshot(nodes, actors, groups)
    assert gpu_actor_counts(snap) == {("A", "ALIVE"): 2.0}
    assert pending_gpus(snap) == {"placement_group": 4.0, "actor": 0.0}
    assert placement_group_counts(snap) == {("PENDING", "INFEASIBLE"): 1}


# --------------------------------------------------------------------------- versions

VERSIONS = ["ray-2.44", "ray-2.49", "ray-2.60-local"]


@pytest.mark.parametrize("version", VERSIONS)
def test_versions_parse_to_the_same_actors(version: str) -> None:
    expected = [parse_actor(r) for r in rows("ray-2.60-local/actors_detail.json")]
    assert [parse_actor(r) for r in rows(f"{version}/actors_detail.json")] == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_versions_parse_to_the_same_placement_groups(version: str) -> None:
    expected = [
        parse_placement_group(r) for r in rows("ray-2.60-local/placement_groups_detail.json")
    ]
    got = [parse_placement_group(r) for r in rows(f"{version}/placement_groups_detail.json")]
    assert got == expected


def test_local_capture_actors() -> None:
    actors = [a for a in (parse_actor(r) for r in rows("ray-2.60-local/actors_detail.json")) if a]
    by_name = {a.name: a for a in actors}
    pending = by_name["pending"]
    assert (pending.state, pending.pid, pending.node_id, pending.num_gpus) == (
        "PENDING_CREATION",
        None,  # Ray sends pid 0 and node null until the actor is placed
        None,
        1.0,
    )
    # Inside a group Ray rewrites {"GPU": 1} to GPU_group_<pg>; one GPU, not two.
    in_pending_group = by_name["inpg"]
    assert in_pending_group.num_gpus == 1.0
    assert in_pending_group.placement_group_id == "c2a03b26999a4c0a92cfd693014b01000000"
    # A CPU actor in a created group: wildcard and indexed CPU names, no GPU.
    assert by_name["in_created"].num_gpus == 0.0
    assert by_name["in_created"].state == "ALIVE"
    alive = sorted(a.pid or 0 for a in actors if a.state == "ALIVE" and a.num_gpus)
    assert alive == [15508, 15509]


def test_local_capture_snapshot() -> None:
    snap = snapshot_from("ray-2.60-local")
    (node,) = snap.nodes
    assert (node.node_id, node.gpus_total, node.gpus_available) == (LOCAL_NODE, 2.0, 0.0)
    assert node.resources_available is not None
    assert node.resources_available["CPU"] == 1.0  # 3 of 4 used
    assert gpu_actor_counts(snap) == {
        ("Gpu", "ALIVE"): 2.0,
        ("Gpu", "PENDING_CREATION"): 2.0,
    }
    assert placement_group_counts(snap) == {
        ("CREATED", "FINISHED"): 1,
        ("PENDING", "INFEASIBLE"): 1,
        ("PENDING", "NO_RESOURCES"): 1,
    }
    # 4 (infeasible) + 1 (waiting); the actor inside the waiting group is not counted
    # again, the one outside any group is.
    assert pending_gpus(snap) == {"placement_group": 5.0, "actor": 1.0}


def test_non_detail_rows_lack_resources() -> None:
    """Without detail=true Ray leaves out required_resources and placement_group_id."""
    actors = [parse_actor(r) for r in rows("ray-2.60-local/actors.json")]
    assert actors and all(a is not None and a.num_gpus == 0.0 for a in actors)
    assert all(a is not None and a.placement_group_id is None for a in actors)
    groups = [parse_placement_group(r) for r in rows("ray-2.60-local/placement_groups.json")]
    assert all(g is not None and g.scheduling_state is None and not g.bundles for g in groups)


# --------------------------------------------------------------------------- quirks


def test_quirky_actors() -> None:
    parsed = [parse_actor(r) for r in rows("quirks/actors_detail.json")]
    assert parsed[-2:] == [None, None]  # no actor_id; not an object
    by_id = {a.actor_id[:4] + a.actor_id[24:26]: a for a in parsed if a}
    pid_as_string, no_resources, indexed, nameless, dead = (
        by_id[k] for k in ("aa000a", "aa000b", "aa000c", "aa000d", "aa000e")
    )
    assert (pid_as_string.pid, pid_as_string.num_gpus) == (4242, 0.5)
    assert no_resources.num_gpus == 0.0
    assert indexed.num_gpus == 2.0  # only GPU_group_<i>_<pg> present
    assert indexed.name is None
    assert (nameless.class_name, nameless.node_id, nameless.placement_group_id) == ("", None, None)
    assert nameless.pid is None and nameless.ray_namespace is None
    assert dead.state == "DEAD"
    snap = RaySnapshot(actors=tuple(a for a in parsed if a))
    # DEAD holds nothing; RESTARTING waits like PENDING_CREATION.
    assert gpu_actor_counts(snap) == {
        ("PidAsString", "ALIVE"): 0.5,
        ("IndexedBundleOnly", "PENDING_CREATION"): 2.0,
        ("", "RESTARTING"): 1.0,
    }
    # No group with that id in the snapshot: the indexed actor counts as pending itself.
    assert pending_gpus(snap) == {"placement_group": 0.0, "actor": 3.0}


def test_quirky_nodes() -> None:
    listing, warnings = list_rows(load("quirks/nodes.json"), "nodes")
    assert warnings == ("nodes: Some nodes did not answer in time.",)
    head, dead, no_id = (parse_node(r) for r in listing)
    assert no_id is None
    assert head is not None and dead is not None
    assert head.is_head  # inferred from node:__internal_head__
    assert head.node_ip == "10.1.2.3"  # node_ip_address spelling
    assert head.resources_total == {"node:__internal_head__": 1.0, "GPU": 4.0, "CPU": 8.0}
    assert head.labels == {}
    assert (dead.state, dead.is_head) == ("DEAD", False)
    assert dead.labels == {"ray.io/node-id": dead.node_id}  # non-string label dropped


def test_quirky_placement_groups() -> None:
    resched, no_detail, no_id = (
        parse_placement_group(r) for r in rows("quirks/placement_groups_detail.json")
    )
    assert no_id is None
    assert resched is not None and no_detail is not None
    assert resched.strategy == "STRICT_SPREAD"
    assert resched.is_detached is True
    assert resched.name is None
    assert [b.node_id is None for b in resched.bundles] == [False, True]
    assert (no_detail.scheduling_state, no_detail.bundles, no_detail.gpus) == (None, (), 0.0)
    snap = RaySnapshot(placement_groups=(resched, no_detail))
    # RESCHEDULING: only the bundle that lost its node waits.
    assert pending_gpus(snap) == {"placement_group": 1.0, "actor": 0.0}
    assert placement_group_counts(snap) == {
        ("RESCHEDULING", "NO_RESOURCES"): 1,
        ("PENDING", ""): 1,
    }


# --------------------------------------------------------------------------- envelope


def test_result_false_is_api_error_with_rays_text_on_one_line() -> None:
    msg = "Given limit 20000 exceeds\n the supported limit 10000.\n" + "x" * 500
    with pytest.raises(SourceError) as caught:
        list_rows({"result": False, "msg": msg, "data": {"result": None}}, "actors")
    assert caught.value.reason == "api_error"
    assert "Given limit 20000 exceeds the supported limit 10000." in caught.value.message
    assert "\n" not in caught.value.message
    assert len(caught.value.message) < MAX_MESSAGE_CHARS + 40


@pytest.mark.parametrize(
    "payload",
    [
        [],
        {"msg": "no result flag"},
        {"result": True, "msg": ""},
        {"result": True, "msg": "", "data": {"result": None}},
        {"result": True, "msg": "", "data": {"result": {"result": "nope"}}},
    ],
)
def test_other_shapes_are_bad_responses(payload: Any) -> None:
    with pytest.raises(SourceError) as caught:
        list_rows(payload, "nodes")
    assert caught.value.reason == "bad_response"


def test_truncation_and_partial_failure_are_warnings() -> None:
    payload = {
        "result": True,
        "msg": "",
        "data": {
            "result": {
                "total": "9",  # int64 as a string
                "num_after_truncation": 7,
                "num_filtered": 5,
                "result": [{}, {}],
                "partial_failure_warning": "Failed to query\ndata from raylet.",
                "warnings": ["one", None],
            }
        },
    }
    listing, warnings = list_rows(payload, "actors")
    assert len(listing) == 2
    assert warnings == (
        "actors: partial failure: Failed to query data from raylet.",
        "actors: one",
        "actors: Ray truncated 9 to 7 at the source",
        "actors: limit reached, 2 of 5 returned",
    )


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("resources", "gpus"),
    [
        ({}, 0.0),
        ({"CPU": 1.0}, 0.0),
        ({"GPU": 0.25, "CPU": 1.0}, 0.25),
        ({"GPU_group_abc01000000": 2.0, "GPU_group_0_abc01000000": 2.0}, 2.0),
        ({"GPU_group_0_abc01000000": 1.0, "GPU_group_1_abc01000000": 1.0}, 2.0),
        ({"bundle_group_abc01000000": 0.001}, 0.0),
        ({"GPU": 1.0, "GPU_group_abc01000000": 1.0}, 1.0),
    ],
)
def test_gpus_requested(resources: dict[str, float], gpus: float) -> None:
    assert gpus_requested(resources) == gpus


def _actor(state: str, gpus: float, pg: str | None = None, cls: str = "W") -> RayActor:
    return RayActor(
        actor_id=f"{state}-{gpus}-{pg}",
        class_name=cls,
        state=state,
        pid=None,
        node_id=None,
        num_gpus=gpus,
        job_id="01000000",
        placement_group_id=pg,
        ray_namespace=None,
    )


def _group(pg_id: str, state: str, gpus: float, scheduling: str | None) -> RayPlacementGroup:
    return RayPlacementGroup(
        pg_id=pg_id,
        name=pg_id,
        state=state,
        scheduling_state=scheduling,
        strategy=None,
        bundles=(RayBundle(0, gpus, None if state != "CREATED" else "n1"),),
    )


def test_pending_gpus_never_counts_twice() -> None:
    snap = RaySnapshot(
        actors=(
            _actor("PENDING_CREATION", 1.0),  # counted
            _actor("RESTARTING", 2.0),  # counted
            _actor("DEPENDENCIES_UNREADY", 4.0),  # waits for arguments, not GPUs
            _actor("PENDING_CREATION", 1.0, pg="pending-pg"),  # counted with its group
            _actor("PENDING_CREATION", 1.0, pg="created-pg"),  # its bundle is reserved
            _actor("PENDING_CREATION", 8.0, pg="unknown-pg"),  # group not seen: counted
            _actor("PENDING_CREATION", 0.0),  # CPU actor
            _actor("ALIVE", 1.0),
        ),
        placement_groups=(
            _group("pending-pg", "PENDING", 2.0, "NO_RESOURCES"),
            _group("created-pg", "CREATED", 1.0, "FINISHED"),
            _group("removed-pg", "REMOVED", 16.0, "REMOVED"),
        ),
    )
    assert pending_gpus(snap) == {"placement_group": 2.0, "actor": 11.0}


def test_gpu_actor_counts_groups_by_class_and_state() -> None:
    snap = RaySnapshot(
        actors=(
            _actor("ALIVE", 1.0, cls="LLM"),
            _actor("ALIVE", 1.0, cls="LLM", pg="x"),
            _actor("ALIVE", 0.0, cls="Router"),
            _actor("PENDING_CREATION", 0.5, cls="LLM"),
            _actor("DEAD", 1.0, cls="LLM"),
        )
    )
    assert gpu_actor_counts(snap) == {("LLM", "ALIVE"): 2.0, ("LLM", "PENDING_CREATION"): 0.5}


def _node(node_id: str, ip: str, name: str | None, state: str = "ALIVE") -> RayNode:
    return RayNode(node_id, ip, name, state, is_head=False)


@pytest.mark.parametrize(
    ("pod_ip", "pod_name", "expected"),
    [
        ("10.0.0.7", "ray-worker-a", "by-ip"),
        ("", "ray-worker-b", "by-name"),
        ("10.9.9.9", "ray-worker-b", "by-name"),  # IP unknown to Ray: fall back to the name
        ("10.0.0.8", "gone", "alive-same-ip"),  # the dead incarnation is skipped
        ("10.0.0.9", "dead-only", None),
        ("10.9.9.9", "nobody", None),
    ],
)
def test_node_for_pod(pod_ip: str, pod_name: str, expected: str | None) -> None:
    nodes = [
        _node("by-ip", "10.0.0.7", "10.0.0.7"),
        _node("by-name", "10.0.0.6", "ray-worker-b"),
        _node("dead-same-ip", "10.0.0.8", "10.0.0.8", state="DEAD"),
        _node("alive-same-ip", "10.0.0.8", "10.0.0.8"),
        _node("dead-only", "10.0.0.9", "dead-only", state="DEAD"),
    ]
    found = node_for_pod(nodes, pod_ip, pod_name)
    assert (found.node_id if found else None) == expected


def test_one_line() -> None:
    assert one_line("  a\n\tb  c ") == "a b c"
    assert one_line("x" * 300, limit=10) == "x" * 9 + "…"


@pytest.mark.parametrize(
    ("address", "base"),
    [
        ("http://127.0.0.1:8265", "http://127.0.0.1:8265"),
        ("raycluster-head-svc:8265", "http://raycluster-head-svc:8265"),
        (
            "https://k8s/api/v1/namespaces/ml/services/head:8265/proxy/",
            "https://k8s/api/v1/namespaces/ml/services/head:8265/proxy",
        ),
    ],
)
def test_addresses(address: str, base: str) -> None:
    assert RayStateClient(address).base_url == base


@pytest.mark.parametrize("address", ["ftp://host", "http://", "http://host:notaport", "  "])
def test_invalid_addresses(address: str) -> None:
    with pytest.raises(SourceError) as caught:
        RayStateClient(address)
    assert caught.value.reason == "invalid_address"


def test_secrets_stay_out_of_urls_and_repr() -> None:
    assert (
        safe_url("http://user:pw@head:8265/api/v0/nodes?x=1#f") == "http://head:8265/api/v0/nodes"
    )
    client = RayStateClient("http://head:8265", token="s3cr3t-token\n")
    assert "s3cr3t" not in repr(client)
    assert "s3cr3t" not in str(vars(client).get("base_url"))
