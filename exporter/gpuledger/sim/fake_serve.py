"""Simulated Ray Serve: what the dashboard answers for Serve, and a Ray node's metrics.

Shapes follow the real Ray 2.60 capture in ``tests/fixtures/ray/ray-2.60-serve/``:

* :func:`serve_instance` is ``GET /api/serve/applications/`` (Ray's ServeInstanceDetails:
  ``applications.<app>.deployments.<dep>`` with ``status``, ``deployment_config`` and
  ``replicas[]`` of ``replica_id``, ``state``, ``node_id``, ``pid``, ``actor_id``);
* :func:`node_detail` is ``GET /nodes/<node_id>`` (only ``data.detail.raylet`` and the
  fields the capture has around ``metricsExportPort``);
* :func:`serve_exposition` is the node's ``:<metricsExportPort>/metrics``: the three queue
  gauges with Ray's labels (``Component``, ``NodeAddress``, ``SessionName``, ``WorkerId``,
  ``otel_scope_*``; ``actor_id`` and ``handle`` on the router's series), plus a histogram and
  the HTTP proxy's gauge as the noise the real endpoint has around them.

:class:`FakeRayMetrics` serves one node's exposition on its own address, with faults
``refuse``, ``hang``, ``http_500`` and ``garbage``. :func:`install` answers the two
dashboard paths from a :class:`~gpuledger.sim.fake_ray.FakeRayDashboard`.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from gpuledger.sim.fake_ray import FakeRayDashboard

MetricsFault = Literal["ok", "refuse", "hang", "http_500", "garbage"]
METRICS_FAULTS: Final[tuple[str, ...]] = get_args(MetricsFault)
APPLICATIONS_PATH: Final = "/api/serve/applications"  # the dashboard strips the final /
NODES_PREFIX: Final = "/nodes/"
SESSION: Final = "session_2026-12-01_13-40-39_757883_20428"
_SCOPE = (
    'otel_scope_name="ray._private.telemetry.open_telemetry_metric_recorder",'
    'otel_scope_schema_url="",otel_scope_version=""'
)


def _hex(seed: str, length: int) -> str:
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return (digest * 2)[:length]


@dataclass(frozen=True)
class FakeReplica:
    replica_id: str
    node_id: str
    node_ip: str
    pid: int  # in the Ray pod's PID namespace
    state: str = "RUNNING"
    ongoing: float = 0.0  # ray_serve_replica_processing_queries


@dataclass(frozen=True)
class FakeRouter:
    """The router (proxy) on one node, for one deployment."""

    node_id: str
    queued: float = 0.0
    at_replicas: float = 0.0


@dataclass(frozen=True)
class FakeDeployment:
    application: str
    name: str
    max_ongoing_requests: int = 5
    status: str = "HEALTHY"
    replicas: tuple[FakeReplica, ...] = ()
    routers: tuple[FakeRouter, ...] = ()


@dataclass
class FakeServe:
    """The Serve instance of a simulated Ray cluster; thread-safe setters."""

    deployments: list[FakeDeployment] = field(default_factory=list)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # node id -> port
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set_deployments(self, deployments: Sequence[FakeDeployment]) -> None:
        with self.lock:
            self.deployments = list(deployments)

    def set_metrics_port(self, node_id: str, port: int) -> None:
        with self.lock:
            self.metrics_ports[node_id] = port

    def snapshot(self) -> tuple[list[FakeDeployment], dict[str, int]]:
        with self.lock:
            return list(self.deployments), dict(self.metrics_ports)


# --------------------------------------------------------------------------- documents


def _replica_row(d: FakeDeployment, r: FakeReplica) -> dict[str, Any]:
    actor_id = _hex(f"actor/{d.application}/{d.name}/{r.replica_id}", 24) + "01000000"
    return {
        "node_id": r.node_id,
        "node_ip": r.node_ip,
        "node_instance_id": "",
        "actor_id": actor_id,
        "actor_name": f"SERVE_REPLICA::{d.application}#{d.name}#{r.replica_id}",
        "worker_id": _worker_id(d, r.replica_id),
        "log_file_path": f"/serve/replica_{d.application}_{d.name}_{r.replica_id}.log",
        "replica_id": r.replica_id,
        "state": r.state,
        "pid": r.pid,
        "start_time_s": 1796132446.8336241,
    }


def _worker_id(d: FakeDeployment, replica: str) -> str:
    return _hex(f"worker/{d.application}/{d.name}/{replica}", 56)


def _deployment_row(d: FakeDeployment) -> dict[str, Any]:
    return {
        "name": d.name,
        "status": d.status,
        "status_trigger": "CONFIG_UPDATE_COMPLETED",
        "message": "",
        "deployment_config": {
            "name": d.name,
            "num_replicas": len(d.replicas),
            "max_ongoing_requests": d.max_ongoing_requests,
            "max_queued_requests": -1,
            "user_config": None,
            "ray_actor_options": {"num_cpus": 0.5},
        },
        "target_num_replicas": len(d.replicas),
        "required_resources": {"CPU": 0.5},
        "replicas": [_replica_row(d, r) for r in d.replicas],
        "recent_dead_replicas": [],
    }


def serve_instance(deployments: Sequence[FakeDeployment]) -> dict[str, Any]:
    """`GET /api/serve/applications/`: an empty instance when there is no deployment,
    as Ray answers while Serve is not running."""
    applications: dict[str, dict[str, Any]] = {}
    for d in deployments:
        app = applications.setdefault(
            d.application,
            {
                "name": d.application,
                "route_prefix": f"/{d.application}",
                "docs_path": None,
                "status": "RUNNING",
                "message": "",
                "last_deployed_time_s": 1796132446.6898463,
                "deployed_app_config": None,
                "source": "imperative",
                "deployments": {},
                "external_scaler_enabled": False,
            },
        )
        app["deployments"][d.name] = _deployment_row(d)
    return {
        "controller_info": {"node_id": "", "actor_name": "SERVE_CONTROLLER_ACTOR"},
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": 8000},
        "grpc_options": {},
        "proxies": {},
        "applications": applications,
        "target_capacity": None,
        "target_groups": [],
    }


def node_detail(node_id: str, node_ip: str, metrics_port: int | None) -> dict[str, Any]:
    """`GET /nodes/<node_id>`: the raylet part the exporter reads; no port when None."""
    raylet: dict[str, Any] = {
        "nodeId": node_id,
        "nodeManagerAddress": node_ip,
        "nodeManagerPort": 38415,
        "state": "ALIVE",
    }
    if metrics_port is not None:
        raylet["metricsExportPort"] = metrics_port
    return {
        "result": True,
        "msg": "Node details fetched.",
        "data": {"detail": {"ip": node_ip, "raylet": raylet, "workers": []}},
    }


def _labels(base: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(base.items())) + "," + _SCOPE


# Ray 2.60's HELP texts of the families written (the capture's).
_HELP: Final = {
    "ray_serve_num_ongoing_http_requests": "The number of ongoing requests in this HTTP proxy.",
    "ray_serve_num_ongoing_requests_at_replicas": (
        "The current number of requests to this deployment that have been submitted to a replica."
    ),
    "ray_serve_deployment_queued_queries": (
        "The current number of queries to this deployment waiting to be assigned to a replica."
    ),
    "ray_serve_replica_processing_queries": "The current number of queries being processed.",
    "ray_serve_deployment_processing_latency_ms": "The latency for queries to be processed.",
}


def _head(name: str, kind: str = "gauge") -> list[str]:
    return [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} {kind}"]


def serve_exposition(node_id: str, node_ip: str, deployments: Sequence[FakeDeployment]) -> str:
    """The Serve part of one Ray node's `/metrics`, as Ray 2.60 writes it."""
    common = {"Component": "core_worker", "NodeAddress": node_ip, "SessionName": SESSION}
    common["Version"] = "2.60.0"
    proxy = {**common, "WorkerId": _hex(f"proxy/{node_id}", 56)}
    routers = [(d, r) for d in deployments for r in d.routers if r.node_id == node_id]
    http_total = sum(r.queued + r.at_replicas for _, r in routers)
    http = {**proxy, "node_id": node_id, "node_ip_address": node_ip}
    lines = _head("ray_serve_num_ongoing_http_requests")
    lines.append(f"ray_serve_num_ongoing_http_requests{{{_labels(http)}}} {float(http_total)}")
    for name, attr in (
        ("ray_serve_num_ongoing_requests_at_replicas", "at_replicas"),
        ("ray_serve_deployment_queued_queries", "queued"),
    ):
        lines += _head(name)
        for d, router in routers:
            labels = {**proxy, "actor_id": _hex(f"proxy-actor/{node_id}", 32)}
            labels |= {"application": d.application, "deployment": d.name, "handle": "wt7tt9ho"}
            lines.append(f"{name}{{{_labels(labels)}}} {float(getattr(router, attr))}")
    lines += _head("ray_serve_replica_processing_queries")
    lines += _head("ray_serve_deployment_processing_latency_ms", "histogram")
    for d in deployments:
        for replica in d.replicas:
            if replica.node_id == node_id:
                lines += _replica_lines(d, replica, common)
    return "\n".join(lines) + "\n"


