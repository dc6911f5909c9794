"""Finding gpuledger's own pods through the Kubernetes API, and reading their /ledger.json.

`gpuledger explain` (and the cluster view's fleet page) need the documents of the node
agents on a few nodes and of the cluster view, without being told their addresses. The
Helm chart labels every pod it makes `app.kubernetes.io/part-of=gpuledger` (fixed, unlike
`app.kubernetes.io/name`, which `nameOverride` changes) and
`app.kubernetes.io/component=node|cluster`, and names the exporter's port `metrics`.

Interface (kept stable for its importers):

    Agent(node, namespace, pod, url, role)          # node None for the cluster view
    Agent.key                                        # node name, or "cluster"
    AgentAccess(tls, ca_file, server_name, auth_file)  # how protected agents are read
    AgentAccess.credentials() -> Credentials        # its TLS context and headers, read now
    AgentAccessError                                 # a file of it cannot be used
    PodLister                                        # Protocol: list_pods(...)
    find_agents(lister, *, namespace, nodes, via, api_url="", scheme="http") -> list[Agent]
    FetchResult(documents, failures)                 # both keyed by Agent.key
    fetch_documents(agents, *, deadline_seconds, concurrency, headers=None,
                    tls_context=None, access=None, max_body_bytes=...) -> FetchResult
    query_nodes(lister, *, pod=None, workload=None, engine=None) -> set[str] | None
    ApiServer                                        # a PodLister over the API server
    connect(*, kubeconfig, context, deadline_seconds, ...) -> ApiServer
    read_for_query(api, *, via, namespace, deadline_seconds, concurrency=32,
                   access=None, pod=/workload=/engine=/gpu=) -> FetchResult  # explain's

`via="direct"` reads `http://<pod IP>:<port>` (in the cluster); `via="proxy"` reads through
the API server's pod proxy, `<api_url>/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy`,
with the caller's credentials (from a laptop). Every read goes through HttpClient: one
deadline from connect to last byte, and a byte cap.

Agents behind `--web-config-file` (the chart's `exporter.webConfig`) are read as
`AgentAccess` says: `https://<pod IP>:<port>` directly, or `pods/https:<pod>:<port>/proxy`
through the API server, which then speaks TLS to the pod without verifying its certificate
(kube-apiserver's proxy transport skips verification: pods are addressed by IP); basic auth
on direct reads only, since the API server strips the Authorization header it authenticates
the caller with (kubernetes/kubernetes#38775).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from gpuledger.document.codec import DocumentError, from_json
from gpuledger.document.v1 import LedgerDocument
from gpuledger.explain.ray import ray_worker_ips
from gpuledger.identity.scheduling import workload_of
from gpuledger.identity.urls import safe_url
from gpuledger.net.httpclient import HttpClient, HttpError

__all__ = [
    "AGENT_SELECTOR",
    "PROXY_REFUSES_AUTH",
    "Agent",
    "AgentAccess",
    "AgentAccessError",
    "ApiServer",
    "ClusterError",
    "Credentials",
    "FetchResult",
    "PodLister",
    "connect",
    "fetch_documents",
    "find_agents",
    "query_nodes",
    "read_for_query",
]

Pod = Mapping[str, Any]  # a Kubernetes pod object, as the API server answers

AGENT_SELECTOR = "app.kubernetes.io/part-of=gpuledger"
COMPONENT_LABEL = "app.kubernetes.io/component"
PORT_NAME = "metrics"
ROLES = ("node", "cluster")
CLUSTER_KEY = "cluster"
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
CONCURRENCY = 32  # agents read at once
MAX_LIST_BYTES = 64 * 1024 * 1024
LIST_PAGE = 500
MAX_LIST_PAGES = 40  # 20,000 pods: a list past that is not what we asked for
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MAX_AUTH_FILE_BYTES = 4096
SCHEMES = ("http", "https")
PROXY_REFUSES_AUTH = (
    "--agent-auth-file cannot be used with --via proxy: the API server takes the "
    "Authorization header for itself and strips it before the pod (kubernetes/kubernetes"
    "#38775); use --via direct from inside the cluster, or kubectl port-forward and "
    "--from https://localhost:PORT"
)


class ClusterError(Exception):
    """The Kubernetes API could not be used: one line for the user, no secrets."""


class AgentAccessError(ValueError):
    """A file of AgentAccess cannot be used: one line naming the file, never its content."""


@dataclass(frozen=True)
class Credentials:
    """What a direct read of an agent carries: the TLS context for https:// URLs (None:
    HttpClient's default, the system's CAs and the URL's host name) and the headers (basic
    auth's Authorization). `repr` leaves the headers out: they hold the password."""

    tls_context: ssl.SSLContext | None
    headers: Mapping[str, str] = field(repr=False)


