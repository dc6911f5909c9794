"""The fake libnvidia-ml.so.1, exercised through the real nvidia-ml-py (pynvml)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from gpuledger.sim.fake_nvml import (
    STATE_ENV,
    VARIANTS,
    FakeGpu,
    FakeNvmlBuildError,
    FakeNvmlState,
    FakeProcess,
    build_fake_nvml,
    render_state,
    write_state,
)

GIB = 1024**3
UUID0 = "GPU-3f1c2a6e-0b7d-4c8e-9a51-2d6f0e4b7a10"
UUID1 = "GPU-8a2d4c1b-5e6f-4a70-8b9c-0d1e2f3a4b5c"

GPU0 = FakeGpu(
    index=0,
    uuid=UUID0,
    name="NVIDIA H100 80GB HBM3",
    pci_bus_id="00000000:18:00.0",
    memory_total=80 * GIB,
    memory_used=40 * GIB,
    util_gpu=37,
    util_memory=12,
)
GPU1 = FakeGpu(
    index=1,
    uuid=UUID1,
    name="NVIDIA H100 80GB HBM3",
    pci_bus_id="0000:2a:00.0",  # legacy spelling: NVML answers with its own
    memory_total=80 * GIB,
    memory_used=1 * GIB,
    util_gpu=0,
    util_memory=0,
    mig_mode=True,
)
PROCS = (
    FakeProcess(gpu_index=0, pid=4242, used_memory=30 * GIB),
    FakeProcess(gpu_index=0, pid=4243, used_memory=8 * GIB),
    FakeProcess(gpu_index=0, pid=77, used_memory=2 * GIB),
)
STATE = FakeNvmlState(gpus=(GPU0, GPU1), processes=PROCS)

LoadFn = Callable[..., ctypes.CDLL]


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One compile per variant for the whole session."""
    cache = tmp_path_factory.mktemp("fake-nvml-cache")
    return {
        "default": build_fake_nvml(cache_dir=cache),
        **{v: build_fake_nvml(frozenset({v}), cache_dir=cache) for v in VARIANTS},
    }


@pytest.fixture
def state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "nvml.state"
    write_state(path, STATE)
    monkeypatch.setenv(STATE_ENV, str(path))
    return path


@pytest.fixture
def load(fake_libs: dict[str, Path]) -> Iterator[LoadFn]:
    """Points pynvml at a fake library variant; undoes it (and any init) afterwards."""
    loaded: list[ctypes.CDLL] = []

    def _load(variant: str = "default", *, init: bool = True) -> ctypes.CDLL:
        lib = ctypes.CDLL(str(fake_libs[variant]))
        loaded.append(lib)
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        if init:
            pynvml.nvmlInit()
        return lib

    yield _load
    for lib in loaded:
        # dlopen returns the same library (and init count) to later tests: drain it.
        for _ in range(1000):
            if lib.nvmlShutdown() != pynvml.NVML_SUCCESS:
                break
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0


def handle(index: int) -> object:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def test_identity(state_file: Path, load: LoadFn) -> None:
    load()
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    h0, h1 = handle(0), handle(1)
    assert pynvml.nvmlDeviceGetUUID(h0) == UUID0
    assert pynvml.nvmlDeviceGetUUID(h1) == UUID1
    assert pynvml.nvmlDeviceGetName(h0) == "NVIDIA H100 80GB HBM3"
    assert pynvml.nvmlDeviceGetIndex(h1) == 1
    pci = pynvml.nvmlDeviceGetPciInfo_v3(h1)
    assert pci.busId == "00000000:2A:00.0"
    assert pci.busIdLegacy == "0000:2A:00.0"
    assert (pci.domain, pci.bus, pci.device) == (0, 0x2A, 0)
    assert pci.pciDeviceId == 0x233010DE
    assert pynvml.nvmlDeviceGetPciInfo_v3(h0).busId == "00000000:18:00.0"
    assert pynvml.nvmlDeviceGetCudaComputeCapability(h0) == (9, 0)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h0) == 0
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(UUID1)
    assert pynvml.nvmlDeviceGetIndex(by_uuid) == 1
    by_bus = pynvml.nvmlDeviceGetHandleByPciBusId("0000:18:00.0")
    assert pynvml.nvmlDeviceGetUUID(by_bus) == UUID0
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        handle(2)
    assert 0 < pynvml.nvmlDeviceGetPowerUsage(h0) < 700_000
    assert 20 < pynvml.nvmlDeviceGetTemperature(h0, pynvml.NVML_TEMPERATURE_GPU) < 100


