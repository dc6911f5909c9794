"""A fake ``libnvidia-ml.so.1``: build it from C, and write the state file it serves.

The library (``fake_nvml.c`` next to this module) implements the NVML C ABI that
nvidia-ml-py, Ray and gpuledger call, so the real ``pynvml`` runs against it unchanged.
It reads its devices from a plain-text file named by ``$GPULEDGER_FAKE_NVML_STATE``::

    driver <version-string>            # default 550.54.15 when absent
    init_error <nvml_return_code>      # optional; nvmlInit* returns it (9 = DRIVER_NOT_LOADED)
    query_error <nvml_return_code>     # optional; nvmlDeviceGetCount* returns it after init
    hang_ms <milliseconds>             # optional; nvmlDeviceGetCount* sleeps this long first
    gpu <index> <uuid> <pci_bus_id> <memory_total_bytes> <memory_used_bytes> \\
        <util_gpu_pct> <util_memory_pct> <mig_mode 0|1> <ok|lost> <name... to end of line>
    mig <gpu_index> <mig_index> <uuid> <gpu_instance_id> <compute_instance_id> \\
        <gpu_instance_slices> <compute_instance_slices> <memory_total> <memory_used> <profile>
    proc <gpu_index> <pid> <used_memory_bytes> [<mig_index>]
    topo <gpu_index> <numa_node> <host_bridge> <pcie_switches a/b/... upstream first, or ->
    nvlink <gpu_index> <link 0-17> <remote_pci_bus_id> <gpu|npu|switch>
    nvlink_error <gpu_index> <nvml_return_code>

(one record per line; the backslashes above are only for width). Fields are separated
by whitespace, a line whose first field starts with ``#`` is a comment, and blank lines and
lines that do not parse are ignored. Up to 64 GPUs (indices 0-63) and 4096 processes.

Behaviour worth knowing:

* The file is re-read on every ``nvmlInit*`` and every ``nvmlDeviceGetCount*`` call, so a
  harness rewrites it (use :func:`write_state`, which renames atomically) and a running
  exporter sees the change at its next poll. The variable itself is read at each reload too.
* Variable unset, or file missing/unreadable: zero GPUs, and ``nvmlInit`` still succeeds.
* ``nvmlDeviceGetCount`` is the highest GPU index + 1; give indices 0..n-1.
* A ``lost`` GPU keeps answering handle, UUID, name, index and PCI queries (the driver
  caches static data) but memory, utilization, MIG mode, power, temperature and process
  queries fail with ``NVML_ERROR_GPU_IS_LOST`` (15).
* PCI bus ids come back in NVML's spelling: upper-case hex, 8-digit domain.
* Memory v2 reports ``reserved`` = 0, so v1 and v2 agree on used and free.
* MIG: a ``mig`` record is a MIG device of a GPU in MIG mode (up to 7 per GPU, indices
  0-6; a record under a GPU without MIG mode is ignored). Its handle answers UUID, name
  (``<parent name> MIG <profile>``), index, GPU/compute instance ids, parent handle,
  attributes (slice counts, memory size), memory and its processes; utilization is
  ``NOT_SUPPORTED`` there and on a GPU in MIG mode, as with real NVML. A ``proc`` record
  with a MIG index runs on that MIG device: the parent's process list (NVML's aggregate)
  carries its GPU/compute instance ids. The GPU's own memory is what the state says; the
  harness sums the instances into it.
* Topology (nvml.h's semantics): the common ancestor of two GPUs comes from their ``topo``
  records (``SYSTEM`` across NUMA nodes, ``NODE`` across host bridges, ``HOSTBRIDGE`` with
  no shared PCIe switch, ``SINGLE`` behind the same last switch, ``MULTIPLE`` through
  several), ``NOT_SUPPORTED`` when either has none. A GPU without ``nvlink`` records has no
  NVLink (``NOT_SUPPORTED``, a PCIe-only board); with them it has 18 links, the recorded
  ones active with that far end, the rest inactive; link 18 and above are
  ``INVALID_ARGUMENT``. ``nvlink_error`` makes that GPU's NVLink queries fail with the code.

Load it the way gpuledger's NVML source does::

    pynvml.nvmlLib = ctypes.CDLL(str(build_fake_nvml()))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()

or put its directory on ``LD_LIBRARY_PATH`` for programs that ``dlopen("libnvidia-ml.so.1")``
themselves (Ray's GPU detection).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "STATE_ENV",
    "VARIANTS",
    "FakeGpu",
    "FakeMig",
    "FakeNvLink",
    "FakeNvmlBuildError",
    "FakeNvmlState",
    "FakePlacement",
    "FakeProcess",
    "build_fake_nvml",
    "render_state",
    "write_state",
]

STATE_ENV = "GPULEDGER_FAKE_NVML_STATE"

# Variant name -> preprocessor flag in fake_nvml.c. Each omits one newer entry point, as an
# older driver would, to exercise pynvml's and gpuledger's fallbacks.
_VARIANT_DEFINES = {
    "no_v3": "-DFAKE_NVML_NO_V3",
    "no_memory_v2": "-DFAKE_NVML_NO_MEMORY_V2",
    "no_nvlink_type": "-DFAKE_NVML_NO_NVLINK_TYPE",
}
VARIANTS = frozenset(_VARIANT_DEFINES)

_LIBRARY_NAME = "libnvidia-ml.so.1"
_SOURCE = Path(__file__).with_name("fake_nvml.c")
# -fvisibility=hidden: export only the NVML entry points (see the comment in the C file).
_BASE_FLAGS = (
    "-shared",
    "-fPIC",
    "-O2",
    "-pthread",
    "-fvisibility=hidden",
    "-Wall",
    f"-Wl,-soname,{_LIBRARY_NAME}",
)
_COMPILE_TIMEOUT_S = 120

# Limits of the C side (buffer sizes from nvml.h and the state's fixed tables). Checking them
# here turns what the library would silently skip into an error at the harness.
_MAX_GPUS = 64
_MAX_PROCESSES = 4096
_MAX_MIG = 7
_PROFILE_MAX_BYTES = 31
_NAME_MAX_BYTES = 95
_UUID_MAX_BYTES = 95
_BUS_ID_MAX_BYTES = 31
_DRIVER_MAX_BYTES = 79
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1
_BUS_ID = re.compile(r"(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?")
# The C side reads the bus id's device number as 0-31 (5 bits, as in PCI).
_MAX_PCI_DEVICE = 31
FAKE_NVLINKS = 18  # links per GPU with NVLink (fake_nvml.c, an H100 SXM's count)
_NVLINK_TYPES = frozenset({"gpu", "npu", "switch"})
_SWITCH = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*")
_SWITCH_PATH_MAX_BYTES = 63


@dataclass(frozen=True)
class FakeGpu:
    """One simulated GPU: static identity plus the live values NVML reports."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total: int
    memory_used: int
    util_gpu: int
    util_memory: int
    mig_mode: bool = False
    lost: bool = False


