"""The scenario file format (docs/scenarios.md): parsing and validation.

Errors name the file, the path inside it and what was expected, e.g.
`demo.yaml: gpus[2].memory_total: expected a size like 80GiB or an integer, got 'lots'`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpuledger.model import frozen_map

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")
_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SECONDS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
HOST_CGROUP = "0::/system.slice/host-workload.service"
NVML_VARIANTS = ("no_v3", "no_memory_v2")


class ScenarioError(ValueError):
    """An invalid scenario file; the message is one line naming file, path and expectation."""


@dataclass(frozen=True)
class SimGpu:
    uuid: str
    index: int
    name: str
    pci_bus_id: str
    memory_total: int
    memory_reserved: int = 0
    utilization: float = 0.0
    mig_mode: bool = False
    lost: bool = False


@dataclass(frozen=True)
class SimProcess:
    pid: int
    ppid: int
    cmdline: tuple[str, ...]
    cgroup: str = HOST_CGROUP
    nspid: tuple[int, ...] = ()
    environ: Mapping[str, str] = field(default_factory=frozen_map)
    gpu_memory: Mapping[str, int] = field(default_factory=frozen_map)  # gpu uuid -> bytes


@dataclass(frozen=True)
class SimNvml:
    library: str = "present"  # present | missing
    variants: tuple[str, ...] = ()
    init_error: int = 0
    driver_version: str = "550.54.15"


@dataclass(frozen=True)
class Phase:
    name: str
    after_seconds: float
    gpus: Mapping[str, Mapping[str, Any]]
    processes: Mapping[int, Mapping[str, Any] | None]
    add_processes: tuple[SimProcess, ...]


@dataclass(frozen=True)
class Scenario:
    source: str  # file name, for messages
    node: str
    description: str
    nvml: SimNvml
    gpus: tuple[SimGpu, ...]
    processes: tuple[SimProcess, ...]
    phases: tuple[Phase, ...] = ()

    def at_phase(self, name: str | None) -> Scenario:
        """This scenario with every phase up to and including `name` applied."""
        if name is None:
            return self
        names = [p.name for p in self.phases]
        if name not in names:
            raise ScenarioError(
                f"{self.source}: phases: no phase named {name!r} "
                f"(have: {', '.join(names) or 'none'})"
            )
        state = self
        for phase in self.phases[: names.index(name) + 1]:
            state = _apply(state, phase)
        return state


class _Path:
    """Where we are inside the document, for error messages."""

    def __init__(self, source: str, parts: tuple[str, ...] = ()) -> None:
        self.source, self.parts = source, parts

    def __truediv__(self, part: str | int) -> _Path:
        text = f"[{part}]" if isinstance(part, int) else (f".{part}" if self.parts else part)
        return _Path(self.source, (*self.parts, text))

    def fail(self, expected: str, got: object) -> ScenarioError:
        where = "".join(self.parts) or "(top level)"
        shown = repr(got)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return ScenarioError(f"{self.source}: {where}: expected {expected}, got {shown}")


def parse_size(value: object, at: _Path) -> int:
    if isinstance(value, bool):
        raise at.fail("a size like 80GiB or an integer number of bytes", value)
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and (m := _SIZE.match(value)):
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    raise at.fail("a size like 80GiB or an integer number of bytes", value)


def parse_duration(value: object, at: _Path) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str) and (m := _DURATION.match(value)):
        return float(m.group(1)) * _SECONDS[m.group(2)]
    raise at.fail("a duration like 30s, 5m or a number of seconds", value)


def _mapping(value: object, at: _Path, what: str = "a mapping") -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise at.fail(what, value)
    return value


def _list(value: object, at: _Path) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise at.fail("a list", value)
    return value


def _str(value: object, at: _Path, what: str = "a string") -> str:
    if not isinstance(value, str) or not value or "\n" in value:
        raise at.fail(what, value)
    return value


def _int(value: object, at: _Path, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise at.fail(f"an integer >= {minimum}", value)
    return value


def _bool(value: object, at: _Path) -> bool:
    if not isinstance(value, bool):
        raise at.fail("true or false", value)
    return value


def _ratio(value: object, at: _Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise at.fail("a ratio between 0 and 1", value)
    return float(value)


def _check_keys(doc: Mapping[str, Any], allowed: set[str], at: _Path) -> None:
    for key in doc:
        if key not in allowed:
            raise (at / str(key)).fail(f"one of the keys {', '.join(sorted(allowed))}", key)


def _default_bus_id(index: int) -> str:
    # 14 slots per PCI domain keeps the bus byte two hex digits for any index.
    return f"{index // 14:08X}:{0x18 + (index % 14) * 0x10:02X}:00.0"


_GPU_KEYS = {
    "uuid",
    "index",
    "name",
    "pci_bus_id",
    "memory_total",
    "memory_reserved",
    "utilization",
    "mig_mode",
    "lost",
}


def _gpu(doc: object, at: _Path, position: int) -> SimGpu:
    d = _mapping(doc, at)
    _check_keys(d, _GPU_KEYS, at)
    uuid = _str(d.get("uuid"), at / "uuid", "a GPU UUID like GPU-3f1c2a6e-…")
    if not uuid.startswith(("GPU-", "MIG-")) or " " in uuid:
        raise (at / "uuid").fail("a GPU UUID starting with GPU- or MIG-", uuid)
    index = _int(d.get("index", position), at / "index")
    return SimGpu(
        uuid=uuid,
        index=index,
        name=_str(d.get("name", "NVIDIA H100 80GB HBM3"), at / "name"),
        pci_bus_id=_str(d.get("pci_bus_id", _default_bus_id(index)), at / "pci_bus_id"),
        memory_total=parse_size(d.get("memory_total", "80GiB"), at / "memory_total"),
        memory_reserved=parse_size(d.get("memory_reserved", 0), at / "memory_reserved"),
        utilization=_ratio(d.get("utilization", 0.0), at / "utilization"),
        mig_mode=_bool(d.get("mig_mode", False), at / "mig_mode"),
        lost=_bool(d.get("lost", False), at / "lost"),
    )


def _gpu_memory(value: object, at: _Path, gpus: tuple[SimGpu, ...]) -> dict[str, int]:
    by_index = {str(g.index): g.uuid for g in gpus}
    known = {g.uuid for g in gpus}
    out: dict[str, int] = {}
    for key, size in _mapping(value or {}, at).items():
        uuid = by_index.get(str(key), str(key))
        if uuid not in known:
            raise (at / str(key)).fail("the UUID or index of a GPU listed under gpus", key)
        out[uuid] = parse_size(size, at / str(key))
    return out


_PROC_KEYS = {"pid", "ppid", "nspid", "cmdline", "cgroup", "environ", "gpu_memory"}


def _process(doc: object, at: _Path, gpus: tuple[SimGpu, ...]) -> SimProcess:
    d = _mapping(doc, at)
    _check_keys(d, _PROC_KEYS, at)
    raw_cmd = d.get("cmdline", ["python3"])
    if isinstance(raw_cmd, str):
        raw_cmd = [raw_cmd]
    cmdline = tuple(str(a) for a in _list(raw_cmd, at / "cmdline"))
    if not cmdline or any("\0" in a for a in cmdline):
        raise (at / "cmdline").fail("a non-empty list of arguments without NUL bytes", raw_cmd)
    environ = {}
    for key, value in _mapping(d.get("environ") or {}, at / "environ").items():
        environ[_str(key, at / "environ", "a variable name")] = str(value)
    nspid = tuple(
        _int(p, at / "nspid" / i, 1) for i, p in enumerate(_list(d.get("nspid"), at / "nspid"))
    )
    return SimProcess(
        pid=_int(d.get("pid"), at / "pid", 2),
        ppid=_int(d.get("ppid", 1), at / "ppid"),
        cmdline=cmdline,
        cgroup=str(d.get("cgroup", HOST_CGROUP)),
        nspid=nspid,
        environ=frozen_map(environ),
        gpu_memory=frozen_map(_gpu_memory(d.get("gpu_memory"), at / "gpu_memory", gpus)),
    )


def _nvml(doc: object, at: _Path) -> SimNvml:
    d = _mapping(doc or {}, at)
    _check_keys(d, {"library", "variants", "init_error", "driver_version"}, at)
    library = d.get("library", "present")
    if library not in ("present", "missing"):
        raise (at / "library").fail("present or missing", library)
    variants = tuple(str(v) for v in _list(d.get("variants"), at / "variants"))
    for i, v in enumerate(variants):
        if v not in NVML_VARIANTS:
            raise (at / "variants" / i).fail(f"one of {', '.join(NVML_VARIANTS)}", v)
    return SimNvml(
        library=library,
        variants=variants,
        init_error=_int(d.get("init_error", 0), at / "init_error"),
        driver_version=_str(d.get("driver_version", "550.54.15"), at / "driver_version"),
    )


def _phase(doc: object, at: _Path, gpus: tuple[SimGpu, ...]) -> Phase:
    d = _mapping(doc, at)
    _check_keys(d, {"name", "after", "gpus", "processes", "add_processes"}, at)
    gpu_patches: dict[str, Mapping[str, Any]] = {}
    known = {g.uuid for g in gpus}
    for uuid, patch in _mapping(d.get("gpus") or {}, at / "gpus").items():
        if uuid not in known:
            raise (at / "gpus" / str(uuid)).fail("the UUID of a GPU listed under gpus", uuid)
        patch_map = _mapping(patch, at / "gpus" / str(uuid))
        _check_keys(patch_map, _GPU_KEYS - {"uuid", "index"}, at / "gpus" / str(uuid))
        gpu_patches[uuid] = patch_map
    proc_patches: dict[int, Mapping[str, Any] | None] = {}
    for pid, patch in _mapping(d.get("processes") or {}, at / "processes").items():
        where = at / "processes" / str(pid)
        key = _int(pid, where, 2)
        proc_patches[key] = None if patch is None else _mapping(patch, where, "a mapping or null")
    adds = tuple(
        _process(p, at / "add_processes" / i, gpus)
        for i, p in enumerate(_list(d.get("add_processes"), at / "add_processes"))
    )
    return Phase(
        name=_str(d.get("name"), at / "name"),
        after_seconds=parse_duration(d.get("after", 0), at / "after"),
        gpus=frozen_map(gpu_patches),
        processes=frozen_map(proc_patches),
        add_processes=adds,
    )


def _apply(state: Scenario, phase: Phase) -> Scenario:
    at = _Path(state.source) / "phases" / phase.name
    gpus = []
    for gpu in state.gpus:
        patch = phase.gpus.get(gpu.uuid)
        merged = {**gpu.__dict__, **patch} if patch else None
        gpus.append(_gpu(merged, at / "gpus" / gpu.uuid, gpu.index) if merged else gpu)
    processes = []
    for proc in state.processes:
        if proc.pid in phase.processes:
            patch = phase.processes[proc.pid]
            if patch is None:
                continue  # the process exited
            merged = {
                "pid": proc.pid,
                "ppid": proc.ppid,
                "cmdline": list(proc.cmdline),
                "cgroup": proc.cgroup,
                "nspid": list(proc.nspid),
                "environ": dict(proc.environ),
                "gpu_memory": dict(proc.gpu_memory),
                **patch,
            }
            processes.append(_process(merged, at / "processes" / str(proc.pid), tuple(gpus)))
        else:
            processes.append(proc)
    processes.extend(phase.add_processes)
    return replace(state, gpus=tuple(gpus), processes=tuple(processes))


def parse_scenario(doc: object, source: str) -> Scenario:
    at = _Path(source)
    d = _mapping(doc, at, "a YAML mapping with keys node, gpus, processes, …")
    _check_keys(d, {"node", "description", "nvml", "gpus", "processes", "phases"}, at)
    gpus = tuple(
        _gpu(g, at / "gpus" / i, i) for i, g in enumerate(_list(d.get("gpus"), at / "gpus"))
    )
    _unique([g.uuid for g in gpus], at / "gpus", "GPU UUIDs")
    _unique([g.index for g in gpus], at / "gpus", "GPU indices")
    processes = tuple(
        _process(p, at / "processes" / i, gpus)
        for i, p in enumerate(_list(d.get("processes"), at / "processes"))
    )
    _unique([p.pid for p in processes], at / "processes", "PIDs")
    phases = tuple(
        _phase(p, at / "phases" / i, gpus)
        for i, p in enumerate(_list(d.get("phases"), at / "phases"))
    )
    _unique([p.name for p in phases], at / "phases", "phase names")
    return Scenario(
        source=source,
        node=_str(d.get("node", "sim-node"), at / "node"),
        description=str(d.get("description", "")),
        nvml=_nvml(d.get("nvml"), at / "nvml"),
        gpus=gpus,
        processes=processes,
        phases=phases,
    )


def _unique(values: list[Any], at: _Path, what: str) -> None:
    seen = set()
    for value in values:
        if value in seen:
            raise at.fail(f"unique {what}", value)
        seen.add(value)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(unknown line)"
        raise ScenarioError(f"{p.name}: {where}: not valid YAML") from None
    return parse_scenario(doc, p.name)