def test_memory_utilization_and_mig(state_file: Path, load: LoadFn) -> None:
    load()
    h0, h1 = handle(0), handle(1)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h0)
    assert (v1.total, v1.used, v1.free) == (80 * GIB, 40 * GIB, 40 * GIB)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.used, v2.free) == (80 * GIB, 0, 40 * GIB, 40 * GIB)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(h0, version=0x01000028)
    util = pynvml.nvmlDeviceGetUtilizationRates(h0)
    assert (util.gpu, util.memory) == (37, 12)
    assert pynvml.nvmlDeviceGetMigMode(h0) == [0, 0]
    assert pynvml.nvmlDeviceGetMigMode(h1) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2


def test_compute_processes(state_file: Path, load: LoadFn) -> None:
    load()
    h0, h1 = handle(0), handle(1)
    for query in (
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
        pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
    ):
        procs = query(h0)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [
            (4242, 30 * GIB),
            (4243, 8 * GIB),
            (77, 2 * GIB),
        ]
        assert {(p.gpuInstanceId, p.computeInstanceId) for p in procs} == {(0xFFFFFFFF, 0xFFFFFFFF)}
        assert query(h1) == []
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(h0) == []


def test_process_count_protocol_at_the_c_abi(state_file: Path, load: LoadFn) -> None:
    lib = load()
    h0, h1 = handle(0), handle(1)
    fn = lib.nvmlDeviceGetComputeRunningProcesses_v3
    count = ctypes.c_uint(0)
    assert fn(h0, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    small = (pynvml.c_nvmlProcessInfo_v3_t * 1)()
    count.value = 1
    assert fn(h0, ctypes.byref(count), small) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    count.value = 0
    assert fn(h1, ctypes.byref(count), None) == pynvml.NVML_SUCCESS
    assert count.value == 0

    # The unversioned v1 entry point fills the short {pid, usedGpuMemory} struct.
    class ProcV1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    v1 = (ProcV1 * 4)()
    count.value = 4
    assert lib.nvmlDeviceGetComputeRunningProcesses(h0, ctypes.byref(count), v1) == 0
    assert count.value == 3
    assert [(p.pid, p.usedGpuMemory) for p in v1[:3]] == [
        (4242, 30 * GIB),
        (4243, 8 * GIB),
        (77, 2 * GIB),
    ]
    assert lib.nvmlDeviceGetComputeRunningProcesses(h0, None, v1) == (
        pynvml.NVML_ERROR_INVALID_ARGUMENT
    )


def test_no_v3_variant(state_file: Path, load: LoadFn) -> None:
    load("no_v3")
    h0 = handle(0)
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h0)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h0)] == [4242, 4243, 77]
    assert pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2).used == 40 * GIB


def test_no_memory_v2_variant(state_file: Path, load: LoadFn) -> None:
    load("no_memory_v2")
    h0 = handle(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2)
    assert pynvml.nvmlDeviceGetMemoryInfo(h0).used == 40 * GIB
    assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(h0)) == 3


def test_lost_gpu(state_file: Path, load: LoadFn) -> None:
    lost = FakeGpu(**{**GPU0.__dict__, "lost": True})
    write_state(state_file, FakeNvmlState(gpus=(lost, GPU1), processes=PROCS))
    load()
    h0, h1 = handle(0), handle(1)
    assert pynvml.nvmlDeviceGetUUID(h0) == UUID0
    assert pynvml.nvmlDeviceGetName(h0) == GPU0.name
    assert pynvml.nvmlDeviceGetIndex(h0) == 0
    assert pynvml.nvmlDeviceGetPciInfo_v3(h0).bus == 0x18
    for query in (
        pynvml.nvmlDeviceGetMemoryInfo,
        pynvml.nvmlDeviceGetUtilizationRates,
        pynvml.nvmlDeviceGetMigMode,
        pynvml.nvmlDeviceGetComputeRunningProcesses,
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            query(h0)
    assert pynvml.nvmlDeviceGetMemoryInfo(h1).used == 1 * GIB


def test_init_error(state_file: Path, load: LoadFn) -> None:
    write_state(state_file, FakeNvmlState(gpus=(GPU0,), init_error=9))
    load(init=False)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    write_state(state_file, FakeNvmlState(gpus=(GPU0,)))
    pynvml.nvmlInit()  # the driver "came back": init re-reads the file
    assert pynvml.nvmlDeviceGetCount() == 1


def test_uninitialized_and_refcount(state_file: Path, load: LoadFn) -> None:
    load(init=False)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    h0 = handle(0)
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetUUID(h0) == UUID0  # one init still outstanding
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetUUID(h0)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_missing_state_means_zero_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load: LoadFn
) -> None:
    monkeypatch.delenv(STATE_ENV, raising=False)
    load()
    assert pynvml.nvmlDeviceGetCount() == 0
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "does-not-exist"))
    assert pynvml.nvmlDeviceGetCount() == 0


