"""A simulated Ray dashboard answering the state API, for the harness and tests.

It answers what the exporter reads, in the shapes Ray 2.60 answers them (the captures in
``tests/fixtures/ray/``; ``tests/integration/test_ray_real.py`` compares both field by
field against a live cluster):

* ``GET /api/v0/nodes``, ``/api/v0/actors``, ``/api/v0/placement_groups``: the list
  envelope, ``detail`` (without it only the non-detail columns), ``limit`` (above 10000 is
  a 400, as in Ray), ``filter_keys``/``filter_predicates``/``filter_values`` with ``=`` and
  ``!=`` on Ray's filterable columns (case-insensitive strings, as in Ray).
* ``GET /api/v0/jobs``: the same envelope, filters on ``job_id``, ``type``, ``status``,
  ``submission_id``; rows sorted by job id (``tests/fixtures/ray/vllm-0.32-ray/``).
  ``GET /api/jobs/``: the job API's plain list of the same rows, every column.
* ``GET /api/cluster_status``: ``loadMetricsReport`` with ``usage``, ``usageByNode``
  (keys camel-cased like the dashboard's), ``resourceDemand`` and ``pgDemand``, derived
  from the rows: ALIVE actors outside placement groups and placed bundles of CREATED
  groups use their node's resources (``set_node_usage`` overrides).

Optional token auth behaves like Ray 2.60's middleware: 401 without a token, 403 with a
wrong one (``Authorization: Bearer`` or ``X-Ray-Authorization``), both as plain text.

Faults, for every path or one (``set_fault(fault, path=...)``): ``refuse`` (the port is
closed), ``hang`` (no answer until ``hang_seconds``), ``stall`` (headers and half the
body, then nothing until ``hang_seconds``), ``http_500`` (aiohttp's bare
text/plain 500), ``result_false`` (500 with Ray's envelope and ``result: false``),
``garbage`` (200, not JSON), ``truncated`` (the body ends before its Content-Length),
``partial_failure`` (200 with ``partial_failure_warning`` and ``warnings`` set), ``huge``
(a 200 body just over 32 MiB, streamed), ``trickle`` (headers at once, then the body one
byte every ``trickle_interval`` seconds: every read returns in time, the whole never
does)::

    with FakeRayDashboard(token="s3cret") as dash:
        node = node_entry("10.0.0.5", gpus=2, is_head=True)
        dash.set_nodes([node])
        dash.set_actors([actor_entry("LLM", node_id=node["node_id"], pid=4242)])
        dash.set_fault("hang", path="/api/cluster_status")
"""

from __future__ import annotations

import collections
import contextlib
import copy
import hashlib
import http.server
import json
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal, get_args
from urllib.parse import parse_qs, urlsplit

from gpuledger.engines import DEFAULT_RAY_DRIVER

__all__ = [
    "FAULTS",
    "FakeRayDashboard",
    "Fault",
    "SeenRequest",
    "actor_entry",
    "job_entry",
    "node_entry",
    "placement_group_entry",
    "ray_id",
]

Fault = Literal[
    "ok",
    "refuse",
    "hang",
    "stall",
    "http_500",
    "result_false",
    "garbage",
    "truncated",
    "partial_failure",
    "huge",
    "trickle",
]
FAULTS: Final[tuple[str, ...]] = get_args(Fault)

NODES_PATH: Final = "/api/v0/nodes"
ACTORS_PATH: Final = "/api/v0/actors"
PLACEMENT_GROUPS_PATH: Final = "/api/v0/placement_groups"
JOBS_PATH: Final = "/api/v0/jobs"
JOB_API_PATH: Final = "/api/jobs"  # `/api/jobs/`: the trailing slash is stripped
CLUSTER_STATUS_PATH: Final = "/api/cluster_status"

# Ray 2.60's ListApiOptions default and RAY_MAX_LIMIT_FROM_API_SERVER.
DEFAULT_LIMIT: Final = 100
MAX_LIMIT: Final = 10000
JOB_ID: Final = "01000000"
HUGE_BYTES: Final = 33 * 1024 * 1024

