"""A fake kubelet PodResources v1 server on a unix socket, for the harness and tests.

It speaks the real wire format (the same `api.proto` the source uses), so the real grpc
client path runs end to end. State and faults can be changed while it serves::

    with FakeKubelet("/tmp/pr/kubelet.sock") as kubelet:
        kubelet.set_pods([("ml", "llama-0", [("vllm", [("nvidia.com/gpu", ["GPU-a", "GPU-b"])])])])
        kubelet.set_allocatable([("nvidia.com/gpu", ["GPU-a", "GPU-b", "GPU-c"])])
        kubelet.set_fault("hang")

Faults: `ok`; `unavailable` (every call aborts UNAVAILABLE, as while the kubelet
restarts); `hang` (every call waits until the caller's deadline has passed);
`unimplemented_allocatable` (GetAllocatableResources answers UNIMPLEMENTED, as kubelets
before 1.21 do); `disabled_allocatable` (it fails UNKNOWN "... disabled", as 1.21-1.22 do
with the feature gate off); `huge` (List answers with more than 16 MiB); `internal` (every
call fails INTERNAL, a kubelet bug); `garbage` (List answers `garbage_bytes`, by default bytes
that are not a ListPodResourcesResponse).

Keep socket paths short: unix socket paths are limited to 107 bytes.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from types import TracebackType
from typing import Any, Final, Literal, get_args

import grpc

from gpuledger.protocols.podresources import api_pb2

__all__ = [
    "FAULTS",
    "ContainerSpec",
    "DeviceGroup",
    "DynamicSpec",
    "FakeKubelet",
    "Fault",
    "PodSpec",
]

Fault = Literal[
    "ok",
    "unavailable",
    "hang",
    "unimplemented_allocatable",
    "disabled_allocatable",
    "huge",
    "internal",
    "garbage",
]
FAULTS: Final[tuple[str, ...]] = get_args(Fault)

# (resource name, device ids in allocation order)
DeviceGroup = tuple[str, Sequence[str]]
# (container name, device groups)
ContainerSpec = tuple[str, Sequence[DeviceGroup]]
# (namespace, pod name, containers)
PodSpec = tuple[str, str, Sequence[ContainerSpec]]
# A DRA device of a container (PodResources v1 `dynamic_resources`, kubelet 1.34):
# (namespace, pod, container, claim namespace, claim name, driver, pool, device, share id:
# "" sends none, as kubelets before 1.35 and unshared devices)
DynamicSpec = tuple[str, str, str, str, str, str, str, str, str]

# Just over the source's default 16 MiB receive limit.
HUGE_BYTES: Final = 17 * 1024 * 1024
# A field-1 length prefix far longer than what follows: no protobuf parser accepts it.
GARBAGE_BYTES: Final = b"\x0a\xff\xff\xff\x0f<html>502 Bad Gateway</html>"
# How often a hanging call looks whether its caller gave up or the server stops.
_HANG_POLL_SECONDS: Final = 0.05
# A hanging call with no client deadline still ends, so stop() never waits forever.
_HANG_MAX_SECONDS: Final = 60.0


def _groups(groups: Sequence[DeviceGroup]) -> list[api_pb2.ContainerDevices]:
    return [
        api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
        for resource, ids in groups
    ]


def _huge_response(size_bytes: int) -> api_pb2.ListPodResourcesResponse:
    """One pod whose device list alone exceeds `size_bytes` when serialized."""
    device_id = "GPU-" + "f" * 1020
    count = size_bytes // len(device_id) + 1
    container = api_pb2.ContainerResources(
        name="huge",
        devices=[
            api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[device_id] * count)
        ],
    )
    pod = api_pb2.PodResources(name="huge", namespace="default", containers=[container])
    return api_pb2.ListPodResourcesResponse(pod_resources=[pod])


class _Servicer:
    """The PodResourcesLister methods (registered by _handlers)."""

    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def List(
        self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse | bytes:
        fault = self._kubelet._enter("List", context)
        if fault == "huge":
            return self._kubelet._huge()
        if fault == "garbage":
            return self._kubelet.garbage_bytes
        return self._kubelet._list_response()

    def GetAllocatableResources(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        fault = self._kubelet._enter("GetAllocatableResources", context)
        if fault == "unimplemented_allocatable":
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        if fault == "disabled_allocatable":
            # What the kubelet's plain Go error looks like on the wire.
            context.abort(
                grpc.StatusCode.UNKNOWN, "Pod Resources API GetAllocatableResources disabled"
            )
        return self._kubelet._allocatable_response()


def _serialize(message: Any) -> bytes:
    """Messages as protobuf; bytes as they are (the `garbage` fault)."""
    return message if isinstance(message, bytes) else bytes(message.SerializeToString())


def _handlers(servicer: _Servicer) -> grpc.GenericRpcHandler:
    """The generated registration, with a serializer that lets raw bytes through."""
    return grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(
                servicer.List,
                request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
                response_serializer=_serialize,
            ),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                servicer.GetAllocatableResources,
                request_deserializer=api_pb2.AllocatableResourcesRequest.FromString,
                response_serializer=_serialize,
            ),
        },
    )


class FakeKubelet:
    """PodResourcesLister on `socket_path`; `start()`/`stop()` or use as a context manager."""

    def __init__(self, socket_path: str | os.PathLike[str], max_workers: int = 8) -> None:
        self.socket_path = os.path.abspath(os.fspath(socket_path))
        self._max_workers = max_workers
        self._lock = threading.Lock()
        self._pods: tuple[PodSpec, ...] = ()
        self._allocatable: tuple[DeviceGroup, ...] = ()
        self._dynamic: tuple[DynamicSpec, ...] = ()
        self._fault: Fault = "ok"
        self._huge_cache: api_pb2.ListPodResourcesResponse | None = None
        # What List answers under the `garbage` fault (tests may set any bytes).
        self.garbage_bytes = GARBAGE_BYTES
        self._stopping = threading.Event()
        self._server: grpc.Server | None = None
        # Calls received per method, faults included: lets tests see reconnects happen.
        self.calls: dict[str, int] = {"List": 0, "GetAllocatableResources": 0}

    # -- state, safe to change while serving ------------------------------------------

    def set_pods(self, pods: Sequence[PodSpec]) -> None:
        """`[(namespace, pod, [(container, [(resource, [device_id, ...]), ...]), ...]), ...]`."""
        frozen = tuple(
            (ns, name, tuple((c, tuple((r, tuple(ids)) for r, ids in groups)) for c, groups in cs))
            for ns, name, cs in pods
        )
        with self._lock:
            self._pods = frozen

    def set_dynamic(self, entries: Sequence[DynamicSpec]) -> None:
        """DRA devices per container; a pod or container not in `set_pods` is added."""
        with self._lock:
            self._dynamic = tuple(entries)

    def set_allocatable(self, groups: Sequence[DeviceGroup]) -> None:
        """`[(resource, [device_id, ...]), ...]`: what GetAllocatableResources reports."""
        frozen = tuple((r, tuple(ids)) for r, ids in groups)
        with self._lock:
            self._allocatable = frozen

    def set_fault(self, fault: Fault) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        with self._lock:
            self._fault = fault

    @property
    def fault(self) -> Fault:
        with self._lock:
            return self._fault

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        if self._server is not None:
            raise RuntimeError("FakeKubelet already started")
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        self._unlink_socket()  # a stale socket from a crashed run would block bind()
        self._stopping.clear()
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix="fake-kubelet"
            )
        )
        server.add_generic_rpc_handlers((_handlers(_Servicer(self)),))
        # grpc raises RuntimeError when it cannot bind (bad path, too long, no permission).
        server.add_insecure_port("unix://" + self.socket_path)
        server.start()
        self._server = server
        return self

    def stop(self, grace_seconds: float = 1.0) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()  # release hanging calls so the grace period suffices
        server.stop(grace_seconds).wait()
        self._unlink_socket()

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _unlink_socket(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    # -- used by the servicer -------------------------------------------------------------

    def _enter(self, method: str, context: grpc.ServicerContext) -> Fault:
        """Count the call and apply the faults every method shares; return the fault."""
        with self._lock:
            self.calls[method] += 1
            fault = self._fault
        if fault == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
        if fault == "internal":
            context.abort(grpc.StatusCode.INTERNAL, "fake kubelet: internal error")
        if fault == "hang":
            self._hang(context)
        return fault

    def _hang(self, context: grpc.ServicerContext) -> None:
        started = time.monotonic()
        while context.is_active() and not self._stopping.is_set():
            remaining = context.time_remaining()
            if remaining is not None and remaining < -1.0:
                break  # well past the caller's deadline: it has given up
            if time.monotonic() - started > _HANG_MAX_SECONDS:
                break
            self._stopping.wait(_HANG_POLL_SECONDS)
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "fake kubelet hung")

    def _list_response(self) -> api_pb2.ListPodResourcesResponse:
        with self._lock:
            pods, dynamic = self._pods, self._dynamic
        # As the kubelet does: one entry per pod and container, devices and claims in it.
        order: dict[tuple[str, str], dict[str, api_pb2.ContainerResources]] = {}
        for namespace, name, containers in pods:
            found = order.setdefault((namespace, name), {})
            for container, groups in containers:
                entry = found.setdefault(container, api_pb2.ContainerResources(name=container))
                entry.devices.extend(_groups(groups))
        for namespace, name, container, claim_ns, claim, driver, pool, device, share in dynamic:
            found = order.setdefault((namespace, name), {})
            entry = found.setdefault(container, api_pb2.ContainerResources(name=container))
            entry.dynamic_resources.append(
                api_pb2.DynamicResource(
                    claim_name=claim,
                    claim_namespace=claim_ns,
                    claim_resources=[
                        api_pb2.ClaimResource(
                            cdi_devices=[api_pb2.CDIDevice(name=f"k8s.{driver}/claim={device}")],
                            driver_name=driver,
                            pool_name=pool,
                            device_name=device,
                            share_id=share or None,
                        )
                    ],
                )
            )
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=name, namespace=namespace, containers=list(containers.values())
                )
                for (namespace, name), containers in order.items()
            ]
        )

    def _allocatable_response(self) -> api_pb2.AllocatableResourcesResponse:
        with self._lock:
            groups = self._allocatable
        return api_pb2.AllocatableResourcesResponse(devices=_groups(groups))

    def _huge(self) -> api_pb2.ListPodResourcesResponse:
        with self._lock:
            if self._huge_cache is None:
                self._huge_cache = _huge_response(HUGE_BYTES)
            return self._huge_cache
