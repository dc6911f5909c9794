"""Dynamic Resource Allocation objects (`resource.k8s.io/v1`, Kubernetes 1.34): a bounded
list per cycle, on the pod informer's client path.

* node mode: this node's ResourceSlices (`fieldSelector=spec.nodeName=<node>`), reduced to
  the devices of the configured GPU drivers that carry a `uuid` attribute — how a
  PodResources `ClaimResource` (driver, pool, device) becomes a GPU or MIG UUID. The
  NVIDIA DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu, formerly
  NVIDIA/k8s-dra-driver-gpu, read at v25.8) names devices `gpu-<minor>` and
  `gpu-<minor>-mig-<profileId>-<start>-<size>` with attributes `uuid`, `parentUUID` and
  `profile`.
* cluster mode: the ResourceClaims that request a GPU device class, so a pending pod's
  DRA GPUs count like its `nvidia.com/gpu` limits; then every node's ResourceSlices, reduced
  to a count of GPU devices per (node, driver), so a DRA-only node counts as a GPU node
  where kube-state-metrics sees no `nvidia.com/gpu` capacity. A failed slice list leaves
  the claims good: the snapshot says why (`nodes_error`, counted as an item error).

A list, not a watch: slices change when devices or MIG layouts do, and one node's slices
are a few KiB; `resourceVersion=0` serves them from the API server's watch cache, not
etcd. Every page is bounded in bytes and time, pages and devices in number. A cluster
that does not serve `resource.k8s.io/v1` (404) has no DRA: the source reports itself not
configured rather than down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuledger.model import NOT_CONFIGURED, Snapshots
from gpuledger.model.dra import DRA, ClaimInfo, DraSnapshot, NodeDevices, SliceDevice
from gpuledger.net import kubeapi
from gpuledger.net.kubeapi import ApiException
from gpuledger.sources.base import Source, SourceError
from gpuledger.sources.kubernetes.lists import ListReader
from gpuledger.sources.kubernetes.pods import _describe_error, connect_client

__all__ = [
    "DEFAULT_GPU_DEVICE_CLASSES",
    "DEFAULT_GPU_DRIVERS",
    "DraSource",
    "claim_info",
    "node_devices",
    "slice_devices",
]

log = logging.getLogger(__name__)

API = "/apis/resource.k8s.io/v1"
DEFAULT_GPU_DRIVERS: tuple[str, ...] = ("gpu.nvidia.com",)
DEFAULT_GPU_DEVICE_CLASSES: tuple[str, ...] = ("gpu.nvidia.com", "mig.nvidia.com")
MAX_PAGES = 100
MAX_DEVICES = 4096  # per node: 8 GPUs with 7 MIG devices each is 64
MAX_CLAIMS = 50_000
# Cluster mode: ResourceSlices of the GPU drivers, cluster-wide (5,000 nodes, a few each).
MAX_SLICES = 50_000
_HTTP_NOT_FOUND = 404
_HTTP_FORBIDDEN = 403
Mode = Literal["node", "cluster"]


def _obj(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _objs(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _attribute(attributes: Mapping[str, Any], driver: str, name: str) -> str | None:
    """A string attribute, named bare or qualified by the driver's domain."""
    value = _obj(attributes.get(name) or attributes.get(f"{driver}/{name}")).get("string")
    return value if isinstance(value, str) and value else None


def slice_devices(item: Mapping[str, Any], drivers: Sequence[str]) -> Iterator[SliceDevice]:
    """The devices of one ResourceSlice of a GPU driver that name their UUID."""
    spec = _obj(item.get("spec"))
    driver = spec.get("driver")
    pool = _obj(spec.get("pool")).get("name")
    if driver not in drivers or not isinstance(pool, str) or not pool:
        return
    for device in _objs(spec.get("devices")):
        attributes = _obj(device.get("attributes"))
        name, uuid = device.get("name"), _attribute(attributes, str(driver), "uuid")
        if isinstance(name, str) and name and uuid:
            yield SliceDevice(
                driver=str(driver),
                pool=pool,
                name=name,
                uuid=uuid,
                parent_uuid=_attribute(attributes, str(driver), "parentUUID"),
                profile=_attribute(attributes, str(driver), "profile"),
            )