# Column order and detail-only split of Ray 2.60's NodeState / ActorState /
# PlacementGroupState (ray.util.state.common), as the captures show them.
_NODE_COLUMNS: Final = (
    "node_id",
    "node_ip",
    "is_head_node",
    "state",
    "state_message",
    "node_name",
    "resources_total",
    "labels",
)
_NODE_DETAIL: Final = ("start_time_ms", "end_time_ms")
_ACTOR_COLUMNS: Final = (
    "actor_id",
    "class_name",
    "state",
    "job_id",
    "name",
    "node_id",
    "pid",
    "ray_namespace",
)
_ACTOR_DETAIL: Final = (
    "serialized_runtime_env",
    "required_resources",
    "death_cause",
    "is_detached",
    "placement_group_id",
    "repr_name",
    "num_restarts",
    "num_restarts_due_to_lineage_reconstruction",
    "num_restarts_due_to_node_preemption",
    "call_site",
    "label_selector",
    "fallback_strategy",
)
_PG_COLUMNS: Final = ("placement_group_id", "name", "creator_job_id", "state")
# JobState.list_columns(detail=False); with detail every column of the row.
_JOB_COLUMNS: Final = (
    "job_id",
    "submission_id",
    "entrypoint",
    "type",
    "status",
    "message",
    "error_type",
    "driver_info",
)
_PG_DETAIL: Final = ("bundles", "is_detached", "stats", "topology_strategy", "topology_assignments")

_FILTERABLE: Final[Mapping[str, frozenset[str]]] = {
    NODES_PATH: frozenset({"node_id", "node_ip", "is_head_node", "state", "node_name"}),
    ACTORS_PATH: frozenset(
        {
            "actor_id",
            "class_name",
            "state",
            "job_id",
            "name",
            "node_id",
            "pid",
            "ray_namespace",
            "placement_group_id",
            "repr_name",
        }
    ),
    PLACEMENT_GROUPS_PATH: frozenset(
        {"placement_group_id", "name", "creator_job_id", "state", "is_detached"}
    ),
    JOBS_PATH: frozenset({"job_id", "type", "status", "submission_id"}),
}

# Ray's texts, so tests see what an operator would.
_DATA_SOURCE_DOWN: Final = (
    "Failed to query the data source. It is either there's a network issue, or the source is down."
)
_PARTIAL_FAILURE: Final = (
    "The returned data may contain incomplete result. Failed to query data from raylet. "
    "Queried 2 raylet and 1 raylet failed to reply. It is due to (1) raylet is unexpectedly "
    "failed. (2) raylet is overloaded. (3) There's an unexpected network issue. Please check "
    "the raylet.out to find the root cause."
)
_HANG_POLL_SECONDS: Final = 0.05


# --------------------------------------------------------------------------- entries


def ray_id(
    kind: Literal["node", "actor", "placement_group"], seed: str, job_id: str = JOB_ID
) -> str:
    """A stable id of Ray's length for `kind`: same seed, same id (golden outputs)."""
    digest = hashlib.sha256(f"{kind}:{seed}".encode()).hexdigest()
    if kind == "node":
        return (digest + digest)[:56]  # NodeID: 28 bytes
    if kind == "actor":
        return digest[:24] + job_id  # ActorID: 12 unique bytes + job id
    return digest[:28] + job_id  # PlacementGroupID: 14 unique bytes + job id


def job_id_of(number: int) -> str:
    """Ray's job id for the n-th job of a cluster (1 -> 01000000): 4 bytes, little-endian."""
    return number.to_bytes(4, "little").hex()


