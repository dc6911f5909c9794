"""Churn: pods and processes created and deleted between and during reads, a GPU lost and
recovered, the kubelet socket replaced, the API server's watch expiring.

What a user must never see: a series of a pod that is gone (once every source has said
so), a process's memory counted as the host's because it exited mid-read, a crash, or an
exporter that slowly grows threads or file descriptors.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuledger.sim.fake_kubelet import FakeKubelet
from gpuledger.sim.fake_nvml import FakeNvmlState, write_state
from gpuledger.sim.harness import nvml_state
from gpuledger.sim.scenario import parse_scenario
from gpuledger.sources.procfs import source as procfs
from tests.conftest import REPO, Sample, pick, value
from tests.reliability.harness import Node, errors, open_fds, source_up
from tests.reliability.scenarios import CHURN_GPUS, GIB, churn_node, job_uid

# Generous leak bounds: what the exporter may hold more after the churn than before it.
# Each cycle of a leak would add one (or more) per round, far past these.
THREAD_SLACK = 4
FD_SLACK = 8
SOURCES = ("nvml", "procfs", "podresources", "kubernetes")
# A join of two processes takes milliseconds; interpreter start-up and imports about 1 s.
JOIN_TIMEOUT = 4.0


def scenario(first: int, count: int = 3, lost: tuple[int, ...] = ()) -> Any:
    return parse_scenario(churn_node(first, count, lost), "churn.yaml")


def pod_labels(current: list[Sample]) -> set[str]:
    """Every non-empty `pod` label value in the exposition."""
    return {labels["pod"] for _, labels, _ in current if labels.get("pod")}


def uid_labels(current: list[Sample]) -> set[str]:
    return {labels["pod_uid"] for _, labels, _ in current if labels.get("pod_uid")}


def shows_exactly(first: int, count: int = 3) -> Callable[[list[Sample]], bool]:
    """Every source up, and the live jobs (and only they) in every family that names pods."""
    names = {f"job-{i}" for i in range(first, first + count)}
    uids = {job_uid(i) for i in range(first, first + count)}

    def done(current: list[Sample]) -> bool:
        used = {
            labels["pod"] for _, labels, _ in pick(current, "gpuledger_container_gpu_processes")
        }
        allocated = {
            labels["pod"] for _, labels, _ in pick(current, "gpuledger_gpu_allocation_info")
        }
        return (
            all(source_up(current, s) == 1 for s in SOURCES)
            and used == names
            and allocated == names
            and pod_labels(current) == names
            and uid_labels(current) == uids
        )

    return done


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    made = Node(churn_node(0), tmp_path / "node", deadline=1.0)
    assert made.sim.apiserver is not None
    made.sim.apiserver.history_limit = 200  # the fake's memory, not the exporter's
    yield made
    made.close()


def settle_resources(limit: float = 5.0) -> tuple[int, int]:
    """Threads and fds once transient ones (handler threads of the fakes) are gone."""
    give_up = time.monotonic() + limit
    counts = (threading.active_count(), open_fds())
    while time.monotonic() < give_up:
        time.sleep(0.1)
        now = (threading.active_count(), open_fds())
        if now == counts:
            break
        counts = now
    return counts


# Threads and fds before and after each test's churn: test-artifacts/churn.json.
MEASURED: dict[str, dict[str, int]] = {}


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    if MEASURED:
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "churn.json").write_text(json.dumps(MEASURED, indent=1))


def assert_no_leak(before: tuple[int, int], after: tuple[int, int]) -> None:
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]
    MEASURED[test] = {
        "threads_before": before[0],
        "threads_after": after[0],
        "fds_before": before[1],
        "fds_after": after[1],
    }
    assert after[0] <= before[0] + THREAD_SLACK, f"threads {before[0]} -> {after[0]}"
    assert after[1] <= before[1] + FD_SLACK, f"open fds {before[1]} -> {after[1]}"


def test_pods_and_processes_come_and_go_between_reads(node: Node) -> None:
    node.until(shows_exactly(0))
    before = settle_resources()
    for first in range(1, 16):
        # Each round one job ends (pod deleted, process exited, allocation released) and
        # one starts, in every source at once.
        node.sim.apply(scenario(first))
        current = node.until(shows_exactly(first))
        assert f"job-{first - 1}" not in pod_labels(current)
        # And it stays gone.
        assert shows_exactly(first)(node.cycle_and_scrape())
    assert_no_leak(before, settle_resources())


def test_pods_and_processes_churn_during_reads(node: Node) -> None:
    """A writer rewrites /proc, the NVML state, the kubelet and the API server as fast as
    it can while the exporter cycles: reads see files half written, PIDs that vanish,
    pods that come and go between the sources' reads."""
    node.until(shows_exactly(0))
    before = settle_resources()
    stop = threading.Event()
    rounds = [0]
    failures: list[BaseException] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                rounds[0] += 1
                node.sim.apply(scenario(rounds[0] % 7, count=1 + rounds[0] % 3))
        except BaseException as exc:  # reported by the test, not lost in a thread
            failures.append(exc)

    writer = threading.Thread(target=churn, name="churn-writer")
    writer.start()
    try:
        for _ in range(60):
            current = node.cycle_and_scrape()
            assert source_up(current, "nvml") == 1
            # Nothing the churn does is a bug in a source: never an internal error.
            for source in SOURCES:
                assert "internal_error" not in errors(current, source), errors(current, source)
    finally:
        stop.set()
        writer.join(30)
    assert not failures, failures
    assert rounds[0] > 20, "the writer barely ran: the test did not churn"
    final = rounds[0] % 7, 1 + rounds[0] % 3
    node.sim.apply(scenario(*final))
    node.until(shows_exactly(*final))
    assert_no_leak(before, settle_resources())


