"""The fake NVML's topology calls through the real nvidia-ml-py, what the NVML source reads
of them, and the weakest link the join takes (ledger/topology.py)."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from gpuledger.ledger.topology import Topology
from gpuledger.model.nvml import Gpu, GpuLink, MigDevice
from gpuledger.sim.fake_nvml import (
    STATE_ENV,
    FakeGpu,
    FakeNvLink,
    FakeNvmlState,
    FakePlacement,
    write_state,
)
from gpuledger.sources.nvml import NvmlSource
from tests.unit.test_fake_nvml import LoadFn, fake_libs, handle, load

__all__ = ["fake_libs", "load"]  # fixtures, used by name

GIB = 1024**3
UUIDS = [f"GPU-7a000000-0000-4000-8000-{i:012d}" for i in range(6)]
BUS = [f"00000000:{0x18 + 0x10 * i:02X}:00.0" for i in range(6)]
SWITCH = "00000000:C0:00.0"


def _gpu(i: int, lost: bool = False) -> FakeGpu:
    return FakeGpu(i, UUIDS[i], "NVIDIA H100 80GB HBM3", BUS[i], 80 * GIB, 0, 0, 0, lost=lost)


# 0,1 behind switch a; 2 behind a/b (a shared upstream switch); 3 on another host bridge;
# 4 on NUMA node 1; 5 unplaced. NVLinks: 0<->1 (link 0 each), 3 to an NVSwitch, 4 to one.
STATE = FakeNvmlState(
    gpus=tuple(_gpu(i) for i in range(6)),
    placements=(
        FakePlacement(0, 0, 0, ("a",)),
        FakePlacement(1, 0, 0, ("a",)),
        FakePlacement(2, 0, 0, ("a", "b")),
        FakePlacement(3, 0, 1),
        FakePlacement(4, 1, 2),
    ),
    nvlinks=(
        FakeNvLink(0, 0, BUS[1]),
        FakeNvLink(1, 0, BUS[0]),
        FakeNvLink(3, 0, SWITCH, "switch"),
        FakeNvLink(4, 2, SWITCH, "switch"),
    ),
)


@pytest.fixture
def topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.state"
    write_state(path, STATE)
    monkeypatch.setenv(STATE_ENV, str(path))
    return path


def test_common_ancestor_follows_the_placement(topology: Path, load: LoadFn) -> None:
    load()
    level = pynvml.nvmlDeviceGetTopologyCommonAncestor
    assert level(handle(0), handle(1)) == pynvml.NVML_TOPOLOGY_SINGLE
    assert level(handle(0), handle(2)) == pynvml.NVML_TOPOLOGY_MULTIPLE
    assert level(handle(0), handle(3)) == pynvml.NVML_TOPOLOGY_NODE
    assert level(handle(3), handle(0)) == pynvml.NVML_TOPOLOGY_NODE
    assert level(handle(0), handle(4)) == pynvml.NVML_TOPOLOGY_SYSTEM
    with pytest.raises(pynvml.NVMLError_NotSupported):  # NVML cannot place GPU 5
        level(handle(0), handle(5))
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        level(handle(0), handle(0))


def test_hostbridge_when_no_switch_is_shared(
    tmp_path: Path, load: LoadFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "nvml.state"
    placements = (FakePlacement(0, 0, 0, ("a",)), FakePlacement(1, 0, 0, ("b",)))
    write_state(path, FakeNvmlState(gpus=(_gpu(0), _gpu(1)), placements=placements))
    monkeypatch.setenv(STATE_ENV, str(path))
    load()
    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handle(0), handle(1))
    assert level == pynvml.NVML_TOPOLOGY_HOSTBRIDGE


def test_nvlink_state_and_far_end(topology: Path, load: LoadFn) -> None:
    load()
    assert pynvml.nvmlDeviceGetNvLinkState(handle(0), 0) == pynvml.NVML_FEATURE_ENABLED
    far = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle(0), 0)  # calls ..._v2
    assert far.busId == BUS[1] and (far.domain, far.bus, far.device) == (0, 0x28, 0)
    assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle(0), 0) == 0  # a GPU
    assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle(3), 0) == 2  # an NVSwitch
    assert pynvml.nvmlDeviceGetNvLinkState(handle(0), 1) == pynvml.NVML_FEATURE_DISABLED
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no far end on an inactive link
        pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle(0), 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # past the GPU's 18 links
        pynvml.nvmlDeviceGetNvLinkState(handle(0), 18)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no NVLink: a PCIe-only board
        pynvml.nvmlDeviceGetNvLinkState(handle(2), 0)


def test_a_failing_or_lost_gpu_answers_its_error(
    tmp_path: Path, load: LoadFn, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "nvml.state"
    state = FakeNvmlState(
        gpus=(_gpu(0), _gpu(1, lost=True)),
        nvlinks=(FakeNvLink(0, 0, BUS[1]), FakeNvLink(1, 0, BUS[0])),
        nvlink_errors=((0, 999),),
    )
    write_state(path, state)
    monkeypatch.setenv(STATE_ENV, str(path))
    load()
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetNvLinkState(handle(0), 0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetNvLinkState(handle(1), 0)


def _links(lib: Path) -> dict[tuple[int, int], GpuLink]:
    source = NvmlSource(str(lib))
    try:
        links = source.fetch().links
    finally:
        source.close()
    index = {u: i for i, u in enumerate(UUIDS)}
    return {(index[x.a], index[x.b]): x for x in links}


def test_the_source_reads_every_pair(topology: Path, fake_libs: dict[str, Path]) -> None:
    links = _links(fake_libs["default"])
    assert len(links) == 15  # 6 GPUs, every pair once
    assert links[(0, 1)] == GpuLink(UUIDS[0], UUIDS[1], "single", True)
    assert links[(0, 4)].link == "system" and links[(0, 4)].nvlink is False
    assert links[(3, 4)] == GpuLink(UUIDS[3], UUIDS[4], "system", True)  # one NVSwitch fabric
    assert links[(0, 5)].link == "unknown"  # no placement: never guessed
    assert links[(0, 5)].nvlink is False  # but its NVLinks answered: none joins them


def test_without_the_far_end_type_a_switch_is_not_assumed(
    topology: Path, fake_libs: dict[str, Path]
) -> None:
    """An older driver without nvmlDeviceGetNvLinkRemoteDeviceType: a link whose far end
    is no GPU here may reach a switch, so those pairs are unknown; a GPU peer is still
    told by its PCI address."""
    links = _links(fake_libs["no_nvlink_type"])
    assert links[(0, 1)].link == "nvlink"
    assert links[(3, 4)].link == "unknown"
    assert links[(0, 2)].link == "multiple"


def test_the_weakest_link_of_an_engine() -> None:
    a, b, c = "GPU-a", "GPU-b", "GPU-c"
    gpu = Gpu(0, a, "", "", up=True, mig_devices=(MigDevice("MIG-a", a, 0, up=True),))
    topo = Topology.of(
        [gpu],
        [GpuLink(a, b, "single", True), GpuLink(a, c, "system", False), GpuLink(b, c, None, None)],
    )
    assert topo.weakest([a]) is None and topo.weakest(["MIG-a", a]) is None
    assert topo.weakest(["MIG-a", b]) == "nvlink"
    assert topo.weakest([a, b, c]) == "system"  # nothing is weaker than a known system
    assert topo.weakest([b, c]) == "unknown"
    assert topo.weakest([a, "GPU-elsewhere"]) == "unknown"  # a pair NVML did not list