@dataclass(frozen=True)
class FakeMig:
    """One MIG device (a compute instance) of the GPU at ``gpu_index``, in MIG mode."""

    gpu_index: int
    index: int  # the MIG device index under its parent (0-6)
    uuid: str
    profile: str  # e.g. 1g.10gb, 1c.3g.40gb
    gpu_instance_id: int
    compute_instance_id: int
    gpu_slices: int
    compute_slices: int
    memory_total: int
    memory_used: int


@dataclass(frozen=True)
class FakeProcess:
    """A compute process as NVML lists it: host PID and its memory on one GPU, on the
    MIG device ``mig_index`` of it when set."""

    gpu_index: int
    pid: int
    used_memory: int
    mig_index: int | None = None


@dataclass(frozen=True)
class FakePlacement:
    """Where the GPU at ``gpu_index`` sits: NUMA node, PCIe host bridge, and the PCIe
    switches above it, upstream first (empty: straight under the host bridge)."""

    gpu_index: int
    numa_node: int
    host_bridge: int
    pcie_switches: tuple[str, ...] = ()


@dataclass(frozen=True)
class FakeNvLink:
    """An active NVLink of the GPU at ``gpu_index``: its link number and what is at the
    far end (a PCI bus id, and ``gpu``, ``npu`` or ``switch``)."""

    gpu_index: int
    link: int
    remote_pci_bus_id: str
    remote_type: str = "gpu"