def test_process_exiting_between_its_status_and_cgroup_reads_is_not_the_hosts(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process exits after procfs read its status, before its cgroup: which pod it
    belonged to is unknown, so its memory must not be reported as the host's."""
    node.until(shows_exactly(0))
    real_read = procfs._read
    exiting = str(node.sim.proc_root / "1000")

    def read_then_exit(path: str, limit: int) -> bytes | None:
        data = real_read(path, limit)
        if path == f"{exiting}/status":
            shutil.rmtree(exiting, ignore_errors=True)
        return data

    monkeypatch.setattr(procfs, "_read", read_then_exit)
    current = node.cycle_and_scrape()
    assert source_up(current, "procfs") == 1
    # GPU 0 holds the host daemon's 1 GiB and job-0's 1 GiB: only the first is the host's.
    assert (
        value(current, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=CHURN_GPUS[0])
        == GIB
    )
    assert not pick(current, "gpuledger_container_gpu_memory_used_bytes", pod="job-0")


def test_gpu_lost_recovered_and_fallen_off_the_bus(node: Node) -> None:
    node.until(shows_exactly(0))
    before = settle_resources()
    for first in range(3):
        # GPU 1 (job-1's on the first round) is lost, then comes back with other jobs.
        node.sim.apply(scenario(first, lost=(1,)))
        current = node.until(
            lambda s: (
                value(s, "gpuledger_gpu_up", gpu_uuid=CHURN_GPUS[1]) == 0
                and source_up(s, "nvml") == 1
            )
        )
        assert not pick(current, "gpuledger_gpu_memory_used_bytes", gpu_uuid=CHURN_GPUS[1])
        assert value(current, "gpuledger_gpu_up", gpu_uuid=CHURN_GPUS[0]) == 1
        node.sim.apply(scenario(first + 1))
        current = node.until(shows_exactly(first + 1))
        assert value(current, "gpuledger_gpu_up", gpu_uuid=CHURN_GPUS[1]) == 1
    # The highest-index GPU falls off the bus: NVML counts one GPU fewer, and its
    # process (job-3's) is no longer listed by NVML either.
    state = scenario(3)
    node.sim.apply(state)
    node.until(shows_exactly(3))
    healthy = nvml_state(state)
    write_state(
        node.sim.state_file,
        FakeNvmlState(
            gpus=healthy.gpus[:3], processes=tuple(p for p in healthy.processes if p.gpu_index < 3)
        ),
    )
    current = node.until(lambda s: len(pick(s, "gpuledger_gpu_info")) == 3)
    left = {name for name, labels, _ in current if labels.get("gpu_uuid") == CHURN_GPUS[3]}
    # Only the kubelet's claim that job-3 holds it stays visible.
    assert left == {"gpuledger_gpu_allocation_info", "gpuledger_gpu_allocated_unused"}, left
    assert value(current, "gpuledger_gpu_allocated_unused", pod="job-3") == 1
    node.sim.apply(state)
    node.until(lambda s: len(pick(s, "gpuledger_gpu_info")) == 4 and shows_exactly(3)(s))
    assert_no_leak(before, settle_resources())


def test_kubelet_socket_replaced(node: Node) -> None:
    """The kubelet restarts: its socket is removed and created again, a new inode on the
    same path, sometimes with the allocations of other pods."""
    node.until(shows_exactly(0))
    before = settle_resources()
    for first in range(1, 8):
        assert node.sim.kubelet is not None
        node.sim.kubelet.stop(grace_seconds=0.1)
        node.cycle_and_scrape()  # the source notices it is gone (socket_missing)
        node.sim.kubelet = FakeKubelet(node.sim.socket_path).start()
        node.sim.apply(scenario(first))
        node.until(shows_exactly(first))
    current = node.cycle_and_scrape()
    assert errors(current, "podresources").get("socket_missing", 0) >= 7
    assert_no_leak(before, settle_resources())


def test_watch_expiring_while_pods_change(node: Node) -> None:
    """The API server forgets the informer's resourceVersion (compaction, restart) while
    pods are deleted and created: the informer relists, and deleted pods leave no series."""
    node.until(shows_exactly(0))
    assert node.sim.apiserver is not None
    before = settle_resources()
    for first in range(1, 5):
        node.sim.apiserver.expire_history()
        node.sim.apply(scenario(first))  # deletions the informer never sees as events
        node.until(shows_exactly(first))
        # Let the new watch run a while, as between compactions: a 410 again right after
        # a relist is a broken server, and the informer rightly backs off from those.
        time.sleep(1.1)
    assert_no_leak(before, settle_resources())


def test_nothing_left_behind_after_close(tmp_path: Path) -> None:
    """Starting and stopping the whole exporter repeatedly returns every thread and fd."""
    before = settle_resources()
    for i in range(3):
        made = Node(churn_node(i), tmp_path / f"n{i}", deadline=1.0)
        made.until(shows_exactly(i))
        made.close()
    after = settle_resources(limit=10.0)
    assert_no_leak(before, after)
    assert os.path.isdir("/proc/self/fd")


# A parent cycle: procfs reads pid 100 (parent 101); 101 exits and its PID is reused by a
# new child of 100 before procfs reads it, so 101's parent is 100. Both in one container.
PARENT_CYCLE = """
import sys
from gpuledger.identity.cgroup import parse_cgroup_file
from gpuledger.ledger import build_ledger
from gpuledger.model import Snapshots, frozen_map
from gpuledger.model.nvml import NVML, Gpu, GpuProcess, NvmlSnapshot
from gpuledger.model.procfs import PROCESSES, ProcessInfo, ProcSnapshot
from gpuledger.model.engines import ENGINES, EngineScrape, EngineTarget, EnginesSnapshot

case = sys.argv[1]
uid, cid = "74747474-0000-4000-8000-747474747474", "d" * 64
cgroup = parse_cgroup_file(
    f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
)
gpu = "GPU-74000000-0000-4000-8000-000000000000"
titles = {"container_env": ("python3", "python3"),
          "vllm_tree": ("VLLM::Worker_TP0", "VLLM::EngineCore")}[case]
procs = {
    pid: ProcessInfo(pid=pid, ppid=parent, nspid=(pid,), title=title, cgroup=cgroup,
                     environ=frozen_map({"NVIDIA_VISIBLE_DEVICES": gpu}))
    for pid, parent, title in ((100, 101, titles[0]), (101, 100, titles[1]))
}
nvml = NvmlSnapshot("550", (Gpu(0, gpu, "H100", "00000000:18:00.0", True,
                                memory_total_bytes=2**36, processes=(GpuProcess(100, 2**30),)),))
scrape = EngineScrape(EngineTarget("http://10.0.0.1:8000/metrics", pod_uid=uid), False,
                      "refused", "refused", (), 0.0)
bundle = Snapshots({NVML: nvml, PROCESSES: ProcSnapshot(procs),
                    ENGINES: EnginesSnapshot((scrape,))})
build_ledger(bundle, node="n1", mode="node", taken_at=0.0)
print("joined")
"""


@pytest.mark.parametrize("case", ["container_env", "vllm_tree"])
def test_pid_reuse_parent_cycle_does_not_hang_the_join(case: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    try:
        result = subprocess.run(
            [sys.executable, "-c", PARENT_CYCLE, case],
            capture_output=True,
            text=True,
            timeout=JOIN_TIMEOUT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"build_ledger did not return within {JOIN_TIMEOUT}s: a parent cycle spins")
    assert result.returncode == 0 and "joined" in result.stdout, result.stderr
