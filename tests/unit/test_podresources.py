"""kubelet PodResources: resource-name matching, replica suffixes, positions, error mapping."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from gpuledger.protocols.podresources import api_pb2
from gpuledger.sources.podresources.source import (
    DEFAULT_RESOURCE_NAMES,
    PodResourcesSource,
    ResourcePatterns,
    allocatable_from_response,
    allocations_from_response,
)

UA = "GPU-8a3f0c11-1111-4111-8111-111111111111"
UB = "GPU-c0ffee33-3333-4333-8333-333333333333"
MIG = "MIG-aaaa0000-0000-5000-8000-000000000000"
DEFAULT = ResourcePatterns.parse(DEFAULT_RESOURCE_NAMES)


def _group(
    resource: str, ids: list[str], numa: list[int] | None = None
) -> api_pb2.ContainerDevices:
    group = api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
    for node in numa or []:
        group.topology.nodes.add(ID=node)
    return group


def _listing(*pods: tuple[str, str, list[tuple[str, list[api_pb2.ContainerDevices]]]]) -> Any:
    return api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                namespace=ns,
                name=name,
                containers=[api_pb2.ContainerResources(name=c, devices=g) for c, g in containers],
            )
            for ns, name, containers in pods
        ]
    )


# --- resource-name patterns ---


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("nvidia.com/mig-3g.40gb", True),
        ("nvidia.com/gpu.shared", False),  # exact names do not match as prefixes
        ("nvidia.com/mig", False),  # the prefix is "nvidia.com/mig-"
        ("NVIDIA.com/gpu", False),  # resource names are case-sensitive
        ("amd.com/gpu", False),
        ("cpu", False),
        ("", False),
    ],
)
def test_default_patterns(name: str, expected: bool) -> None:
    assert DEFAULT.matches(name) is expected


def test_patterns_from_comma_string_and_star() -> None:
    patterns = ResourcePatterns.parse(" nvidia.com/gpu.shared , amd.com/* ,")
    assert patterns.matches("nvidia.com/gpu.shared")
    assert patterns.matches("amd.com/gpu")
    assert not patterns.matches("nvidia.com/gpu")
    assert ResourcePatterns.parse(["*"]).matches("anything/at-all")


@pytest.mark.parametrize("bad", [[], [""], " , ", ["nvidia.com/*gpu"], ["*/gpu"]])
def test_bad_patterns_rejected(bad: str | list[str]) -> None:
    with pytest.raises(ValueError):
        ResourcePatterns.parse(bad)


def test_source_validates_its_arguments() -> None:
    with pytest.raises(ValueError):
        PodResourcesSource("/nonexistent.sock", resource_names=[])
    with pytest.raises(ValueError):
        PodResourcesSource("/nonexistent.sock", timeout_seconds=0)


# --- flattening List ---


def test_replica_suffix_stripped_and_device_id_kept() -> None:
    rows = allocations_from_response(
        _listing(
            ("ml", "a", [("main", [_group("nvidia.com/gpu", [f"{UA}::0"])])]),
            ("ml", "b", [("main", [_group("nvidia.com/gpu", [f"{UA}::1"])])]),
        ),
        DEFAULT,
    )
    assert [(r.pod, r.device_id, r.gpu_uuid, r.position) for r in rows] == [
        ("a", f"{UA}::0", UA, 0),
        ("b", f"{UA}::1", UA, 0),
    ]


def test_positions_follow_list_order_within_a_group() -> None:
    rows = allocations_from_response(
        _listing(("ml", "tp2", [("vllm", [_group("nvidia.com/gpu", [UB, UA])])])), DEFAULT
    )
    assert [(r.gpu_uuid, r.position) for r in rows] == [(UB, 0), (UA, 1)]


def test_positions_span_resources_in_stable_order() -> None:
    """Group order from the kubelet varies per call (Go maps); positions must not."""
    gpu = _group("nvidia.com/gpu", [UA])
    mig = _group("nvidia.com/mig-1g.10gb", [MIG])
    forward = allocations_from_response(_listing(("ml", "p", [("c", [gpu, mig])])), DEFAULT)
    backward = allocations_from_response(_listing(("ml", "p", [("c", [mig, gpu])])), DEFAULT)
    assert forward == backward
    assert [(r.resource, r.gpu_uuid, r.position) for r in forward] == [
        ("nvidia.com/gpu", UA, 0),
        ("nvidia.com/mig-1g.10gb", MIG, 1),
    ]


def test_numa_groups_of_one_resource_in_stable_order() -> None:
    n1 = _group("nvidia.com/gpu", [UB], numa=[1])
    n0 = _group("nvidia.com/gpu", [UA], numa=[0])
    rows = allocations_from_response(_listing(("ml", "p", [("c", [n1, n0])])), DEFAULT)
    assert [(r.gpu_uuid, r.position) for r in rows] == [(UA, 0), (UB, 1)]


def test_two_replicas_of_one_gpu_in_one_container_share_a_position() -> None:
    ids = [f"{UA}::0", f"{UA}::3", UB]
    rows = allocations_from_response(
        _listing(("ml", "p", [("c", [_group("nvidia.com/gpu", ids)])])), DEFAULT
    )
    assert [(r.device_id, r.position) for r in rows] == [
        (f"{UA}::0", 0),
        (f"{UA}::3", 0),
        (UB, 1),
    ]


def test_positions_are_per_container_and_other_resources_ignored() -> None:
    rows = allocations_from_response(
        _listing(
            (
                "ml",
                "p",
                [
                    ("a", [_group("example.com/nic", ["nic0"]), _group("nvidia.com/gpu", [UA])]),
                    ("b", [_group("nvidia.com/gpu", [UB])]),
                    ("sidecar", []),
                ],
            )
        ),
        DEFAULT,
    )
    assert [(r.container, r.gpu_uuid, r.position) for r in rows] == [("a", UA, 0), ("b", UB, 0)]


def test_odd_ids_kept_verbatim_empty_ids_skipped() -> None:
    # Index strategy ids, and "::x" that is not a replica number, stay as they are.
    ids = ["", "  ", "0", f"{UA}::x", f" {UB} "]
    rows = allocations_from_response(
        _listing(("ml", "p", [("c", [_group("nvidia.com/gpu", ids)])])), DEFAULT
    )
    assert [(r.device_id, r.gpu_uuid) for r in rows] == [
        ("0", "0"),
        (f"{UA}::x", f"{UA}::x"),
        (UB, UB),
    ]


def test_allocations_sorted_for_stable_output() -> None:
    rows = allocations_from_response(
        _listing(
            ("zeta", "p", [("c", [_group("nvidia.com/gpu", [UA])])]),
            ("alpha", "q", [("c", [_group("nvidia.com/gpu", [UB])])]),
        ),
        DEFAULT,
    )
    assert [r.namespace for r in rows] == ["alpha", "zeta"]


# --- GetAllocatableResources ---


def test_allocatable_filters_and_dedupes() -> None:
    answer = api_pb2.AllocatableResourcesResponse(
        devices=[
            _group("nvidia.com/mig-2g.20gb", [MIG]),
            _group("example.com/nic", ["nic0"]),
            _group("nvidia.com/gpu", [f"{UA}::0", f"{UA}::1", f"{UA}::0", UB]),
        ]
    )
    assert allocatable_from_response(answer, DEFAULT) == (f"{UA}::0", f"{UA}::1", UB, MIG)


# --- error mapping (channel-level failures are covered by the integration tests) ---


class _CallError(grpc.RpcError, grpc.Call):
    """What a failed unary call raises: an RpcError that is also a Call."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()

    def trailing_metadata(self) -> Any:  # RpcError's and Call's stubs disagree on the type
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False