def job_entry(
    job_id: str,
    *,
    driver_pid: int,
    driver_node_ip: str,
    entrypoint: str = DEFAULT_RAY_DRIVER,
    status: str = "RUNNING",
    start_time_ms: int = 1796132137248,
    padding: int = 124,
) -> dict[str, Any]:
    """An /api/jobs/ row of a driver job as Ray 2.60 sends it (the capture's column
    order). The entrypoint is the driver's command line: vLLM's setproctitle title
    followed by the empty arguments it pads argv with."""
    finished = status != "RUNNING"
    return {
        "type": "DRIVER",
        "job_id": job_id,
        "submission_id": None,
        "driver_info": {"id": job_id, "node_ip_address": driver_node_ip, "pid": str(driver_pid)},
        "status": status,
        "entrypoint": " ".join([entrypoint, *['""'] * padding]),
        "message": None,
        "error_type": None,
        "start_time": start_time_ms,
        "end_time": start_time_ms + 132213 if finished else 0,
        "metadata": {},
        "runtime_env": {},
        "driver_agent_http_address": None,
        "driver_node_id": None,
        "driver_exit_code": None,
    }


def node_entry(
    node_ip: str,
    *,
    gpus: float = 0.0,
    cpus: float = 2.0,
    is_head: bool = False,
    state: str = "ALIVE",
    node_id: str | None = None,
    node_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    memory_bytes: float = 17344478413.0,
    object_store_bytes: float = 7433347891.0,
    start_time_ms: int = 1795939526646,
) -> dict[str, Any]:
    """A /api/v0/nodes row (detail columns included) as Ray 2.60 sends it."""
    node_id = node_id or ray_id("node", node_ip)
    resources: dict[str, float] = {}
    if is_head:
        resources["node:__internal_head__"] = 1.0
    resources["CPU"] = float(cpus)
    resources[f"node:{node_ip}"] = 1.0
    if gpus:
        resources["GPU"] = float(gpus)  # Ray leaves GPU out on nodes without any
    resources["object_store_memory"] = object_store_bytes
    resources["memory"] = memory_bytes
    return {
        "node_id": node_id,
        "node_ip": node_ip,
        "is_head_node": is_head,
        "state": state,
        "state_message": None,
        "node_name": node_name or node_ip,
        "resources_total": resources,
        "labels": {"ray.io/node-id": node_id, **(labels or {})},
        "start_time_ms": start_time_ms,
        "end_time_ms": 0 if state == "ALIVE" else start_time_ms + 60_000,
    }


def _request(
    gpus: float, cpus: float, placement_group_id: str | None, bundle_index: int | None
) -> dict[str, float]:
    """required_resources as Ray records them, rewritten to bundle names inside a group."""
    plain = {k: v for k, v in (("CPU", float(cpus)), ("GPU", float(gpus))) if v}
    if placement_group_id is None:
        return plain
    out: dict[str, float] = {}
    for name, amount in plain.items():
        out[f"{name}_group_{placement_group_id}"] = amount
        if bundle_index is not None:
            out[f"{name}_group_{bundle_index}_{placement_group_id}"] = amount
    # Every bundle carries 1000 units of this marker; each task/actor in it takes 0.001.
    out[f"bundle_group_{placement_group_id}"] = 0.001
    if bundle_index is not None:
        out[f"bundle_group_{bundle_index}_{placement_group_id}"] = 0.001
    return out


def actor_entry(
    class_name: str,
    *,
    state: str = "ALIVE",
    node_id: str | None = None,
    pid: int = 0,
    num_gpus: float = 1.0,
    num_cpus: float = 0.0,
    name: str = "",
    actor_id: str | None = None,
    job_id: str = JOB_ID,
    placement_group_id: str | None = None,
    bundle_index: int | None = None,
    ray_namespace: str = "64d2d39c-0f21-4401-ba23-e326062c3856",
) -> dict[str, Any]:
    """A /api/v0/actors row (detail columns included) as Ray 2.60 sends it.

    `pid` is the PID in the worker's namespace; Ray sends 0 and a null node until the
    actor is placed.
    """
    actor_id = actor_id or ray_id("actor", f"{class_name}/{name}/{node_id}/{pid}")
    return {
        "actor_id": actor_id,
        "class_name": class_name,
        "state": state,
        "job_id": job_id,
        "name": name,
        "node_id": node_id,
        "pid": pid,
        "ray_namespace": ray_namespace,
        "serialized_runtime_env": "{}",
        "required_resources": _request(num_gpus, num_cpus, placement_group_id, bundle_index),
        "death_cause": None,
        "is_detached": False,
        "placement_group_id": placement_group_id,
        "repr_name": "",
        # int64 proto fields: JSON strings, as Ray's MessageToDict writes them.
        "num_restarts": "0",
        "num_restarts_due_to_lineage_reconstruction": "0",
        "num_restarts_due_to_node_preemption": "0",
        "call_site": None,
        "label_selector": {},
        "fallback_strategy": None,
    }