@dataclass(frozen=True)
class FakeNvmlState:
    """Everything the fake library serves; ``init_error`` != 0 makes nvmlInit fail.

    Faults for tests: ``query_error`` != 0 makes nvmlDeviceGetCount fail with that code
    after a successful init (a driver erroring mid-run); ``hang_ms`` > 0 makes it sleep that
    long first (a hung driver; at most 600000).
    """

    gpus: tuple[FakeGpu, ...] = ()
    processes: tuple[FakeProcess, ...] = ()
    migs: tuple[FakeMig, ...] = ()
    driver_version: str = "550.54.15"
    init_error: int = 0
    query_error: int = 0
    hang_ms: int = 0
    placements: tuple[FakePlacement, ...] = ()
    nvlinks: tuple[FakeNvLink, ...] = ()
    # (gpu_index, nvml return code): that GPU's NVLink queries fail with it.
    nvlink_errors: tuple[tuple[int, int], ...] = ()


class FakeNvmlBuildError(RuntimeError):
    """The fake library could not be compiled; the message says why and what to do."""


# ---- building ----------------------------------------------------------------------------


def _default_cache_dir() -> Path:
    explicit = os.environ.get("GPULEDGER_CACHE_DIR")
    if explicit:
        base = Path(explicit)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg) / "gpuledger" if xdg else Path.home() / ".cache" / "gpuledger"
    return base / "fake-nvml"


