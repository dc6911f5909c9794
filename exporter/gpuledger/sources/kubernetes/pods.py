"""Kubernetes pods through an informer: one list, then a watch, with the real client.

Two modes (docs/design.md, "Modes"):

* node: the pods on this node (`spec.nodeName=<node>`), for Pod UID, labels, container
  ids and workload of everything the node's processes belong to;
* cluster: pods that are not placed (`status.phase=Pending,spec.nodeName=`), kept only
  while `PodScheduled=False`, with the reason classified (scheduling_gated,
  insufficient_gpu, ...).

The informer runs in its own thread: list (paged), then watch from the list's
resourceVersion with bookmarks; `410 Gone` relists; other failures back off
exponentially with jitter (first retry at once, cap `backoff_cap_seconds`) and relist
when the server answers again, which also drops pods deleted during the outage. A watch
that stops answering is noticed after its `timeoutSeconds` plus the request timeout.
Each object is reduced to a `PodInfo` as it arrives, so memory holds only the fields
the ledger uses, never whole pod objects.

`fetch()` only copies the cache. While the last list/watch attempt failed it raises
(the source is down and its series drop, docs/reliability.md), but the cache is kept: the watch
resumes from it, and `cached()` still returns it, marked `synced=False`, for callers that
prefer stale data to none.

Credentials stay inside the client: messages carry the API host and HTTP status, never
headers, tokens or response bodies.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import urllib3.exceptions

from gpuledger.identity.scheduling import (
    DEFAULT_GPU_RESOURCES,
    cause_nodes,
    classify_pending,
    is_gpu_resource,
    pod_scheduled_condition,
    workload_of,
)
from gpuledger.model import Snapshots, frozen_map
from gpuledger.model.kubernetes import PODS, PodInfo, PodsSnapshot
from gpuledger.net import kubeapi
from gpuledger.net.bounded import BodyTimedOut, BodyTooLarge, read_bounded
from gpuledger.net.kubeapi import ApiException
from gpuledger.sources.base import Source, SourceError

__all__ = [
    "InformerStats",
    "Mode",
    "PodInfo",
    "PodInformer",
    "PodsSnapshot",
    "bare_container_id",
    "connect_client",
    "gpu_request",
    "pod_info",
]

log = logging.getLogger(__name__)

Mode = Literal["node", "cluster"]

_HTTP_GONE = 410
# One list page (page_size pods) is a few MiB; far more is a broken or hostile server.
# Refuse it rather than buffer it (objects are at most ~1.5 MiB: etcd's request limit).
DEFAULT_MAX_LIST_BYTES = 64 * 1024 * 1024
# 1,000 pages of 500: half a million pods. A server that never stops paging is broken.
MAX_LIST_PAGES = 1000
# Annotations are free text that other tools fill; keep only the discovery hints we use.
ANNOTATION_PREFIXES = ("gpuledger.io/", "prometheus.io/")


@dataclass(frozen=True)
class InformerStats:
    """Counters for tests, logs and self-monitoring."""

    lists: int  # completed lists (each replaces the cache)
    gone: int  # 410 Gone answers that forced a relist
    watches: int  # watch requests made
    events: int  # watch events applied
    failures: int  # failed list/watch attempts
    last_sync_timestamp: float | None  # wall clock of the last list or event


# --- pod JSON -> PodInfo (pure) ---


def bare_container_id(value: object) -> str | None:
    """`containerd://<id>` (or `cri-o://`, `docker://`) -> `<id>`; None when unset."""
    if not isinstance(value, str) or not value:
        return None
    _, sep, rest = value.partition("://")
    bare = (rest if sep else value).strip().lower()
    return bare or None


def _quantity(value: object) -> int:
    """Extended resources are whole numbers ("2"); anything else counts as none."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str):
        try:
            return max(int(value.strip()), 0)
        except ValueError:
            return 0
    return 0