def placement_group_entry(
    name: str,
    bundles: Sequence[Mapping[str, float]],
    *,
    state: str = "PENDING",
    scheduling_state: str | None = None,
    node_ids: Sequence[str | None] | None = None,
    placement_group_id: str | None = None,
    creator_job_id: str = JOB_ID,
    is_detached: bool = False,
    created_ns: int = 1795939529358947745,
    scheduling_attempt: int = 1,
) -> dict[str, Any]:
    """A /api/v0/placement_groups row (detail columns included) as Ray 2.60 sends it.

    `scheduling_state` defaults to FINISHED for CREATED groups and QUEUED otherwise; pass
    NO_RESOURCES or INFEASIBLE for pending groups. `node_ids` places the bundles.
    """
    pg_id = placement_group_id or ray_id("placement_group", name)
    if scheduling_state is None:
        scheduling_state = "FINISHED" if state == "CREATED" else "QUEUED"
    placed = list(node_ids) if node_ids is not None else [None] * len(bundles)
    finished = scheduling_state == "FINISHED"
    return {
        "placement_group_id": pg_id,
        "name": name,
        "creator_job_id": creator_job_id,
        "state": state,
        "bundles": [
            {
                "bundle_id": {"placement_group_id": pg_id, "bundle_index": index},
                "unit_resources": {k: float(v) for k, v in resources.items()},
                "node_id": placed[index] or "",
                "label_selector": {},
            }
            for index, resources in enumerate(bundles)
        ],
        "is_detached": is_detached,
        "stats": {
            "creation_request_received_ns": str(created_ns),
            "scheduling_started_time_ns": str(created_ns + 156706),
            "scheduling_attempt": scheduling_attempt,
            "scheduling_state": scheduling_state,
            "scheduling_latency_us": "1363" if finished else "0",
            "end_to_end_creation_latency_us": "1389" if finished else "0",
            "highest_retry_delay_ms": 0.0,
        },
        "topology_strategy": {},
        "topology_assignments": {},
    }


# --------------------------------------------------------------------------- responses


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def google_style(value: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's to_google_style: dict keys camel-cased, dicts inside lists too,
    but not dicts inside lists inside lists (so resourceDemand keeps snake_case)."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            out[_camel(key)] = google_style(item)
        elif isinstance(item, list):
            out[_camel(key)] = [google_style(x) if isinstance(x, dict) else x for x in item]
        else:
            out[_camel(key)] = item
    return out


def _envelope(result: bool, msg: str, data: Mapping[str, Any]) -> bytes:
    return json.dumps({"result": result, "msg": msg, "data": dict(data)}).encode()


def _freq(items: Sequence[Any]) -> list[list[Any]]:
    """[[item, count], ...] in first-seen order, as Ray's freq_of_dicts."""
    seen: list[list[Any]] = []
    for item in items:
        for entry in seen:
            if entry[0] == item:
                entry[1] += 1
                break
        else:
            seen.append([item, 1])
    return seen


@dataclass(frozen=True)
class SeenRequest:
    """One request the fake answered; no header values are kept."""

    path: str
    query: Mapping[str, list[str]]
    had_authorization: bool


class _ApiError(Exception):
    def __init__(self, status: int, msg: str) -> None:
        super().__init__(msg)
        self.status = status
        self.msg = msg


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], dashboard: FakeRayDashboard) -> None:
        self.dashboard = dashboard
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        # As aiohttp does: headers and body go out as separate writes, and with Nagle on, a
        # kept-alive client's delayed ACK would add ~40 ms to every answer.
        with contextlib.suppress(OSError):
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Close kept-alive connections too, so a closed port really refuses."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read results, not access logs

    def do_GET(self) -> None:
        self.server.dashboard._handle(self)


