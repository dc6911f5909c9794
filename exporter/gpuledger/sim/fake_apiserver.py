"""A Kubernetes API server for pods, on loopback, that the real `kubernetes` client talks to.

Only what an informer needs, with the real wire behaviour:

* `GET /api/v1/pods` (and `/api/v1/namespaces/<ns>/pods`): a `PodList` with
  `metadata.resourceVersion`; `fieldSelector` (`spec.nodeName`, `status.phase`,
  `status.podIP`, `metadata.name`, `metadata.namespace`; `=`, `==`, `!=`; others are 400 as
  on a real server); `limit`/`continue` paging over a consistent snapshot, `410 Expired` for a
  continue token older than `expire_history()`. Lists always answer the current state
  (any `resourceVersion` asked for is at most that old); `labelSelector` (`=`, `==`,
  `!=`, `key`, `!key`, `in`, `notin`).
* `?watch=true`: a chunked stream of JSON lines `{"type": ..., "object": ...}` from
  `resourceVersion` (unset or "0": synthetic ADDED for current objects first),
  honouring `timeoutSeconds` and `allowWatchBookmarks` (a BOOKMARK every
  `bookmark_interval` seconds). An object that stops matching the field selector arrives
  as DELETED, one that starts matching as ADDED, as with the real watch cache. A watch
  from a resourceVersion older than the kept history gets `ERROR` with a `410` Status
  inside a 200 stream, as the real server sends it.
* `GET /api/v1/namespaces/<ns>/pods/[https:]<name>:<port>/proxy/<path>`: the pods/proxy
  subresource, forwarding a GET to the pod's `status.podIP` and port (a number or a
  container port's name) through HttpClient (`proxy_deadline`, `proxy_max_bytes`), the
  caller's headers not forwarded (the real server strips the Authorization header too);
  with the `https:` prefix over TLS, the pod's certificate not verified (kube-apiserver's
  proxy transport skips verification: pods are addressed by IP); `404` for an unknown pod,
  `503` with a Status for a pod without an IP or one that cannot be read (a TLS pod asked
  without the prefix, a plain one with it); counted in `requests["proxy"]`.
* `GET /apis/resource.k8s.io/v1/resourceslices` and `.../resourceclaims`
  (`set_dra_objects`): a `ResourceSliceList`/`ResourceClaimList` of the
  `resource.k8s.io/v1` API (Kubernetes 1.34), `fieldSelector=spec.nodeName=<node>` for
  slices, no paging; `404` while no objects were set, as a server without DRA answers.
* `GET /apis/inference.networking.k8s.io/v1/inferencepools` (and
  `.../namespaces/<ns>/inferencepools[/<name>]`; `set_inference_pools`): an
  `InferencePoolList` of the Gateway API Inference Extension's v1 API, with
  `limit`/`continue` paging as pods have; `404` while none were set, as a cluster without
  the CRD answers (and for watches, which the fake does not serve).
* `GET /api/v1/namespaces/<ns>/services/<name>` (and the namespace's list; `set_services`):
  a Service, `404` with a Status for an unknown one.
* faults (`set_fault`): `refuse` (listening socket closed, connections cut), `http_500`,
  `forbidden` (403), `unauthorized` (401), `hang` (requests and open watches stall until
  the fault is cleared), `garbage` (200 with an HTML page instead of JSON), `truncated`
  (a Content-Length, half the body, then the connection closes), `huge` (200 streaming a
  list body of `huge_bytes`, 65 MiB by default); the last three also end open watches.
  `set_delay` slows every answer.
* in-cluster wiring (`tls=`, `token=`, `service_account()`): HTTPS with a certificate
  the client must verify, and `401` unless `Authorization: Bearer <token>` is sent, so
  the client's in-cluster loader (service host/port, token and CA files) is tested
  end to end.

Resource versions are one global counter, as etcd's are: `expire_history()` moves it on
(writes to other kinds would) and forgets every older version.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import copy
import hmac
import ipaddress
import json
import re
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import parse_qs, urlsplit

import kubernetes.client
import yaml

from gpuledger.net.httpclient import HttpClient, HttpError

__all__ = [
    "FakeApiServer",
    "Fault",
    "make_agent_pod",
    "make_pod",
    "pod_scheduled_false",
    "self_signed_certificate",
]

Fault = Literal[
    "ok", "refuse", "http_500", "forbidden", "unauthorized", "hang", "garbage", "truncated", "huge"
]
_FAULTS: tuple[str, ...] = get_args(Fault)
# Faults that replace the body of every answer (and end open watches).
_BODY_FAULTS = ("garbage", "truncated", "huge")
HUGE_BYTES = 65 * 1024 * 1024
_FAULT_STATUS = {
    "http_500": (500, "InternalError", "Internal error occurred: etcdserver: request timed out"),
    "forbidden": (
        403,
        "Forbidden",
        'pods is forbidden: User "system:serviceaccount:gpuledger:gpuledger" cannot list '
        'resource "pods" in API group "" at the cluster scope',
    ),
    "unauthorized": (401, "Unauthorized", "Unauthorized"),
}
_FIELDS = {
    "spec.nodeName": ("spec", "nodeName"),
    "status.phase": ("status", "phase"),
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "status.podIP": ("status", "podIP"),  # explain finds a Ray node's pod by its IP
}
_OWNER_API = {
    "ReplicaSet": "apps/v1",
    "StatefulSet": "apps/v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "RayCluster": "ray.io/v1",
    "Node": "v1",
}


# Dynamic Resource Allocation, GA in Kubernetes 1.34.
DRA_API = "/apis/resource.k8s.io/v1"
# Gateway API Inference Extension: InferencePool v1 (GIE v1.0.0 and later).
GATEWAY_API = "/apis/inference.networking.k8s.io/v1"
_POOLS = re.compile(r"^(?:/namespaces/([^/]+))?/inferencepools(?:/([^/]+))?$")
_SERVICES = re.compile(r"^/api/v1/namespaces/([^/]+)/services(?:/([^/]+))?$")


def _now_rfc3339(at: float | None = None) -> str:
    moment = datetime.fromtimestamp(time.time() if at is None else at, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _bearer_matches(header: str, token: str) -> bool:
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), token)


def self_signed_certificate(directory: str | Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (and its key) in `directory`, for `tls=`.
    Needs `cryptography`: a test dependency, imported here so the exporter never does."""
    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-apiserver")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = target / "apiserver.crt", target / "apiserver.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def pod_scheduled_false(reason: str, message: str, since: float | None = None) -> dict[str, Any]:
    """A `PodScheduled=False` condition as the scheduler writes it."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "lastProbeTime": None,
        "lastTransitionTime": _now_rfc3339(since),
        "reason": reason,
        "message": message,
    }


_SERVING_IMAGE = "registry.example/serving:1.0"
_RUNNING_CONDITIONS = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
)


def make_pod(
    namespace: str,
    name: str,
    *,
    uid: str | None = None,
    node: str | None = None,
    phase: str = "Running",
    labels: Mapping[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    containers: Sequence[tuple[str, int, str | None]] = (("main", 0, None),),
    conditions: Sequence[Mapping[str, Any]] | None = None,
    init_containers: Sequence[tuple[str, int, str | None]] = (),
    pod_ip: str | None = None,
    scheduling_gates: Sequence[str] = (),
    deleting: bool = False,
    gpu_resource: str = "nvidia.com/gpu",
    annotations: Mapping[str, str] | None = None,
    container_resources: Mapping[str, str] | None = None,
    ports: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A Pod object as the API server returns it.

    `owner` is `(kind, name)`; `containers` and `init_containers` are
    `(name, gpu_limit, container_id)` with the id as the kubelet reports it
    (`containerd://<64 hex>`) or None while not started. Without `conditions`, a pod with
    a node gets the Running set (PodScheduled, Initialized, ContainersReady, Ready) and
    one without gets none (the scheduler has not looked yet): pass
    `pod_scheduled_false(...)` for an unplaced pod. `ports` (name -> number) are the
    first container's named ports.
    """
    uid = uid or str(uuid.uuid4())
    created = _now_rfc3339()
    if conditions is None:
        running = node is not None and phase == "Running"
        conditions = _true_conditions(created) if running else []
    metadata = _pod_metadata(
        namespace,
        name,
        uid,
        created=created,
        labels=labels,
        annotations=annotations,
        owner=owner,
        deleting=deleting,
    )

    def specs(entries: Sequence[tuple[str, int, str | None]]) -> list[dict[str, Any]]:
        return _container_specs(entries, gpu_resource, container_resources or {})

    spec: dict[str, Any] = {
        "containers": specs(containers),
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}
        ],
    }
    if init_containers:
        spec["initContainers"] = specs(init_containers)
    if ports:
        spec["containers"][0]["ports"] = [
            {"name": port_name, "containerPort": number, "protocol": "TCP"}
            for port_name, number in ports.items()
        ]
    if node is not None:
        spec["nodeName"] = node
    if scheduling_gates:
        spec["schedulingGates"] = [{"name": gate} for gate in scheduling_gates]
    status: dict[str, Any] = {"phase": phase, "conditions": [dict(c) for c in conditions]}
    if node is not None:
        status |= _placed_status(created, containers, init_containers, pod_ip)
    return {"kind": "Pod", "apiVersion": "v1", "metadata": metadata, "spec": spec, "status": status}