def test_rewrite_is_seen_on_next_count(
    state_file: Path, monkeypatch: pytest.MonkeyPatch, load: LoadFn
) -> None:
    load()
    h0 = handle(0)
    assert pynvml.nvmlDeviceGetCount() == 2
    busier = FakeGpu(**{**GPU0.__dict__, "memory_used": 70 * GIB, "util_gpu": 99})
    write_state(state_file, FakeNvmlState(gpus=(busier,), driver_version="560.35.03"))
    assert pynvml.nvmlDeviceGetCount() == 1
    # The old handle now reads the new values; the removed GPU's index is invalid.
    assert pynvml.nvmlDeviceGetMemoryInfo(h0).used == 70 * GIB
    assert pynvml.nvmlDeviceGetUtilizationRates(h0).gpu == 99
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h0) == []
    assert pynvml.nvmlSystemGetDriverVersion() == "560.35.03"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        handle(1)
    # The harness may also repoint the variable at another file.
    other = state_file.with_name("other.state")
    write_state(other, STATE)
    monkeypatch.setenv(STATE_ENV, str(other))
    assert pynvml.nvmlDeviceGetCount() == 2


def test_garbage_lines_are_ignored(state_file: Path, load: LoadFn) -> None:
    good = render_state(FakeNvmlState(gpus=(GPU0,), processes=PROCS[:1]))
    garbage = [
        "",
        "   ",
        "# a comment",
        "  # an indented comment",
        "gpu",
        "gpu 1",
        "gpu x GPU-x 00000000:19:00.0 1 1 1 1 0 ok Name",
        "gpu 2 GPU-2 not-a-bus-id 1 1 1 1 0 ok Name",
        "gpu 3 GPU-3 00000000:1A:00.0 -5 1 1 1 0 ok Name",
        "gpu 4 GPU-4 00000000:1B:00.0 1 1 1 1 2 ok Name",
        "gpu 5 GPU-5 00000000:1C:00.0 1 1 1 1 0 maybe Name",
        "gpu 6 GPU-6 00000000:1D:00.0 1 1 1 1 0 ok",
        "gpu 64 GPU-64 00000000:1E:00.0 1 1 1 1 0 ok Too Far",
        "gpu 7 GPU-7 00000000:1F:00.0 99999999999999999999999 1 1 1 0 ok Overflow",
        "gpu 8 " + "U" * 500 + " 00000000:20:00.0 1 1 1 1 0 ok Long UUID",
        "proc",
        "proc 0 12",
        "proc 0 12 13 14",
        "proc 0 0x10 5",
        "proc 99 1 1",
        "driver",
        "driver a b",
        "init_error nine",
        "bogus keyword here",
        "\x00\x01\x02 binary \xff",
        "x" * 10_000,
    ]
    state_file.write_text(good + "\n".join(garbage) + "\n", errors="surrogateescape")
    load()
    assert pynvml.nvmlDeviceGetCount() == 1
    h0 = handle(0)
    assert pynvml.nvmlDeviceGetUUID(h0) == UUID0
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h0)] == [4242]
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    # A gap in the indices: count is highest + 1, and the gap is an invalid index.
    state_file.write_text(
        "gpu 2 GPU-2 00000000:20:00.0 10 5 1 1 0 ok  Trailing Spaces Kept Out  \r\n"
    )
    assert pynvml.nvmlDeviceGetCount() == 3
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        handle(0)
    assert pynvml.nvmlDeviceGetName(handle(2)) == "Trailing Spaces Kept Out"


def test_table_limits(state_file: Path, load: LoadFn) -> None:
    last = FakeGpu(**{**GPU0.__dict__, "index": 63, "pci_bus_id": "00000000:F0:00.0"})
    procs = "".join(f"proc 63 {pid} 1\n" for pid in range(1, 5001))
    state_file.write_text(render_state(FakeNvmlState(gpus=(last,))) + procs)
    load()
    assert pynvml.nvmlDeviceGetCount() == 64
    assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle(63))) == 4096
    with pytest.raises(ValueError, match="4096"):
        render_state(FakeNvmlState(processes=(FakeProcess(0, 1, 1),) * 4097))


def test_loads_by_soname_from_ld_library_path(fake_libs: dict[str, Path], state_file: Path) -> None:
    # Ray's GPU detection does CDLL("libnvidia-ml.so.1") itself; LD_LIBRARY_PATH is read at
    # process start, hence the subprocess.
    code = (
        "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); "
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h))"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_libs["default"].parent)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "2 NVIDIA H100 80GB HBM3"


