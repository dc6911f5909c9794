"""MIG in the fake libnvidia-ml.so.1: a scenario's MIG layout, read back through the calls
the real nvidia-ml-py makes (pynvml), as gpuledger and nvidia-smi would read it."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from gpuledger.sim.fake_nvml import STATE_ENV, FakeMig, FakeNvmlState, build_fake_nvml, write_state
from gpuledger.sim.harness import nvml_state
from gpuledger.sim.scenario import ScenarioError, parse_scenario

GIB = 1024**3
MIB = 1024**2
GPU0 = "GPU-3f1c2a6e-0b7d-4c8e-9a51-2d6f0e4b7a10"
GPU1 = "GPU-8a2d4c1b-5e6f-4a70-8b9c-0d1e2f3a4b5c"
MIG_A = "MIG-6f2d4c1a-0b7d-5c8e-9a51-2d6f0e4b7a11"
MIG_B = "MIG-7e3c5d2b-1c8e-5d9f-8b62-3e7a1f5c8b22"
MIG_C = "MIG-8d4b6e3c-2d9f-5e0a-9c73-4f8b2a6d9c33"
NOT_IN_INSTANCE = 0xFFFFFFFF

SCENARIO = f"""
gpus:
  - uuid: {GPU0}
    memory_reserved: 1GiB
  - uuid: {GPU1}
    memory_reserved: 512MiB
    mig:
      - {{profile: 1g.10gb, uuid: {MIG_A}, gpu_instance_id: 9, memory_used: 5GiB}}
      - {{profile: 3g.40gb, uuid: {MIG_B}, index: 2, gpu_instance_id: 2}}
      - {{profile: 1c.3g.40gb, uuid: {MIG_C}, index: 4, gpu_instance_id: 1,
          compute_instance_id: 2, memory_total: 39GiB}}
processes:
  - {{pid: 100, gpu_memory: {{{GPU0}: 20GiB}}}}
  - {{pid: 200, gpu_memory: {{{MIG_A}: 3GiB}}}}
  - {{pid: 201, gpu_memory: {{{MIG_B}: 12GiB}}}}
  - {{pid: 202, gpu_memory: {{{MIG_B}: 4GiB}}}}
