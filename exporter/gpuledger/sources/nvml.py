"""NVML source: what the GPUs physically show, through the real nvidia-ml-py.

The library is loaded lazily and re-tried every cycle, so an exporter started before the
driver (or with none) keeps serving and recovers by itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from typing import Any

import pynvml

from gpuledger.model import Snapshots
from gpuledger.model.nvml import NVML, Gpu, GpuLink, GpuProcess, MigDevice, NvmlSnapshot
from gpuledger.sources.base import Source, SourceError
from gpuledger.sources.nvml_topology import TopologyGpu, pci_address, read_links

log = logging.getLogger(__name__)

# pynvml keeps its library handle in module globals: one NVML per process.
_load_lock = threading.Lock()

_REASONS: dict[int, str] = {
    pynvml.NVML_ERROR_UNINITIALIZED: "uninitialized",
    pynvml.NVML_ERROR_NOT_SUPPORTED: "not_supported",
    pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
    pynvml.NVML_ERROR_TIMEOUT: "timeout",
    pynvml.NVML_ERROR_IRQ_ISSUE: "irq_issue",
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found",
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: "function_not_found",
    pynvml.NVML_ERROR_GPU_IS_LOST: "gpu_is_lost",
    pynvml.NVML_ERROR_RESET_REQUIRED: "reset_required",
    pynvml.NVML_ERROR_UNKNOWN: "unknown",
}


def nvml_reason(exc: pynvml.NVMLError) -> str:
    """Bounded label value for an NVML error code."""
    return _REASONS.get(int(exc.value), "nvml_error")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSource(Source[NvmlSnapshot]):
    key = NVML

    def __init__(self, library_path: str | None = None, topology_seconds: float = 1.0) -> None:
        self.library_path = library_path
        # The GPU pairs' topology gets this long, inside the source's deadline.
        self.topology_seconds = topology_seconds
        self._initialised = False
        # Static facts survive a lost GPU: NVML may stop answering even for its UUID.
        self._uuid_by_index: dict[int, str] = {}
        self._ancestors: dict[tuple[str, str], str] = {}

    def fetch(self, inputs: Snapshots | None = None) -> NvmlSnapshot:
        self._ensure_initialised()
        try:
            count = pynvml.nvmlDeviceGetCount()
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as exc:
            self._initialised = False  # driver reloaded or gone: init again next cycle
            raise SourceError(nvml_reason(exc), f"NVML query failed: {exc}") from None
        gpus = tuple(g for g in (self._read_gpu(i) for i in range(count)) if g is not None)
        return NvmlSnapshot(driver_version=driver, gpus=gpus, links=self._links(gpus))

    def _links(self, gpus: tuple[Gpu, ...]) -> tuple[GpuLink, ...]:
        """The pairs of GPUs that answer; a lost GPU's pairs are left out (unknown)."""
        deadline = time.monotonic() + self.topology_seconds
        found = []
        for gpu in gpus:
            if not gpu.up:
                continue
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
                address = pci_address(pynvml.nvmlDeviceGetPciInfo_v3(handle))
            except pynvml.NVMLError:
                continue
            found.append(TopologyGpu(gpu.uuid, handle, address))
        return read_links(found, deadline, self._ancestors) if len(found) > 1 else ()

    def _ensure_initialised(self) -> None:
        if self._initialised:
            return
        with _load_lock:
            if self.library_path is not None:
                try:
                    library = ctypes.CDLL(self.library_path)
                except OSError:
                    raise SourceError(
                        "library_not_found",
                        f"cannot load NVML library {self.library_path!r} (--nvml-library)",
                    ) from None
                pynvml.nvmlLib = library
                pynvml._nvmlGetFunctionPointer_cache.clear()
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                reason = nvml_reason(exc)
                if reason == "library_not_found":
                    raise SourceError(
                        reason,
                        "libnvidia-ml.so.1 not found: no NVIDIA driver on this host, or the "
                        "container was started without the NVIDIA runtime / driver capabilities",
                    ) from None
                raise SourceError(reason, f"nvmlInit failed: {exc}") from None
        self._initialised = True

    def _read_gpu(self, index: int) -> Gpu | None:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            uuid = self._uuid_by_index.get(index)
            if uuid is None:
                log.warning("GPU at index %d unreadable and never seen: %s", index, exc)
                return None
            return Gpu(index, uuid, "", "", up=False, error_reason=nvml_reason(exc))
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            name = _text(pynvml.nvmlDeviceGetName(handle))
            pci_bus_id = _text(pynvml.nvmlDeviceGetPciInfo_v3(handle).busId)
        except pynvml.NVMLError as exc:
            uuid = self._uuid_by_index.get(index, "")
            if not uuid:
                return None
            return Gpu(index, uuid, "", "", up=False, error_reason=nvml_reason(exc))
        self._uuid_by_index[index] = uuid
        try:
            total, used = _memory(handle)
            utilization = _utilization(handle)
            mig_mode = _mig_mode(handle)
            # In MIG mode processes run on MIG devices: each MIG handle lists its own
            # (NVML's per-instance view, which needs no privilege the aggregate needs).
            in_mig = mig_mode == "enabled"
            processes = () if in_mig else _processes(handle, total)
            migs = _mig_devices(handle, uuid) if in_mig else ()
        except pynvml.NVMLError as exc:
            return Gpu(index, uuid, name, pci_bus_id, up=False, error_reason=nvml_reason(exc))
        return Gpu(
            index=index,
            uuid=uuid,
            name=name,
            pci_bus_id=pci_bus_id,
            up=True,
            mig_mode=mig_mode,
            memory_total_bytes=total,
            memory_used_bytes=used,
            utilization_ratio=utilization,
            processes=processes,
            mig_devices=migs,
        )

    def close(self) -> None:
        if self._initialised:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            self._initialised = False