def test_concurrent_reads_during_rewrites(state_file: Path, load: LoadFn) -> None:
    load()
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                n = pynvml.nvmlDeviceGetCount()
                assert n in (1, 2)
                h = handle(0)
                assert pynvml.nvmlDeviceGetUUID(h) == UUID0
                assert pynvml.nvmlDeviceGetMemoryInfo(h).total == 80 * GIB
                assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)) in (0, 3)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(100):
        write_state(state_file, STATE if i % 2 else FakeNvmlState(gpus=(GPU0,)))
    stop.set()
    for t in threads:
        t.join()
    assert errors == []


def test_build_cache_is_reused(fake_libs: dict[str, Path]) -> None:
    path = fake_libs["default"]
    assert path.name == "libnvidia-ml.so.1"
    assert path.stat().st_mode & 0o777 == 0o755
    mtime = path.stat().st_mtime_ns
    again = build_fake_nvml(cache_dir=path.parent.parent)
    assert again == path
    assert again.stat().st_mtime_ns == mtime
    assert len({fake_libs[k].parent for k in fake_libs}) == len(fake_libs)
    assert not [p for p in path.parent.iterdir() if p.name != "libnvidia-ml.so.1"]


def test_build_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown"):
        build_fake_nvml(frozenset({"no_v4"}), cache_dir=tmp_path)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(FakeNvmlBuildError, match="install gcc"):
        build_fake_nvml(cache_dir=tmp_path)
    failing = tmp_path / "failing-cc"
    failing.write_text("#!/bin/sh\necho 'cc: internal error' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    with pytest.raises(FakeNvmlBuildError, match="internal error"):
        build_fake_nvml(cache_dir=tmp_path / "cache")
    leftovers = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert leftovers == []


def test_default_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A compiler that only records where it was asked to write, to keep this test cheap.
    fake_cc = tmp_path / "fake-cc"
    fake_cc.write_text('#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\n: > "$2"\n')
    fake_cc.chmod(0o755)
    monkeypatch.setenv("CC", str(fake_cc))
    monkeypatch.setenv("GPULEDGER_CACHE_DIR", str(tmp_path / "explicit"))
    assert build_fake_nvml().parent.parent == tmp_path / "explicit" / "fake-nvml"
    monkeypatch.delenv("GPULEDGER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build_fake_nvml().parent.parent == tmp_path / "xdg" / "gpuledger" / "fake-nvml"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".cache" / "gpuledger" / "fake-nvml"
    assert build_fake_nvml().parent.parent == expected


def test_render_state() -> None:
    text = render_state(FakeNvmlState(gpus=(GPU0,), processes=PROCS[:1], init_error=9))
    assert text.splitlines()[1:] == [
        "driver 550.54.15",
        "init_error 9",
        f"gpu 0 {UUID0} 00000000:18:00.0 {80 * GIB} {40 * GIB} 37 12 0 ok NVIDIA H100 80GB HBM3",
        f"proc 0 4242 {30 * GIB}",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "NVIDIA\nH100"}, "single line"),
        ({"name": "NVIDIA\rH100"}, "single line"),
        ({"name": " padded"}, "surrounding whitespace"),
        ({"name": ""}, "non-empty"),
        ({"name": "N" * 96}, "longer than"),
        ({"uuid": "GPU-1 2"}, "whitespace"),
        ({"uuid": "GPU-1\n"}, "whitespace"),
        ({"pci_bus_id": "0000:18:00.0\n"}, "whitespace"),
        ({"pci_bus_id": "18-00-0"}, "DOMAIN:BUS"),
        ({"pci_bus_id": "0000:118:00.0"}, "DOMAIN:BUS"),
        ({"index": 64}, "index"),
        ({"index": -1}, "index"),
        ({"memory_used": -1}, "memory_used"),
        ({"util_gpu": 101}, "util_gpu"),
    ],
)
def test_render_state_rejects(change: dict[str, object], message: str) -> None:
    bad = FakeGpu(**{**GPU0.__dict__, **change})
    with pytest.raises(ValueError, match=message):
        render_state(FakeNvmlState(gpus=(bad,)))


def test_render_state_rejects_state_level_errors() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        render_state(FakeNvmlState(gpus=(GPU0, GPU0)))
    with pytest.raises(ValueError, match="driver_version"):
        render_state(FakeNvmlState(driver_version="550 54"))
    with pytest.raises(ValueError, match="pid"):
        render_state(FakeNvmlState(processes=(FakeProcess(0, 0, 1),)))


def test_write_state_is_atomic_and_readable(tmp_path: Path) -> None:
    path = tmp_path / "state"
    write_state(path, STATE)
    write_state(path, FakeNvmlState())
    assert path.read_text() == render_state(FakeNvmlState())
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["state"]
    with pytest.raises(ValueError):
        write_state(path, FakeNvmlState(gpus=(FakeGpu(**{**GPU0.__dict__, "name": "a\nb"}),)))
    assert path.read_text() == render_state(FakeNvmlState())
    assert [p.name for p in tmp_path.iterdir()] == ["state"]
