"""Ray Serve source (node mode): deployments and replicas from the Ray dashboard, queues
from the metrics of the Ray nodes that run here.

Per cycle, only while a Ray node runs on this node (RAY_LOCAL, from sources/ray/state.py):

* ``GET /api/serve/applications/`` on the dashboard (``--ray-address``, with its token):
  every application's deployments (status, ``max_ongoing_requests``) and replicas
  (``replica_id``, ``state``, ``node_id``, ``pid``). Ray answers an empty instance when
  Serve is not running, and 501 when the dashboard lacks Serve's dependencies. Only what
  is named here is read: the answer also holds runtime environments and user config.
  404 or 501 (a dashboard without its Serve module or Serve's dependencies) means Serve
  cannot run on this cluster: an empty snapshot, not a failure.
* For each local Ray node, once and again after a failed read: ``GET /nodes/<node_id>``
  on the dashboard for ``data.detail.raylet.metricsExportPort``. ``/api/v0/nodes`` does
  not carry it, and ``--metrics-export-port`` is random unless set (KubeRay sets 8080).
* ``GET http://<node_ip>:<metricsExportPort>/metrics`` (no token: the endpoint has none,
  and the dashboard's token must not go to another port), filtered to the ray_serve_*
  queue gauges (sources/ray/serve_metrics.py).

Every request goes through gpuledger/net/httpclient.py with what is left of one deadline for
the whole fetch and a byte cap. The shapes are Ray 2.60's, from the capture in
tests/fixtures/ray/ray-2.60-serve/.
"""

from __future__ import annotations

import json
import math
import re
import ssl
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from gpuledger.identity.urls import safe_url
from gpuledger.model import Snapshots
from gpuledger.model.ray import RAY_LOCAL, LocalRayNode
from gpuledger.model.serve import (
    SERVE,
    ServeDeployment,
    ServeNodeMetrics,
    ServeReplica,
    ServeReplicaLoad,
    ServeRouterQueue,
    ServeSnapshot,
)
from gpuledger.net.httpclient import HttpClient, HttpError
from gpuledger.sources.base import Source, SourceError
from gpuledger.sources.engines.exposition import ExpositionError
from gpuledger.sources.ray.serve_metrics import MetricsBody
from gpuledger.sources.ray.state import JsonReader, _base_url, one_line

# Bounded vocabulary for SourceError.reason and item errors (a label value).
REASONS: Final[tuple[str, ...]] = (
    "ray_down",  # the Ray source failed this cycle: which Ray nodes run here is unknown
    "unauthorized",  # 401/403 from the dashboard
    "unreachable",
    "timeout",
    "http_error",
    "bad_response",
    "too_large",
    "invalid_address",
    # A local Ray node's metrics endpoint: not found, or not read.
    "metrics_no_port",
    "metrics_unreachable",
    "metrics_timeout",
    "metrics_http_error",
    "metrics_bad_response",
    "metrics_too_large",
)

APPLICATIONS_PATH: Final = "/api/serve/applications/"
# A replica takes ~0.5 KiB of the answer, a deployment ~1.5 KiB: 4 MiB is thousands of
# replicas. A node's detail carries its workers' command lines: ~20 KiB a worker.
MAX_APPLICATIONS_BYTES: Final = 4 * 1024 * 1024
MAX_NODE_BYTES: Final = 8 * 1024 * 1024
# A node's whole Ray exposition, mostly histogram buckets of every worker on it.
MAX_METRICS_BYTES: Final = 32 * 1024 * 1024
# What json.loads may build from a dashboard answer: one JSON value (a separator: `,` `:`
# `{` `[`) per 8 bytes of the cap; real answers hold one per 20-40 bytes.
BYTES_PER_SEPARATOR: Final = 8
_HEX: Final = re.compile(r"[0-9a-f]{1,128}")
# HTTP reasons (httpclient.REASONS) -> this source's.
_TRANSPORT: Final = {
    "timeout": "timeout",
    "too_large": "too_large",
    "truncated": "bad_response",
    "garbage": "bad_response",
    "invalid_url": "invalid_address",
}


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# --------------------------------------------------------------------------- parsing