def _replica_lines(d: FakeDeployment, r: FakeReplica, common: Mapping[str, str]) -> list[str]:
    labels = {**common, "WorkerId": _worker_id(d, r.replica_id)}
    labels |= {"application": d.application, "deployment": d.name, "replica": r.replica_id}
    lines = [f"ray_serve_replica_processing_queries{{{_labels(labels)}}} {float(r.ongoing)}"]
    for le in ("1.0", "500.0", "+Inf"):
        bucket = _labels({**labels, "le": le, "route": f"/{d.application}"})
        lines.append(f"ray_serve_deployment_processing_latency_ms_bucket{{{bucket}}} 0.0")
    return lines


# --------------------------------------------------------------------------- serving


def install(dashboard: FakeRayDashboard, serve: FakeServe) -> None:
    """Make `dashboard` answer Serve's applications and the nodes' detail from `serve`."""

    def applications(_path: str) -> bytes:
        deployments, _ = serve.snapshot()
        return json.dumps(serve_instance(deployments)).encode()

    def nodes(path: str) -> bytes | None:
        node_id = path[len(NODES_PREFIX) :]
        deployments, ports = serve.snapshot()
        ips = {r.node_id: r.node_ip for d in deployments for r in d.replicas}
        known = dashboard.node_ips()
        if node_id not in known:
            return None
        return json.dumps(
            node_detail(node_id, ips.get(node_id, known[node_id]), ports.get(node_id))
        ).encode()

    dashboard.set_route(APPLICATIONS_PATH, applications)
    dashboard.set_route(NODES_PREFIX, nodes)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.owner.answer(self)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: FakeRayMetrics) -> None:
        self.owner = owner
        super().__init__(address, _Handler)


