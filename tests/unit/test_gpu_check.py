"""scripts/gpu_check.py without a GPU: its NVML side against the fake library (the CUDA
child needs real hardware). Inventory, the MIG view checks, and the message without MIG."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

from gpuledger.sim.fake_nvml import STATE_ENV, build_fake_nvml, write_state
from gpuledger.sim.harness import nvml_state
from gpuledger.sim.scenario import parse_scenario
from tests.conftest import REPO

GPU = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
PARENT = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
MIG = "MIG-cccccccc-0000-5000-8000-000000000000"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Serve a scenario document through the fake library; pynvml initialised on it."""
    state = tmp_path / "nvml.state"
    monkeypatch.setenv(STATE_ENV, str(state))
    lib = ctypes.CDLL(str(build_fake_nvml(cache_dir=tmp_path / "cache")))

    def serve(doc: dict[str, Any]) -> None:
        write_state(state, nvml_state(parse_scenario(doc, "t.yaml")))
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml.nvmlInit()

    yield serve
    while lib.nvmlShutdown() == pynvml.NVML_SUCCESS:
        pass
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0


def mig_node(pid: int) -> dict[str, Any]:
    return {
        "gpus": [
            {"uuid": GPU},
            {"uuid": PARENT, "mig": [{"uuid": MIG, "profile": "1g.10gb", "gpu_instance_id": 9}]},
        ],
        "processes": [{"pid": pid, "gpu_memory": {MIG: "300MiB"}}],
    }


def test_without_mig_it_says_so_and_does_not_fail(
    nvml: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    check = load_script()
    nvml({"gpus": [{"uuid": GPU}]})
    found = check.inventory()
    assert (found.whole, found.migs) == ([GPU], [])
    assert check.check_mig_device(found) == []
    out = capsys.readouterr().out
    assert "MIG: no GPU is in MIG mode: this machine has no MIG device" in out
    assert "the MIG check was not run (no failure)" in out


def test_mig_device_found_read_and_its_series_checked(nvml: Any) -> None:
    check = load_script()
    nvml(mig_node(os.getpid()))
    found = check.inventory()
    assert found.modes == {GPU: (0, 0), PARENT: (1, 1)}
    assert found.migs == [(PARENT, MIG, 9, 0)]
    reader, ledger = check.read_ledger()
    assert check.check_mig_view(reader, ledger, found.migs[0], os.getpid()) == []
    # This process holds 300 MiB on the MIG device only, and calls it cuda:... by UUID.
    view = {p.pid: p for p in ledger.processes}[os.getpid()]
    assert dict(view.gpu_memory) == {MIG: 300 * 1024**2}
    # Wrong instance ids are caught; so is a MIG device missing from the snapshot.
    assert check.check_mig_view(reader, ledger, (PARENT, MIG, 3, 0), os.getpid())
    assert check.check_mig_view(reader, ledger, (GPU, MIG, 9, 0), os.getpid())
    assert check.inventory().modes == found.modes  # read-only


def test_topology_calls_printed_and_the_sources_pairs_checked(
    nvml: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    check = load_script()
    nvml(
        {
            "gpus": [
                {"uuid": GPU, "numa_node": 0, "nvlink_peers": [1]},
                {"uuid": PARENT, "numa_node": 1},
            ]
        }
    )
    assert check.check_topology() == []
    out = capsys.readouterr().out
    assert "GPU 0 - GPU 1: common ancestor system" in out
    assert "link 0 -> 00000000:28:00.0 (type 0)" in out  # GPU 1's bus id, a GPU
    assert f"source: {GPU} - {PARENT}: nvlink" in out


def test_topology_on_one_gpu_prints_its_links_and_needs_no_pair(
    nvml: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    check = load_script()
    nvml({"gpus": [{"uuid": GPU}]})
    assert check.check_topology() == []
    out = capsys.readouterr().out
    assert "NVLink calls: 36 x Not Supported" in out  # a PCIe-only board
    assert "topology: one GPU, no pair to compare (no failure)" in out