@dataclass(frozen=True)
class _SliceCount:
    """One ResourceSlice of a GPU driver on a node, reduced to its GPU devices."""

    node: str
    driver: str
    pool: str
    generation: int
    devices: int


def _slice_count(item: Mapping[str, Any], drivers: Sequence[str]) -> _SliceCount | None:
    """A node-local slice of a GPU driver (spec.nodeName set), else None."""
    spec = _obj(item.get("spec"))
    node, pool = spec.get("nodeName"), _obj(spec.get("pool"))
    if spec.get("driver") not in drivers or not isinstance(node, str) or not node:
        return None
    generation = pool.get("generation")
    return _SliceCount(
        node=node,
        driver=str(spec["driver"]),
        pool=str(pool.get("name") or ""),
        generation=generation if isinstance(generation, int) else 0,
        devices=sum(1 for _ in slice_devices(item, drivers)),
    )


def node_devices(slices: Iterable[_SliceCount]) -> tuple[NodeDevices, ...]:
    """GPU devices per (node, driver), from each pool's newest generation only (a driver
    republishing a pool leaves older slices behind until it deletes them); nodes whose
    slices publish none are left out."""
    found = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in found:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    counts: dict[tuple[str, str], int] = {}
    for s in found:
        if s.generation == newest[(s.driver, s.pool)]:
            counts[(s.node, s.driver)] = counts.get((s.node, s.driver), 0) + s.devices
    return tuple(NodeDevices(n, d, c) for (n, d), c in sorted(counts.items()) if c > 0)


def _request_classes(request: Mapping[str, Any]) -> tuple[str | None, int]:
    """(device class, devices asked) of one v1 DeviceRequest: `exactly`, else the first
    of `firstAvailable` (the one the scheduler tries first)."""
    exact = _obj(request.get("exactly")) or next(iter(_objs(request.get("firstAvailable"))), {})
    name = exact.get("deviceClassName")
    count = exact.get("count", 1)
    if exact.get("allocationMode") == "All" or not isinstance(count, int) or count < 1:
        count = 1  # "All" is every matching device: unknown here, at least one
    return (name if isinstance(name, str) else None), min(count, 1024)


def claim_info(item: Mapping[str, Any], classes: Sequence[str]) -> ClaimInfo | None:
    """One ResourceClaim reduced to its GPU requests; None when it asks for no GPU class."""
    metadata = _obj(item.get("metadata"))
    status = _obj(item.get("status"))
    found: list[str] = []
    gpus = 0
    for request in _objs(_obj(_obj(item.get("spec")).get("devices")).get("requests"))[:32]:
        name, count = _request_classes(request)
        if name is not None and name in classes:
            gpus += count
            if name not in found:
                found.append(name)
    if not found or not metadata.get("name"):
        return None
    return ClaimInfo(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata["name"]),
        device_classes=tuple(found),
        gpus=gpus,
        allocated=bool(status.get("allocation")),
        reserved_for=len(_objs(status.get("reservedFor"))),
        deleting=bool(metadata.get("deletionTimestamp")),
    )