@dataclass(frozen=True)
class AgentAccess:
    """How the node agents are read when `--web-config-file` protects them.

    * `tls`: discovered agents serve HTTPS: `https://POD_IP:PORT`, or `https:POD:PORT` in a
      pod proxy path. URLs given by address (`--agent-url`, `--from`) keep their own scheme.
    * `ca_file`: the CA bundle the agents' certificate chain is verified against, alone
      (the system's CAs are then not trusted). The agents are addressed by pod IP, which
      their certificate rarely names (cert-manager's carries the Services' DNS names), so
      with a CA file the chain is verified and the name only when `server_name` is given,
      as Prometheus' `serverName` does: without it, any certificate that CA signed is
      accepted, so use a CA that signs for gpuledger only, or give the name. Without a CA
      file: the system's CAs, and the URL's host name (or `server_name`).
    * `server_name`: the name the certificate must carry; also sent as SNI.
    * `auth_file`: a file holding one line `USER:PASSWORD`, for basic auth. A file, never a
      flag's or variable's value, so the password is in no process listing or pod spec; it
      never appears in a message either. Sent on direct reads only: through the pod proxy
      it cannot pass (PROXY_REFUSES_AUTH).

    `credentials()` reads the files each time it is called (once per refresh of the agents'
    documents): a rotated CA or password is used from the next refresh, without a restart.
    """

    tls: bool = False
    ca_file: str | None = None
    server_name: str | None = None
    auth_file: str | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def credentials(self) -> Credentials:
        """The TLS context and headers from the files as they are now; AgentAccessError
        when one cannot be used."""
        return Credentials(self._tls_context(), self._headers())

    def _tls_context(self) -> ssl.SSLContext | None:
        return verified_tls_context(self.ca_file, self.server_name, ca_flag="--agent-ca-file")

    def _headers(self) -> dict[str, str]:
        if not self.auth_file:
            return {}
        try:
            with open(self.auth_file, "rb") as f:
                raw = f.read(MAX_AUTH_FILE_BYTES + 1)
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise AgentAccessError(
                f"--agent-auth-file {self.auth_file}: cannot read it: {why}"
            ) from None
        line = raw.rstrip(b"\r\n")
        user, colon, _ = line.partition(b":")
        if len(raw) > MAX_AUTH_FILE_BYTES or not colon or not user or b"\n" in line:
            raise AgentAccessError(
                f"--agent-auth-file {self.auth_file}: expected one line USER:PASSWORD"
            )
        return {"Authorization": "Basic " + base64.b64encode(line).decode("ascii")}


def verified_tls_context(
    ca_file: str | None, server_name: str | None, *, ca_flag: str
) -> ssl.SSLContext | None:
    """The TLS context of a CA file and a server name (AgentAccess's rules; the Prometheus
    reader's too); None without either. AgentAccessError names `ca_flag` and the file."""
    if not ca_file and not server_name:
        return None
    context = _ServerNameContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, TLS 1.2+
    context.server_name = server_name
    if not ca_file:
        context.load_default_certs()
        return context
    try:
        context.load_verify_locations(cafile=ca_file)
    except OSError as exc:  # ssl.SSLError is one too: not a PEM certificate
        why = (
            "no CA certificate in it"
            if isinstance(exc, ssl.SSLError)
            else f"cannot read it: {exc.strerror or type(exc).__name__}"
        )
        raise AgentAccessError(f"{ca_flag} {ca_file}: {why}") from None
    if not server_name:
        context.check_hostname = False  # the chain is verified, not the pod IP
    return context