def parse_applications(
    payload: Any,
) -> tuple[tuple[ServeDeployment, ...], tuple[ServeReplica, ...]]:
    """Deployments and replicas from a /api/serve/applications/ answer (Ray's
    ServeInstanceDetails). Raises SourceError("bad_response") for another shape."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("applications", {}), Mapping):
        raise SourceError("bad_response", "Ray Serve applications: not a Serve instance answer")
    deployments: list[ServeDeployment] = []
    replicas: list[ServeReplica] = []
    for app_name, app in _mapping(payload.get("applications")).items():
        application = _text(_mapping(app).get("name")) or str(app_name)
        for dep_name, dep in _mapping(_mapping(app).get("deployments")).items():
            deployment = _text(_mapping(dep).get("name")) or str(dep_name)
            deployments.append(_deployment(application, deployment, _mapping(dep)))
            rows = _mapping(dep).get("replicas")
            for row in rows if isinstance(rows, list) else []:
                replica = _replica(application, deployment, _mapping(row))
                if replica is not None:
                    replicas.append(replica)
    return tuple(deployments), tuple(replicas)


def _deployment(application: str, deployment: str, dep: Mapping[str, Any]) -> ServeDeployment:
    config = _mapping(dep.get("deployment_config"))
    return ServeDeployment(
        application=application,
        deployment=deployment,
        status=_text(dep.get("status")) or "UNKNOWN",
        max_ongoing_requests=_int(config.get("max_ongoing_requests")),
        target_replicas=_int(dep.get("target_num_replicas")),
    )


def _replica(application: str, deployment: str, row: Mapping[str, Any]) -> ServeReplica | None:
    replica_id = _text(row.get("replica_id"))
    if replica_id is None:
        return None
    pid = _int(row.get("pid"))
    return ServeReplica(
        application=application,
        deployment=deployment,
        replica=replica_id,
        state=_text(row.get("state")) or "UNKNOWN",
        node_id=_text(row.get("node_id")),
        pid=pid if pid is not None and pid > 0 else None,
        actor_id=_text(row.get("actor_id")),
    )


def metrics_export_port(payload: Any) -> int | None:
    """`data.detail.raylet.metricsExportPort` of a dashboard /nodes/<node_id> answer."""
    detail = _mapping(_mapping(_mapping(payload).get("data")).get("detail"))
    port = _int(_mapping(detail.get("raylet")).get("metricsExportPort"))
    return port if port is not None and 0 < port < 65536 else None


def metrics_url(node_ip: str, port: int) -> str:
    host = f"[{node_ip}]" if ":" in node_ip else node_ip
    return f"http://{host}:{port}/metrics"


# --------------------------------------------------------------------------- client


class _NoServe(Exception):
    """404 or 501 from the dashboard: the module (or Serve's dependencies) is not there."""


class _NodeFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ServeClient:
    """Reads Serve's applications from the dashboard and Serve's queues from the local Ray
    nodes' metrics. One per `--ray-address`, used from the source runner's thread."""

    def __init__(
        self, address: str, token: str | None = None, timeout_seconds: float = 4.0
    ) -> None:
        self.base_url = _base_url(address)
        self.timeout_seconds = timeout_seconds
        self._headers = {"Accept": "application/json"}
        secret = (token or "").strip()
        if secret:
            self._headers["Authorization"] = f"Bearer {secret}"
        self._tls = ssl.create_default_context()
        self._ports: dict[str, int] = {}  # node id -> metricsExportPort, while it answers

    def __repr__(self) -> str:
        return f"ServeClient({safe_url(self.base_url)!r})"

    def fetch(self, local: Sequence[LocalRayNode]) -> ServeSnapshot:
        if not local:
            return ServeSnapshot()  # no Ray node here: nothing to ask the dashboard
        deadline = time.monotonic() + self.timeout_seconds
        try:
            payload = self._dashboard_json(APPLICATIONS_PATH, MAX_APPLICATIONS_BYTES, deadline)
        except _NoServe:
            return ServeSnapshot()
        deployments, replicas = parse_applications(payload)
        here = {n.node.node_id for n in local}
        replicas = tuple(r for r in replicas if r.node_id in here)
        self._ports = {k: v for k, v in self._ports.items() if k in here}
        if not deployments:
            return ServeSnapshot()  # Serve is not running: no queue to read
        nodes = tuple(self._node_metrics(n, deadline) for n in local)
        return ServeSnapshot(deployments=deployments, replicas=replicas, nodes=nodes)

    # ---- one node's metrics

    def _node_metrics(self, local: LocalRayNode, deadline: float) -> ServeNodeMetrics:
        node = local.node
        url = ""
        try:
            port = self._port(node.node_id, deadline)
            url = metrics_url(node.node_ip, port)
            routers, replicas = self._scrape(url, deadline)
        except _NodeFailed as exc:
            self._ports.pop(node.node_id, None)  # found again next cycle
            return ServeNodeMetrics(
                node.node_id, safe_url(url), False, (), (), exc.reason, exc.message
            )
        return ServeNodeMetrics(node.node_id, safe_url(url), True, routers, replicas)

    def _port(self, node_id: str, deadline: float) -> int:
        if node_id in self._ports:
            return self._ports[node_id]
        if not _HEX.fullmatch(node_id):  # it goes into a URL path
            raise _NodeFailed("metrics_no_port", "a Ray node id that is not hexadecimal")
        try:
            payload = self._dashboard_json(f"/nodes/{node_id}", MAX_NODE_BYTES, deadline)
        except _NoServe:
            payload = None  # a dashboard without the node module: no port to find
        except SourceError as exc:
            raise _NodeFailed(f"metrics_{_node_reason(exc.reason)}", exc.message) from None
        port = metrics_export_port(payload)
        if port is None:
            raise _NodeFailed(
                "metrics_no_port",
                f"the Ray dashboard names no metrics export port for Ray node {node_id[:12]}",
            )
        self._ports[node_id] = port
        return port

    def _scrape(
        self, url: str, deadline: float
    ) -> tuple[tuple[ServeRouterQueue, ...], tuple[ServeReplicaLoad, ...]]:
        where = safe_url(url)
        body = MetricsBody()  # read as it arrives: the body (up to 32 MiB) is never held
        try:
            response = self._http(deadline, MAX_METRICS_BYTES, {}).get(url, consume=body)
        except HttpError as exc:
            reason = _node_reason(_TRANSPORT.get(exc.reason, "unreachable"))
            raise _NodeFailed(f"metrics_{reason}", exc.message) from None
        if response.status != 200:
            raise _NodeFailed("metrics_http_error", f"HTTP {response.status} from {where}")
        try:
            return body.parsed()
        except ExpositionError as exc:  # its message never quotes the body
            raise _NodeFailed("metrics_bad_response", f"{where}: {exc}") from None

    # ---- the dashboard

    def _dashboard_json(self, path: str, max_bytes: int, deadline: float) -> Any:
        url = self.base_url + path
        where = safe_url(url)
        reader = JsonReader(max_bytes, max_bytes // BYTES_PER_SEPARATOR)
        try:
            response = self._http(deadline, max_bytes, self._headers, redirects=0).get(
                url, consume=reader
            )
        except HttpError as exc:
            raise _transport_error(exc, where, self.timeout_seconds, max_bytes) from None
        if reader.failure is not None:
            raise SourceError(
                "too_large", f"{where} answered more than {max_bytes >> 20} MiB or JSON values"
            )
        if response.status in (401, 403):
            raise SourceError(
                "unauthorized",
                f"{where} refused the request (HTTP {response.status}): "
                + ("--ray-token-file holds another token" if "Authorization" in self._headers
                   else "Ray 2.60 enables token auth by default: pass --ray-token-file"),
            )  # fmt: skip
        if response.status in (404, 501):
            raise _NoServe()
        if response.status != 200:
            raise SourceError("http_error", f"HTTP {response.status} from {where}")
        try:
            return json.loads(reader.body())
        except (ValueError, RecursionError):
            raise SourceError("bad_response", f"{where} did not answer JSON") from None

    def _http(
        self, deadline: float, max_bytes: int, headers: Mapping[str, str], redirects: int = 3
    ) -> HttpClient:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HttpError("timeout", "the Serve fetch ran out of time")
        return HttpClient(
            deadline_seconds=left,
            max_body_bytes=max_bytes,
            headers=headers,
            tls_context=self._tls,
            # None for the dashboard: its token must never be replayed to another host.
            max_redirects=redirects,
        )

    def close(self) -> None:
        """Nothing held between requests."""


# A dashboard or transport reason -> the reason of a node whose metrics were not read.
_NODE_REASONS: Final = {
    "timeout": "timeout",
    "too_large": "too_large",
    "bad_response": "bad_response",
    "http_error": "http_error",
    "unauthorized": "http_error",
}


def _node_reason(reason: str) -> str:
    return _NODE_REASONS.get(reason, "unreachable")


def _transport_error(exc: HttpError, where: str, timeout: float, max_bytes: int) -> SourceError:
    reason = _TRANSPORT.get(exc.reason, "unreachable")
    if reason == "timeout":
        return SourceError("timeout", f"no complete answer from {where} within {timeout:g}s")
    if reason == "too_large":
        return SourceError("too_large", f"{where} answered more than {max_bytes >> 20} MiB")
    return SourceError(reason, one_line(exc.message))


# --------------------------------------------------------------------------- source


class ServeSource(Source[ServeSnapshot]):
    """Node mode: Serve's deployments, and their queues on the Ray nodes that run here."""

    key = SERVE
    needs = (RAY_LOCAL,)

    def __init__(self, client: ServeClient, namespace: str = "", workload: str = "ray") -> None:
        self.client = client
        self.namespace = namespace
        self.workload = workload

    def fetch(self, inputs: Snapshots) -> ServeSnapshot:
        local = inputs.get(RAY_LOCAL)
        if local is None:
            raise SourceError(
                "ray_down", "the Ray state API did not answer: which Ray nodes run here is unknown"
            )
        snapshot = self.client.fetch(local)
        down = [n for n in snapshot.nodes if not n.up]
        if snapshot.nodes and len(down) == len(snapshot.nodes):
            # No queue of this node is known: the source is down, not empty.
            first = down[0]
            raise SourceError(
                first.error_reason or "metrics_unreachable", first.error_message or ""
            )
        return replace(snapshot, namespace=self.namespace, workload=self.workload)

    def item_errors(self, snapshot: ServeSnapshot) -> Iterable[str]:
        return [n.error_reason or "metrics_unreachable" for n in snapshot.nodes if not n.up]

    def close(self) -> None:
        self.client.close()