def _true_conditions(created: str) -> list[dict[str, Any]]:
    return [
        {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": created}
        for kind in _RUNNING_CONDITIONS
    ]


def _pod_metadata(
    namespace: str,
    name: str,
    uid: str,
    *,
    created: str,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    owner: tuple[str, str] | None,
    deleting: bool,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": "0",
        "creationTimestamp": created,
        "labels": dict(labels or {}),
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    if owner is not None:
        kind, owner_name = owner
        metadata["ownerReferences"] = [
            {
                "apiVersion": _OWNER_API.get(kind, "example.com/v1"),
                "kind": kind,
                "name": owner_name,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{kind}/{owner_name}")),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    if deleting:
        metadata["deletionTimestamp"] = created
        metadata["deletionGracePeriodSeconds"] = 30
    return metadata


def _container_specs(
    entries: Sequence[tuple[str, int, str | None]],
    gpu_resource: str,
    container_resources: Mapping[str, str],
) -> list[dict[str, Any]]:
    out = []
    for cname, gpus, _ in entries:
        resources: dict[str, Any] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
        # A container may name its own, e.g. nvidia.com/mig-1g.10gb (MIG, mixed strategy).
        resource = container_resources.get(cname, gpu_resource)
        if gpus:
            resources["limits"] = {resource: str(gpus)}
            resources["requests"][resource] = str(gpus)
        out.append(
            {
                "name": cname,
                "image": _SERVING_IMAGE,
                "resources": resources,
                "terminationMessagePath": "/dev/termination-log",
                "imagePullPolicy": "IfNotPresent",
            }
        )
    return out


def _placed_status(
    created: str,
    containers: Sequence[tuple[str, int, str | None]],
    init_containers: Sequence[tuple[str, int, str | None]],
    pod_ip: str | None,
) -> dict[str, Any]:
    """The status fields the kubelet adds once a pod is on a node."""
    status: dict[str, Any] = {
        "hostIP": "10.0.0.10",
        "startTime": created,
        "qosClass": "Burstable",
        "containerStatuses": _container_statuses(containers, created),
    }
    if init_containers:
        status["initContainerStatuses"] = _container_statuses(init_containers, created)
    if pod_ip is not None:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    return status


def _container_statuses(
    entries: Sequence[tuple[str, int, str | None]], created: str
) -> list[dict[str, Any]]:
    out = []
    for cname, _, cid in entries:
        status: dict[str, Any] = {
            "name": cname,
            "image": _SERVING_IMAGE,
            "imageID": "",
            "ready": cid is not None,
            "restartCount": 0,
            "started": cid is not None,
            "state": {"running": {"startedAt": created}}
            if cid is not None
            else {"waiting": {"reason": "ContainerCreating"}},
        }
        if cid is not None:
            status["containerID"] = cid
        out.append(status)
    return out


def make_agent_pod(
    namespace: str,
    name: str,
    *,
    component: str,
    port: int,
    node: str | None = None,
    pod_ip: str | None = "127.0.0.1",
) -> dict[str, Any]:
    """A gpuledger pod as the Helm chart makes it: its labels (helm/gpuledger/templates/
    _helpers.tpl), `component` "node" (the DaemonSet, on `node`) or "cluster", and the
    exporter's port named `metrics`."""
    labels = {
        "app.kubernetes.io/name": "gpuledger",
        "app.kubernetes.io/instance": "gpuledger",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "gpuledger",
        "app.kubernetes.io/managed-by": "Helm",
        "gpuledger.io/job": f"gpuledger-{component}",
    }
    owner = ("DaemonSet", "gpuledger-node") if component == "node" else None
    return make_pod(
        namespace,
        name,
        node=node if component == "node" else node or "cpu-node-1",
        labels=labels,
        owner=owner,
        containers=(("gpuledger", 0, "containerd://" + "a" * 64),),
        pod_ip=pod_ip,
        ports={"metrics": port},
    )


# --- field and label selectors ---

# One requirement of a selector: does this pod meet it?
_Requirement = Callable[[Mapping[str, Any]], bool]


class _BadSelector(ValueError):
    pass


def _field_requirement(path: tuple[str, str], equal: bool, value: str) -> _Requirement:
    section, field = path
    return lambda pod: (str((pod.get(section) or {}).get(field) or "") == value) == equal


def _parse_selector(text: str) -> list[_Requirement]:
    requirements: list[_Requirement] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "!=" in part:
            key, value = part.split("!=", 1)
            equal = False
        elif "==" in part:
            key, value = part.split("==", 1)
            equal = True
        elif "=" in part:
            key, value = part.split("=", 1)
            equal = True
        else:
            raise _BadSelector(f"invalid selector: '{part}'; can't understand '{part}'")
        path = _FIELDS.get(key.strip())
        if path is None:
            raise _BadSelector(f"field label not supported: {key.strip()}")
        requirements.append(_field_requirement(path, equal, value.strip()))
    return requirements


_SET_BASED = re.compile(r"^([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")


def _split_labels(text: str) -> list[str]:
    """Requirements are comma-separated, but `k in (a,b)` has commas of its own."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return [p for p in parts if p]


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _label_requirement(part: str) -> _Requirement:
    """`k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, as the API
    server's label selector grammar has them."""
    if match := _SET_BASED.match(part):
        key, op, listed = match.groups()
        values = {v.strip() for v in listed.split(",") if v.strip()}
        return lambda pod: (_labels(pod).get(key) in values) == (op == "in")
    op = next((o for o in ("!=", "==", "=") if o in part), None)
    key, value = (x.strip() for x in part.split(op, 1)) if op else (part, "")
    negated = op == "!=" or (op is None and key.startswith("!"))
    key = key.removeprefix("!").strip() if op is None else key
    if not _LABEL_KEY.match(key):
        raise _BadSelector(f"unable to parse requirement: {part!r}")
    if op is None:
        return lambda pod: (key in _labels(pod)) != negated
    return lambda pod: (_labels(pod).get(key) == value) != negated


def _parse_label_selector(text: str) -> list[_Requirement]:
    return [_label_requirement(part) for part in _split_labels(text)]


def _matches(pod: Mapping[str, Any] | None, requirements: Sequence[_Requirement]) -> bool:
    return pod is not None and all(meets(pod) for meets in requirements)


# --- server state ---


@dataclass(frozen=True)
class _Change:
    rv: int
    kind: str  # ADDED | MODIFIED | DELETED
    old: dict[str, Any] | None
    new: dict[str, Any] | None  # for DELETED: the final object, at the deletion's rv


class _Closed(Exception):
    """The server stopped or a fault cut the connection."""


class FakeApiServer:
    """Pods, their history and faults behind an HTTP server on 127.0.0.1.

    Use as a context manager, or `start()` / `close()`.
    """

    def __init__(
        self,
        *,
        bookmark_interval: float = 1.0,
        default_watch_timeout: float = 60.0,
        history_limit: int = 10_000,
        tls: tuple[Path, Path] | None = None,
        token: str | None = None,
    ) -> None:
        self.tls = tls  # (certificate, key) PEM files: serve HTTPS
        self.token = token  # require this bearer token
        self.bookmark_interval = bookmark_interval
        self.default_watch_timeout = default_watch_timeout
        self.history_limit = history_limit
        self._cond = threading.Condition()
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._rv = 1
        self._oldest_rv = 1  # a watch from an rv below this gets 410
        self._history: list[_Change] = []
        self._snapshots: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self._fault: str = "ok"
        self._delay = 0.0
        self.huge_bytes = HUGE_BYTES
        self._closing = False
        self._generation = 0  # bumped by expire_history: open watches end with 410
        self._port = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self.requests: dict[str, int] = {
            **{"list": 0, "watch": 0, "proxy": 0, "dra": 0},
            **{"inferencepools": 0, "services": 0},
        }
        # resource.k8s.io/v1 collections by resource name; a name absent answers 404,
        # as a server without DRA (before 1.34, or the API group turned off) does.
        self._dra: dict[str, list[dict[str, Any]]] = {}
        # InferencePools (None: the CRD is not installed, 404) and Services by namespace/name.
        self._pools: list[dict[str, Any]] | None = None
        self._services: dict[tuple[str, str], dict[str, Any]] = {}
        self.proxy_deadline = 30.0  # seconds a pods/proxy read may take, connect to last byte
        self.proxy_max_bytes = 128 * 1024 * 1024

    # -- lifecycle --

    def start(self) -> FakeApiServer:
        self._listen()
        return self

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._unlisten()
        self._cut_connections()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self._port}"

    def _listen(self) -> None:
        server = _Server(("127.0.0.1", self._port), _handler_class(self))
        self._port = server.server_address[1]
        if self.tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*self.tls)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._httpd = server
        self._serve_thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="fake-apiserver",
        )
        self._serve_thread.start()

    def _unlisten(self) -> None:
        server, self._httpd = self._httpd, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def _cut_connections(self) -> None:
        with self._cond:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    # -- client configuration --

    def kubeconfig(self, path: str | Path) -> Path:
        """Write a kubeconfig pointing at this server: with its CA under `tls=`, and its
        bearer token under `token=` (else no credentials)."""
        target = Path(path)
        cluster: dict[str, str] = {"server": self.url}
        if self.tls is not None:
            cluster["certificate-authority"] = str(Path(self.tls[0]).resolve())
        user = {"token": self.token} if self.token is not None else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "fake", "user": user}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        target.write_text(yaml.safe_dump(config))
        return target

    def service_account(self, directory: str | Path) -> dict[str, str]:
        """Write what the kubelet mounts in a pod (`token`, `ca.crt`) into `directory`;
        returns the environment variables a pod gets for the API service."""
        if self.tls is None or self.token is None:
            raise ValueError("in-cluster wiring needs a server started with tls= and token=")
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        (target / "token").write_text(self.token)
        (target / "ca.crt").write_bytes(Path(self.tls[0]).read_bytes())
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` for this server (no retries inside urllib3)."""
        configuration = kubernetes.client.Configuration(host=self.url)
        configuration.retries = 0
        return kubernetes.client.ApiClient(configuration)

    # -- state --

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def pods(self) -> list[dict[str, Any]]:
        with self._cond:
            return [copy.deepcopy(p) for p in self._pods.values()]

    def _record(self, kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
        self._rv += 1
        if new is not None:
            new["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append(_Change(self._rv, kind, old, new))
        if len(self._history) > self.history_limit:
            dropped = self._history[: len(self._history) - self.history_limit]
            del self._history[: len(dropped)]
            self._oldest_rv = dropped[-1].rv
        self._cond.notify_all()
        return str(self._rv)

    def add_pod(self, pod: Mapping[str, Any]) -> str:
        """Create a pod (ADDED); returns its resourceVersion."""
        new = copy.deepcopy(dict(pod))
        key = (new["metadata"]["namespace"], new["metadata"]["name"])
        with self._cond:
            if key in self._pods:
                raise ValueError(f"pod {key[0]}/{key[1]} already exists")
            self._pods[key] = new
            return self._record("ADDED", None, new)

    def update_pod(self, pod: Mapping[str, Any]) -> str:
        """Replace a pod by namespace/name (MODIFIED); returns its resourceVersion."""
        new = copy.deepcopy(dict(pod))
        key = (new["metadata"]["namespace"], new["metadata"]["name"])
        with self._cond:
            old = self._pods.get(key)
            if old is None:
                raise KeyError(f"pod {key[0]}/{key[1]} not found")
            self._pods[key] = new
            return self._record("MODIFIED", old, new)

    def delete_pod(self, namespace: str, name: str) -> str:
        """Remove a pod (DELETED); returns the deletion's resourceVersion."""
        with self._cond:
            old = self._pods.pop((namespace, name))
            final = copy.deepcopy(old)
            return self._record("DELETED", old, final)

    def set_dra_objects(self, resource: str, items: Sequence[Mapping[str, Any]]) -> None:
        """Serve `items` at /apis/resource.k8s.io/v1/<resource> (resourceslices,
        resourceclaims), list only; `fieldSelector=spec.nodeName=` filters slices."""
        with self._cond:
            self._dra[resource] = [copy.deepcopy(dict(i)) for i in items]

    def _serve_dra(self, handler: _Handler, resource: str, query: Mapping[str, str]) -> None:
        with self._cond:
            self.requests["dra"] += 1
            items = self._dra.get(resource)
            rv = self._rv
        if items is None or query.get("watch") in ("true", "1"):
            handler.send_json(
                404, _status(404, "NotFound", "the server could not find the requested resource")
            )
            return
        wanted = query.get("fieldSelector", "")
        if wanted.startswith("spec.nodeName="):
            node = wanted.partition("=")[2]
            items = [i for i in items if i.get("spec", {}).get("nodeName") == node]
        kind = "ResourceSliceList" if resource == "resourceslices" else "ResourceClaimList"
        handler.send_json(
            200,
            {
                "kind": kind,
                "apiVersion": "resource.k8s.io/v1",
                "metadata": {"resourceVersion": str(rv)},
                "items": items,
            },
        )

    def set_inference_pools(self, items: Sequence[Mapping[str, Any]] | None) -> None:
        """Serve `items` (InferencePool objects) under GATEWAY_API; None: answer 404, as a
        cluster without the CRD. A changed set moves the resourceVersion on."""
        new = None if items is None else [copy.deepcopy(dict(i)) for i in items]
        with self._cond:
            if new == self._pools:
                return
            if new is not None:
                self._rv += 1
                for item in new:
                    item.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            self._pools = new

    def set_services(self, items: Sequence[Mapping[str, Any]]) -> None:
        """Replace the Services served under /api/v1/namespaces/<ns>/services."""
        with self._cond:
            self._services = {
                (i["metadata"]["namespace"], i["metadata"]["name"]): copy.deepcopy(dict(i))
                for i in items
            }

    def _serve_pools(
        self, handler: _Handler, match: re.Match[str], query: Mapping[str, str]
    ) -> None:
        namespace, name = match.groups()
        with self._cond:
            self.requests["inferencepools"] += 1
            pools = copy.deepcopy(self._pools)
        if pools is None or query.get("watch") in ("true", "1"):
            handler.send_json(
                404, _status(404, "NotFound", "the server could not find the requested resource")
            )
            return
        if namespace is not None:
            pools = [p for p in pools if p["metadata"].get("namespace") == namespace]
        if name is not None:
            found = [p for p in pools if p["metadata"].get("name") == name]
            if not found:
                message = f'inferencepools.inference.networking.k8s.io "{name}" not found'
                handler.send_json(404, _status(404, "NotFound", message))
            else:
                handler.send_json(200, found[0])
            return
        code, body = self._page(query, pools, "InferencePoolList", "inference.networking.k8s.io/v1")
        handler.send_json(code, body)

    def _serve_services(
        self, handler: _Handler, match: re.Match[str], query: Mapping[str, str]
    ) -> None:
        namespace, name = match.groups()
        with self._cond:
            self.requests["services"] += 1
            found = copy.deepcopy(self._services.get((namespace, name or "")))
            listed = [
                copy.deepcopy(v) for (ns, _), v in sorted(self._services.items()) if ns == namespace
            ]
        if name is None:
            code, body = self._page(query, listed, "ServiceList", "v1")
            handler.send_json(code, body)
        elif found is None:
            handler.send_json(404, _status(404, "NotFound", f'services "{name}" not found'))
        else:
            handler.send_json(200, found)

    def _page(
        self, query: Mapping[str, str], items: list[dict[str, Any]], kind: str, api_version: str
    ) -> tuple[int, dict[str, Any]]:
        """One page of a list of objects other than pods: `limit` and `continue` as the API
        server pages them (a token over the first page's snapshot; 410 once forgotten)."""
        with self._cond:
            token = query.get("continue")
            if token and query.get("resourceVersion"):
                return 400, _status(
                    400,
                    "BadRequest",
                    "specifying resource version is not allowed when using continue",
                )
            rv = self._rv
            snapshot_id, offset = uuid.uuid4().hex, 0
            if token:
                try:
                    decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
                    snapshot_id, offset = str(decoded["id"]), int(decoded["offset"])
                except (ValueError, KeyError, TypeError):
                    return 400, _status(400, "BadRequest", "continue key is not valid")
                if snapshot_id not in self._snapshots:
                    return 410, _status(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent "
                        "list result. You can start a new list without the continue parameter.",
                    )
                rv, items = self._snapshots[snapshot_id]
            try:
                limit = int(query.get("limit") or 0)
            except ValueError:
                return 400, _status(400, "BadRequest", "invalid limit")
            page = items[offset : offset + limit] if limit > 0 else items[offset:]
            metadata: dict[str, Any] = {"resourceVersion": str(rv)}
            next_offset = offset + len(page)
            if next_offset < len(items):
                self._snapshots[snapshot_id] = (rv, items)
                if len(self._snapshots) > 64:
                    del self._snapshots[next(iter(self._snapshots))]
                metadata["continue"] = base64.urlsafe_b64encode(
                    json.dumps({"id": snapshot_id, "offset": next_offset}).encode()
                ).decode()
                metadata["remainingItemCount"] = len(items) - next_offset
            else:
                self._snapshots.pop(snapshot_id, None)
        return 200, {"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": page}

    def expire_history(self) -> None:
        """Forget every resourceVersion up to now: open watches get ERROR 410 and end,
        watches from an older version get 410, continue tokens expire."""
        with self._cond:
            self._rv += 1  # other kinds' writes move the global counter too
            self._oldest_rv = self._rv
            self._history.clear()
            self._snapshots.clear()
            self._generation += 1
            self._cond.notify_all()

    def set_fault(self, fault: Fault) -> None:
        """Switch how the server misbehaves; "ok" restores normal answers (and, after
        "refuse", listens again on the same port)."""
        if fault not in _FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {_FAULTS}")
        with self._cond:
            previous, self._fault = self._fault, fault
            self._cond.notify_all()
        if fault == "refuse" and previous != "refuse":
            self._unlisten()
            self._cut_connections()
        elif previous == "refuse" and fault != "refuse":
            self._listen()  # same port: the client's configuration still points here
        if fault in ("http_500", "forbidden", "unauthorized", *_BODY_FAULTS):
            self._cut_connections()  # open watches break, as when a server restarts

    def set_delay(self, seconds: float) -> None:
        """Delay every answer (a slow, overloaded API server)."""
        with self._cond:
            self._delay = max(0.0, seconds)

    # -- request handling (called from handler threads) --

    def _wait_while_hung(self) -> None:
        with self._cond:
            while self._fault == "hang" and not self._closing:
                self._cond.wait(0.5)
            if self._closing:
                raise _Closed

    def _handle_get(self, handler: _Handler) -> None:
        parts = urlsplit(handler.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        self._wait_while_hung()
        if self._delay:
            time.sleep(self._delay)
        if self.token is not None and not _bearer_matches(
            handler.headers.get("Authorization", ""), self.token
        ):
            handler.send_json(401, _status(401, "Unauthorized", "Unauthorized"))
            return
        with self._cond:
            fault = self._fault
        if fault in _FAULT_STATUS:
            code, reason, message = _FAULT_STATUS[fault]
            handler.send_json(code, _status(code, reason, message))
            return
        if fault in _BODY_FAULTS:
            self._bad_body(handler, fault)
            return
        path = parts.path.rstrip("/")
        namespace: str | None = None
        if proxied := _PROXY.match(parts.path):
            self._proxy(handler, proxied, parts.query)
            return
        if path.startswith(DRA_API + "/"):
            self._serve_dra(handler, path[len(DRA_API) + 1 :], query)
            return
        if path.startswith(GATEWAY_API + "/") and (pools := _POOLS.match(path[len(GATEWAY_API) :])):
            self._serve_pools(handler, pools, query)
            return
        if services := _SERVICES.match(path):
            self._serve_services(handler, services, query)
            return
        if path.startswith("/api/v1/namespaces/") and path.endswith("/pods"):
            namespace = path[len("/api/v1/namespaces/") : -len("/pods")]
        elif path == "/version":
            handler.send_json(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake"})
            return
        elif path != "/api/v1/pods":
            handler.send_json(
                404, _status(404, "NotFound", "the server could not find the requested resource")
            )
            return
        try:
            requirements = _parse_selector(query.get("fieldSelector", ""))
            requirements += _parse_label_selector(query.get("labelSelector", ""))
        except _BadSelector as exc:
            handler.send_json(400, _status(400, "BadRequest", str(exc)))
            return
        if namespace is not None:
            requirements.append(_field_requirement(_FIELDS["metadata.namespace"], True, namespace))
        if query.get("watch") in ("true", "1"):
            self._serve_watch(handler, query, requirements)
        else:
            self._serve_list(handler, query, requirements)

    def _proxy(self, handler: _Handler, request: re.Match[str], query: str) -> None:
        """GET the pod's own path at its IP and port (a number or a port's name), as the
        pods/proxy subresource does; 503 with a Status when the pod cannot be reached."""
        namespace, scheme, name, port, path = request.groups()
        with self._cond:
            self.requests["proxy"] += 1
            pod = copy.deepcopy(self._pods.get((namespace, name)))
        if pod is None:
            handler.send_json(404, _status(404, "NotFound", f'pods "{name}" not found'))
            return
        ip = (pod.get("status") or {}).get("podIP")
        number = _port_number(pod, port)
        if not ip or number is None:
            why = "the pod has no IP" if not ip else f"no port {port!r} on the pod"
            handler.send_json(503, _status(503, "ServiceUnavailable", why))
            return
        target = f"{scheme or 'http'}://{ip}:{number}{path or '/'}" + (f"?{query}" if query else "")
        client = HttpClient(
            deadline_seconds=self.proxy_deadline,
            max_body_bytes=self.proxy_max_bytes,
            tls_context=_unverified_context(),
        )
        try:
            answer = client.get(target)  # the caller's Authorization stays here
        except HttpError as exc:
            message = f"error trying to reach service: {exc.message} ({exc.reason})"
            handler.send_json(503, _status(503, "ServiceUnavailable", message))
            return
        content_type = answer.headers.get("content-type", "application/octet-stream")
        handler.send_raw(answer.status, answer.body, content_type)

    def _bad_body(self, handler: _Handler, fault: str) -> None:
        handler.close_connection = True
        if fault == "garbage":
            handler.send_raw(200, b"<html><body>502 Bad Gateway</body></html>\n", "text/html")
            return
        body = json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []})
        if fault == "truncated":
            handler.send_raw(200, body.encode(), "application/json", cut=len(body) // 2)
            return
        # huge: valid JSON, just too big; no Content-Length, so only a streamed cap catches it
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Connection", "close")
        handler.end_headers()
        chunk = b"x" * (1024 * 1024)
        handler.wfile.write(b'{"kind": "PodList", "metadata": {}, "items": [], "padding": "')
        for _ in range(self.huge_bytes // len(chunk) + 1):
            if self._closing:
                return
            handler.wfile.write(chunk)
        handler.wfile.write(b'"}')
        handler.wfile.flush()

    def _serve_list(
        self, handler: _Handler, query: Mapping[str, str], requirements: Sequence[_Requirement]
    ) -> None:
        code, body = self._list_page(query, requirements)
        handler.send_json(code, body)

    def _list_page(
        self, query: Mapping[str, str], requirements: Sequence[_Requirement]
    ) -> tuple[int, dict[str, Any]]:
        with self._cond:
            self.requests["list"] += 1
            if query.get("resourceVersionMatch") and not query.get("resourceVersion"):
                return 400, _status(
                    400,
                    "BadRequest",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            # A continued list pages its first page's snapshot: nothing to select again.
            items = (
                []
                if query.get("continue")
                else [
                    copy.deepcopy(p)
                    for _, p in sorted(self._pods.items())
                    if _matches(p, requirements)
                ]
            )
            return self._page(query, items, "PodList", "v1")

    def _serve_watch(
        self, handler: _Handler, query: Mapping[str, str], requirements: Sequence[_Requirement]
    ) -> None:
        try:
            timeout = float(query.get("timeoutSeconds") or self.default_watch_timeout)
        except ValueError:
            timeout = self.default_watch_timeout
        deadline = time.monotonic() + timeout
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        requested = query.get("resourceVersion", "")
        initial: list[dict[str, Any]] = []
        with self._cond:
            self.requests["watch"] += 1
            generation = self._generation
            oldest = self._oldest_rv
            if requested in ("", "0"):
                cursor = self._rv
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(p)}
                    for _, p in sorted(self._pods.items())
                    if _matches(p, requirements)
                ]
            elif not requested.isdigit():
                cursor = -1
            else:
                cursor = int(requested)
        if cursor < 0:
            handler.send_json(400, _status(400, "BadRequest", "invalid resourceVersion"))
            return
        handler.start_stream()
        if requested not in ("", "0") and cursor < oldest:
            handler.send_chunk({"type": "ERROR", "object": _gone(cursor, oldest)})
            handler.end_stream()
            return
        for event in initial:
            handler.send_chunk(event)
        next_bookmark = time.monotonic() + self.bookmark_interval
        while True:
            action, events, cursor = self._next_watch_step(
                requirements, cursor, generation, deadline, next_bookmark if bookmarks else None
            )
            if action == "end":
                handler.end_stream()
                return
            if action == "gone":  # history expired under an open watch
                handler.send_chunk({"type": "ERROR", "object": _gone(cursor, cursor + 1)})
                handler.end_stream()
                return
            for event in events:
                handler.send_chunk(event)
            if action == "bookmark":
                handler.send_chunk(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": "Pod",
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(cursor)},
                        },
                    }
                )
                next_bookmark = time.monotonic() + self.bookmark_interval

    def _next_watch_step(
        self,
        requirements: Sequence[_Requirement],
        cursor: int,
        generation: int,
        deadline: float,
        next_bookmark: float | None,
    ) -> tuple[str, list[dict[str, Any]], int]:
        """Wait for what an open watch sends next: (action, events, new cursor)."""
        with self._cond:
            while True:
                if self._closing or self._fault in ("refuse", *_FAULT_STATUS, *_BODY_FAULTS):
                    raise _Closed
                if self._generation != generation:
                    return "gone", [], cursor
                if self._fault == "hang":  # send nothing, not even the end of the stream
                    self._cond.wait(0.1)
                    continue
                now = time.monotonic()
                if now >= deadline:
                    return "end", [], cursor
                start = bisect.bisect_right(self._history, cursor, key=_rv_of)
                pending = self._history[start:]
                if pending:
                    events = [e for e in (_as_event(c, requirements) for c in pending) if e]
                    return "events", events, pending[-1].rv
                if next_bookmark is not None and now >= next_bookmark:
                    # Nothing pending: every version up to now has been sent or filtered.
                    return "bookmark", [], self._rv
                wake = deadline if next_bookmark is None else min(deadline, next_bookmark)
                self._cond.wait(max(0.01, wake - now))


# /api/v1/namespaces/<ns>/pods/[http:|https:]<name>:<port>/proxy[/<path>]
_PROXY = re.compile(
    r"^/api/v1/namespaces/([^/]+)/pods/(?:(https?):)?([^/:]+):([^/:]+)/proxy(/.*)?$"
)


def _unverified_context() -> ssl.SSLContext:
    """TLS to a pod as kube-apiserver's proxy transport speaks it: encrypted, the pod's
    certificate not verified (InsecureSkipVerify: pods are addressed by IP)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _port_number(pod: Mapping[str, Any], port: str) -> int | None:
    if port.isdigit():
        return int(port)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for named in container.get("ports") or []:
            if named.get("name") == port:
                return int(named["containerPort"])
    return None


def _rv_of(change: _Change) -> int:
    return change.rv


def _gone(requested: int, oldest: int) -> dict[str, Any]:
    return _status(410, "Expired", f"too old resource version: {requested} ({oldest})")


def _as_event(change: _Change, requirements: Sequence[_Requirement]) -> dict[str, Any] | None:
    """The event a watcher with this selector sees for a change, if any."""
    was = _matches(change.old, requirements)
    now = _matches(change.new, requirements) if change.kind != "DELETED" else False
    if change.kind == "DELETED":
        kind = "DELETED" if was else None
    elif was and now:
        kind = "MODIFIED"
    elif now:
        kind = "ADDED"
    elif was:
        kind = "DELETED"  # left the selector
    else:
        kind = None
    if kind is None:
        return None
    return {"type": kind, "object": copy.deepcopy(change.new)}


class _Server(ThreadingHTTPServer):
    # Handler threads may be parked in a hang or a watch: never wait for them on close.
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FakeApiServer  # set by _handler_class

    def setup(self) -> None:
        super().setup()
        with self.owner._cond:
            self.owner._connections.add(self.connection)

    def finish(self) -> None:
        with self.owner._cond:
            self.owner._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self) -> None:
        try:
            self.owner._handle_get(self)
        except (_Closed, OSError):
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests stay quiet

    def send_json(self, code: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def send_raw(self, code: int, body: bytes, content_type: str, cut: int | None = None) -> None:
        """`body` as is; with `cut`, only its first `cut` bytes, then the connection closes."""
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body if cut is None else body[:cut])
        self.wfile.flush()
        if cut is not None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def send_chunk(self, event: Mapping[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _handler_class(owner: FakeApiServer) -> type[_Handler]:
    return type("FakeApiHandler", (_Handler,), {"owner": owner})
