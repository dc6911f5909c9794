"""PodResources source against the fake kubelet over a real gRPC unix socket."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuledger.model.podresources import PodResourcesSnapshot
from gpuledger.sim.fake_kubelet import FakeKubelet
from gpuledger.sources.base import SourceError, SourceRunner
from gpuledger.sources.podresources import PodResourcesSource

UA = "GPU-8a3f0c11-1111-4111-8111-111111111111"
UB = "GPU-c0ffee33-3333-4333-8333-333333333333"
UC = "GPU-deadbe44-4444-4444-8444-444444444444"
MIG0 = "MIG-aaaa0000-0000-5000-8000-000000000000"
MIG1 = "MIG-bbbb1111-1111-5111-8111-111111111111"

PODS = [
    # Tensor parallel 2: one container, two whole GPUs.
    ("llm", "vllm-tp2-0", [("vllm", [("nvidia.com/gpu", [UB, UC])])]),
    # Time-slicing: two pods hold replicas of the same GPU.
    ("llm", "small-a", [("server", [("nvidia.com/gpu", [f"{UA}::0"])])]),
    ("llm", "small-b", [("server", [("nvidia.com/gpu", [f"{UA}::1"])])]),
    # MIG slices, and a container with no devices at all.
    (
        "batch",
        "embed-0",
        [
            ("init", []),
            ("embed", [("nvidia.com/mig-1g.10gb", [MIG0]), ("nvidia.com/mig-2g.20gb", [MIG1])]),
        ],
    ),
    # Not a GPU resource: ignored.
    ("net", "router", [("router", [("example.com/nic", ["nic0"])])]),
]
ALLOCATABLE = [
    ("nvidia.com/gpu", [f"{UA}::0", f"{UA}::1", f"{UA}::2", UB, UC]),
    ("nvidia.com/mig-1g.10gb", [MIG0]),
    ("nvidia.com/mig-2g.20gb", [MIG1]),
    ("example.com/nic", ["nic0"]),
]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # pytest's tmp_path can exceed the 107-byte limit of unix socket paths.
    path = Path(tempfile.mkdtemp(prefix="gl-pr-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(sock_dir: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(sock_dir / "kubelet.sock") as fake:
        fake.set_pods(PODS)
        fake.set_allocatable(ALLOCATABLE)
        yield fake


@pytest.fixture
def source(kubelet: FakeKubelet) -> Iterator[PodResourcesSource]:
    src = PodResourcesSource(kubelet.socket_path, timeout_seconds=0.5)
    yield src
    src.close()


def _rows(snapshot: PodResourcesSnapshot) -> list[tuple[str, str, str, str, str, str, int]]:
    return [
        (a.namespace, a.pod, a.container, a.resource, a.device_id, a.gpu_uuid, a.position)
        for a in snapshot.allocations
    ]


def _fails(source: PodResourcesSource) -> SourceError:
    with pytest.raises(SourceError) as info:
        source.fetch()
    return info.value


def test_allocations_and_allocatable(source: PodResourcesSource) -> None:
    snapshot = source.fetch()
    assert _rows(snapshot) == [
        ("batch", "embed-0", "embed", "nvidia.com/mig-1g.10gb", MIG0, MIG0, 0),
        ("batch", "embed-0", "embed", "nvidia.com/mig-2g.20gb", MIG1, MIG1, 1),
        ("llm", "small-a", "server", "nvidia.com/gpu", f"{UA}::0", UA, 0),
        ("llm", "small-b", "server", "nvidia.com/gpu", f"{UA}::1", UA, 0),
        ("llm", "vllm-tp2-0", "vllm", "nvidia.com/gpu", UB, UB, 0),
        ("llm", "vllm-tp2-0", "vllm", "nvidia.com/gpu", UC, UC, 1),
    ]
    assert snapshot.allocatable == (f"{UA}::0", f"{UA}::1", f"{UA}::2", UB, UC, MIG0, MIG1)


def test_custom_resource_names(kubelet: FakeKubelet) -> None:
    source = PodResourcesSource(kubelet.socket_path, resource_names=["nvidia.com/mig-*"])
    try:
        snapshot = source.fetch()
    finally:
        source.close()
    assert {a.gpu_uuid for a in snapshot.allocations} == {MIG0, MIG1}
    assert snapshot.allocatable == (MIG0, MIG1)


def test_state_changes_seen_on_next_fetch(kubelet: FakeKubelet, source: PodResourcesSource) -> None:
    assert len(source.fetch().allocations) == 6
    kubelet.set_pods([p for p in PODS if p[1] != "vllm-tp2-0"])  # pod deleted
    assert {a.pod for a in source.fetch().allocations} == {"small-a", "small-b", "embed-0"}


def test_socket_missing_then_kubelet_appears(sock_dir: Path) -> None:
    path = sock_dir / "pod-resources" / "kubelet.sock"
    source = PodResourcesSource(str(path), timeout_seconds=0.5)
    try:
        error = _fails(source)
        assert error.reason == "socket_missing"
        assert str(path) in error.message
        assert "hostPath" in error.message and str(path.parent) in error.message
        with FakeKubelet(path) as fake:
            fake.set_pods(PODS)
            assert len(source.fetch().allocations) == 6
    finally:
        source.close()


def test_path_that_is_not_a_socket(sock_dir: Path) -> None:
    # The classic mistake: hostPath of the socket file itself created a directory.
    (sock_dir / "kubelet.sock").mkdir()
    source = PodResourcesSource(str(sock_dir / "kubelet.sock"), timeout_seconds=0.5)
    error = _fails(source)
    assert error.reason == "socket_missing"
    assert "not a unix socket" in error.message


def test_stale_socket_is_unavailable(sock_dir: Path) -> None:
    # A socket file nobody listens on (kubelet died): connect() is refused.
    path = str(sock_dir / "kubelet.sock")
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()
    source = PodResourcesSource(path, timeout_seconds=0.5)
    started = time.monotonic()
    try:
        assert _fails(source).reason == "unavailable"
    finally:
        source.close()
    assert time.monotonic() - started < 10


def test_unavailable_then_recovers(kubelet: FakeKubelet, source: PodResourcesSource) -> None:
    kubelet.set_fault("unavailable")
    error = _fails(source)
    assert error.reason == "unavailable"
    assert "restarting" in error.message
    kubelet.set_fault("ok")
    assert len(source.fetch().allocations) == 6


def test_hang_is_bounded_by_timeout_then_recovers(
    kubelet: FakeKubelet, source: PodResourcesSource
) -> None:
    kubelet.set_fault("hang")
    started = time.monotonic()
    error = _fails(source)
    elapsed = time.monotonic() - started
    assert error.reason == "timeout"
    assert "0.5s" in error.message
    assert elapsed < 10
    kubelet.set_fault("ok")
    assert len(source.fetch().allocations) == 6


@pytest.mark.parametrize("fault", ["unimplemented_allocatable", "disabled_allocatable"])
def test_allocatable_not_offered_is_none(
    kubelet: FakeKubelet, source: PodResourcesSource, fault: str
) -> None:
    kubelet.set_fault(fault)  # type: ignore[arg-type]
    snapshot = source.fetch()
    assert snapshot.allocatable is None
    assert len(snapshot.allocations) == 6


def test_huge_answer_fails_cleanly_then_recovers(
    kubelet: FakeKubelet, source: PodResourcesSource
) -> None:
    kubelet.set_fault("huge")
    assert _fails(source).reason == "resource_exhausted"
    kubelet.set_fault("ok")
    assert len(source.fetch().allocations) == 6


def test_kubelet_restart_reconnects(sock_dir: Path) -> None:
    path = sock_dir / "kubelet.sock"
    source = PodResourcesSource(str(path), timeout_seconds=0.5)
    try:
        with FakeKubelet(path) as first:
            first.set_pods(PODS[:1])
            assert len(source.fetch().allocations) == 2
        assert _fails(source).reason == "socket_missing"
        with FakeKubelet(path) as second:  # a new socket inode, as after a restart
            second.set_pods(PODS)
            assert len(source.fetch().allocations) == 6
            assert second.calls["List"] == 1
    finally:
        source.close()


def test_kubelet_restart_between_fetches(sock_dir: Path) -> None:
    """The socket is replaced while the source holds a channel to the old one."""
    path = sock_dir / "kubelet.sock"
    source = PodResourcesSource(str(path), timeout_seconds=0.5)
    try:
        with FakeKubelet(path) as first:
            first.set_pods(PODS[:1])
            assert len(source.fetch().allocations) == 2
        with FakeKubelet(path) as second:
            second.set_pods(PODS)
            # grpc may fail the first call fast on the dead connection; the source then
            # drops the channel, so the next cycle must succeed.
            outcomes: list[int | str] = []
            for _ in range(2):
                try:
                    outcomes.append(len(source.fetch().allocations))
                    break
                except SourceError as exc:
                    outcomes.append(exc.reason)
            assert outcomes[-1] == 6, outcomes
            assert set(outcomes[:-1]) <= {"unavailable"}
    finally:
        source.close()


def test_through_source_runner(kubelet: FakeKubelet, source: PodResourcesSource) -> None:
    runner: SourceRunner[PodResourcesSnapshot] = SourceRunner("podresources", 5.0)
    try:
        kubelet.set_fault("unavailable")
        value, status = runner.run(source.fetch)
        assert value is None
        assert (status.up, status.error_reason) == (False, "unavailable")
        kubelet.set_fault("ok")
        value, status = runner.run(source.fetch)
        assert status.up and value is not None and len(value.allocations) == 6
    finally:
        runner.close()


def test_fake_kubelet_stop_removes_socket_and_is_idempotent(sock_dir: Path) -> None:
    fake = FakeKubelet(sock_dir / "kubelet.sock").start()
    assert os.path.exists(fake.socket_path)
    fake.set_fault("hang")
    fake.stop()
    fake.stop()
    assert not os.path.exists(fake.socket_path)
    with pytest.raises(ValueError):
        fake.set_fault("bogus")  # type: ignore[arg-type]