def _memory(handle: Any) -> tuple[int, int]:
    """Memory v2 (excludes driver-reserved memory from `used`) where the driver has it."""
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except (
        pynvml.NVMLError_FunctionNotFound,
        pynvml.NVMLError_NotSupported,
        pynvml.NVMLError_ArgumentVersionMismatch,
    ):
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.total), int(info.used)


def _utilization(handle: Any) -> float | None:
    try:
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
    except pynvml.NVMLError_NotSupported:
        return None  # e.g. MIG-enabled GPUs do not report utilization
    return min(max(int(rates.gpu), 0), 100) / 100.0


def _mig_mode(handle: Any) -> str:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError_NotSupported:
        return "unsupported"
    return "enabled" if current == pynvml.NVML_DEVICE_MIG_ENABLE else "disabled"


def _mig_devices(parent: Any, parent_uuid: str) -> tuple[MigDevice, ...]:
    """The GPU's MIG devices, by MIG device index. Handles are fetched every cycle: NVML
    reuses them when instances are destroyed and made again."""
    found = []
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
        except pynvml.NVMLError_NotFound:
            continue  # an empty slot: MIG device indices need not be dense
        mig = _read_mig(handle, parent_uuid, index)
        if mig is not None:
            found.append(mig)
    return tuple(found)


def _read_mig(handle: Any, parent_uuid: str, index: int) -> MigDevice | None:
    try:
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    except pynvml.NVMLError as exc:
        log.warning("MIG device %d of %s has no UUID: %s", index, parent_uuid, exc)
        return None  # nothing to key its series by
    try:
        profile = _mig_profile(handle, _text(pynvml.nvmlDeviceGetName(handle)))
        gpu_instance = int(pynvml.nvmlDeviceGetGpuInstanceId(handle))
        compute_instance = int(pynvml.nvmlDeviceGetComputeInstanceId(handle))
        total, used = _memory(handle)
        processes = _processes(handle, total)
    except pynvml.NVMLError as exc:
        return MigDevice(uuid, parent_uuid, index, up=False, error_reason=nvml_reason(exc))
    return MigDevice(
        uuid=uuid,
        parent_uuid=parent_uuid,
        index=index,
        up=True,
        gpu_instance_id=gpu_instance,
        compute_instance_id=compute_instance,
        profile=profile,
        memory_total_bytes=total,
        memory_used_bytes=used,
        processes=processes,
    )


def _mig_profile(handle: Any, name: str) -> str:
    """The profile NVML names a MIG device by (`<GPU name> MIG 1g.10gb`); else built from
    its attributes' slice counts and memory, as `[<c>c.]<g>g.<GiB rounded up>gb`."""
    _, marker, profile = name.rpartition(" MIG ")
    if marker and profile:
        return profile
    try:
        attributes = pynvml.nvmlDeviceGetAttributes(handle)
    except pynvml.NVMLError:
        return ""
    gpu_slices = int(attributes.gpuInstanceSliceCount)
    compute_slices = int(attributes.computeInstanceSliceCount)
    gib = -(-int(attributes.memorySizeMB) // 1024)
    built = f"{gpu_slices}g.{gib}gb"
    return built if compute_slices in (0, gpu_slices) else f"{compute_slices}c.{built}"


def _processes(handle: Any, total_bytes: int) -> tuple[GpuProcess, ...]:
    try:
        raw = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except pynvml.NVMLLibraryMismatchError:
        raw = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)  # drivers before _v3
    by_pid: dict[int, GpuProcess] = {}
    for proc in raw:
        pid = int(proc.pid)
        if pid <= 0:
            continue  # NVML reports pid 0 for processes outside our PID namespace
        used = proc.usedGpuMemory
        if used is not None and not 0 <= int(used) <= total_bytes:
            used = None  # a value larger than the GPU is garbage, not a fact
        by_pid[pid] = GpuProcess(pid, None if used is None else int(used))
    return tuple(sorted(by_pid.values(), key=lambda p: p.pid))