"""


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """pynvml on the fake, serving SCENARIO; undone afterwards."""
    state = tmp_path / "nvml.state"
    write_state(state, nvml_state(parse_scenario(yaml.safe_load(SCENARIO), "t.yaml")))
    monkeypatch.setenv(STATE_ENV, str(state))
    lib = ctypes.CDLL(str(build_fake_nvml(cache_dir=tmp_path / "cache")))
    pynvml.nvmlLib = lib
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()
    yield lib
    while lib.nvmlShutdown() == pynvml.NVML_SUCCESS:
        pass
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0


def migs_of(parent: Any) -> list[Any]:
    """Every MIG handle of a GPU, the way a reader walks them (empty slots are NOT_FOUND)."""
    found = []
    for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            found.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i))
        except pynvml.NVMLError_NotFound:
            continue
    return found


def test_mig_devices_are_what_the_scenario_says(nvml: ctypes.CDLL) -> None:
    plain, parent = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert pynvml.nvmlDeviceGetMigMode(parent) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(plain) == 0
    assert migs_of(plain) == []
    migs = migs_of(parent)
    rows = [
        (
            pynvml.nvmlDeviceGetUUID(h),
            pynvml.nvmlDeviceGetIndex(h),
            pynvml.nvmlDeviceGetName(h),
            pynvml.nvmlDeviceGetGpuInstanceId(h),
            pynvml.nvmlDeviceGetComputeInstanceId(h),
        )
        for h in migs
    ]
    name = "NVIDIA H100 80GB HBM3 MIG "
    assert rows == [
        (MIG_A, 0, name + "1g.10gb", 9, 0),
        (MIG_B, 2, name + "3g.40gb", 2, 0),
        (MIG_C, 4, name + "1c.3g.40gb", 1, 2),
    ]
    for h in migs:
        assert pynvml.nvmlDeviceIsMigDeviceHandle(h).value == 1
        back = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)
        assert pynvml.nvmlDeviceGetUUID(back) == GPU1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(parent)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)  # an empty slot
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(MIG_B)
    assert pynvml.nvmlDeviceGetIndex(by_uuid) == 2


def test_mig_attributes_give_the_profile(nvml: ctypes.CDLL) -> None:
    a, b, c = migs_of(pynvml.nvmlDeviceGetHandleByIndex(1))
    attrs = [pynvml.nvmlDeviceGetAttributes(h) for h in (a, b, c)]
    assert [(x.gpuInstanceSliceCount, x.computeInstanceSliceCount) for x in attrs] == [
        (1, 1),
        (3, 3),
        (3, 1),
    ]
    assert [x.memorySizeMB for x in attrs] == [10 * 1024, 40 * 1024, 39 * 1024]
    assert [x.multiprocessorCount for x in attrs] == [16, 60, 16]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetAttributes(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_mig_memory_and_no_utilization(nvml: ctypes.CDLL) -> None:
    plain, parent = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    a, b, c = migs_of(parent)
    for version in (None, pynvml.nvmlMemory_v2):
        used = [pynvml.nvmlDeviceGetMemoryInfo(h, version=version).used for h in (a, b, c)]
        total = [pynvml.nvmlDeviceGetMemoryInfo(h, version=version).total for h in (a, b, c)]
        # memory_used as written; else its processes' memory summed.
        assert used == [5 * GIB, 16 * GIB, 0]
        assert total == [10 * GIB, 40 * GIB, 39 * GIB]
        # The GPU's memory holds its reserve and every instance's.
        parent_used = pynvml.nvmlDeviceGetMemoryInfo(parent, version=version).used
        assert parent_used == 512 * MIB + 21 * GIB
    # NVML reports no utilization on a MIG device, nor on a GPU in MIG mode: never invented.
    for h in (parent, a, b, c):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetUtilizationRates(h)
    assert pynvml.nvmlDeviceGetUtilizationRates(plain).gpu == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(a)


def test_processes_per_mig_device_and_in_the_aggregate(nvml: ctypes.CDLL) -> None:
    plain, parent = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    a, b, c = migs_of(parent)

    def listed(handle: Any) -> list[tuple[int, int, int, int]]:
        return [
            (p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        ]

    assert listed(a) == [(200, 3 * GIB, 9, 0)]
    assert listed(b) == [(201, 12 * GIB, 2, 0), (202, 4 * GIB, 2, 0)]
    assert listed(c) == []
    # The parent's list (what a privileged caller gets): every instance's, with its ids.
    assert listed(parent) == [
        (200, 3 * GIB, 9, 0),
        (201, 12 * GIB, 2, 0),
        (202, 4 * GIB, 2, 0),
    ]
    assert listed(plain) == [(100, 20 * GIB, NOT_IN_INSTANCE, NOT_IN_INSTANCE)]
    v2 = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(b)
    assert [(p.pid, p.gpuInstanceId) for p in v2] == [(201, 2), (202, 2)]
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(a) == []


def test_a_lost_parent_loses_its_mig_devices(nvml: ctypes.CDLL) -> None:
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    a = migs_of(parent)[0]
    doc = yaml.safe_load(SCENARIO)
    doc["gpus"][1]["lost"] = True
    write_state(Path(os.environ[STATE_ENV]), nvml_state(parse_scenario(doc, "t.yaml")))
    pynvml.nvmlDeviceGetCount()  # the fake reloads its state here
    assert pynvml.nvmlDeviceGetUUID(a) == MIG_A  # static identity stays
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(a)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetComputeRunningProcesses(a)


def test_mig_handles_go_when_mig_mode_does(nvml: ctypes.CDLL) -> None:
    parent = pynvml.nvmlDeviceGetHandleByIndex(1)
    a = migs_of(parent)[0]
    doc = yaml.safe_load(SCENARIO)
    doc["gpus"][1] = {"uuid": GPU1}
    doc["processes"] = []
    write_state(Path(os.environ[STATE_ENV]), nvml_state(parse_scenario(doc, "t.yaml")))
    pynvml.nvmlDeviceGetCount()
    assert migs_of(parent) == []
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(a)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mig_mode": False}, "no MIG devices on a GPU with mig_mode: false"),
        ({"mig": [{"profile": "1g.10gb", "uuid": "GPU-x"}]}, "starting with MIG-"),
        ({"mig": [{"profile": "10gb", "uuid": MIG_A}]}, "a MIG profile like"),
        ({"mig": [{"profile": "3c.1g.10gb", "uuid": MIG_A}]}, "a MIG profile like"),
        ({"mig": [{"profile": "1g.10gb", "uuid": MIG_A, "index": 7}]}, "index below 7"),
        ({"mig": [{"profile": "1g.10gb", "uuid": MIG_A, "memroy_used": 1}]}, "did you mean"),
        (
            {
                "mig": [
                    {"profile": "1g.10gb", "uuid": MIG_A, "gpu_instance_id": 3},
                    {"profile": "1g.10gb", "uuid": MIG_B, "gpu_instance_id": 3},
                ]
            },
            "unique instance ids",
        ),
    ],
)
def test_mig_layout_errors(change: dict[str, Any], message: str) -> None:
    doc = yaml.safe_load(SCENARIO)
    doc["gpus"][1] = {"uuid": GPU1, **doc["gpus"][1], **change}
    doc["processes"] = []
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(doc, "t.yaml")


def test_processes_name_the_mig_device_not_its_gpu() -> None:
    doc = yaml.safe_load(SCENARIO)
    doc["processes"] = [{"pid": 300, "gpu_memory": {GPU1: "1GiB"}}]
    with pytest.raises(ScenarioError, match=r"processes\[0\]\.gpu_memory.*MIG device UUID"):
        parse_scenario(doc, "t.yaml")
    doc["processes"] = []
    doc["gpus"][0]["uuid"] = MIG_A
    with pytest.raises(ScenarioError, match="unique GPU and MIG UUIDs"):
        parse_scenario(doc, "t.yaml")


def test_a_phase_that_removes_a_mig_device_under_a_process_fails() -> None:
    doc = yaml.safe_load(SCENARIO)
    doc["phases"] = [{"name": "reshaped", "gpus": {GPU1: {"mig": []}}}]
    scenario = parse_scenario(doc, "t.yaml")
    with pytest.raises(ScenarioError, match=r"processes\.200\.gpu_memory"):
        scenario.at_phase("reshaped")
    doc["phases"] = [{"name": "typo", "gpus": {GPU1: {"mig": [{"uuid": MIG_A}]}}}]
    with pytest.raises(ScenarioError, match=r"phases\[0\]\.gpus\..*profile"):
        parse_scenario(doc, "t.yaml")


def test_render_state_refuses_impossible_mig_layouts() -> None:
    state = nvml_state(parse_scenario(yaml.safe_load(SCENARIO), "t.yaml"))
    one = state.migs[0]
    cases: list[tuple[FakeNvmlState, str]] = [
        (FakeNvmlState(gpus=state.gpus, migs=(one, one)), "duplicate MIG device slots"),
        (
            FakeNvmlState(gpus=state.gpus[:1], migs=(FakeMig(**{**one.__dict__, "gpu_index": 0}),)),
            "not in MIG mode",
        ),
        (
            FakeNvmlState(gpus=state.gpus, migs=(FakeMig(**{**one.__dict__, "index": 7}),)),
            r"index must be an integer in \[0, 6\]",
        ),
        (
            FakeNvmlState(gpus=state.gpus, migs=(FakeMig(**{**one.__dict__, "uuid": GPU0}),)),
            "must be unique",
        ),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            write_state(Path("/nonexistent/never-written"), bad)
