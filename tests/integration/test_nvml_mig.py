"""The NVML source on a MIG node: each GPU's MIG devices, and every process on the MIG
device it runs on, read through the real nvidia-ml-py from the fake library."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from gpuledger.model.nvml import GpuProcess, MigDevice, NvmlSnapshot
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import parse_scenario
from gpuledger.sources import nvml as nvml_source
from gpuledger.sources.nvml import NvmlSource

GIB = 1024**3
GPU0 = "GPU-0aaaaaaa-0000-4000-8000-000000000000"
GPU1 = "GPU-1bbbbbbb-0000-4000-8000-000000000001"
MIG_A = "MIG-aaaaaaaa-1111-5000-8000-000000000000"
MIG_B = "MIG-bbbbbbbb-1111-5000-8000-000000000001"
MIG_C = "MIG-cccccccc-1111-5000-8000-000000000002"


def scenario(**gpu1: Any) -> dict[str, Any]:
    return {
        "gpus": [
            {"uuid": GPU0, "utilization": 0.5},
            {
                "uuid": GPU1,
                "mig": [
                    {"profile": "1g.10gb", "uuid": MIG_A, "gpu_instance_id": 7},
                    {"profile": "3g.40gb", "uuid": MIG_B, "index": 3, "gpu_instance_id": 2},
                    {"profile": "1c.3g.40gb", "uuid": MIG_C, "index": 5, "gpu_instance_id": 1},
                ],
                **gpu1,
            },
        ],
        "processes": [
            {"pid": 100, "gpu_memory": {GPU0: "20GiB"}},
            {"pid": 200, "gpu_memory": {MIG_A: "3GiB"}},
            {"pid": 201, "gpu_memory": {MIG_B: "12GiB"}},
            {"pid": 202, "gpu_memory": {MIG_B: "1GiB"}},
        ],
    }


@pytest.fixture
def read() -> Iterator[Any]:
    nodes: list[SimulatedNode] = []
    sources: list[NvmlSource] = []

    def _read(doc: dict[str, Any]) -> NvmlSnapshot:
        node = SimulatedNode(parse_scenario(doc, "t.yaml"))
        nodes.append(node)
        source = NvmlSource(node.library_path)
        sources.append(source)
        return source.fetch()

    yield _read
    for source in sources:
        source.close()
    for node in nodes:
        node.close()


def test_mig_devices_and_their_processes(read: Any) -> None:
    snapshot = read(scenario())
    plain, parent = snapshot.gpus
    assert plain.mig_devices == ()
    assert plain.utilization_ratio == 0.5
    assert plain.processes == (GpuProcess(100, 20 * GIB),)
    assert parent.mig_mode == "enabled"
    assert parent.utilization_ratio is None  # NVML has none in MIG mode
    assert parent.processes == ()  # they run on its MIG devices
    assert parent.memory_used_bytes == 16 * GIB
    assert parent.mig_devices == (
        MigDevice(
            MIG_A,
            GPU1,
            0,
            up=True,
            gpu_instance_id=7,
            compute_instance_id=0,
            profile="1g.10gb",
            memory_total_bytes=10 * GIB,
            memory_used_bytes=3 * GIB,
            processes=(GpuProcess(200, 3 * GIB),),
        ),
        MigDevice(
            MIG_B,
            GPU1,
            3,
            up=True,
            gpu_instance_id=2,
            compute_instance_id=0,
            profile="3g.40gb",
            memory_total_bytes=40 * GIB,
            memory_used_bytes=13 * GIB,
            processes=(GpuProcess(201, 12 * GIB), GpuProcess(202, 1 * GIB)),
        ),
        MigDevice(
            MIG_C,
            GPU1,
            5,
            up=True,
            gpu_instance_id=1,
            compute_instance_id=0,
            profile="1c.3g.40gb",
            memory_total_bytes=40 * GIB,
            memory_used_bytes=0,
            processes=(),
        ),
    )


def test_a_lost_mig_gpu_is_down_with_no_invented_instances(read: Any) -> None:
    doc = scenario(lost=True)
    snapshot = read(doc)
    parent = snapshot.gpus[1]
    assert (parent.up, parent.error_reason, parent.mig_devices) == (False, "gpu_is_lost", ())
    assert snapshot.gpus[0].up


def test_profile_from_attributes_when_the_name_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    class Attributes:
        gpuInstanceSliceCount = 3
        computeInstanceSliceCount = 1
        memorySizeMB = 40192  # NVML's MiB for a 3g.40gb slice of an 80 GB H100

    monkeypatch.setattr(pynvml, "nvmlDeviceGetAttributes", lambda handle: Attributes)
    assert nvml_source._mig_profile(None, "NVIDIA H100 80GB HBM3 MIG 2g.20gb") == "2g.20gb"
    assert nvml_source._mig_profile(None, "NVIDIA H100 80GB HBM3") == "1c.3g.40gb"
    Attributes.computeInstanceSliceCount = 3
    assert nvml_source._mig_profile(None, "") == "3g.40gb"