class _ServerNameContext(ssl.SSLContext):
    """Verifies `server_name` (and sends it as SNI) instead of the host connected to, when
    set: http.client passes the URL's host, here a pod IP."""

    server_name: str | None = None

    def wrap_socket(  # noqa: PLR0917 (ssl.SSLContext.wrap_socket's signature)
        self,
        sock: socket.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        return super().wrap_socket(
            sock,
            server_side=server_side,
            do_handshake_on_connect=do_handshake_on_connect,
            suppress_ragged_eofs=suppress_ragged_eofs,
            server_hostname=self.server_name or server_hostname,
            session=session,
        )


class PodLister(Protocol):
    """Lists pods as the API returns them (camelCase JSON); `namespace` None: all."""

    def list_pods(
        self, *, namespace: str | None, label_selector: str = "", field_selector: str = ""
    ) -> list[Pod]: ...


@dataclass(frozen=True)
class Agent:
    node: str | None  # None for the cluster view
    namespace: str
    pod: str
    url: str  # base URL; GET url + "/ledger.json"; "" when the pod has no IP
    role: str  # "node" or "cluster"

    @property
    def key(self) -> str:
        return self.node if self.node is not None else CLUSTER_KEY


@dataclass(frozen=True)
class FetchResult:
    documents: dict[str, LedgerDocument]  # Agent.key -> its /ledger.json
    failures: dict[str, str]  # Agent.key -> one line: why it could not be read


# --- finding the agents ---


def find_agents(
    lister: PodLister,
    *,
    namespace: str | None,
    nodes: Collection[str] | None,
    via: str,
    api_url: str = "",
    scheme: str = "http",
) -> list[Agent]:
    """The node agents on `nodes` (every node when None) and the cluster view, one per
    key: where a rollout leaves two pods for a key, the Ready one, then the newest.
    `scheme` is what the agents serve (https with `--web-config-file`'s TLS)."""
    if via not in ("direct", "proxy"):
        raise ValueError(f"via must be 'direct' or 'proxy', not {via!r}")
    if via == "proxy" and not api_url:
        raise ValueError("via='proxy' needs the API server's URL")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be 'http' or 'https', not {scheme!r}")
    chosen: dict[str, tuple[tuple[bool, bool, str], Agent]] = {}
    for pod in lister.list_pods(namespace=namespace, label_selector=AGENT_SELECTOR):
        agent = _agent_of(pod, via, api_url.rstrip("/"), scheme)
        if agent is None or (
            agent.role == "node" and nodes is not None and agent.node not in nodes
        ):
            continue
        rank = _rank(pod)
        if agent.key not in chosen or rank > chosen[agent.key][0]:
            chosen[agent.key] = (rank, agent)
    agents = [agent for _, agent in chosen.values()]
    return sorted(agents, key=lambda a: (a.role == "cluster", a.key))


def _agent_of(pod: Pod, via: str, api_url: str, scheme: str) -> Agent | None:
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    role = (metadata.get("labels") or {}).get(COMPONENT_LABEL)
    port = _metrics_port(spec)
    if role not in ROLES or port is None:
        return None
    node = spec.get("nodeName") if role == "node" else None
    if role == "node" and not node:
        return None  # a node agent not placed yet serves no node
    namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
    ip = str((pod.get("status") or {}).get("podIP") or "")
    if not ip:
        url = ""  # neither way reaches a pod without an IP
    elif via == "direct":
        url = f"{scheme}://[{ip}]:{port}" if ":" in ip else f"{scheme}://{ip}:{port}"
    else:
        # The pods/proxy subresource's name is [scheme:]name[:port]; https: makes the API
        # server speak TLS to the pod.
        target = f"{'https:' if scheme == 'https' else ''}{quote(name)}:{port}"
        url = f"{api_url}/api/v1/namespaces/{quote(namespace)}/pods/{target}/proxy"
    return Agent(node=node, namespace=namespace, pod=name, url=url, role=role)


def _metrics_port(spec: Mapping[str, Any]) -> int | None:
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == PORT_NAME and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def _rank(pod: Pod) -> tuple[bool, bool, str]:
    status, metadata = pod.get("status") or {}, pod.get("metadata") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    alive = status.get("phase") == "Running" and not metadata.get("deletionTimestamp")
    return (alive and ready, alive, str(metadata.get("creationTimestamp", "")))


def query_nodes(
    lister: PodLister,
    *,
    pod: str | None = None,
    workload: str | None = None,
    engine: str | None = None,
) -> set[str] | None:
    """The nodes an explain query's pods run on; None when the query names no pod (a GPU,
    a model name): then every node may hold the answer. Pods not placed have no node; the
    cluster view, always read, answers for them."""
    if engine is not None and "/" in engine:
        # NS/POD[:RANK], or a model name such as org/model: a pod that is not there.
        ns, _, name = engine.partition("/")
        found = _pods_named(lister, ns, name.split(":", 1)[0])
        return _nodes(found) if found else None
    if pod is not None:
        ns, _, name = pod.partition("/")
        return _nodes(_pods_named(lister, ns, name))
    if workload is not None and "/" not in workload:
        return None  # a workload in no namespace (a bare host's engine): not a pod's
    if workload is not None:
        ns, _, name = workload.partition("/")
        return _nodes(p for p in lister.list_pods(namespace=ns) if _workload(p) == name)
    return None


def _pods_named(lister: PodLister, namespace: str, name: str) -> list[Pod]:
    if not namespace or not name:
        return []
    return lister.list_pods(namespace=namespace, field_selector=f"metadata.name={name}")


def _workload(pod: Pod) -> str:
    metadata = pod.get("metadata") or {}
    return workload_of(
        str(metadata.get("name", "")), metadata.get("labels"), metadata.get("ownerReferences")
    )


def _nodes(pods: Iterable[Pod]) -> set[str]:
    return {str(n) for p in pods if (n := (p.get("spec") or {}).get("nodeName"))}


def read_for_query(
    api: ApiServer,
    *,
    via: str,
    namespace: str | None,
    deadline_seconds: float,
    concurrency: int = CONCURRENCY,
    access: AgentAccess | None = None,
    **query: str | None,
) -> FetchResult:
    """The documents an explain query needs: the agents on its pods' nodes (all nodes for
    a GPU or a model name), then those of the nodes whose pods are the Ray nodes holding
    the workers of a Ray-executor engine they name (within another deadline), and the
    cluster view, with a failure for every agent that could not be read and every node
    where none was found. Through the proxy, `access`
    gives the scheme only: the API server's credentials reach it, and it verifies nothing
    of the pod's certificate; basic auth cannot pass (ValueError, PROXY_REFUSES_AUTH)."""
    access = access or AgentAccess()
    proxied = via == "proxy"
    if proxied and access.auth_file:
        raise ValueError(PROXY_REFUSES_AUTH)
    nodes = query_nodes(
        api, pod=query.get("pod"), workload=query.get("workload"), engine=query.get("engine")
    )
    found = find_agents(
        api, namespace=namespace, nodes=nodes, via=via, api_url=api.url, scheme=access.scheme
    )
    result = fetch_documents(
        found,
        deadline_seconds=deadline_seconds,
        concurrency=concurrency,
        headers=api.headers() if proxied else None,
        tls_context=api.tls_context if proxied else None,
        access=None if proxied else access,
    )
    keys = {a.key for a in found}
    if nodes is not None:
        # A Ray-executor engine's workers run on other nodes: read their agents too.
        more = ray_worker_nodes(api, result.documents.values()) - set(nodes)
        keys |= _read_more(
            api,
            result,
            more,
            namespace=namespace,
            via=via,
            deadline_seconds=deadline_seconds,
            concurrency=concurrency,
            access=access,
        )
        nodes = {*nodes, *more}
    for node in sorted(set(nodes or ()) - keys):
        result.failures[node] = f"no gpuledger node agent found on this node ({AGENT_SELECTOR})"
    if CLUSTER_KEY not in keys:
        result.failures[CLUSTER_KEY] = (
            f"no gpuledger cluster view found ({AGENT_SELECTOR}, {COMPONENT_LABEL}=cluster): "
            "pods not placed are unknown"
        )
    return result


def _read_more(
    api: ApiServer,
    result: FetchResult,
    nodes: Collection[str],
    *,
    namespace: str | None,
    via: str,
    deadline_seconds: float,
    concurrency: int,
    access: AgentAccess,
) -> set[str]:
    """The node agents of `nodes` read into `result` (another deadline); their keys."""
    if not nodes:
        return set()
    found = find_agents(
        api, namespace=namespace, nodes=nodes, via=via, api_url=api.url, scheme=access.scheme
    )
    agents = [a for a in found if a.role == "node"]
    proxied = via == "proxy"
    more = fetch_documents(
        agents,
        deadline_seconds=deadline_seconds,
        concurrency=concurrency,
        headers=api.headers() if proxied else None,
        tls_context=api.tls_context if proxied else None,
        access=None if proxied else access,
    )
    result.documents.update(more.documents)
    result.failures.update(more.failures)
    return {a.key for a in agents}


MAX_RAY_WORKER_NODES = 64  # pod-IP lookups for one query's Ray workers


def ray_worker_nodes(lister: PodLister, docs: Iterable[LedgerDocument]) -> set[str]:
    """The nodes of the pods whose IPs are the Ray nodes holding the workers of the
    documents' Ray-executor engines (a Ray node's IP is its pod's)."""
    found: set[str] = set()
    for ip in sorted(ray_worker_ips(list(docs)))[:MAX_RAY_WORKER_NODES]:
        found |= _nodes(lister.list_pods(namespace=None, field_selector=f"status.podIP={ip}"))
    return found


# --- reading the documents ---


def fetch_documents(
    agents: Sequence[Agent],
    *,
    deadline_seconds: float,
    concurrency: int,
    headers: Mapping[str, str] | None = None,
    tls_context: ssl.SSLContext | None = None,
    access: AgentAccess | None = None,
    max_body_bytes: int = MAX_DOCUMENT_BYTES,
) -> FetchResult:
    """Every agent's /ledger.json, `concurrency` at a time, all within one deadline: a
    read gets the time left when it starts, so a slow agent delays no answer past it.
    `access` (direct reads only) gives the TLS context and headers, its files read now:
    when one cannot be used, every agent's failure says so."""
    if deadline_seconds <= 0 or concurrency < 1:
        raise ValueError("deadline_seconds must be > 0 and concurrency >= 1")
    if access is not None:
        if headers or tls_context is not None:
            raise ValueError("access is for direct reads: no headers or tls_context with it")
        try:
            credentials = access.credentials()
        except AgentAccessError as exc:
            return FetchResult({}, {a.key: f"{a.namespace}/{a.pod}: {exc}" for a in agents})
        headers, tls_context = credentials.headers, credentials.tls_context
    reader = _Reader(
        time.monotonic() + deadline_seconds,
        deadline_seconds,
        headers or {},
        tls_context,
        max_body_bytes,
    )
    result = FetchResult({}, {})
    lock = threading.Lock()

    def read(agent: Agent) -> None:
        doc, failure = reader.read(agent)
        with lock:
            if doc is not None:
                result.documents[agent.key] = doc
            else:
                result.failures[agent.key] = failure

    if agents:
        with ThreadPoolExecutor(min(concurrency, len(agents)), "ledger-read") as pool:
            list(pool.map(read, agents))
    return result


@dataclass(frozen=True)
class _Reader:
    end: float  # time.monotonic() by which every read is over
    deadline_seconds: float
    headers: Mapping[str, str]
    tls_context: ssl.SSLContext | None
    max_body_bytes: int

    def read(self, agent: Agent) -> tuple[LedgerDocument | None, str]:
        who = f"{agent.namespace}/{agent.pod}"
        if not agent.url:
            return None, f"{who}: the pod has no IP (not running)"
        left = self.end - time.monotonic()
        if left <= 0:
            return None, f"{who}: not read, the {self.deadline_seconds:g}s deadline passed first"
        target = agent.url + "/ledger.json"
        client = HttpClient(
            deadline_seconds=left,
            max_body_bytes=self.max_body_bytes,
            headers={**self.headers, "Accept": "application/json"},
            tls_context=self.tls_context,
            max_redirects=0,  # credentials for the API server go nowhere else
        )
        try:
            response = client.get(target)
        except HttpError as exc:
            return None, f"{who}: {exc.message} ({exc.reason})"
        if response.status != 200:
            status = f"HTTP {response.status}{_status(response.body)}"
            return None, f"{who}: {safe_url(target)}: {status}"
        return _document(who, target, response.body)


def _document(who: str, target: str, body: bytes) -> tuple[LedgerDocument | None, str]:
    try:
        obj = json.loads(body)
    except ValueError:
        return None, f"{who}: {safe_url(target)}: not JSON"
    try:
        return from_json(obj), ""
    except DocumentError as exc:
        return None, f"{who}: {safe_url(target)}: {exc}"


def _status(body: bytes) -> str:
    """The message of a Kubernetes Status answer (the API server saying why its proxy
    failed: "no endpoints", "connection refused"), short and on one line."""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(message, str) or not message:
        return ""
    return ": " + " ".join(message.split())[:200]


# --- the API server ---


class ApiServer:
    """A PodLister over the Kubernetes API with the caller's credentials, through
    HttpClient: every request has one deadline and a byte cap, and no retries hide a
    failure. Its `headers()` and `tls_context` are what a pod proxy read needs too."""

    def __init__(
        self,
        url: str,
        *,
        authorization: Callable[[], str | None],
        tls_context: ssl.SSLContext | None,
        deadline_seconds: float,
        in_cluster: bool,
    ) -> None:
        self.url = url.rstrip("/")
        self.tls_context = tls_context
        self.in_cluster = in_cluster
        self._authorization = authorization
        self._deadline = deadline_seconds

    def headers(self) -> dict[str, str]:
        """The Authorization header, re-read each call (in-cluster tokens rotate)."""
        value = self._authorization()
        return {"Authorization": value} if value else {}

    def list_pods(
        self, *, namespace: str | None, label_selector: str = "", field_selector: str = ""
    ) -> list[Pod]:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"
        query = {"labelSelector": label_selector, "fieldSelector": field_selector}
        items: list[Pod] = []
        token = ""
        for _ in range(MAX_LIST_PAGES):
            params = {k: v for k, v in query.items() if v}
            params.update({"limit": str(LIST_PAGE), **({"continue": token} if token else {})})
            page = self._get(f"{path}?{urlencode(params)}")
            items.extend(p for p in page.get("items") or [] if isinstance(p, Mapping))
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return items
        raise ClusterError(f"{self.url}{path}: more than {MAX_LIST_PAGES} pages of pods")

    def _get(self, path_and_query: str) -> Mapping[str, Any]:
        target = self.url + path_and_query
        client = HttpClient(
            deadline_seconds=self._deadline,
            max_body_bytes=MAX_LIST_BYTES,
            headers={**self.headers(), "Accept": "application/json"},
            tls_context=self.tls_context,
            max_redirects=0,
        )
        try:
            response = client.get(target)
        except HttpError as exc:
            raise ClusterError(
                f"cannot reach the Kubernetes API: {exc.message} ({exc.reason})"
            ) from None
        if response.status != 200:
            raise ClusterError(
                f"the Kubernetes API answered {safe_url(target)}: HTTP {response.status}"
                f"{_status(response.body)}"
            )
        try:
            body = json.loads(response.body)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise ClusterError(f"{safe_url(target)}: not a Kubernetes API answer")
        return body


def connect(
    *,
    kubeconfig: str | None,
    context: str | None,
    deadline_seconds: float,
    service_account_dir: str | None = None,
) -> ApiServer:
    """The API server as kubectl would find it: `kubeconfig` when given; else in-cluster
    when the service account's files are mounted; else $KUBECONFIG or ~/.kube/config.
    The kubernetes client loads the configuration (every authenticator it supports);
    the requests themselves go through HttpClient."""
    from gpuledger.net import kubeapi  # noqa: PLC0415 (only discovery needs it)

    service_account_dir = service_account_dir or SERVICE_ACCOUNT_DIR
    in_cluster = kubeconfig is None and Path(service_account_dir, "token").is_file()
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())
    where = "the in-cluster configuration" if in_cluster else f"kubeconfig {path}"
    try:
        if in_cluster:
            configuration = kubeapi.incluster_configuration(service_account_dir)
        else:
            configuration = kubeapi.kubeconfig_configuration(path, context=context)
        tls_context = tls_context_of(configuration)
    except ClusterError:
        raise
    except Exception as exc:  # ConfigException, OSError, YAML and SSL errors
        detail = (str(exc).splitlines() or [""])[0][:160] or type(exc).__name__
        raise ClusterError(f"cannot load {where}: {detail}") from None
    return ApiServer(
        str(configuration.host),
        authorization=lambda: configuration.get_api_key_with_prefix(
            "BearerToken", alias="authorization"
        ),
        tls_context=tls_context,
        deadline_seconds=deadline_seconds,
        in_cluster=in_cluster,
    )


def tls_context_of(configuration: Any) -> ssl.SSLContext | None:
    """The kubernetes client's TLS settings as an SSLContext: its CA (file or data), its
    client certificate, and `insecure-skip-tls-verify`. None for an http:// server."""
    if not str(configuration.host).startswith("https://"):
        return None
    if getattr(configuration, "tls_server_name", None):
        raise ClusterError("kubeconfig tls-server-name is not supported here: use --from URL")
    context = ssl.create_default_context(
        cafile=configuration.ssl_ca_cert or None,
        cadata=getattr(configuration, "ca_cert_data", None) or None,
    )
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
