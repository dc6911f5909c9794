"""The DRA source's reductions of resource.k8s.io/v1 objects and PodResources entries."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from gpuledger.ledger import build_ledger
from gpuledger.model import Snapshots
from gpuledger.model.dra import DRA, NodeDevices
from gpuledger.net.kubeapi import ApiException
from gpuledger.protocols.podresources import api_pb2
from gpuledger.sources.kubernetes import dra, lists
from gpuledger.sources.kubernetes.dra import DraSource, claim_info, slice_devices
from gpuledger.sources.podresources.source import claims_from_response

GPU = "GPU-d2000000-0000-4000-8000-000000000002"
MIG = "MIG-d3a00000-0000-4000-8000-000000000031"


def _slice(driver: str, devices: list[dict[str, object]]) -> dict[str, object]:
    return {"spec": {"driver": driver, "pool": {"name": "n1"}, "devices": devices}}


def test_slice_devices_give_gpu_and_mig_uuids_and_skip_other_drivers() -> None:
    item = _slice(
        "gpu.nvidia.com",
        [
            {"name": "gpu-2", "attributes": {"uuid": {"string": GPU}}},
            {
                "name": "gpu-3-mig-9-0-1",
                "attributes": {
                    "gpu.nvidia.com/uuid": {"string": MIG},
                    "parentUUID": {"string": GPU},
                    "profile": {"string": "1g.10gb"},
                },
            },
            {"name": "no-uuid", "attributes": {}},
        ],
    )
    found = list(slice_devices(item, ("gpu.nvidia.com",)))
    assert [(d.name, d.uuid, d.parent_uuid, d.profile) for d in found] == [
        ("gpu-2", GPU, None, None),
        ("gpu-3-mig-9-0-1", MIG, GPU, "1g.10gb"),
    ]
    assert (
        list(slice_devices(_slice("dra.net", item["spec"]["devices"]), ("gpu.nvidia.com",))) == []
    )  # type: ignore[index]


def test_claim_info_counts_gpu_classes_only() -> None:
    claim = {
        "metadata": {"namespace": "ml", "name": "c", "deletionTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
                    {"name": "b", "firstAvailable": [{"deviceClassName": "mig.nvidia.com"}]},
                    {"name": "nic", "exactly": {"deviceClassName": "dra.net"}},
                ]
            }
        },
        "status": {"reservedFor": [{"name": "p"}]},
    }
    info = claim_info(claim, ("gpu.nvidia.com", "mig.nvidia.com"))
    assert info is not None
    assert (info.gpus, info.device_classes, info.reserved_for, info.deleting) == (
        3,
        ("gpu.nvidia.com", "mig.nvidia.com"),
        1,
        True,
    )
    assert claim_info({"metadata": {"name": "x"}, "spec": {}}, ("gpu.nvidia.com",)) is None


def test_podresources_dynamic_entries_of_gpu_drivers_only() -> None:
    resources = [
        api_pb2.ClaimResource(driver_name="gpu.nvidia.com", pool_name="n1", device_name="gpu-2"),
        api_pb2.ClaimResource(driver_name="dra.net", pool_name="n1", device_name="eth1"),
    ]
    container = api_pb2.ContainerResources(
        name="main",
        dynamic_resources=[
            api_pb2.DynamicResource(claim_name="gpu-claim", claim_resources=resources)
        ],
    )
    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[api_pb2.PodResources(name="p", namespace="ml", containers=[container])]
    )
    [row] = claims_from_response(response, ("gpu.nvidia.com",))
    assert (row.pod, row.device.claim_namespace, row.device.qualified) == (
        "p",
        "ml",
        "gpu.nvidia.com/n1/gpu-2",
    )


def _node_slice(
    node: str, generation: int, uuids: list[str], driver: str = "gpu.nvidia.com"
) -> Any:
    devices = [
        {"name": f"gpu-{i}", "attributes": {"uuid": {"string": u}}} for i, u in enumerate(uuids)
    ]
    pool = {"name": node, "generation": generation}
    return {"spec": {"driver": driver, "nodeName": node, "pool": pool, "devices": devices}}


GPU_CLAIM = {
    "metadata": {"namespace": "ml", "name": "c"},
    "spec": {
        "devices": {"requests": [{"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
    },
}


class _Body:
    def __init__(self, items: list[Any]) -> None:
        self.body = json.dumps({"items": items, "metadata": {}}).encode()

    def release_conn(self) -> None:
        pass


def _cluster_source(monkeypatch: pytest.MonkeyPatch, slices: list[Any] | int) -> DraSource:
    """A cluster-mode source whose API lists GPU_CLAIM, and `slices` (an HTTP status: fails)."""

    def list_objects(client: Any, path: str, **params: Any) -> _Body:
        if not path.endswith("/resourceslices"):
            return _Body([GPU_CLAIM])
        assert params["field_selector"] is None  # every node's slices
        if isinstance(slices, int):
            raise ApiException(status=slices, reason="Forbidden")
        return _Body(slices)

    monkeypatch.setattr(dra.kubeapi, "list_objects", list_objects)
    monkeypatch.setattr(lists, "read_bounded", lambda body, limit, deadline: body.body)
    client = SimpleNamespace(configuration=SimpleNamespace(host="https://k8s:6443"))
    return DraSource("cluster", api_client=client)


def test_cluster_view_counts_gpu_devices_per_node_from_each_pools_newest_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = _cluster_source(
        monkeypatch,
        [
            _node_slice("n1", 1, [GPU, MIG]),  # republished below: gone once generation 2 is
            _node_slice("n1", 2, [GPU]),
            _node_slice("n1", 2, [MIG]),  # a pool of two slices
            _node_slice("n2", 1, []),  # publishes no GPU device: not a GPU node
            _node_slice("n3", 1, [GPU], driver="dra.net"),
            {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": "rack"}, "allNodes": True}},
        ],
    )
    snapshot = source.fetch()
    assert [c.name for c in snapshot.claims] == ["c"]
    assert snapshot.nodes == (NodeDevices("n1", "gpu.nvidia.com", 2),)
    assert (snapshot.nodes_error, list(source.item_errors(snapshot))) == (None, [])


def test_cluster_view_keeps_its_claims_when_the_slices_cannot_be_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A chart from before list on resourceslices: pending pods' claims still count, the
    # failure is an item error, and /ledger.json says what is not known.
    source = _cluster_source(monkeypatch, 403)
    snapshot = source.fetch()
    assert [c.name for c in snapshot.claims] == ["c"]
    assert (snapshot.nodes, snapshot.nodes_error) == ((), "forbidden")
    assert list(source.item_errors(snapshot)) == ["forbidden"]
    ledger = build_ledger(Snapshots({DRA: snapshot}), node="x", mode="cluster", taken_at=0.0)
    assert ledger.dra_nodes == ()
    assert any("ResourceSlices not listed (forbidden)" in u for u in ledger.unknowns)
