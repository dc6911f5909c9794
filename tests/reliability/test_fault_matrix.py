"""Fault matrix: every source x {absent, refusing, hanging, erroring, garbage, truncated,
oversized, flapping}, through the real pipeline and the real HTTP server.

For each cell: the exporter keeps serving; a scrape taken while a cycle runs answers within
SCRAPE_BOUND and a cycle within two source deadlines (plus slack); the faulted source says
why (`gpuledger_source_up` 0 and `gpuledger_source_errors_total{reason}`, or per engine
`gpuledger_engine_up` 0 for vLLM); only series that depend on that source change; and once
the fault ends, the source recovers by itself and every series is back as before.

docs/reliability.md has this matrix as a table. Cells left out (truncated for NVML and
PodResources) are explained there.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import random
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuledger.sim.fake_kubelet import FakeKubelet
from gpuledger.sim.fake_nvml import FakeNvmlState, FakeProcess, write_state
from gpuledger.sim.harness import nvml_state
from gpuledger.sim.scenario import parse_scenario
from tests.conftest import REPO, Sample, pick, value
from tests.reliability.harness import Node, errors, series, source_up, status_of
from tests.reliability.scenarios import GIB, SOURCES, full_node

DEADLINE = 0.5
# A scrape renders the last published ledger and never waits on a source: generous bound.
SCRAPE_BOUND = 1.0
# A cycle waits at most one deadline per stage (two stages), plus slack for a busy CI box.
CYCLE_SLACK = 1.0
FLAPS = 3

GPU_FAMILIES = {
    "gpuledger_gpu_info",
    "gpuledger_gpu_up",
    "gpuledger_gpu_memory_total_bytes",
    "gpuledger_gpu_memory_used_bytes",
    "gpuledger_gpu_utilization_ratio",
}
CONTAINER_FAMILIES = {
    "gpuledger_container_gpu_memory_used_bytes",
    "gpuledger_container_gpu_processes",
    "gpuledger_unattributed_gpu_memory_used_bytes",
    "gpuledger_container_device_info",
    "gpuledger_gpu_allocated_unused",
    "gpuledger_gpu_unallocated_use",
}
ENGINE_VALUES = {
    "gpuledger_engine_requests",
    "gpuledger_engine_requests_waiting_by_reason",
    "gpuledger_engine_kv_cache_usage_ratio",
    "gpuledger_engine_preemptions_total",
}
ENGINE_FAMILIES = {
    *ENGINE_VALUES,
    "gpuledger_engine_up",
    "gpuledger_engine_config_info",
    "gpuledger_engine_gpus",
    "gpuledger_engine_gpu_info",
    "gpuledger_engine_max_num_seqs",
}
RAY_FAMILIES = {
    "gpuledger_ray_node_gpus",
    "gpuledger_ray_actor_gpus",
    "gpuledger_ray_actor_gpu_memory_used_bytes",
    "gpuledger_ray_actors_without_gpu_memory",
}
RAY_PROCESS_FAMILIES = {
    "gpuledger_ray_actor_gpu_memory_used_bytes",
    "gpuledger_ray_actors_without_gpu_memory",
}

# Families whose series may change while a source is down: those built from it, directly
# or through another source that needs it (procfs reads the PIDs NVML reports; the Ray
# layer joins actors to pods and to NVML memory). Every other series must stay as it was.
AFFECTS: dict[str, set[str]] = {
    "nvml": GPU_FAMILIES | CONTAINER_FAMILIES | RAY_PROCESS_FAMILIES,
    "procfs": CONTAINER_FAMILIES | RAY_PROCESS_FAMILIES,
    "podresources": {
        "gpuledger_gpu_allocation_info",
        "gpuledger_container_device_info",
        "gpuledger_gpu_allocated_unused",
        "gpuledger_gpu_unallocated_use",
        "gpuledger_ray_node_gpus",
    },
    # Pod names, UIDs and workloads label almost everything; while the API server is
    # down after a first list, the informer's cache keeps them (nothing changes then).
    "kubernetes": CONTAINER_FAMILIES
    | RAY_FAMILIES
    | {"gpuledger_gpu_allocation_info", "gpuledger_pod_starting"},
    "vllm": ENGINE_FAMILIES,
    "ray": RAY_FAMILIES,
}
# Families that must be gone while the source is down (its own series).
OWN: dict[str, set[str]] = {
    "nvml": GPU_FAMILIES,
    "procfs": {
        "gpuledger_container_gpu_memory_used_bytes",
        "gpuledger_container_gpu_processes",
        "gpuledger_unattributed_gpu_memory_used_bytes",
    },
    "podresources": {"gpuledger_gpu_allocation_info"},
    "kubernetes": set(),  # identities stay from the informer's cache (see the docstring)
    "vllm": ENGINE_VALUES,  # gpuledger_engine_up stays, at 0
    "ray": RAY_FAMILIES,
}


Action = Callable[[Node], None]


@dataclass(frozen=True)
class Cell:
    source: str
    fault: str
    how: str  # what the simulated source does, for the docs and failure messages
    start: Action
    stop: Action
    # Reasons in gpuledger_source_errors_total that say why; empty: the source stays up
    # (bad data is contained, or for vLLM the engine, not the source, is down).
    reasons: tuple[str, ...] = ()
    # The fault is there before the exporter starts: a doc change or config change.
    doc: Callable[[dict[str, Any]], None] | None = None
    config: Callable[[Path], dict[str, Any]] | None = None
    deadline: float = DEADLINE
    # Extra assertions while the fault is on (for faults the source absorbs).
    check: Callable[[list[Sample]], None] | None = None

    @property
    def id(self) -> str:
        return f"{self.source}-{self.fault}"


def noop(_: Node) -> None:
    pass


def restore(node: Node) -> None:
    node.restore()


# ----------------------------------------------------------------------------- NVML


def nvml_fault(**changes: Any) -> Action:
    def start(node: Node) -> None:
        state = dataclasses.replace(nvml_state(node.healthy), **changes)
        write_state(node.sim.state_file, state)

    return start


def nvml_library_elsewhere(tmp: Path) -> dict[str, Any]:
    return {"nvml_library": str(tmp / "driver" / "libnvidia-ml.so.1")}


def nvml_library_installed(node: Node) -> None:
    target = Path(node.config.nvml_library or "")
    if target.exists():
        return  # never rewrite a loaded library in place: its mapping would change under it
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    shutil.copy(node.sim.library_path, partial)
    partial.replace(target)


def nvml_garbage(node: Node) -> None:
    state = nvml_state(node.healthy)
    # A process claiming more memory than the GPU has (what a driver bug looks like).
    bogus = tuple(
        FakeProcess(p.gpu_index, p.pid, 2**62) if p.pid == 100 else p for p in state.processes
    )
    write_state(node.sim.state_file, dataclasses.replace(state, processes=bogus))


def nvml_garbage_check(current: list[Sample]) -> None:
    assert source_up(current, "nvml") == 1
    used = value(current, "gpuledger_container_gpu_memory_used_bytes", pod="train-0")
    assert 0 <= used <= 80 * GIB, "a value larger than the GPU is not a fact"


def nvml_oversized(node: Node) -> None:
    state = nvml_state(node.healthy)
    gpus = [
        dataclasses.replace(state.gpus[0], index=i, uuid=f"GPU-71000000-0000-4000-8000-{i:012d}")
        for i in range(64)
    ]
    gpus[0], gpus[1] = state.gpus[0], state.gpus[1]
    # The library's limit: 4096 processes, most of them not visible in /proc.
    extra = [FakeProcess(i % 64, 10_000 + i, GIB) for i in range(4096 - len(state.processes))]
    write_state(
        node.sim.state_file,
        FakeNvmlState(gpus=tuple(gpus), processes=(*state.processes, *extra)),
    )


def nvml_oversized_check(current: list[Sample]) -> None:
    assert source_up(current, "nvml") == 1
    assert len(pick(current, "gpuledger_gpu_info")) == 64
    # The pods' processes are still attributed among the 4,096.
    assert value(current, "gpuledger_container_gpu_processes", pod="train-0") == 1


# --------------------------------------------------------------------------- procfs


def proc_root(node: Node) -> Path:
    return node.sim.proc_root


def proc_root_away(node: Node) -> None:
    proc_root(node).rename(proc_root(node).with_name("proc.away"))


def proc_root_back(node: Node) -> None:
    away = proc_root(node).with_name("proc.away")
    if away.exists():
        away.rename(proc_root(node))


def pids_hidden(node: Node) -> None:
    """As without hostPID (or with hidepid): the root exists, host PIDs are not in it."""
    hidden = proc_root(node).with_name("proc.hidden")
    hidden.mkdir(exist_ok=True)
    for entry in proc_root(node).iterdir():
        entry.rename(hidden / entry.name)


def pids_shown(node: Node) -> None:
    hidden = proc_root(node).with_name("proc.hidden")
    if hidden.exists():
        for entry in hidden.iterdir():
            entry.rename(proc_root(node) / entry.name)
        hidden.rmdir()


def fifo_status(node: Node) -> None:
    """/proc/<pid>/status blocks on open, as reads of a process stuck in D state do."""
    status = proc_root(node) / "100" / "status"
    status.unlink()
    os.mkfifo(status)


def fifo_released(node: Node) -> None:
    status = proc_root(node) / "100" / "status"
    if status.exists() and not status.is_file():
        try:
            fd = os.open(status, os.O_WRONLY | os.O_NONBLOCK)  # a waiting reader gets EOF
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: nobody is blocked on it
                raise
        else:
            os.close(fd)
        status.unlink()
    node.restore()


def unreadable(*names: str) -> Action:
    """Each process's files replaced by directories: reads fail (EISDIR), as reads of
    another user's environ fail (EACCES) without CAP_SYS_PTRACE."""

    def start(node: Node) -> None:
        for pid_dir in proc_root(node).iterdir():
            for name in names:
                (pid_dir / name).unlink()
                (pid_dir / name).mkdir()

    return start