class FakeRayDashboard:
    """The dashboard on 127.0.0.1 (an ephemeral port unless given). Thread-safe setters."""

    def __init__(self, token: str | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._port = port
        self._token = token
        self._lock = threading.Lock()
        self._nodes: list[dict[str, Any]] = []
        self._actors: list[dict[str, Any]] = []
        self._groups: list[dict[str, Any]] = []
        self._jobs: list[dict[str, Any]] = []
        self._usage_overrides: dict[str, dict[str, float]] = {}
        self._routes: dict[str, Callable[[str], bytes | None]] = {}
        self._faults: dict[str | None, Fault] = {}
        self._release = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.hang_seconds = 30.0
        self.trickle_interval = 0.05
        # The latest requests, for tests; bounded so a long `simulate` run stays small.
        self.requests_seen: collections.deque[SeenRequest] = collections.deque(maxlen=1000)

    # ---- lifecycle

    def start(self) -> FakeRayDashboard:
        self._release.clear()
        self._serve()
        return self

    def stop(self) -> None:
        self._release.set()  # hanging handlers return at once
        self._close_server()

    def __enter__(self) -> FakeRayDashboard:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    def _serve(self) -> None:
        server = _Server((self.host, self._port), self)
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-ray-{self._port}",
            daemon=True,
        )
        self._thread.start()

    def _close_server(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
            server.drop_connections()
        if thread is not None:
            thread.join(timeout=5)

    # ---- state

    def set_nodes(self, nodes: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            self._nodes = [copy.deepcopy(dict(n)) for n in nodes]

    def set_actors(self, actors: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            self._actors = [copy.deepcopy(dict(a)) for a in actors]

    def set_placement_groups(self, groups: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            self._groups = [copy.deepcopy(dict(g)) for g in groups]

    def set_jobs(self, jobs: Sequence[Mapping[str, Any]]) -> None:
        """Job rows in the /api/jobs/ form (job_entry); /api/v0/jobs shows their columns."""
        with self._lock:
            self._jobs = [copy.deepcopy(dict(j)) for j in jobs]

    def set_node_usage(self, node_id: str, used: Mapping[str, float] | None) -> None:
        """Override the used amounts cluster_status reports for a node (None: derive)."""
        with self._lock:
            if used is None:
                self._usage_overrides.pop(node_id, None)
            else:
                self._usage_overrides[node_id] = dict(used)

    def set_route(self, prefix: str, answer: Callable[[str], bytes | None] | None) -> None:
        """Answer the path `prefix` (or, ending in /, the paths under it) with `answer(path)`,
        None being a 404: more of the dashboard, such as sim/fake_serve.py's Serve paths.
        Token auth and faults apply as to every path; None removes the route."""
        with self._lock:
            if answer is None:
                self._routes.pop(prefix, None)
            else:
                self._routes[prefix] = answer

    def node_ips(self) -> dict[str, str]:
        """Node id -> node IP of the nodes set."""
        with self._lock:
            return {n["node_id"]: n["node_ip"] for n in self._nodes}

    def set_token(self, token: str | None) -> None:
        with self._lock:
            self._token = token

    def set_fault(self, fault: Fault, path: str | None = None) -> None:
        """Make every path (or only `path`) misbehave; "ok" clears it."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {FAULTS}")
        with self._lock:
            if fault == "ok":
                self._faults.pop(path, None)
            else:
                self._faults[path] = fault
            refusing = "refuse" in self._faults.values()
        # `refuse` closes the port for real, so clients see ECONNREFUSED; clearing it
        # binds the same port again.
        if refusing and self._server is not None:
            self._close_server()
        elif not refusing and self._server is None and not self._release.is_set():
            self._serve()

    # ---- serving

    def _fault_for(self, path: str) -> Fault:
        with self._lock:
            return self._faults.get(path) or self._faults.get(None) or "ok"

    def _handle(self, handler: _Handler) -> None:
        parts = urlsplit(handler.path)
        path = parts.path.rstrip("/") or "/"
        query = parse_qs(parts.query, keep_blank_values=True)
        headers = handler.headers
        auth = headers.get("Authorization") or headers.get("X-Ray-Authorization") or ""
        with self._lock:
            token = self._token
            self.requests_seen.append(SeenRequest(path, query, bool(auth)))
        fault = self._fault_for(path)
        if fault == "hang":
            self._release.wait(self.hang_seconds)
            handler.close_connection = True
            return
        if token is not None:
            if not auth:
                self._reply(handler, 401, b"Unauthorized: Missing authentication token", "text")
                return
            if auth != f"Bearer {token}":
                self._reply(handler, 403, b"Forbidden: Invalid authentication token", "text")
                return
        if fault == "http_500":
            self._reply(
                handler, 500, b"500 Internal Server Error\n\nServer got itself in trouble", "text"
            )
            return
        if fault == "result_false":
            self._reply(handler, 500, _envelope(False, _DATA_SOURCE_DOWN, {"result": None}))
            return
        if fault == "garbage":
            self._reply(handler, 200, b"<html><body>502 Bad Gateway</body></html>")
            return
        if fault == "huge":
            self._stream_huge(handler)
            return
        try:
            answer = self._answer(path, query, partial=fault == "partial_failure")
        except _ApiError as exc:
            self._reply(handler, exc.status, _envelope(False, exc.msg, {"result": None}))
            return
        if answer is None:
            self._reply(handler, 404, b"404: Not Found", "text")
            return
        if fault in ("truncated", "stall"):
            self._reply_partly(handler, answer, stall=fault == "stall")
            return
        if fault == "trickle":
            self._trickle(handler, answer)
            return
        self._reply(handler, 200, answer)

    def _reply(
        self, handler: _Handler, status: int, body: bytes, kind: Literal["json", "text"] = "json"
    ) -> None:
        content_type = "application/json" if kind == "json" else "text/plain"
        with contextlib.suppress(OSError):  # the client may have given up already
            handler.send_response(status)
            handler.send_header("Content-Type", f"{content_type}; charset=utf-8")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)

    def _reply_partly(self, handler: _Handler, body: bytes, stall: bool) -> None:
        """Half the declared body, then close (truncated) or go quiet (stall)."""
        handler.close_connection = True
        with contextlib.suppress(OSError):
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json; charset=utf-8")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body[: len(body) // 2])
            handler.wfile.flush()
            if stall:
                self._release.wait(self.hang_seconds)
            handler.connection.shutdown(socket.SHUT_RDWR)

    def _trickle(self, handler: _Handler, body: bytes) -> None:
        """The whole body, declared up front, one byte at a time (a server dripping bytes)."""
        handler.close_connection = True
        with contextlib.suppress(OSError):
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json; charset=utf-8")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.flush()
            for i in range(len(body)):
                if self._release.wait(self.trickle_interval):
                    return
                handler.wfile.write(body[i : i + 1])
                handler.wfile.flush()

    def _stream_huge(self, handler: _Handler) -> None:
        # Valid JSON, just too big; no Content-Length so only the streamed cap catches it.
        handler.close_connection = True
        chunk = b"x" * (1024 * 1024)
        with contextlib.suppress(OSError):
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json; charset=utf-8")
            handler.send_header("Connection", "close")
            handler.end_headers()
            handler.wfile.write(b'{"result": true, "msg": "", "data": {"padding": "')
            for _ in range(HUGE_BYTES // len(chunk)):
                if self._release.is_set():
                    return
                handler.wfile.write(chunk)
            handler.wfile.write(b'"}}')

    def _answer(self, path: str, query: Mapping[str, list[str]], partial: bool) -> bytes | None:
        with self._lock:
            routes = dict(self._routes)
        for prefix, answer in routes.items():
            if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
                return answer(path)
        # The rows as set: the setters copy them in and replace the lists whole, and no
        # answer changes a row, so a request reads them without copying (deep-copying
        # every actor on every request was 1-2 s an answer at 64x the dense node: the
        # simulator, not the exporter, missed the deadline).
        with self._lock:
            nodes, actors, groups = self._nodes, self._actors, self._groups
            jobs = sorted(self._jobs, key=lambda j: str(j.get("job_id") or ""))
            overrides = {k: dict(v) for k, v in self._usage_overrides.items()}
        if path == CLUSTER_STATUS_PATH:
            return self._cluster_status(nodes, actors, groups, overrides)
        if path == JOB_API_PATH:
            return json.dumps(jobs).encode()
        # Detail shows a job's every column (JobDetails'), in the row's own order.
        job_detail = tuple(k for j in jobs[:1] for k in j if k not in _JOB_COLUMNS)
        tables: dict[str, tuple[list[dict[str, Any]], tuple[str, ...], tuple[str, ...]]] = {
            NODES_PATH: (nodes, _NODE_COLUMNS, _NODE_DETAIL),
            ACTORS_PATH: (actors, _ACTOR_COLUMNS, _ACTOR_DETAIL),
            PLACEMENT_GROUPS_PATH: (groups, _PG_COLUMNS, _PG_DETAIL),
            JOBS_PATH: (jobs, _JOB_COLUMNS, job_detail),
        }
        if path not in tables:
            return None
        rows, columns, detail_columns = tables[path]
        limit = _limit(query)
        detail = _flag(query.get("detail", ["false"])[-1])
        filters = _filters(query, path)
        filtered = [row for row in rows if _matches(row, filters)]
        shown = columns + detail_columns if detail else columns
        result = [{k: row[k] for k in shown if k in row} for row in filtered[:limit]]
        listing = {
            "total": len(rows),
            "num_after_truncation": len(rows),
            "num_filtered": len(filtered),
            "result": result,
            "partial_failure_warning": _PARTIAL_FAILURE if partial else "",
            "warnings": ["Some raylets did not answer within the timeout."] if partial else None,
        }
        return _envelope(True, "", {"result": listing})

    def _cluster_status(
        self,
        nodes: list[dict[str, Any]],
        actors: list[dict[str, Any]],
        groups: list[dict[str, Any]],
        overrides: Mapping[str, Mapping[str, float]],
    ) -> bytes:
        cluster, by_node = _usage(nodes, _used(nodes, actors, groups), overrides)
        pending_actors = [
            a.get("required_resources") or {}
            for a in actors
            if a.get("state") in ("PENDING_CREATION", "RESTARTING")
        ]
        pending_groups = [
            {
                "bundles": _freq([b.get("unit_resources") or {} for b in g.get("bundles") or []]),
                "strategy": "PACK",
            }
            for g in groups
            if g.get("state") in ("PENDING", "RESCHEDULING")
        ]
        report = {
            "usage": cluster,
            "resource_demand": _freq(pending_actors),
            "pg_demand": _freq(pending_groups),
            "request_demand": [],
            "node_types": _freq([dict(n["resources_total"]) for n in nodes]),
            "head_ip": None,
            "usage_by_node": by_node,
            "node_type_mapping": None,
            "idle_time_map": None,
        }
        status = {
            "gcs_request_time": 0.005,
            "time": 1795939532.4922726,
            "monitor_pid": 12039,
            "autoscaler_update_time": 0.003,
            "autoscaler_report": {
                "active_nodes": {f"node_{n['node_id']}": 1 for n in nodes},
                "idle_nodes": None,
                "pending_nodes": [],
                "pending_launches": {},
                "failed_nodes": [],
                "node_availability_summary": {"node_availabilities": {}},
                "node_activities": None,
                "pending_resources": {},
                "node_type_mapping": {n["node_id"]: f"node_{n['node_id']}" for n in nodes},
                "legacy": True,
            },
            "non_terminated_nodes_time": 1.2e-05,
            "load_metrics_report": report,
        }
        data = google_style(
            {
                "autoscaling_status": f"Cluster status: {len(nodes)} nodes",
                "autoscaling_error": None,
                "cluster_status": status,
            }
        )
        return _envelope(True, "Got cluster status.", data)


def _used(
    nodes: list[dict[str, Any]], actors: list[dict[str, Any]], groups: list[dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """Node id -> resources held by live actors outside groups and by created groups."""
    used: dict[str, dict[str, float]] = {n["node_id"]: {} for n in nodes}

    def take(node_id: str | None, resources: Mapping[str, float]) -> None:
        if node_id in used:
            for name, amount in resources.items():
                used[node_id][name] = used[node_id].get(name, 0.0) + amount

    for actor in actors:
        if actor.get("state") == "ALIVE" and not actor.get("placement_group_id"):
            take(actor.get("node_id"), actor.get("required_resources") or {})
    for group in groups:
        if group.get("state") == "CREATED":
            for bundle in group.get("bundles") or []:
                take(bundle.get("node_id"), bundle.get("unit_resources") or {})
    return used


def _usage(
    nodes: list[dict[str, Any]],
    used: Mapping[str, Mapping[str, float]],
    overrides: Mapping[str, Mapping[str, float]],
) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    """(cluster totals, per live node) of [used, total] for every resource."""
    by_node: dict[str, dict[str, list[float]]] = {}
    cluster: dict[str, list[float]] = {}
    for node in nodes:
        if node.get("state") != "ALIVE":
            continue
        node_used = dict(used[node["node_id"]], **overrides.get(node["node_id"], {}))
        per_node: dict[str, list[float]] = {}
        for name, total in node["resources_total"].items():
            # google_style() camel-cases these names, as the dashboard does.
            pair = [min(total, node_used.get(name, 0.0)), total]
            per_node[name] = pair
            seen = cluster.setdefault(name, [0.0, 0.0])
            seen[0] += pair[0]
            seen[1] += pair[1]
        by_node[node["node_id"]] = per_node
    return cluster, by_node


# --------------------------------------------------------------------------- query


def _flag(value: str) -> bool:
    return value.lower() in ("true", "1")


def _limit(query: Mapping[str, list[str]]) -> int:
    raw = query.get("limit", [str(DEFAULT_LIMIT)])[-1]
    try:
        limit = int(raw)
    except ValueError:
        raise _ApiError(400, f"invalid literal for int() with base 10: {raw!r}") from None
    if limit > MAX_LIMIT:
        raise _ApiError(
            400,
            f"Given limit {limit} exceeds the supported limit {MAX_LIMIT}. Use a lower "
            "limit, or set the `RAY_MAX_LIMIT_FROM_API_SERVER` environment variable to a "
            "larger value.",
        )
    return limit


def _filters(query: Mapping[str, list[str]], path: str) -> list[tuple[str, str, str]]:
    keys = query.get("filter_keys", [])
    predicates = query.get("filter_predicates", [])
    values = query.get("filter_values", [])
    filterable = _FILTERABLE[path]
    out = []
    for key, predicate, value in zip(keys, predicates, values, strict=False):
        column = key.lower()
        if column not in filterable:
            raise _ApiError(
                400,
                f"The given filter column {column} is not supported. Enter filters with "
                f"\u2013-filter key=value or \u2013-filter key!=value Supported filter "
                f"columns: {set(filterable)}",
            )
        if predicate not in ("=", "!="):
            raise _ApiError(
                400,
                f"Unsupported filter predicate {predicate} is given. Available predicates: =, !=.",
            )
        out.append((column, predicate, value))
    return out


def _equal(actual: Any, wanted: str) -> bool:
    # Ray compares strings case-insensitively and converts the filter value to the
    # column's type for ints and bools.
    if isinstance(actual, bool):
        return actual == _flag(wanted)
    if isinstance(actual, int):
        try:
            return actual == int(wanted)
        except ValueError:
            return False
    if isinstance(actual, str):
        return actual.lower() == wanted.lower()
    return False


def _matches(row: Mapping[str, Any], filters: Sequence[tuple[str, str, str]]) -> bool:
    for column, predicate, value in filters:
        if column not in row:
            return False
        equal = _equal(row[column], value)
        if equal != (predicate == "="):
            return False
    return True