@pytest.mark.parametrize(
    ("code", "details", "reason"),
    [
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", "timeout"),
        (grpc.StatusCode.UNAVAILABLE, "failed to connect: Connection refused", "unavailable"),
        (
            grpc.StatusCode.UNAVAILABLE,
            "unix:/var/lib/kubelet/pod-resources/kubelet.sock: Permission denied",
            "permission_denied",
        ),
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "Received message larger than max",
            "resource_exhausted",
        ),
        (grpc.StatusCode.INTERNAL, "boom", "internal"),
        (grpc.StatusCode.UNKNOWN, "something else", "unknown"),
    ],
)
def test_status_to_reason(code: grpc.StatusCode, details: str, reason: str) -> None:
    source = PodResourcesSource("/run/kubelet.sock", timeout_seconds=1.5)
    error = source._error(_CallError(code, details))
    assert error.reason == reason
    assert "/run/kubelet.sock" in error.message
    assert "\n" not in error.message


def test_status_details_cut_to_one_short_line() -> None:
    source = PodResourcesSource("/run/kubelet.sock")
    error = source._error(_CallError(grpc.StatusCode.INTERNAL, "line\n" * 500))
    assert "\n" not in error.message
    assert len(error.message) < 300


def test_bare_rpc_error_without_status() -> None:
    error = PodResourcesSource("/run/kubelet.sock")._error(grpc.RpcError())
    assert error.reason == "rpc_error"
