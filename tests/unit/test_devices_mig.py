"""MIG device ids -> MIG devices (identity rule 4): PodResources device ids under the device
plugin's single and mixed strategies and its index strategy, NVIDIA_VISIBLE_DEVICES and
CUDA_VISIBLE_DEVICES, each resolving to the right MIG UUID or to nothing."""

from __future__ import annotations

import pytest

from gpuledger.identity.devices import (
    HostGpu,
    apply_cuda_visible_devices,
    container_device_map,
    parse_nvidia_visible_devices,
)

G0 = HostGpu(0, "GPU-0c0c0c0c-0000-4000-8000-000000000000", "00000000:18:00.0")
G1 = HostGpu(1, "GPU-1d1d1d1d-1111-4111-8111-111111111111", "00000000:2A:00.0")
G2 = HostGpu(2, "GPU-2e2e2e2e-2222-4222-8222-222222222222", "00000000:3A:00.0")


def mig(parent: HostGpu, n: int, gi: int, ci: int = 0) -> HostGpu:
    return HostGpu(
        parent.index,
        f"MIG-{parent.index}{n}{n}{n}aaaa-0000-5000-8000-00000000000{n}",
        parent.pci_bus_id,
        parent.uuid,
        gpu_instance_id=gi,
        compute_instance_id=ci,
    )


# GPU 1 and GPU 2 in MIG mode; MIG devices in MIG device index order under each parent.
M10, M11, M12 = mig(G1, 0, 7), mig(G1, 1, 8), mig(G1, 2, 2, 1)
M20, M21 = mig(G2, 0, 1), mig(G2, 1, 2)
HOST = (G0, G1, M10, M11, M12, G2, M20, M21)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (M11.uuid, (M11,)),
        (M11.uuid.lower(), (M11,)),
        ("1:1", (M11,)),
        ("2:0,1:2", (M12, M20)),  # CUDA order: PCI bus order, then MIG device index
        (f"{M21.uuid},{M10.uuid}", (M10, M21)),
        ("1:3", ()),  # no MIG device 3 on GPU 1
        ("0:0", ()),  # GPU 0 is not in MIG mode
        (f"MIG-{G1.uuid}/8/0", (M11,)),  # legacy, by instance ids
        (f"MIG-{G1.uuid}/2/1", (M12,)),
        (f"MIG-{G1.uuid}/2/0", ()),  # no such compute instance
        (f"MIG-{G0.uuid}/1/0", ()),
        ("all", (G0, G1, G2)),  # `all` gives the GPUs, not their MIG devices
    ],
)
def test_nvidia_visible_devices_naming_mig_devices(
    value: str, expected: tuple[HostGpu, ...]
) -> None:
    assert parse_nvidia_visible_devices(value, HOST) == expected


@pytest.mark.parametrize(
    ("resource", "ids", "expected"),
    [
        # single strategy: nvidia.com/gpu whose devices are MIG UUIDs
        ("nvidia.com/gpu", [M21.uuid], (M21,)),
        ("nvidia.com/gpu", [M12.uuid, M10.uuid], (M10, M12)),
        # mixed strategy: nvidia.com/mig-<profile>, MIG UUIDs too
        ("nvidia.com/mig-1g.10gb", [M11.uuid], (M11,)),
        # time-slicing replicas of a MIG device
        ("nvidia.com/mig-1g.10gb", [f"{M11.uuid}::3", f"{M11.uuid}::4"], (M11,)),
        # the device plugin's index strategy: <gpu>:<mig>
        ("nvidia.com/mig-3g.40gb", ["2:1"], (M21,)),
        ("nvidia.com/gpu", ["1:2", "1:0"], (M10, M12)),
    ],
)
def test_podresources_device_ids_resolve_to_mig_devices(
    resource: str, ids: list[str], expected: tuple[HostGpu, ...]
) -> None:
    del resource  # both strategies give the same kind of id; the name does not matter
    assert container_device_map(None, None, None, HOST, allocated_uuids=ids) == expected


def test_a_process_names_its_mig_device_by_uuid_prefix_ordinal_or_legacy_id() -> None:
    given = container_device_map(None, None, None, HOST, allocated_uuids=[M10.uuid, M20.uuid])
    assert given == (M10, M20)
    assert apply_cuda_visible_devices(None, given) == (M10, M20)
    assert apply_cuda_visible_devices("1", given) == (M20,)
    assert apply_cuda_visible_devices(M20.uuid[:10], given) == (M20,)
    assert apply_cuda_visible_devices(f"MIG-{G2.uuid}/1/0", given) == (M20,)
    # A MIG device the container was not given is invalid, and parsing stops there.
    assert apply_cuda_visible_devices(f"0,{M11.uuid},1", given) == (M10,)
    assert apply_cuda_visible_devices(f"MIG-{G1.uuid}/8/0", given) == ()


def test_environment_and_process_filter_together() -> None:
    got = container_device_map(f"{M12.uuid},2:1", f"MIG-{G2.uuid}/2/0", None, HOST)
    assert got == (M21,)


def test_legacy_form_needs_the_instance_ids() -> None:
    bare = HostGpu(1, M11.uuid, G1.pci_bus_id, G1.uuid)  # NVML gave no instance ids
    assert parse_nvidia_visible_devices(f"MIG-{G1.uuid}/8/0", (G1, bare)) == ()


def test_index_form_names_nvml_mig_device_index_not_position() -> None:
    """`<gpu>:<mig>` is what the toolkit passes to nvmlDeviceGetMigDeviceHandleByIndex:
    with MIG devices 0 and 3 only, `1:3` is the second of them and `1:1` is none."""
    first = HostGpu(1, "MIG-10000000-0000-5000-8000-000000000000", G1.pci_bus_id, G1.uuid, 1, 0, 0)
    fourth = HostGpu(1, "MIG-13333333-0000-5000-8000-000000000003", G1.pci_bus_id, G1.uuid, 2, 0, 3)
    host = (G0, G1, first, fourth)
    assert parse_nvidia_visible_devices("1:3", host) == (fourth,)
    assert parse_nvidia_visible_devices("1:1", host) == ()
    assert container_device_map(None, None, None, host, allocated_uuids=["1:0", "1:3"]) == (
        first,
        fourth,
    )