class FakeRayMetrics:
    """One Ray node's metrics export port: `render()` gives the exposition to serve."""

    def __init__(self, render: Callable[[], str], host: str = "127.0.0.1") -> None:
        self.host = host
        self._render = render
        self._fault: MetricsFault = "ok"
        self._release = threading.Event()
        self._server: _Server | None = None
        self._port = 0
        # Requests answered, and whether any carried an Authorization header (none should:
        # the dashboard's token is not for this port).
        self.requests = 0
        self.saw_authorization = False

    @property
    def port(self) -> int:
        return self._port

    def start(self) -> FakeRayMetrics:
        self._release.clear()
        self._server = _Server((self.host, self._port), self)
        self._port = self._server.server_address[1]
        threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-ray-metrics-{self._port}",
            daemon=True,
        ).start()
        return self

    def stop(self) -> None:
        self._release.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def set_fault(self, fault: str) -> None:
        if fault not in METRICS_FAULTS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {METRICS_FAULTS}")
        refusing = fault == "refuse"
        if refusing and self._server is not None:
            self.stop()
        self._fault = fault  # type: ignore[assignment]
        if not refusing and self._server is None:
            self.start()  # the same port again

    def answer(self, handler: _Handler) -> None:
        self.requests += 1
        self.saw_authorization |= "Authorization" in handler.headers
        fault = self._fault
        if fault == "hang":
            self._release.wait(30.0)
            handler.close_connection = True
            return
        status, body = 200, self._render().encode()
        if fault == "http_500":
            status, body = 500, b"500 Internal Server Error"
        elif fault == "garbage":
            body = b"<html><body>502 Bad Gateway</body></html>\n"
        with contextlib.suppress(OSError):
            handler.send_response(status)
            handler.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