def _compiler() -> list[str]:
    """The compiler command: ``$CC`` (may carry flags, e.g. ``"ccache gcc"``), else cc/gcc."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        argv = shlex.split(cc)
        resolved = shutil.which(argv[0])
        if resolved is None:
            raise FakeNvmlBuildError(
                f"C compiler from $CC not found: {argv[0]!r}; "
                "fix or unset $CC, or install gcc (e.g. apt-get install gcc)"
            )
        return [resolved, *argv[1:]]
    for name in ("cc", "gcc"):
        resolved = shutil.which(name)
        if resolved is not None:
            return [resolved]
    raise FakeNvmlBuildError(
        "no C compiler found to build the fake libnvidia-ml.so.1: "
        "install gcc (e.g. apt-get install gcc) or set $CC"
    )


def build_fake_nvml(variants: frozenset[str] = frozenset(), cache_dir: Path | None = None) -> Path:
    """Compile the fake library (once per source, flags and compiler) and return its path.

    The result is ``<cache_dir>/<sha256>/libnvidia-ml.so.1``; an existing build is reused.
    The default cache directory is ``$GPULEDGER_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/gpuledger``, else ``~/.cache/gpuledger``, each followed by
    ``fake-nvml``. Concurrent builds are safe: each compiles to its own temporary name and
    renames it into place.
    """
    unknown = set(variants) - VARIANTS
    if unknown:
        raise ValueError(
            f"unknown fake NVML variant(s) {sorted(unknown)}; known: {sorted(VARIANTS)}"
        )
    try:
        source = _SOURCE.read_bytes()
    except OSError as exc:
        raise FakeNvmlBuildError(
            f"cannot read the fake NVML source {_SOURCE}: {exc}; "
            "reinstall gpuledger (the .c file ships as package data)"
        ) from exc
    compiler = _compiler()
    flags = [*_BASE_FLAGS, *sorted(_VARIANT_DEFINES[v] for v in variants)]

    digest = hashlib.sha256()
    for part in (source, *(a.encode() for a in compiler), *(f.encode() for f in flags)):
        # Length-prefix each part so different splits never hash alike.
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    out_dir = (cache_dir if cache_dir is not None else _default_cache_dir()) / digest.hexdigest()
    target = out_dir / _LIBRARY_NAME
    if target.is_file():
        return target

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FakeNvmlBuildError(
            f"cannot create the build cache directory {out_dir}: {exc}; "
            "set $GPULEDGER_CACHE_DIR to a writable directory"
        ) from exc
    fd, tmp_name = tempfile.mkstemp(prefix=f".{_LIBRARY_NAME}.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        cmd = [*compiler, *flags, "-o", str(tmp), str(_SOURCE)]
        try:
            result = subprocess.run(
                cmd, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FakeNvmlBuildError(
                f"running the C compiler failed ({shlex.join(cmd)}): {exc}; "
                "check that gcc works (e.g. apt-get install gcc) or set $CC"
            ) from exc
        if result.returncode != 0:
            raise FakeNvmlBuildError(
                f"compiling the fake libnvidia-ml.so.1 failed (exit {result.returncode}): "
                f"{shlex.join(cmd)}\n{result.stderr.strip()}\n"
                "a working gcc or clang with pthread support is required (set $CC to choose)"
            )
        # mkstemp's 0600 survives linking; a loader running as another user must read it.
        tmp.chmod(0o755)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


# ---- state file --------------------------------------------------------------------------


def _check_token(what: str, value: str, max_bytes: int) -> None:
    """A single whitespace-free field of a state line."""
    if not value:
        raise ValueError(f"{what} must not be empty")
    if any(c.isspace() for c in value) or "\0" in value:
        raise ValueError(f"{what} must not contain whitespace or NUL: {value!r}")
    if len(value.encode()) > max_bytes:
        raise ValueError(f"{what} longer than {max_bytes} bytes: {value!r}")


def _check_int(what: str, value: int, low: int, high: int) -> None:
    # bool is an int subclass; a True where a count belongs is a caller bug.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer in [{low}, {high}], got {value!r}")


def _render_gpu(gpu: FakeGpu) -> str:
    where = f"gpu {gpu.index}"
    _check_int(f"{where}: index", gpu.index, 0, _MAX_GPUS - 1)
    _check_token(f"{where}: uuid", gpu.uuid, _UUID_MAX_BYTES)
    _check_token(f"{where}: pci_bus_id", gpu.pci_bus_id, _BUS_ID_MAX_BYTES)
    if not _BUS_ID.fullmatch(gpu.pci_bus_id):
        raise ValueError(
            f"{where}: pci_bus_id is not DOMAIN:BUS:DEVICE.FUNCTION in hex: {gpu.pci_bus_id!r}"
        )
    if int(gpu.pci_bus_id.split(":")[-1].split(".")[0], 16) > _MAX_PCI_DEVICE:
        raise ValueError(f"{where}: pci_bus_id device number above 0x1f: {gpu.pci_bus_id!r}")
    # The name runs to the end of the line and the reader trims it, so it must be one
    # line, non-empty, and without surrounding whitespace to come back unchanged.
    if "\n" in gpu.name or "\r" in gpu.name or "\0" in gpu.name:
        raise ValueError(f"{where}: name must be a single line: {gpu.name!r}")
    if not gpu.name or gpu.name != gpu.name.strip():
        raise ValueError(
            f"{where}: name must be non-empty without surrounding whitespace: {gpu.name!r}"
        )
    if len(gpu.name.encode()) > _NAME_MAX_BYTES:
        raise ValueError(f"{where}: name longer than {_NAME_MAX_BYTES} bytes: {gpu.name!r}")
    _check_int(f"{where}: memory_total", gpu.memory_total, 0, _U64_MAX)
    _check_int(f"{where}: memory_used", gpu.memory_used, 0, _U64_MAX)
    _check_int(f"{where}: util_gpu", gpu.util_gpu, 0, 100)
    _check_int(f"{where}: util_memory", gpu.util_memory, 0, 100)
    return (
        f"gpu {gpu.index} {gpu.uuid} {gpu.pci_bus_id} {gpu.memory_total} {gpu.memory_used} "
        f"{gpu.util_gpu} {gpu.util_memory} {int(bool(gpu.mig_mode))} "
        f"{'lost' if gpu.lost else 'ok'} {gpu.name}"
    )


def _render_mig(mig: FakeMig, names: dict[int, str]) -> str:
    where = f"mig {mig.uuid!r}"
    _check_int(f"{where}: gpu_index", mig.gpu_index, 0, _MAX_GPUS - 1)
    _check_int(f"{where}: index", mig.index, 0, _MAX_MIG - 1)
    _check_token(f"{where}: uuid", mig.uuid, _UUID_MAX_BYTES)
    _check_token(f"{where}: profile", mig.profile, _PROFILE_MAX_BYTES)
    for what in ("gpu_instance_id", "compute_instance_id", "gpu_slices", "compute_slices"):
        _check_int(f"{where}: {what}", getattr(mig, what), 0, _U32_MAX)
    _check_int(f"{where}: memory_total", mig.memory_total, 0, _U64_MAX)
    _check_int(f"{where}: memory_used", mig.memory_used, 0, _U64_MAX)
    # The library names it "<parent name> MIG <profile>" and drops it when that is too long.
    name = f"{names.get(mig.gpu_index, '')} MIG {mig.profile}"
    if len(name.encode()) > _NAME_MAX_BYTES:
        raise ValueError(f"{where}: name longer than {_NAME_MAX_BYTES} bytes: {name!r}")
    return (
        f"mig {mig.gpu_index} {mig.index} {mig.uuid} {mig.gpu_instance_id} "
        f"{mig.compute_instance_id} {mig.gpu_slices} {mig.compute_slices} "
        f"{mig.memory_total} {mig.memory_used} {mig.profile}"
    )


def _render_process(proc: FakeProcess) -> str:
    where = f"process {proc.pid!r}"
    _check_int(f"{where}: gpu_index", proc.gpu_index, 0, _MAX_GPUS - 1)
    _check_int(f"{where}: pid", proc.pid, 1, _U32_MAX)
    _check_int(f"{where}: used_memory", proc.used_memory, 0, _U64_MAX)
    line = f"proc {proc.gpu_index} {proc.pid} {proc.used_memory}"
    if proc.mig_index is None:
        return line
    _check_int(f"{where}: mig_index", proc.mig_index, 0, _MAX_MIG - 1)
    return f"{line} {proc.mig_index}"


def _check_migs(state: FakeNvmlState) -> None:
    """MIG devices sit in distinct slots of GPUs in MIG mode, with distinct UUIDs."""
    in_mig_mode = {g.index for g in state.gpus if g.mig_mode}
    slots = [(m.gpu_index, m.index) for m in state.migs]
    if len(set(slots)) != len(slots):
        raise ValueError(f"duplicate MIG device slots (gpu_index, index): {sorted(slots)}")
    # GPUs may repeat a UUID (a faulty driver, for tests); MIG devices may not.
    uuids = [m.uuid for m in state.migs]
    if len(set(uuids)) != len(uuids) or set(uuids) & {g.uuid for g in state.gpus}:
        raise ValueError("MIG device UUIDs must be unique and differ from GPU UUIDs")
    for mig in state.migs:
        if mig.gpu_index not in in_mig_mode:
            raise ValueError(f"mig {mig.uuid!r}: GPU {mig.gpu_index} is not in MIG mode")
    for proc in state.processes:
        if proc.mig_index is not None and (proc.gpu_index, proc.mig_index) not in slots:
            raise ValueError(
                f"process {proc.pid}: no MIG device {proc.mig_index} on GPU {proc.gpu_index}"
            )


def _render_placement(p: FakePlacement) -> str:
    where = f"placement of GPU {p.gpu_index}"
    _check_int(f"{where}: gpu_index", p.gpu_index, 0, _MAX_GPUS - 1)
    _check_int(f"{where}: numa_node", p.numa_node, 0, _U32_MAX)
    _check_int(f"{where}: host_bridge", p.host_bridge, 0, _U32_MAX)
    path = "/".join(p.pcie_switches) or "-"
    if p.pcie_switches and not _SWITCH.fullmatch(path):
        raise ValueError(f"{where}: PCIe switch names are letters, digits, _ . -: {path!r}")
    if len(path.encode()) > _SWITCH_PATH_MAX_BYTES:
        raise ValueError(f"{where}: PCIe switches longer than {_SWITCH_PATH_MAX_BYTES} bytes")
    return f"topo {p.gpu_index} {p.numa_node} {p.host_bridge} {path}"


def _render_nvlink(link: FakeNvLink) -> str:
    where = f"NVLink {link.link} of GPU {link.gpu_index}"
    _check_int(f"{where}: gpu_index", link.gpu_index, 0, _MAX_GPUS - 1)
    _check_int(f"{where}: link", link.link, 0, FAKE_NVLINKS - 1)
    if not _BUS_ID.fullmatch(link.remote_pci_bus_id):
        raise ValueError(f"{where}: remote_pci_bus_id not in hex: {link.remote_pci_bus_id!r}")
    if link.remote_type not in _NVLINK_TYPES:
        raise ValueError(f"{where}: remote_type one of {sorted(_NVLINK_TYPES)}")
    return f"nvlink {link.gpu_index} {link.link} {link.remote_pci_bus_id} {link.remote_type}"


def _topology_lines(state: FakeNvmlState) -> list[str]:
    slots = [(n.gpu_index, n.link) for n in state.nvlinks]
    if len(set(slots)) != len(slots):
        raise ValueError(f"duplicate NVLinks (gpu_index, link): {sorted(slots)}")
    lines = [_render_placement(p) for p in state.placements]
    lines.extend(_render_nvlink(n) for n in state.nvlinks)
    for gpu_index, code in state.nvlink_errors:
        _check_int("nvlink_errors: gpu_index", gpu_index, 0, _MAX_GPUS - 1)
        _check_int("nvlink_errors: code", code, 1, 2**31 - 1)
        lines.append(f"nvlink_error {gpu_index} {code}")
    return lines


def render_state(state: FakeNvmlState) -> str:
    """The state file text for ``state``; ValueError for anything the library cannot read."""
    _check_token("driver_version", state.driver_version, _DRIVER_MAX_BYTES)
    # Positive int32: the library returns it as an nvmlReturn_t.
    _check_int("init_error", state.init_error, 0, 2**31 - 1)
    indices = [g.index for g in state.gpus]
    duplicates = sorted({i for i in indices if indices.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate GPU indices: {duplicates}")
    if len(state.processes) > _MAX_PROCESSES:
        raise ValueError(f"at most {_MAX_PROCESSES} processes, got {len(state.processes)}")
    lines = ["# gpuledger fake NVML state (generated by gpuledger.sim.fake_nvml)"]
    lines.append(f"driver {state.driver_version}")
    _check_int("query_error", state.query_error, 0, 2**31 - 1)
    _check_int("hang_ms", state.hang_ms, 0, 600_000)
    if state.init_error:
        lines.append(f"init_error {state.init_error}")
    if state.query_error:
        lines.append(f"query_error {state.query_error}")
    if state.hang_ms:
        lines.append(f"hang_ms {state.hang_ms}")
    lines.extend(_render_gpu(g) for g in state.gpus)
    _check_migs(state)
    names = {g.index: g.name for g in state.gpus}
    lines.extend(_render_mig(m, names) for m in state.migs)
    lines.extend(_render_process(p) for p in state.processes)
    lines.extend(_topology_lines(state))
    return "\n".join(lines) + "\n"


def write_state(path: Path, state: FakeNvmlState) -> None:
    """Write the state file atomically, so a concurrent reload sees old or new, never half."""
    text = render_state(state)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        # mkstemp creates 0600; the reader may be a process running as another user.
        tmp.chmod(0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
