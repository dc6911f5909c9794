"""InferencePools (Gateway API Inference Extension, `inference.networking.k8s.io/v1`):
which pods form each pool, and where its endpoint picker's metrics are. Cluster mode.

Upstream facts (tests/fixtures/gateway/README.md, GIE v1.6.0): a pool selects pods of its
own namespace by `spec.selector.matchLabels` only (at least one label); each pod is an
endpoint per `spec.targetPorts[].number`; `spec.endpointPickerRef` (optional since v1.6.0)
names a Service (`kind` Service, the default) in front of the picker, which serves its
metrics on the port named `http-metrics` (9090 in llm-d-router's and GIE's charts).

Each fetch, under one deadline: one bounded list of the pools; one bounded pod list per
pool, by its label selector (a pool's failure is its own `members_error`); and each
picker's Service, read once a minute (Services rarely change). A cluster that does not
serve the API (404) has no pools: the source reports itself not configured.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gpuledger.model import NOT_CONFIGURED, Snapshots
from gpuledger.model.gateway import (
    INFERENCE_POOLS,
    InferencePool,
    PickerRef,
    PoolMember,
    PoolsSnapshot,
)
from gpuledger.net import kubeapi
from gpuledger.net.kubeapi import ApiException
from gpuledger.sources.base import Source, SourceError
from gpuledger.sources.kubernetes.lists import ListReader, obj, objs
from gpuledger.sources.kubernetes.pods import _describe_error, connect_client, pod_info

__all__ = ["InferencePoolSource", "picker_url", "pool_of"]

API = "/apis/inference.networking.k8s.io/v1"
MAX_POOLS = 5_000
MAX_MEMBERS = 2_000  # per pool
MAX_SELECTOR_LABELS = 64
MAX_WORKERS = 8  # member lists at once  # the CRD's bound on matchLabels
METRICS_PORT_NAME = "http-metrics"
DEFAULT_METRICS_PORT = 9090
SERVICE_TTL_SECONDS = 60.0
_HTTP_NOT_FOUND = 404
_HTTP_FORBIDDEN = 403


def _accepted(status: Mapping[str, Any]) -> str | None:
    """The Accepted condition's status of the pool's first parent (a Gateway)."""
    for parent in objs(status.get("parents"))[:1]:
        for condition in objs(parent.get("conditions")):
            if condition.get("type") == "Accepted" and isinstance(condition.get("status"), str):
                return str(condition["status"])
    return None


def _picker_ref(spec: Mapping[str, Any]) -> PickerRef | None:
    ref = obj(spec.get("endpointPickerRef"))
    name = ref.get("name")
    if not isinstance(name, str) or not name or ref.get("kind", "Service") != "Service":
        return None
    port = obj(ref.get("port")).get("number")
    mode = ref.get("failureMode")
    return PickerRef(
        service=name,
        port=port if isinstance(port, int) else None,
        failure_mode=mode if mode in ("FailOpen", "FailClose") else "FailClose",
    )


@dataclass(frozen=True)
class _PoolSpec:
    """One InferencePool object, before its members and picker URL are known."""

    namespace: str
    name: str
    uid: str
    selector: Mapping[str, str]
    target_ports: tuple[int, ...]
    picker: PickerRef | None
    accepted: str | None


def pool_of(item: Mapping[str, Any]) -> list[_PoolSpec]:
    """One InferencePool object reduced to what the ledger needs; [] when it has no name."""
    metadata, spec = obj(item.get("metadata")), obj(item.get("spec"))
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        return []
    labels = obj(obj(spec.get("selector")).get("matchLabels"))
    selector = {k: v for k, v in list(labels.items())[:MAX_SELECTOR_LABELS] if isinstance(v, str)}
    ports = tuple(
        p
        for p in (obj(x).get("number") for x in objs(spec.get("targetPorts"))[:8])
        if isinstance(p, int) and 0 < p < 65536
    )
    return [
        _PoolSpec(
            namespace=namespace,
            name=name,
            uid=str(metadata.get("uid") or ""),
            selector=selector,
            target_ports=ports,
            picker=_picker_ref(spec),
            accepted=_accepted(obj(item.get("status"))),
        )
    ]


def picker_url(service: Mapping[str, Any], namespace: str, name: str) -> str:
    """The picker's metrics URL from its Service: the ClusterIP (the Service's DNS name for
    a headless one) and the port named `http-metrics`, else 9090."""
    spec = obj(service.get("spec"))
    port = next(
        (
            p.get("port")
            for p in objs(spec.get("ports"))
            if p.get("name") == METRICS_PORT_NAME and isinstance(p.get("port"), int)
        ),
        DEFAULT_METRICS_PORT,
    )
    ip = spec.get("clusterIP")
    host = ip if isinstance(ip, str) and ip and ip != "None" else f"{name}.{namespace}.svc"
    if ":" in host:
        host = f"[{host}]"  # an IPv6 ClusterIP
    return f"http://{host}:{port}/metrics"


def _member(item: Mapping[str, Any]) -> list[PoolMember]:
    info = pod_info(item)
    if info is None or info.deletion:  # a terminating pod is no endpoint any more
        return []
    return [PoolMember(info.uid, info.name, info.workload, info.node_name, info.pod_ip, info.ready)]


class InferencePoolSource(Source[PoolsSnapshot]):
    """Every InferencePool with its member pods and its picker's metrics URL."""

    key = INFERENCE_POOLS

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        service_account_dir: str = kubeapi.SERVICE_ACCOUNT_DIR,
        api_client: Any = None,
        picker_urls: Mapping[str, str] | None = None,
        timeout_seconds: float = 4.0,
        page_size: int = 500,
        max_page_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._kubeconfig = kubeconfig
        self._service_account_dir = service_account_dir
        self._client: Any = api_client
        self._owns_client = api_client is None
        self._picker_urls = dict(picker_urls or {})  # NAMESPACE/POOL -> URL
        self._timeout = timeout_seconds
        self._page_size = page_size
        self._max_page_bytes = max_page_bytes
        # (namespace, service) -> (its metrics URL or None when unreadable, read at)
        self._services: dict[tuple[str, str], tuple[str | None, float]] = {}
        self._pool_executor: concurrent.futures.ThreadPoolExecutor | None = None

    def fetch(self, inputs: Snapshots | None = None) -> PoolsSnapshot:
        if self._client is None:
            self._client = connect_client(self._kubeconfig, self._service_account_dir)
        host = str(getattr(self._client.configuration, "host", "") or "(unknown host)")
        reader = ListReader(self._client, host, self._page_size, self._max_page_bytes)
        deadline = time.monotonic() + self._timeout
        try:
            specs = reader.collect(f"{API}/inferencepools", deadline, pool_of, MAX_POOLS, "pools")
        except ApiException as exc:
            raise self._api_error(exc, host, "inferencepools") from None
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(*_describe_error(exc, host)) from None
        urls = [self._metrics_url(reader, spec, deadline) for spec in specs]
        members = self._all_members(reader, specs, deadline)
        self._forget_services({(p.namespace, p.picker.service) for p in specs if p.picker})
        pools = [
            self._pool(spec, url, *found)
            for spec, url, found in zip(specs, urls, members, strict=True)
        ]
        return PoolsSnapshot(tuple(sorted(pools, key=lambda p: (p.namespace, p.name))))

    def _all_members(
        self, reader: ListReader, specs: Sequence[_PoolSpec], deadline: float
    ) -> list[tuple[tuple[PoolMember, ...], str | None]]:
        """Every pool's members, listed MAX_WORKERS at a time under the fetch's deadline
        (one list per pool: a cycle costs as many lists as there are pools)."""
        if not specs:
            return []
        executor = self._executor()
        futures = [
            executor.submit(self.cpu.run, functools.partial(self._members, reader, s, deadline))
            for s in specs
        ]
        done, _ = concurrent.futures.wait(
            futures, timeout=max(0.0, deadline - time.monotonic()) + 0.5
        )
        return [f.result() if f in done else ((), "timeout") for f in futures]

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool_executor is None:
            self._pool_executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=MAX_WORKERS, thread_name_prefix="pool-members"
            )
        return self._pool_executor

    def item_errors(self, snapshot: PoolsSnapshot) -> Iterable[str]:
        return [p.members_error for p in snapshot.pools if p.members_error]

    @staticmethod
    def _pool(
        spec: _PoolSpec, url: str | None, members: tuple[PoolMember, ...], error: str | None
    ) -> InferencePool:
        return InferencePool(
            namespace=spec.namespace,
            name=spec.name,
            uid=spec.uid,
            selector=spec.selector,
            target_ports=spec.target_ports,
            picker=spec.picker,
            picker_metrics_url=url,
            members=members,
            members_error=error,
            accepted=spec.accepted,
        )

    def _members(
        self, reader: ListReader, spec: _PoolSpec, deadline: float
    ) -> tuple[tuple[PoolMember, ...], str | None]:
        if not spec.selector:
            return (), None  # upstream requires a label: an empty one selects nothing
        selector = ",".join(f"{k}={v}" for k, v in sorted(spec.selector.items()))
        path = f"/api/v1/namespaces/{quote(spec.namespace, safe='')}/pods"
        try:
            found = reader.collect(
                path,
                deadline,
                _member,
                MAX_MEMBERS,
                f"pods in pool {spec.name}",
                label_selector=selector,
            )
        except ApiException as exc:
            return (), self._api_error(exc, reader.host, "pods").reason
        except SourceError as exc:
            return (), exc.reason
        except Exception as exc:
            return (), _describe_error(exc, reader.host)[0]
        return tuple(sorted(found, key=lambda m: (m.name, m.uid))), None

    def _metrics_url(self, reader: ListReader, spec: _PoolSpec, deadline: float) -> str | None:
        configured = self._picker_urls.get(f"{spec.namespace}/{spec.name}")
        if configured is not None:
            return configured
        if spec.picker is None:
            return None
        key = (spec.namespace, spec.picker.service)
        cached = self._services.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[1] < SERVICE_TTL_SECONDS:
            return cached[0]
        path = (
            f"/api/v1/namespaces/{quote(spec.namespace, safe='')}/services/"
            f"{quote(spec.picker.service, safe='')}"
        )
        try:
            url = picker_url(reader.get(path, deadline), *key)
        except ApiException as exc:
            if exc.status == _HTTP_NOT_FOUND:  # no such Service: asked again in a minute
                self._services[key] = (None, now)
            return None
        except Exception:  # unreadable this cycle (a timeout, a bad answer): asked again next
            return None
        self._services[key] = (url, now)
        return url

    def _forget_services(self, keep: set[tuple[str, str]]) -> None:
        for key in [k for k in self._services if k not in keep]:
            del self._services[key]

    def _api_error(self, exc: ApiException, host: str, what: str) -> SourceError:
        status = int(exc.status or 0)
        if status == _HTTP_NOT_FOUND and what == "inferencepools":
            return SourceError(NOT_CONFIGURED, f"the Kubernetes API {host} serves no {API}")
        if status == _HTTP_FORBIDDEN:
            group = "inference.networking.k8s.io" if what == "inferencepools" else "core"
            return SourceError(
                "forbidden",
                f"Kubernetes API {host} answered 403 Forbidden: the exporter's service "
                f"account needs list on {what} ({group}), list on pods and get on services",
            )
        return SourceError(*_describe_error(exc, host))

    def close(self) -> None:
        if self._pool_executor is not None:
            self._pool_executor.shutdown(wait=False, cancel_futures=True)
            self._pool_executor = None
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None
