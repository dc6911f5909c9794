"""kubelet PodResources source: which container holds which GPU, as Kubernetes allocated it.

The kubelet serves the PodResources v1 gRPC API on a unix socket
(`/var/lib/kubelet/pod-resources/kubelet.sock`). `List` gives every container's
device-plugin allocations; `GetAllocatableResources` gives every device the kubelet can
hand out. PodResources carries pod names, not UIDs: the ledger joins on namespace/name
with the pod informer.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import grpc

from gpuledger.identity.devices import strip_replica_suffix
from gpuledger.model import Snapshots
from gpuledger.model.podresources import (
    PODRESOURCES,
    ClaimAllocation,
    ClaimDevice,
    DeviceAllocation,
    PodResourcesSnapshot,
)
from gpuledger.protocols.podresources import api_pb2, api_pb2_grpc
from gpuledger.sources.base import Source, SourceError

__all__ = [
    "DEFAULT_DRA_DRIVERS",
    "DEFAULT_RESOURCE_NAMES",
    "DEFAULT_SOCKET_PATH",
    "DeviceAllocation",
    "PodResourcesSnapshot",
    "PodResourcesSource",
    "ResourcePatterns",
]

DEFAULT_SOCKET_PATH = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCE_NAMES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-*")
# A node lists every container's devices, CPUs and memory: a few hundred KiB at most.
# Far more means something is wrong; refuse it cleanly instead of buffering it.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Status details come from the kubelet or grpc core; keep error messages one short line.
_MAX_DETAIL_CHARS = 200


@dataclass(frozen=True)
class ResourcePatterns:
    """Extended-resource names to report: exact names, or prefixes written with a trailing `*`."""

    exact: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def parse(cls, patterns: str | Sequence[str]) -> ResourcePatterns:
        """`("nvidia.com/gpu", "nvidia.com/mig-*")`; a single string is a comma-separated list.

        Raises ValueError for an empty list or a `*` anywhere but at the end, so a bad
        `--podresources-resource` flag fails at start-up rather than matching nothing.
        """
        items = patterns.split(",") if isinstance(patterns, str) else list(patterns)
        exact: set[str] = set()
        prefixes: list[str] = []
        for raw in items:
            pattern = raw.strip()
            if not pattern:
                continue
            if "*" in pattern[:-1]:
                raise ValueError(f"resource pattern {pattern!r}: only a trailing '*' is supported")
            if pattern.endswith("*"):
                prefixes.append(pattern[:-1])
            else:
                exact.add(pattern)
        if not exact and not prefixes:
            raise ValueError("no resource name patterns given")
        return cls(frozenset(exact), tuple(prefixes))

    def matches(self, resource_name: str) -> bool:
        # Resource names are case-sensitive in Kubernetes: compare as given.
        return resource_name in self.exact or resource_name.startswith(self.prefixes)


def _sorted_groups(
    groups: Iterable[api_pb2.ContainerDevices], patterns: ResourcePatterns
) -> list[api_pb2.ContainerDevices]:
    """Matching device groups in a stable order.

    The kubelet builds the list by iterating Go maps (per resource, then per NUMA node),
    so group order changes from call to call; sorting keeps positions, and the series
    built on them, from flapping. Order inside a group is stored, hence kept.
    """
    matching = [g for g in groups if patterns.matches(g.resource_name)]
    return sorted(
        matching,
        key=lambda g: (g.resource_name, tuple(sorted(n.ID for n in g.topology.nodes))),
    )


def allocations_from_response(
    response: api_pb2.ListPodResourcesResponse, patterns: ResourcePatterns
) -> tuple[DeviceAllocation, ...]:
    """Flatten a List answer to one row per (container, matching device id)."""
    rows: list[DeviceAllocation] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            position_of: dict[str, int] = {}
            for group in _sorted_groups(container.devices, patterns):
                for raw_id in group.device_ids:
                    device_id = raw_id.strip()
                    if not device_id:
                        continue
                    gpu_uuid = strip_replica_suffix(device_id)
                    # Two replicas of one GPU in one container are still one CUDA device.
                    position = position_of.setdefault(gpu_uuid, len(position_of))
                    rows.append(
                        DeviceAllocation(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            resource=group.resource_name,
                            device_id=device_id,
                            gpu_uuid=gpu_uuid,
                            position=position,
                        )
                    )
    rows.sort(key=lambda a: (a.namespace, a.pod, a.container, a.position, a.device_id))
    return tuple(rows)


# The NVIDIA DRA driver's name for GPUs and MIG devices (kubernetes-sigs/dra-driver-nvidia-gpu).
DEFAULT_DRA_DRIVERS: tuple[str, ...] = ("gpu.nvidia.com",)


def claims_from_response(
    response: api_pb2.ListPodResourcesResponse, drivers: Sequence[str]
) -> tuple[ClaimAllocation, ...]:
    """One row per (container, DRA device of a GPU driver): `dynamic_resources`, field 5
    of ContainerResources (kubelet 1.34: gate KubeletPodResourcesDynamicResources, beta)."""
    rows: set[ClaimAllocation] = set()
    for pod in response.pod_resources:
        for container in pod.containers:
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    if resource.driver_name not in drivers or not resource.device_name:
                        continue
                    device = ClaimDevice(
                        claim_namespace=claim.claim_namespace or pod.namespace,
                        claim_name=claim.claim_name,
                        driver=resource.driver_name,
                        pool=resource.pool_name,
                        device=resource.device_name,
                        # Kubernetes 1.35 names the share of a device several claims
                        # hold (ClaimResource field 5); older kubelets send none.
                        share_id=resource.share_id,
                    )
                    rows.add(ClaimAllocation(pod.namespace, pod.name, container.name, device))
    return tuple(sorted(rows, key=_claim_order))


def _claim_order(c: ClaimAllocation) -> tuple[str, ...]:
    d = c.device
    return (c.namespace, c.pod, c.container, d.claim_name, d.driver, d.pool, d.device, d.share_id)


def allocatable_from_response(
    response: api_pb2.AllocatableResourcesResponse, patterns: ResourcePatterns
) -> tuple[str, ...]:
    """Distinct device ids of the matching resources, in a stable order."""
    seen: dict[str, None] = {}
    for group in _sorted_groups(response.devices, patterns):
        for raw_id in group.device_ids:
            device_id = raw_id.strip()
            if device_id:
                seen.setdefault(device_id, None)
    return tuple(seen)


def _one_line(text: str | None) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= _MAX_DETAIL_CHARS else line[: _MAX_DETAIL_CHARS - 3] + "..."


def _status(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    """Status code and raw details; errors raised by calls are also grpc.Call objects."""
    if not isinstance(exc, grpc.Call):
        return None, ""
    return exc.code(), exc.details() or ""


def _allocatable_unsupported(exc: grpc.RpcError) -> bool:
    """True when the kubelet does not offer GetAllocatableResources (rather than failing it)."""
    code, detail = _status(exc)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return True  # kubelet before 1.21: no such method
    # 1.21-1.22 with the KubeletPodResourcesGetAllocatable gate off answer with a plain
    # Go error (status UNKNOWN) naming the method as disabled.
    return code == grpc.StatusCode.UNKNOWN and "disabled" in detail


class PodResourcesSource(Source[PodResourcesSnapshot]):
    key = PODRESOURCES

    """Reads the kubelet PodResources API once per `fetch()`.

    The channel is kept between fetches (the kubelet is local and cheap to ask) and
    dropped after any failure, so a restarted kubelet is reached afresh next cycle.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET_PATH,
        resource_names: str | Sequence[str] = DEFAULT_RESOURCE_NAMES,
        timeout_seconds: float = 3.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        dra_drivers: Sequence[str] = DEFAULT_DRA_DRIVERS,
    ) -> None:
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        # grpc resolves `unix://` targets relative to nothing useful: pin the path down.
        self.socket_path = os.path.abspath(socket_path)
        self.patterns = ResourcePatterns.parse(resource_names)
        self.timeout_seconds = timeout_seconds
        self.max_message_bytes = max_message_bytes
        self.dra_drivers = tuple(dra_drivers)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def fetch(self, inputs: Snapshots | None = None) -> PodResourcesSnapshot:
        self._check_socket()
        # One deadline for both calls, so a slow kubelet costs at most timeout_seconds.
        deadline = time.monotonic() + self.timeout_seconds
        try:
            stub = self._connect()
            listed = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_seconds)
            allocations = allocations_from_response(listed, self.patterns)
            claims = claims_from_response(listed, self.dra_drivers)
            allocatable: tuple[str, ...] | None
            try:
                answer = stub.GetAllocatableResources(
                    api_pb2.AllocatableResourcesRequest(),
                    timeout=max(deadline - time.monotonic(), 0.001),
                )
                allocatable = allocatable_from_response(answer, self.patterns)
            except grpc.RpcError as exc:
                if not _allocatable_unsupported(exc):
                    raise
                allocatable = None
        except grpc.RpcError as exc:
            self.close()
            raise self._error(exc) from None
        except BaseException:
            self.close()
            raise
        return PodResourcesSnapshot(allocations, allocatable, claims)

    def _check_socket(self) -> None:
        """Name the deployment mistake before grpc turns it into a generic UNAVAILABLE."""
        path = self.socket_path
        mount = os.path.dirname(path)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            self.close()
            raise SourceError(
                "socket_missing",
                f"kubelet PodResources socket {path} not found: mount the host directory "
                f"{mount} into the exporter (hostPath volume) or set --podresources-socket",
            ) from None
        except PermissionError:
            mode = None  # the directory is not searchable; connect() reports it below
        if mode is not None and not stat.S_ISSOCK(mode):
            self.close()
            raise SourceError(
                "socket_missing",
                f"{path} is not a unix socket: mount the host directory {mount} (hostPath, "
                "type Directory), not the socket file itself, so kubelet restarts show through",
            )

    def _connect(self) -> api_pb2_grpc.PodResourcesListerStub:
        with self._lock:
            if self._stub is None:
                self._channel = grpc.insecure_channel(
                    "unix://" + self.socket_path,
                    options=[("grpc.max_receive_message_length", self.max_message_bytes)],
                )
                self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
            return self._stub

    def _error(self, exc: grpc.RpcError) -> SourceError:
        code, raw_detail = _status(exc)
        detail = _one_line(raw_detail)
        where = f"kubelet PodResources at {self.socket_path}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return SourceError("timeout", f"{where}: no answer within {self.timeout_seconds:g}s")
        if code == grpc.StatusCode.UNAVAILABLE:
            # connect() failures all arrive as UNAVAILABLE; a root-only socket is the one
            # a person must fix in the manifest rather than wait out.
            if "permission denied" in raw_detail.lower():
                return SourceError(
                    "permission_denied",
                    f"{where}: permission denied; the kubelet socket is root-only, run the "
                    "exporter as root (runAsUser: 0)",
                )
            return SourceError(
                "unavailable", f"{where} unavailable (kubelet down or restarting?): {detail}"
            )
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return SourceError(
                "resource_exhausted",
                f"{where}: answer refused, over the {self.max_message_bytes}-byte limit: {detail}",
            )
        name = code.name.lower() if code is not None else "rpc_error"
        return SourceError(name, f"{where}: call failed ({name}): {detail}")

    def close(self) -> None:
        with self._lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()