def readable_again(node: Node) -> None:
    for path in proc_root(node).glob("*/*"):
        if path.is_dir():
            path.rmdir()
    node.restore()


def rewrite_files(change: Callable[[str, bytes], bytes]) -> Action:
    def start(node: Node) -> None:
        for pid_dir in proc_root(node).iterdir():
            for name in ("status", "cgroup", "cmdline", "environ"):
                path = pid_dir / name
                path.write_bytes(change(name, path.read_bytes()))

    return start


def garbage_bytes(name: str, content: bytes) -> bytes:
    rng = random.Random(f"{name}:{len(content)}")  # deterministic
    return bytes(rng.randrange(256) for _ in range(200))


def truncated_bytes(name: str, content: bytes) -> bytes:
    return content[: len(content) // 2]


def oversized_bytes(name: str, content: bytes) -> bytes:
    # The real content first, then far more than the exporter reads (64 KiB for small
    # files, 1 MiB for environ).
    if name == "environ":
        return content + b"".join(b"JUNK_%07d=%s\0" % (i, b"x" * 100) for i in range(30_000))
    if name == "cmdline":
        return content + b"--pad\0" * 200_000
    return content + b"\n" * (1024 * 1024)


def procfs_up(current: list[Sample]) -> None:
    assert source_up(current, "procfs") == 1


def procfs_garbage_check(current: list[Sample]) -> None:
    procfs_up(current)
    # A cgroup that names no pod means no pod: the memory is the host's, not lost.
    assert not pick(current, "gpuledger_container_gpu_memory_used_bytes")
    total = sum(v for _, _, v in pick(current, "gpuledger_unattributed_gpu_memory_used_bytes"))
    assert total == 16 * GIB


# ---------------------------------------------------------------------- PodResources


def kubelet_gone(node: Node) -> None:
    assert node.sim.kubelet is not None
    node.sim.kubelet.stop(grace_seconds=0.1)
    node.extra["kubelet_stopped"] = True


def kubelet_back(node: Node) -> None:
    """A new kubelet on the same path (once: stop actions also run at teardown)."""
    stale = node.extra.pop("stale_socket", None)
    if stale is not None:
        stale.close()
        os.unlink(node.sim.socket_path)
    if node.extra.pop("kubelet_stopped", False):
        node.sim.kubelet = FakeKubelet(node.sim.socket_path).start()
    node.restore()


def kubelet_stale_socket(node: Node) -> None:
    """The kubelet died and left its socket file: connecting is refused."""
    kubelet_gone(node)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(node.sim.socket_path)  # bound, never listening
    node.extra["stale_socket"] = stale


def kubelet_fault(fault: str) -> Action:
    def start(node: Node) -> None:
        assert node.sim.kubelet is not None
        node.sim.kubelet.set_fault(fault)  # type: ignore[arg-type]

    return start


# ------------------------------------------------------------------------ Kubernetes


def api_fault(fault: str) -> Action:
    def start(node: Node) -> None:
        assert node.sim.apiserver is not None
        node.sim.apiserver.set_fault(fault)  # type: ignore[arg-type]

    return start


def kubeconfig_elsewhere(tmp: Path) -> dict[str, Any]:
    return {"kubeconfig": str(tmp / "absent-kubeconfig")}


def kubeconfig_written(node: Node) -> None:
    assert node.sim.apiserver is not None and node.config.kubeconfig is not None
    node.sim.apiserver.kubeconfig(node.config.kubeconfig)


def api_hangs_from_the_start(doc: dict[str, Any]) -> None:
    doc["kubernetes"]["fault"] = "hang"


def identities_kept(current: list[Sample]) -> None:
    """After a first list, pod identities stay from the informer's cache."""
    assert value(current, "gpuledger_container_gpu_processes", pod="train-0") == 1


def no_pod_names(current: list[Sample]) -> None:
    assert not pick(current, "gpuledger_pod_starting")
    for _, labels, _ in pick(current, "gpuledger_container_gpu_memory_used_bytes"):
        assert labels["pod"] == "" and labels["pod_uid"], labels


# ----------------------------------------------------------------------------- vLLM


def engine_fault(fault: str) -> Action:
    def start(node: Node) -> None:
        node.sim.engines["static-0"].set_fault(fault)  # type: ignore[arg-type]

    return start


def engine_refuses_from_the_start(doc: dict[str, Any]) -> None:
    doc["vllm"][0]["fault"] = "refuse"


def engine_down(current: list[Sample]) -> bool:
    ups = pick(current, "gpuledger_engine_up")
    return bool(ups) and all(v == 0 for _, _, v in ups) and source_up(current, "vllm") == 1


def engine_down_check(current: list[Sample]) -> None:
    assert engine_down(current), pick(current, "gpuledger_engine_up")


# ------------------------------------------------------------------------------ Ray


def ray_fault(fault: str) -> Action:
    def start(node: Node) -> None:
        assert node.sim.ray is not None
        node.sim.ray.hang_seconds = 2.0  # the fake's handler lets go soon after
        node.sim.ray.set_fault(fault)  # type: ignore[arg-type]

    return start


def ray_refuses_from_the_start(doc: dict[str, Any]) -> None:
    doc["ray"]["fault"] = "refuse"


# ------------------------------------------------------------------------- the matrix

CELLS = [
    # NVML
    Cell("nvml", "absent", "no libnvidia-ml.so.1 at the configured path; installed later",
         noop, nvml_library_installed, ("library_not_found",), config=nvml_library_elsewhere),
    Cell("nvml", "refusing", "every query answers NVML_ERROR_NO_PERMISSION",
         nvml_fault(query_error=4), restore, ("no_permission",)),
    Cell("nvml", "hanging", "nvmlDeviceGetCount blocks for 1.5 s (three deadlines)",
         nvml_fault(hang_ms=1500), restore, ("timeout", "still_running")),
    Cell("nvml", "erroring", "every query answers NVML_ERROR_UNKNOWN after init",
         nvml_fault(query_error=999), restore, ("unknown",)),
    Cell("nvml", "garbage", "a process reports 4 EiB of memory on an 80 GiB GPU",
         nvml_garbage, restore, check=nvml_garbage_check),
    Cell("nvml", "oversized", "64 GPUs and 4,096 processes (the library's limits)",
         nvml_oversized, restore, check=nvml_oversized_check),
    Cell("nvml", "flapping", "NVML_ERROR_UNKNOWN on, off, on, off...",
         nvml_fault(query_error=999), restore, ("unknown",)),
    # procfs
    Cell("procfs", "absent", "the proc root is gone (wrong --proc-root, unmounted)",
         proc_root_away, proc_root_back, ("proc_root_missing",)),
    Cell("procfs", "refusing", "host PIDs not visible: the root exists, the PIDs are not in it",
         pids_hidden, pids_shown, ("pids_not_visible",)),
    Cell("procfs", "hanging", "open(/proc/<pid>/status) blocks (a FIFO stands for D state)",
         fifo_status, fifo_released, ("timeout", "still_running")),
    Cell("procfs", "erroring", "environ and cmdline of every process unreadable",
         unreadable("environ", "cmdline"), readable_again, check=procfs_up),
    Cell("procfs", "garbage", "status, cgroup, cmdline, environ are random bytes",
         rewrite_files(garbage_bytes), restore, check=procfs_garbage_check),
    Cell("procfs", "truncated", "every file cut in half",
         rewrite_files(truncated_bytes), restore, check=procfs_up),
    Cell("procfs", "oversized", "files padded past the read limits (environ > 3 MiB)",
         rewrite_files(oversized_bytes), restore, check=procfs_up),
    Cell("procfs", "flapping", "the proc root disappears and comes back",
         proc_root_away, proc_root_back, ("proc_root_missing",)),
    # PodResources
    Cell("podresources", "absent", "the kubelet stops and its socket is removed",
         kubelet_gone, kubelet_back, ("socket_missing",)),
    Cell("podresources", "refusing", "a stale socket file nothing listens on",
         kubelet_stale_socket, kubelet_back, ("unavailable",)),
    Cell("podresources", "hanging", "calls never answer before the client's deadline",
         kubelet_fault("hang"), restore, ("timeout",)),
    Cell("podresources", "erroring", "calls fail with INTERNAL",
         kubelet_fault("internal"), restore, ("internal",)),
    Cell("podresources", "garbage", "List answers bytes that are not protobuf",
         kubelet_fault("garbage"), restore, ("internal",)),
    Cell("podresources", "oversized", "List answers 17 MiB (over the 16 MiB limit)",
         kubelet_fault("huge"), restore, ("resource_exhausted",), deadline=3.0),
    Cell("podresources", "flapping", "UNAVAILABLE on, off, on, off...",
         kubelet_fault("unavailable"), restore, ("unavailable",)),
    # Kubernetes API
    Cell("kubernetes", "absent", "no kubeconfig yet; written later",
         noop, kubeconfig_written, ("config",), config=kubeconfig_elsewhere, check=no_pod_names),
    Cell("kubernetes", "refusing", "the API server's port is closed after the first list",
         api_fault("refuse"), restore, ("unreachable",), check=identities_kept),
    Cell("kubernetes", "hanging", "the first list never answers until the hang ends",
         noop, restore, ("not_synced",), doc=api_hangs_from_the_start, check=no_pod_names),
    Cell("kubernetes", "erroring", "HTTP 500 after the first list",
         api_fault("http_500"), restore, ("server_error",), check=identities_kept),
    Cell("kubernetes", "garbage", "200 with an HTML page instead of JSON",
         api_fault("garbage"), restore, ("bad_response",), check=identities_kept),
    Cell("kubernetes", "truncated", "the body stops at half its Content-Length",
         api_fault("truncated"), restore, ("unreachable",), check=identities_kept),
    Cell("kubernetes", "oversized", "a list page of 65 MiB (over the 64 MiB cap)",
         api_fault("huge"), restore, ("too_large",), check=identities_kept),
    Cell("kubernetes", "flapping", "HTTP 500 on, off, on, off...",
         api_fault("http_500"), restore, ("server_error",), check=identities_kept),
    # vLLM (the source stays up; each engine has its own gpuledger_engine_up)
    Cell("vllm", "absent", "nothing listens at the target from the start",
         noop, restore, doc=engine_refuses_from_the_start, check=engine_down_check),
    Cell("vllm", "refusing", "the engine's port closes",
         engine_fault("refuse"), restore, check=engine_down_check),
    Cell("vllm", "hanging", "connections accepted, never answered",
         engine_fault("hang"), restore, check=engine_down_check),
    Cell("vllm", "erroring", "HTTP 500",
         engine_fault("http_500"), restore, check=engine_down_check),
    Cell("vllm", "garbage", "200 with HTML and binary bytes",
         engine_fault("garbage"), restore, check=engine_down_check),
    Cell("vllm", "truncated", "half the declared body, then close",
         engine_fault("truncated"), restore, check=engine_down_check),
    Cell("vllm", "oversized", "a valid exposition padded to 32 MiB (cap 8 MiB)",
         engine_fault("huge"), restore, check=engine_down_check),
    Cell("vllm", "flapping", "the port closes and opens again",
         engine_fault("refuse"), restore, check=engine_down_check),
    # Ray dashboard
    Cell("ray", "absent", "nothing listens at --ray-address from the start",
         noop, restore, ("unreachable",), doc=ray_refuses_from_the_start),
    Cell("ray", "refusing", "the dashboard's port closes",
         ray_fault("refuse"), restore, ("unreachable",)),
    Cell("ray", "hanging", "requests never answered",
         ray_fault("hang"), restore, ("timeout", "still_running")),
    Cell("ray", "erroring", "HTTP 500 (aiohttp's bare text page)",
         ray_fault("http_500"), restore, ("http_error",)),
    Cell("ray", "garbage", "200 with HTML instead of JSON",
         ray_fault("garbage"), restore, ("bad_response",)),
    Cell("ray", "truncated", "half the declared body, then close",
         ray_fault("truncated"), restore, ("bad_response",)),
    Cell("ray", "oversized", "a 33 MiB body, streamed (cap 32 MiB)",
         ray_fault("huge"), restore, ("too_large",), deadline=3.0),
    Cell("ray", "flapping", "HTTP 500 on, off, on, off...",
         ray_fault("http_500"), restore, ("http_error",)),
]  # fmt: skip


def faulted(cell: Cell, current: list[Sample]) -> bool:
    """Whether the exporter shows the fault (the source says why, or the check holds)."""
    if cell.reasons:
        seen = errors(current, cell.source)
        return source_up(current, cell.source) == 0 and any(r in seen for r in cell.reasons)
    if cell.source == "vllm":
        return engine_down(current)
    if cell.check is None:
        return True
    try:
        cell.check(current)
    except AssertionError:
        return False
    return True


def recovered(baseline: frozenset[Any]) -> Callable[[list[Sample]], bool]:
    return lambda current: (
        all(source_up(current, s) == 1 for s in SOURCES) and (series(current) == baseline)
    )


def changed_families(before: frozenset[Any], after: frozenset[Any]) -> set[str]:
    return {name for name, _ in before ^ after}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> frozenset[Any]:
    """The series of the healthy node, every source up."""
    node = Node(full_node(), tmp_path_factory.mktemp("baseline"), deadline=DEADLINE)
    try:
        return series(node.until(recovered_any))
    finally:
        node.close()


def recovered_any(current: list[Sample]) -> bool:
    return all(source_up(current, s) == 1 for s in SOURCES)


@pytest.fixture
def node_for(tmp_path: Path) -> Iterator[Callable[[Cell], Node]]:
    made: list[tuple[Node, Cell]] = []

    def make(cell: Cell) -> Node:
        doc = full_node()
        if cell.doc is not None:
            cell.doc(doc)
        config = cell.config(tmp_path) if cell.config is not None else {}
        node = Node(
            doc,
            tmp_path / "node",
            deadline=cell.deadline,
            warm_up=0 if cell.doc or cell.config else 5.0,
            healthy=parse_scenario(full_node(), "healthy.yaml"),
            **config,
        )
        made.append((node, cell))
        return node

    yield make
    for node, cell in made:
        try:
            cell.stop(node)  # a hung reader must never outlive the test
        finally:
            node.close()


def assert_served_in_time(node: Node, cell: Cell) -> None:
    assert node.last_scrape_seconds < SCRAPE_BOUND, (cell.id, node.last_scrape_seconds)
    assert node.last_cycle_seconds < 2 * cell.deadline + CYCLE_SLACK, (
        cell.id,
        node.last_cycle_seconds,
    )
    status, body, _ = node.get("/healthz")
    assert (status, body) == (200, b"ok\n")


def assert_fault_shown(cell: Cell, current: list[Sample], before: frozenset[Any]) -> None:
    now = series(current)
    changed = changed_families(before, now)
    stray = changed - AFFECTS[cell.source]
    assert not stray, f"{cell.id}: series of other sources changed: {sorted(stray)}"
    if cell.reasons:
        assert source_up(current, cell.source) == 0, status_of(current)
        assert set(errors(current, cell.source)) & set(cell.reasons), status_of(current)
        still_there = {n for n, _ in now} & OWN[cell.source]
        assert not still_there, f"{cell.id}: its own series should be gone: {still_there}"
    if cell.source == "vllm":
        assert not {n for n, _ in now} & OWN["vllm"]
    if cell.check is not None:
        cell.check(current)


# What each cell measured, written to test-artifacts/fault-matrix.json (docs/reliability.md).
MEASURED: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    if MEASURED:
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "fault-matrix.json").write_text(json.dumps(MEASURED, indent=1))


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.id)
def test_fault(cell: Cell, baseline: frozenset[Any], node_for: Callable[[Cell], Node]) -> None:
    node = node_for(cell)
    at_start = cell.doc is not None or cell.config is not None
    if not at_start:
        assert series(node.until(recovered_any)) == baseline
    rounds = FLAPS if cell.fault == "flapping" else 1
    worst = {"cycle_s": 0.0, "scrape_s": 0.0, "shown_after_s": 0.0, "recovered_after_s": 0.0}
    for _ in range(rounds):
        started = time.monotonic()
        cell.start(node)
        current = node.until(lambda s: faulted(cell, s), timeout=20)
        shown = time.monotonic() - started
        assert_served_in_time(node, cell)
        # One more cycle under the fault: still contained, still served in time.
        current = node.cycle_and_scrape()
        assert_served_in_time(node, cell)
        assert_fault_shown(cell, current, baseline)
        seen = errors(current, cell.source)
        worst["cycle_s"] = node.max_cycle_seconds
        worst["scrape_s"] = node.max_scrape_seconds
        worst["shown_after_s"] = max(worst["shown_after_s"], shown)
        started = time.monotonic()
        cell.stop(node)
        current = node.until(recovered(baseline), timeout=20)
        worst["recovered_after_s"] = max(worst["recovered_after_s"], time.monotonic() - started)
        assert_served_in_time(node, cell)
    if cell.reasons:
        counted = sum(errors(current, cell.source).get(r, 0) for r in cell.reasons)
        assert counted >= rounds, status_of(current)
    MEASURED[cell.id] = {
        "how": cell.how,
        "reasons": sorted(seen),
        **{k: round(v, 3) for k, v in worst.items()},
    }


def test_why_an_engine_is_down_is_visible(node_for: Callable[[Cell], Node]) -> None:
    cell = next(c for c in CELLS if c.id == "vllm-erroring")
    node = node_for(cell)
    node.until(recovered_any)
    cell.start(node)
    current = node.until(engine_down)
    document = json.loads(node.get("/ledger.json")[1])
    reasons = {engine.get("reason") for engine in document["engines"]}
    counted = errors(current, "vllm")
    assert reasons == {"http_500"} or counted.get("http_500"), (reasons, counted)
