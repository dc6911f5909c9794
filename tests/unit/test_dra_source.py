"""The DRA source's reductions of resource.k8s.io/v1 objects and PodResources entries."""

from __future__ import annotations

from gpuledger.protocols.podresources import api_pb2
from gpuledger.sources.kubernetes.dra import claim_info, slice_devices
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