def _obj(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _objs(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _container_gpus(container: Mapping[str, Any], gpu_resources: Sequence[str]) -> int:
    resources = _obj(container.get("resources"))
    # Extended resources need a limit; a request alone must equal it, so it stands in.
    amounts = _obj(resources.get("limits")) or _obj(resources.get("requests"))
    return sum(_quantity(v) for k, v in amounts.items() if is_gpu_resource(str(k), gpu_resources))


def gpu_request(spec: Mapping[str, Any], gpu_resources: Sequence[str]) -> int:
    """GPUs a Pod holds while running: app containers plus sidecars (init containers with
    `restartPolicy: Always`), or the largest plain init container if that is more.
    (Slightly generous for sidecars started after a large init container.)"""
    running = sum(_container_gpus(c, gpu_resources) for c in _objs(spec.get("containers")))
    init_peak = 0
    for container in _objs(spec.get("initContainers")):
        if container.get("restartPolicy") == "Always":
            running += _container_gpus(container, gpu_resources)
        else:
            init_peak = max(init_peak, _container_gpus(container, gpu_resources))
    return max(running, init_peak)


def _timestamp(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)  # the API always means UTC
    return parsed.timestamp()


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _str_map(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def pod_info(
    pod: Mapping[str, Any], gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES
) -> PodInfo | None:
    """Reduce one Pod object (API JSON) to a PodInfo; None if it has no uid or name.
    Tolerates any shape (a malformed object must not stop the informer)."""
    metadata = _obj(pod.get("metadata"))
    spec = _obj(pod.get("spec"))
    status = _obj(pod.get("status"))
    uid = metadata.get("uid")
    name = metadata.get("name")
    if not isinstance(uid, str) or not uid or not isinstance(name, str) or not name:
        return None
    labels = _str_map(metadata.get("labels"))
    conditions = _objs(status.get("conditions"))
    container_ids: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for entry in _objs(status.get(key)):
            cid = bare_container_id(entry.get("containerID"))
            if cid is not None and entry.get("name"):
                container_ids[str(entry["name"])] = cid
    pending_reason = classify_pending(conditions, gpu_resources)
    scheduled = pod_scheduled_condition(conditions)
    pending_since = (
        _timestamp(scheduled.get("lastTransitionTime"))
        if scheduled is not None and scheduled.get("status") == "False"
        else None
    )
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return PodInfo(
        uid=uid,
        namespace=str(metadata.get("namespace") or ""),
        name=name,
        node_name=_str_or_none(spec.get("nodeName")),
        phase=str(status.get("phase") or "Unknown"),
        labels=frozen_map(labels),
        workload=workload_of(name, labels, _objs(metadata.get("ownerReferences"))),
        pod_ip=_str_or_none(status.get("podIP")),
        container_ids=frozen_map(container_ids),
        gpu_requests=gpu_request(spec, gpu_resources),
        pending_reason=pending_reason,
        pending_since=pending_since,
        ready=ready,
        deletion=bool(metadata.get("deletionTimestamp")),
        annotations=frozen_map(
            {
                k: v
                for k, v in _str_map(metadata.get("annotations")).items()
                if k.startswith(ANNOTATION_PREFIXES)
            }
        ),
        claims=pod_claims(spec, status),
        pending_nodes=_pending_nodes(scheduled, pending_reason),
    )


# A pod may name at most 128 claims (API validation); more is a hostile object.
_MAX_POD_CLAIMS = 128


def pod_claims(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceClaim names a pod uses: `resourceClaimName`, or for a template the
    name the controller generated (status.resourceClaimStatuses); not yet made: absent."""
    generated = {
        str(e.get("name")): e.get("resourceClaimName")
        for e in _objs(status.get("resourceClaimStatuses"))[:_MAX_POD_CLAIMS]
    }
    names: list[str] = []
    for entry in _objs(spec.get("resourceClaims"))[:_MAX_POD_CLAIMS]:
        name = entry.get("resourceClaimName") or generated.get(str(entry.get("name")))
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return tuple(names)


def _pending_nodes(scheduled: Mapping[str, Any] | None, reason: str | None) -> int | None:
    message = scheduled.get("message") if scheduled is not None else None
    if reason is None or not isinstance(message, str):
        return None
    return cause_nodes(message[:4096], reason)


# --- errors -> (reason, message) ---


class _Gone(Exception):
    """The resourceVersion (or continue token) is too old: relist."""


def _describe_error(exc: BaseException, host: str) -> tuple[str, str]:
    """Bounded reason and a one-line message; never the response body or headers."""
    if isinstance(exc, SourceError):
        return exc.reason, exc.message
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        if status == 401:
            return "unauthorized", (
                f"Kubernetes API {host} answered 401 Unauthorized: the service account "
                "token or kubeconfig credentials were rejected"
            )
        if status == 403:
            return "forbidden", (
                f"Kubernetes API {host} answered 403 Forbidden: the exporter's service "
                "account needs list and watch on pods"
            )
        if status == 429:
            return "throttled", f"Kubernetes API {host} answered 429 Too Many Requests"
        if status >= 500:
            return "server_error", f"Kubernetes API {host} answered HTTP {status}"
        if status == 0:  # the client's wrapper for TLS failures
            return "tls", f"TLS handshake with the Kubernetes API {host} failed"
        return "http_error", f"Kubernetes API {host} answered HTTP {status}"
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        return _describe_error(exc.reason, host)
    if isinstance(exc, urllib3.exceptions.SSLError):
        return "tls", f"TLS handshake with the Kubernetes API {host} failed"
    # Before the timeout check: urllib3 derives NewConnectionError (refused, no route,
    # DNS) from ConnectTimeoutError.
    if isinstance(exc, urllib3.exceptions.NewConnectionError | ConnectionRefusedError):
        return "unreachable", f"cannot connect to the Kubernetes API {host}"
    if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError | socket.timeout):
        return "timeout", f"Kubernetes API {host} did not answer in time"
    if isinstance(
        exc,
        urllib3.exceptions.NewConnectionError
        | urllib3.exceptions.ProtocolError
        | urllib3.exceptions.HTTPError
        | ConnectionError,
    ):
        return "unreachable", f"cannot reach the Kubernetes API {host} ({type(exc).__name__})"
    if isinstance(exc, ValueError | KeyError | TypeError):
        return "bad_response", f"unexpected answer from the Kubernetes API {host}"
    return "internal_error", type(exc).__name__


def connect_client(kubeconfig: str | None, service_account_dir: str) -> Any:
    """An API client from `kubeconfig`, else the in-cluster service account; raises
    SourceError("config", ...) naming what could not be loaded, never its content."""
    where = f"kubeconfig {kubeconfig!r}" if kubeconfig else "in-cluster"
    try:
        if kubeconfig:
            configuration = kubeapi.kubeconfig_configuration(kubeconfig)
        else:
            configuration = kubeapi.incluster_configuration(service_account_dir)
    except kubeapi.ConfigException as exc:
        # The loader's own words ("Service host/port is not set."), one bounded line.
        detail = (str(exc).splitlines() or [""])[0][:160]
        raise SourceError(
            "config", f"cannot load the {where} Kubernetes configuration: {detail}"
        ) from None
    except Exception as exc:  # unreadable or malformed file
        raise SourceError(
            "config", f"cannot load the {where} Kubernetes configuration: {type(exc).__name__}"
        ) from None
    # Sources retry with their own backoff; urllib3's silent retries would multiply
    # every timeout.
    configuration.retries = 0
    return kubeapi.api_client(configuration)


# --- the informer ---


class PodInformer(Source[PodsSnapshot]):
    """Pods cached from list + watch in a background thread; `fetch()` reads the cache.

    `api_client` (a `kubernetes.client.ApiClient`) is for tests and embedding; otherwise
    the in-cluster service account is used, or `kubeconfig` when given. `stop()` is final:
    make a new informer to start over.
    """

    def __init__(
        self,
        mode: Mode = "node",
        *,
        node_name: str | None = None,
        kubeconfig: str | None = None,
        service_account_dir: str = kubeapi.SERVICE_ACCOUNT_DIR,
        api_client: Any = None,
        gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES,
        pending_gpu_only: bool = False,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 30.0,
        page_size: int = 500,
        backoff_base_seconds: float = 0.5,
        backoff_cap_seconds: float = 30.0,
        max_list_bytes: int = DEFAULT_MAX_LIST_BYTES,
    ) -> None:
        if mode not in ("node", "cluster"):
            raise ValueError(f"mode must be 'node' or 'cluster', not {mode!r}")
        if mode == "node" and not node_name:
            raise ValueError("node mode needs node_name (the Downward API's spec.nodeName)")
        self.mode: Mode = mode
        self.node_name = node_name
        self.gpu_resources = tuple(gpu_resources)
        # Cluster mode only: skip pending pods that ask for no GPU (memory, cardinality).
        self.pending_gpu_only = pending_gpu_only
        self._kubeconfig = kubeconfig
        self._service_account_dir = service_account_dir
        self._given_client = api_client
        self._watch_timeout = max(1, int(watch_timeout_seconds))
        self._request_timeout = request_timeout_seconds
        self._page_size = page_size
        self._backoff_base = backoff_base_seconds
        self._backoff_cap = backoff_cap_seconds
        self._max_list_bytes = max_list_bytes
        # Cluster mode uses the scheduler's own selector for unbound pods. A pod leaving
        # a selector arrives as DELETED, so a pod that gets placed drops out by itself.
        self.field_selector = (
            f"spec.nodeName={node_name}"
            if mode == "node"
            else "status.phase=Pending,spec.nodeName="
        )

        self._lock = threading.Lock()
        self._pods: dict[str, PodInfo] = {}
        self._snapshot: tuple[PodInfo, ...] | None = ()
        self._synced = False
        self._error: tuple[str, str] | None = None
        self._counts = dict.fromkeys(("lists", "gone", "watches", "events", "failures"), 0)
        self._last_sync: float | None = None

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None  # the running kubernetes.watch.Watch, for stop()
        self._client: Any = None
        self._host = "(not configured)"
        self._resource_version: str | None = None

    key = PODS

    # -- public API --

    def start(self) -> None:
        """Start the background thread (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"pod-informer-{self.mode}", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread: unblocks a running watch at once; a list in flight ends
        within the request timeout (the thread is a daemon, so exit never waits on it)."""
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.stop()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if (
            self._given_client is None
            and self._client is not None
            and not (thread is not None and thread.is_alive())
        ):
            self._client.close()

    def fetch(self, inputs: Snapshots | None = None) -> PodsSnapshot:
        """The cached pods; starts the informer on first use. Never touches the network.

        Raises SourceError while the last list/watch attempt failed (reason from the
        failure: unreachable, timeout, forbidden, unauthorized, server_error, config,
        ...), or `not_synced` until the first list completes.
        """
        self.start()
        with self._lock:
            if self._error is not None:
                raise SourceError(*self._error)
            if not self._synced:
                raise SourceError(
                    "not_synced", "waiting for the first pod list from the Kubernetes API"
                )
            return PodsSnapshot(self._pods_tuple(), synced=True)

    def warm_up(self, timeout_seconds: float) -> None:
        if not self.wait_synced(timeout_seconds):
            log.info("pod informer not synced after %gs; continuing", timeout_seconds)

    def fallback(self) -> PodsSnapshot | None:
        # After a first list, the cache is still the best knowledge of pod identities
        # while the API server is away. The source stays down and its last-success
        # timestamp ages, so the staleness is visible.
        return self.cached() if self.stats().lists else None

    def close(self) -> None:
        self.stop()

    def cached(self) -> PodsSnapshot:
        """The cache even while the source is down (`synced=False` then); never raises."""
        with self._lock:
            return PodsSnapshot(self._pods_tuple(), self._synced and self._error is None)

    def wait_synced(self, timeout: float) -> bool:
        """Block until the first list completes (startup, tests). True if synced."""
        self.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._synced:
                    return True
            time.sleep(0.02)
        return False

    def stats(self) -> InformerStats:
        with self._lock:
            return InformerStats(**self._counts, last_sync_timestamp=self._last_sync)

    # -- cache --

    def _pods_tuple(self) -> tuple[PodInfo, ...]:
        # Rebuilt only after a change, so a scrape of an idle cluster costs nothing.
        if self._snapshot is None:
            self._snapshot = tuple(
                sorted(self._pods.values(), key=lambda p: (p.namespace, p.name, p.uid))
            )
        return self._snapshot

    def _keep(self, info: PodInfo) -> bool:
        if self.mode == "node":
            return True
        if info.pending_reason is None:  # placed, or not yet seen by the scheduler
            return False
        # A pod with claims may ask for GPUs through DRA: the ledger decides with its claims.
        return not self.pending_gpu_only or info.gpu_requests > 0 or bool(info.claims)

    # -- the loop --

    def _run(self) -> None:
        need_list = True
        failures = 0  # consecutive failed attempts; the first retry is immediate
        gone_streak = 0
        while not self._stop.is_set():
            watching = False
            try:
                if self._client is None:
                    self._connect()
                if need_list:
                    self.cpu.tick()
                    self._list()
                    self.cpu.tick()
                    need_list = False
                watching = True
                if self._watch_once():
                    failures = gone_streak = 0
                    continue
                # Ended at once with nothing: back off, though the cache is still current.
                failures += 1
            except _Gone:
                need_list = True
                gone_streak += 1
                with self._lock:
                    self._counts["gone"] += 1
                log.info("pod watch resourceVersion expired (410 Gone): relisting")
                if gone_streak > 1:  # 410 again right after a fresh list: slow down
                    failures += 1
            except Exception as exc:
                if self._stop.is_set():
                    break
                need_list = True
                failures += 1
                # A broken watch is relisted at once and reported only if that fails too,
                # so a routine connection reset does not blink the source down.
                self._fail(exc, report=not (watching and failures == 1))
            self._stop.wait(self._backoff(failures))
        log.debug("pod informer stopped")

    def _backoff(self, failures: int) -> float:
        if failures <= 1:
            return 0.0
        ceiling = min(self._backoff_cap, self._backoff_base * 2.0 ** (failures - 2))
        # Jitter spreads a DaemonSet's reconnects after an API server restart.
        return ceiling * random.uniform(0.5, 1.0)  # noqa: S311 - not cryptographic

    def _fail(self, exc: BaseException, *, report: bool) -> None:
        reason, message = _describe_error(exc, self._host)
        with self._lock:
            self._counts["failures"] += 1
            if not report:
                log.debug("pod watch broke, relisting: %s (%s)", message, reason)
                return
            changed = self._error is None or self._error[0] != reason
            self._error = (reason, message)
        # One warning per change of reason: an outage must not flood the log.
        (log.warning if changed else log.debug)("pod informer: %s (%s)", message, reason)

    def _connect(self) -> None:
        client = self._given_client
        if client is None:
            client = connect_client(self._kubeconfig, self._service_account_dir)
        self._client = client
        self._host = str(getattr(client.configuration, "host", "") or "(unknown host)")

    def _list_versions(self, consistent: bool) -> dict[str, str]:
        """resourceVersion arguments of a list's first page, as client-go's reflector
        chooses them: "0" (served from the API server's watch cache, not etcd: a DaemonSet
        relisting on every node must not scan etcd) until the first sync, then "not older
        than what we saw", and a consistent read from etcd only when that is too old."""
        if consistent:
            return {}
        if self._resource_version is None:
            return {"resource_version": "0"}
        return {
            "resource_version": self._resource_version,
            "resource_version_match": "NotOlderThan",
        }

    def _list(self) -> None:
        """Paged list into a fresh cache, replacing it whole (drops pods deleted unseen)."""
        pods: dict[str, PodInfo] = {}
        token: str | None = None
        consistent = False
        for _ in range(MAX_LIST_PAGES):
            # Continue pages must not repeat the resourceVersion: the token carries it.
            versions = {"_continue": token} if token else self._list_versions(consistent)
            try:
                # Raw JSON: the client's model deserialisation costs ~1 ms a pod.
                response = kubeapi.list_pods(
                    self._client,
                    field_selector=self.field_selector,
                    limit=self._page_size,
                    _request_timeout=(self._request_timeout, self._request_timeout),
                    **versions,
                )
            except ApiException as exc:
                # Our resourceVersion or continue token expired: one consistent list over.
                if exc.status == _HTTP_GONE and not consistent:
                    pods, token, consistent = {}, None, True
                    continue
                raise
            try:
                body = json.loads(self._read_page(response))
            except BaseException:
                response.close()  # a half-read answer must not go back to the pool
                raise
            finally:
                response.release_conn()
            # A list answer is {"metadata": {...}, "items": [{...}, ...]}; anything else
            # is a broken server (or not an API server at all).
            is_list = isinstance(body, Mapping)
            items = (body.get("items") or []) if is_list else None
            metadata = (body.get("metadata") or {}) if is_list else None
            if (
                not isinstance(items, list)
                or not all(isinstance(item, Mapping) for item in items)
                or not isinstance(metadata, Mapping)
            ):
                raise SourceError(
                    "bad_response", f"the Kubernetes API {self._host} sent no PodList"
                )
            for item in items:
                info = pod_info(item, self.gpu_resources)
                if info is not None and self._keep(info):
                    pods[info.uid] = info
            raw_token = metadata.get("continue")
            token = raw_token if isinstance(raw_token, str) and raw_token else None
            if token is None:
                break
        else:
            raise SourceError(
                "bad_response",
                f"the Kubernetes API {self._host} kept sending list pages: "
                f"more than {MAX_LIST_PAGES}",
            )
        self._resource_version = str(metadata.get("resourceVersion") or "") or None
        with self._lock:
            self._pods = pods
            self._snapshot = None
            self._synced = True
            self._error = None
            self._counts["lists"] += 1
            self._last_sync = time.time()

    def _read_page(self, response: Any) -> bytes:
        """A list answer's body, bounded in size and in total time.

        The request timeout bounds each socket read; a server dripping bytes would reset it
        forever, so the whole body gets the same budget. read1 returns what one socket read
        brings, so the budget is checked while the server trickles.
        """
        deadline = time.monotonic() + self._request_timeout
        try:
            return read_bounded(response, self._max_list_bytes, deadline)
        except BodyTooLarge:
            raise SourceError(
                "too_large",
                f"the Kubernetes API {self._host} answered a list page over "
                f"{self._max_list_bytes // (1024 * 1024)} MiB",
            ) from None
        except BodyTimedOut:
            raise SourceError(
                "timeout",
                f"the Kubernetes API {self._host} took over {self._request_timeout:g}s "
                "to send a list page",
            ) from None

    def _watch_once(self) -> bool:
        """One watch request until the server ends it. True if it delivered events or
        ran its course; False if it ended at once with nothing (a suspicious server)."""
        watch = kubeapi.new_watch()
        self._watch = watch
        started = time.monotonic()
        delivered = 0
        with self._lock:
            self._counts["watches"] += 1
        try:
            if self._stop.is_set():
                return True
            stream = watch.stream(
                functools.partial(kubeapi.list_pods, self._client),
                field_selector=self.field_selector,
                resource_version=self._resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                # Reads may idle until the server's own timeout; past it, it hangs.
                _request_timeout=(
                    self._request_timeout,
                    self._watch_timeout + self._request_timeout,
                ),
            )
            for event in stream:
                self._apply(event)
                self.cpu.tick()  # the watch thread's CPU is this source's
                delivered += 1
                if self._stop.is_set():
                    break
        except ApiException as exc:
            if exc.status == _HTTP_GONE:
                raise _Gone from None
            raise
        finally:
            self._watch = None
        return delivered > 0 or time.monotonic() - started >= 1.0

    def _apply(self, event: Mapping[str, Any]) -> None:
        if not isinstance(event, Mapping):
            # The client yields None for a line that is not JSON: the stream is broken,
            # events may be lost, so the loop relists.
            raise SourceError(
                "bad_response",
                f"the Kubernetes API {self._host} sent a watch line that is not JSON",
            )
        kind = event.get("type")
        obj = _obj(event.get("raw_object") or event.get("object"))
        metadata = _obj(obj.get("metadata"))
        version = metadata.get("resourceVersion")
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                info = pod_info(obj, self.gpu_resources)
                if info is not None:
                    if self._keep(info):
                        self._pods[info.uid] = info
                    else:
                        self._pods.pop(info.uid, None)
                    self._snapshot = None
            elif kind == "DELETED" and self._pods.pop(str(metadata.get("uid")), None):
                self._snapshot = None
            # BOOKMARK: only the resourceVersion moves, so a re-watch starts late enough.
            self._counts["events"] += 1
            self._last_sync = time.time()
        if version:
            self._resource_version = str(version)