class DraSource(Source[DraSnapshot]):
    """Node mode: this node's slices; cluster mode: GPU claims. One bounded list a fetch."""

    key = DRA

    def __init__(
        self,
        mode: Mode = "node",
        *,
        node_name: str | None = None,
        kubeconfig: str | None = None,
        service_account_dir: str = kubeapi.SERVICE_ACCOUNT_DIR,
        api_client: Any = None,
        drivers: Sequence[str] = DEFAULT_GPU_DRIVERS,
        device_classes: Sequence[str] = DEFAULT_GPU_DEVICE_CLASSES,
        timeout_seconds: float = 4.0,
        page_size: int = 500,
        max_page_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if mode == "node" and not node_name:
            raise ValueError("node mode needs node_name (the Downward API's spec.nodeName)")
        self.mode: Mode = mode
        self.drivers = tuple(drivers)
        self.device_classes = tuple(device_classes)
        self._kubeconfig = kubeconfig
        self._service_account_dir = service_account_dir
        self._client: Any = api_client
        self._owns_client = api_client is None
        self._timeout = timeout_seconds
        self._page_size = page_size
        self._max_page_bytes = max_page_bytes
        self.path = f"{API}/resourceslices" if mode == "node" else f"{API}/resourceclaims"
        self.field_selector = f"spec.nodeName={node_name}" if mode == "node" else None
        self._nodes_error: str | None = None

    def fetch(self, inputs: Snapshots | None = None) -> DraSnapshot:
        if self._client is None:
            self._client = connect_client(self._kubeconfig, self._service_account_dir)
        host = str(getattr(self._client.configuration, "host", "") or "(unknown host)")
        deadline = time.monotonic() + self._timeout
        try:
            if self.mode == "node":
                devices = self._collect(deadline, host, self._devices, MAX_DEVICES)
                return DraSnapshot(devices=tuple(sorted(devices, key=_device_key)))
            claims = self._collect(deadline, host, self._claims, MAX_CLAIMS)
            nodes, error = self._nodes(deadline, host)
            return DraSnapshot(
                claims=tuple(sorted(claims, key=lambda c: (c.namespace, c.name))),
                nodes=nodes,
                nodes_error=error,
            )
        except ApiException as exc:
            raise self._api_error(exc, host) from None
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(*_describe_error(exc, host)) from None

    def _nodes(self, deadline: float, host: str) -> tuple[tuple[NodeDevices, ...], str | None]:
        """Cluster mode: GPU devices per node from every slice, on the same client path and
        bounds as the node agent's list; a failure is the snapshot's `nodes_error`."""
        try:
            found = self._collect(
                deadline, host, self._slice_counts, MAX_SLICES, path=f"{API}/resourceslices"
            )
            error: SourceError | None = None
        except ApiException as exc:
            error = self._api_error(exc, host, "resourceslices")
        except SourceError as exc:
            error = exc
        except Exception as exc:
            error = SourceError(*_describe_error(exc, host))
        reason = error.reason if error is not None else None
        if reason != self._nodes_error:  # transitions only: no log line every cycle
            if error is not None:
                log.warning("ResourceSlices not listed, DRA GPU nodes unknown: %s", error)
            else:
                log.info("ResourceSlices listed again")
            self._nodes_error = reason
        return (node_devices(found), None) if error is None else ((), reason)

    def _slice_counts(self, item: Mapping[str, Any]) -> list[_SliceCount]:
        found = _slice_count(item, self.drivers)
        return [found] if found is not None else []

    def item_errors(self, snapshot: DraSnapshot) -> Iterable[str]:
        return [snapshot.nodes_error] if snapshot.nodes_error else []

    def _devices(self, item: Mapping[str, Any]) -> list[SliceDevice]:
        return list(slice_devices(item, self.drivers))

    def _claims(self, item: Mapping[str, Any]) -> list[ClaimInfo]:
        found = claim_info(item, self.device_classes)
        return [found] if found is not None else []

    def _collect(
        self,
        deadline: float,
        host: str,
        reduce: Callable[[Mapping[str, Any]], list[Any]],
        cap: int,
        *,
        path: str | None = None,
    ) -> list[Any]:
        """Every page of the list, each item reduced as it is parsed, at most `cap` rows.
        `path`: another list than the mode's (cluster mode's slices, cluster-wide)."""
        reader = ListReader(self._client, host, self._page_size, self._max_page_bytes)
        what = "GPU ResourceSlices" if path is not None else self._what
        selector = self.field_selector if path is None else None
        return reader.collect(
            path or self.path, deadline, reduce, cap, what, field_selector=selector
        )

    @property
    def _what(self) -> str:
        return "GPU devices in this node's ResourceSlices" if self.mode == "node" else "claims"

    def _api_error(self, exc: ApiException, host: str, what: str | None = None) -> SourceError:
        status = int(exc.status or 0)
        if status == _HTTP_NOT_FOUND:
            # No resource.k8s.io/v1 here (before Kubernetes 1.34, or DRA turned off).
            return SourceError(NOT_CONFIGURED, f"the Kubernetes API {host} serves no {API}")
        if status == _HTTP_FORBIDDEN:
            what = what or ("resourceslices" if self.mode == "node" else "resourceclaims")
            return SourceError(
                "forbidden",
                f"Kubernetes API {host} answered 403 Forbidden: the exporter's service "
                f"account needs get and list on {what} (resource.k8s.io)",
            )
        return SourceError(*_describe_error(exc, host))

    def close(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None


def _device_key(d: SliceDevice) -> tuple[str, str, str]:
    return d.driver, d.pool, d.name
