"""Finding gpuledger's agents and reading their /ledger.json (gpuledger/explain/agents.py)."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuledger.explain.agents import (
    AGENT_SELECTOR,
    Agent,
    AgentAccess,
    AgentAccessError,
    ApiServer,
    ClusterError,
    connect,
    fetch_documents,
    find_agents,
    query_nodes,
    read_for_query,
    tls_context_of,
)
from gpuledger.export.document import SCHEMA
from gpuledger.sim.fake_apiserver import (
    FakeApiServer,
    make_agent_pod,
    make_pod,
    self_signed_certificate,
)
from tests.certs import Issued, issue

Pod = Mapping[str, Any]


class Lister:
    """Pods in memory; records what was asked."""

    def __init__(self, *pods: Pod) -> None:
        self.pods = list(pods)
        self.calls: list[tuple[str | None, str, str]] = []

    def list_pods(
        self, *, namespace: str | None, label_selector: str = "", field_selector: str = ""
    ) -> list[Pod]:
        self.calls.append((namespace, label_selector, field_selector))
        name = field_selector.removeprefix("metadata.name=") if field_selector else None
        return [
            p
            for p in self.pods
            if namespace in (None, p["metadata"]["namespace"])
            and (name is None or p["metadata"]["name"] == name)
            and (not label_selector or p["metadata"]["labels"].get("app.kubernetes.io/part-of"))
        ]


def agent_pods() -> list[Pod]:
    return [
        make_agent_pod("gpuledger", "node-a", component="node", node="gpu-a", port=9402),
        make_agent_pod("gpuledger", "node-b", component="node", node="gpu-b", port=9403),
        make_agent_pod("gpuledger", "cluster-0", component="cluster", port=9404),
    ]


def test_only_the_agents_on_the_nodes_asked_and_the_cluster_view() -> None:
    lister = Lister(*agent_pods())
    found = find_agents(lister, namespace="gpuledger", nodes={"gpu-b"}, via="direct")
    assert found == [
        Agent("gpu-b", "gpuledger", "node-b", "http://127.0.0.1:9403", "node"),
        Agent(None, "gpuledger", "cluster-0", "http://127.0.0.1:9404", "cluster"),
    ]
    assert [a.key for a in found] == ["gpu-b", "cluster"]
    assert lister.calls == [("gpuledger", AGENT_SELECTOR, "")]
    everywhere = find_agents(lister, namespace=None, nodes=None, via="direct")
    assert [a.key for a in everywhere] == ["gpu-a", "gpu-b", "cluster"]
    assert [a.key for a in find_agents(lister, namespace=None, nodes=(), via="direct")] == [
        "cluster"
    ]


def test_proxy_urls_go_through_the_api_server() -> None:
    found = find_agents(
        Lister(*agent_pods()),
        namespace=None,
        nodes={"gpu-a"},
        via="proxy",
        api_url="https://api.example:6443/",
    )
    assert found[0].url == (
        "https://api.example:6443/api/v1/namespaces/gpuledger/pods/node-a:9402/proxy"
    )
    with pytest.raises(ValueError, match="API server"):
        find_agents(Lister(), namespace=None, nodes=None, via="proxy")
    with pytest.raises(ValueError, match="direct"):
        find_agents(Lister(), namespace=None, nodes=None, via="tunnel")


def test_a_rollout_keeps_the_ready_agent_and_pods_without_a_port_are_not_agents() -> None:
    old = make_agent_pod("gpuledger", "node-a-old", component="node", node="gpu-a", port=1)
    old["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    new = make_agent_pod("gpuledger", "node-a-new", component="node", node="gpu-a", port=2)
    portless = make_agent_pod("gpuledger", "node-b", component="node", node="gpu-b", port=3)
    portless["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 3}]
    other = make_agent_pod("gpuledger", "hook", component="test", node="gpu-b", port=4)
    no_ip = make_agent_pod("gpuledger", "node-c", component="node", node="gpu-c", port=5)
    del no_ip["status"]["podIP"]
    found = find_agents(
        Lister(old, new, portless, other, no_ip), namespace=None, nodes=None, via="direct"
    )
    assert [(a.pod, a.url) for a in found] == [
        ("node-a-new", "http://127.0.0.1:2"),
        ("node-c", ""),
    ]


def test_ipv6_pod_ips_are_bracketed() -> None:
    pod = make_agent_pod("g", "n", component="node", node="x", port=9402, pod_ip="fd00::7")
    assert find_agents(Lister(pod), namespace=None, nodes=None, via="direct")[0].url == (
        "http://[fd00::7]:9402"
    )


def test_the_nodes_of_a_query() -> None:
    lister = Lister(
        make_pod("serve", "chat-0", node="gpu-a", owner=("StatefulSet", "chat")),
        make_pod("serve", "chat-1", node="gpu-b", owner=("StatefulSet", "chat")),
        make_pod("serve", "chat-2", owner=("StatefulSet", "chat"), phase="Pending"),
        make_pod(
            "serve",
            "web-6d4cf56db6-x2x9z",
            node="gpu-c",
            owner=("ReplicaSet", "web-6d4cf56db6"),
            labels={"pod-template-hash": "6d4cf56db6"},
        ),
    )
    assert query_nodes(lister, pod="serve/chat-1") == {"gpu-b"}
    assert query_nodes(lister, pod="serve/chat-2") == set()  # pending: the cluster view
    assert query_nodes(lister, pod="serve/gone") == set()
    assert query_nodes(lister, workload="serve/chat") == {"gpu-a", "gpu-b"}
    assert query_nodes(lister, workload="serve/web") == {"gpu-c"}
    assert query_nodes(lister, engine="serve/chat-0:1") == {"gpu-a"}
    # A model name looks like NS/POD; with no such pod every node is read.
    assert query_nodes(lister, engine="meta-llama/Llama-3.1-8B") is None
    assert query_nodes(lister, engine="llama") is None


# --- reading ---


def document(node: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "node": node}


class Agents:
    """Loopback exporters answering GET /ledger.json with `body(path)`, over TLS when given
    a server context; the Authorization header of every request is kept."""

    def __init__(self) -> None:
        self.servers: list[ThreadingHTTPServer] = []
        self.active = 0
        self.most_active = 0
        self.authorizations: list[str | None] = []
        self.lock = threading.Lock()

    def serve(
        self, body: Callable[[], bytes], pause: float = 0.0, tls: ssl.SSLContext | None = None
    ) -> str:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer.lock:
                    outer.authorizations.append(self.headers.get("Authorization"))
                    outer.active += 1
                    outer.most_active = max(outer.most_active, outer.active)
                time.sleep(pause)
                data = body()
                with outer.lock:
                    outer.active -= 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        if tls is not None:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        return f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def agents() -> Iterator[Agents]:
    made = Agents()
    yield made
    made.close()


def trickling_server() -> tuple[socket.socket, str]:
    """Accepts, then sends its status line a byte every 0.2 s."""
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 200:
                    conn.sendall(bytes([byte]))
                    time.sleep(0.2)

    threading.Thread(target=run, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"


def closed_port() -> str:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def agent(key: str, url: str) -> Agent:
    node = None if key == "cluster" else key
    return Agent(node, "gpuledger", f"pod-{key}", url, "cluster" if node is None else "node")


def test_documents_and_named_failures_within_one_deadline(agents: Agents) -> None:
    good = agents.serve(lambda: json.dumps(document("a")).encode())
    not_ours = agents.serve(lambda: b'{"schema": "other"}')
    listener, slow = trickling_server()
    started = time.monotonic()
    result = fetch_documents(
        [
            agent("a", good),
            agent("b", slow),
            agent("c", closed_port()),
            agent("d", not_ours),
            agent("e", ""),
        ],
        deadline_seconds=1.0,
        concurrency=8,
    )
    elapsed = time.monotonic() - started
    listener.close()
    assert list(result.documents) == ["a"]
    assert result.documents["a"].node == "a"
    assert result.failures["b"].endswith("(timeout)")
    assert result.failures["c"].endswith("(refused)")
    assert f"not a {SCHEMA} document" in result.failures["d"]
    assert result.failures["e"] == "gpuledger/pod-e: the pod has no IP (not running)"
    assert elapsed < 3, f"took {elapsed:.1f}s for a 1 s deadline"


def test_concurrency_is_bounded_and_the_deadline_covers_the_queue(agents: Agents) -> None:
    url = agents.serve(lambda: json.dumps(document("x")).encode(), pause=0.3)
    result = fetch_documents(
        [agent(f"n{i}", url) for i in range(6)], deadline_seconds=5.0, concurrency=2
    )
    assert len(result.documents) == 6
    assert agents.most_active == 2
    # Reads waiting for a slot get only the time left: none runs past the deadline.
    started = time.monotonic()
    late = fetch_documents(
        [agent(f"n{i}", url) for i in range(6)], deadline_seconds=0.5, concurrency=1
    )
    assert time.monotonic() - started < 2
    assert len(late.documents) == 1
    assert any("deadline passed first" in why for why in late.failures.values())


def test_no_redirects_so_credentials_stay_with_the_api_server() -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def redirect() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\n\r\n")

    threading.Thread(target=redirect, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    result = fetch_documents(
        [agent("a", url)],
        deadline_seconds=2,
        concurrency=1,
        headers={"Authorization": "Bearer secret-token"},
    )
    listener.close()
    assert result.failures["a"].endswith("HTTP 302")
    assert "secret-token" not in result.failures["a"]


# --- the API server ---


def test_api_server_lists_by_label_across_pages() -> None:
    with FakeApiServer(token="t0k") as api:
        for pod in agent_pods():
            api.add_pod(pod)
        for i in range(7):
            api.add_pod(make_pod("serve", f"p{i}", node="gpu-a"))
        server = ApiServer(
            api.url,
            authorization=lambda: "Bearer t0k",
            tls_context=None,
            deadline_seconds=2,
            in_cluster=False,
        )
        agents_found = server.list_pods(namespace=None, label_selector=AGENT_SELECTOR)
        assert sorted(p["metadata"]["name"] for p in agents_found) == [
            "cluster-0",
            "node-a",
            "node-b",
        ]
        serving = server.list_pods(namespace="serve")
        assert len(serving) == 7
        wrong = ApiServer(
            api.url,
            authorization=lambda: "Bearer nope",
            tls_context=None,
            deadline_seconds=2,
            in_cluster=False,
        )
        with pytest.raises(ClusterError, match="HTTP 401: Unauthorized"):
            wrong.list_pods(namespace=None)


def test_connect_reads_a_kubeconfig_and_names_a_missing_one(tmp_path: Path) -> None:
    with FakeApiServer() as api:
        api.add_pod(agent_pods()[0])
        config = api.kubeconfig(tmp_path / "kubeconfig")
        server = connect(
            kubeconfig=str(config),
            context=None,
            deadline_seconds=2,
            service_account_dir=str(tmp_path / "none"),
        )
        assert server.url == api.url and not server.in_cluster
        assert len(server.list_pods(namespace=None, label_selector=AGENT_SELECTOR)) == 1
        with pytest.raises(ClusterError, match="cannot load kubeconfig"):
            connect(kubeconfig=str(config), context="nope", deadline_seconds=2)
    with pytest.raises(ClusterError, match="cannot load kubeconfig"):
        connect(kubeconfig=str(tmp_path / "missing"), context=None, deadline_seconds=2)
    with pytest.raises(ClusterError, match="cannot reach the Kubernetes API"):
        server.list_pods(namespace=None)


def test_in_cluster_when_the_service_account_is_mounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = self_signed_certificate(tmp_path / "tls")
    with FakeApiServer(tls=tls, token="in-cluster-token") as api:
        api.add_pod(agent_pods()[2])
        for key, value in api.service_account(tmp_path / "sa").items():
            monkeypatch.setenv(key, value)
        server = connect(
            kubeconfig=None,
            context=None,
            deadline_seconds=2,
            service_account_dir=str(tmp_path / "sa"),
        )
        assert server.in_cluster
        assert server.headers()["Authorization"].lower() == "bearer in-cluster-token"
        pods = server.list_pods(namespace=None, label_selector=AGENT_SELECTOR)
        assert [p["metadata"]["name"] for p in pods] == ["cluster-0"]


class _Configuration:
    """The fields of a kubernetes client Configuration that TLS reads."""

    def __init__(self, host: str, **fields: Any) -> None:
        self.host = host
        self.ssl_ca_cert = fields.get("ssl_ca_cert")
        self.ca_cert_data = None
        self.cert_file = fields.get("cert_file")
        self.key_file = fields.get("key_file")
        self.verify_ssl = fields.get("verify_ssl", True)
        self.tls_server_name = fields.get("tls_server_name")


def test_tls_context_carries_the_ca_and_the_client_certificate(tmp_path: Path) -> None:
    import ssl

    server_cert, server_key = self_signed_certificate(tmp_path / "server")
    client_cert, client_key = self_signed_certificate(tmp_path / "client")
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(server_cert, server_key)
    server_side.load_verify_locations(client_cert)
    server_side.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no answer
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    peers: list[str] = []

    def serve_once() -> None:
        conn, _ = listener.accept()
        with contextlib.suppress(OSError), server_side.wrap_socket(conn, server_side=True) as tls:
            peers.append(str(tls.getpeercert()["subject"]))
            tls.recv(65536)
            body = json.dumps(document("tls")).encode()
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    threading.Thread(target=serve_once, daemon=True).start()
    context = tls_context_of(
        _Configuration(
            f"https://127.0.0.1:{port}",
            ssl_ca_cert=str(server_cert),
            cert_file=str(client_cert),
            key_file=str(client_key),
        )
    )
    result = fetch_documents(
        [agent("a", f"https://127.0.0.1:{port}")],
        deadline_seconds=3,
        concurrency=1,
        tls_context=context,
    )
    listener.close()
    assert result.documents["a"].node == "tls", result.failures
    assert "fake-apiserver" in peers[0]
    assert tls_context_of(_Configuration("http://127.0.0.1:1")) is None
    insecure = tls_context_of(_Configuration("https://x", verify_ssl=False))
    assert insecure is not None and insecure.verify_mode == ssl.CERT_NONE
    with pytest.raises(ClusterError, match="tls-server-name"):
        tls_context_of(_Configuration("https://x", tls_server_name="api.internal"))


# --- agents behind --web-config-file (AgentAccess) ---

PASSWORD = "s3cret:with:colons-do-not-print"


def auth_file(tmp_path: Path, text: str = f"ledger-reader:{PASSWORD}\n") -> str:
    path = tmp_path / "auth"
    path.write_text(text)
    return str(path)


def basic(user_password: str) -> str:
    return "Basic " + base64.b64encode(user_password.encode()).decode()


def server_context(issued: Issued, sni: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(issued.cert_file, issued.key_file)
    if sni is not None:

        def record(_sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: object) -> None:
            sni.append(str(name))

        context.sni_callback = record
    return context


def ledger(node: str) -> Callable[[], bytes]:
    return lambda: json.dumps(document(node)).encode()


def test_https_agents_at_their_pod_ip_and_through_the_proxy() -> None:
    lister = Lister(*agent_pods())
    direct = find_agents(lister, namespace=None, nodes={"gpu-a"}, via="direct", scheme="https")
    assert [a.url for a in direct] == ["https://127.0.0.1:9402", "https://127.0.0.1:9404"]
    proxied = find_agents(
        lister,
        namespace=None,
        nodes={"gpu-a"},
        via="proxy",
        api_url="https://api.example:6443",
        scheme="https",
    )
    # The pods/proxy name is [scheme:]name[:port]: https: makes the API server speak TLS.
    assert [a.url for a in proxied] == [
        "https://api.example:6443/api/v1/namespaces/gpuledger/pods/https:node-a:9402/proxy",
        "https://api.example:6443/api/v1/namespaces/gpuledger/pods/https:cluster-0:9404/proxy",
    ]
    v6 = make_agent_pod("g", "n", component="node", node="x", port=9402, pod_ip="fd00::7")
    found = find_agents(Lister(v6), namespace=None, nodes=None, via="direct", scheme="https")
    assert found[0].url == "https://[fd00::7]:9402"
    with pytest.raises(ValueError, match="scheme"):
        find_agents(lister, namespace=None, nodes=None, via="direct", scheme="ftp")


def test_basic_auth_goes_to_direct_reads_only(agents: Agents, tmp_path: Path) -> None:
    access = AgentAccess(auth_file=auth_file(tmp_path))
    url = agents.serve(ledger("gpu-a"))
    port = int(url.rsplit(":", 1)[1])
    result = fetch_documents(
        [agent("gpu-a", url)], deadline_seconds=2, concurrency=1, access=access
    )
    assert result.documents["gpu-a"].node == "gpu-a", result.failures
    assert agents.authorizations == [basic(f"ledger-reader:{PASSWORD}")]
    with pytest.raises(ValueError, match="direct reads"):
        fetch_documents([], deadline_seconds=1, concurrency=1, headers={"X": "y"}, access=access)
    with FakeApiServer(token="t0k") as api:
        api.add_pod(make_agent_pod("g", "node-a", component="node", node="gpu-a", port=port))
        server = ApiServer(
            api.url,
            authorization=lambda: "Bearer t0k",
            tls_context=None,
            deadline_seconds=2,
            in_cluster=False,
        )
        # Through the pod proxy the API server would take the header for itself.
        with pytest.raises(ValueError, match="--via direct"):
            read_for_query(server, via="proxy", namespace=None, deadline_seconds=2, access=access)
        assert api.requests["proxy"] == 0
        direct = read_for_query(
            server, via="direct", namespace=None, deadline_seconds=2, access=access
        )
        proxied = read_for_query(
            server, via="proxy", namespace=None, deadline_seconds=2, access=AgentAccess()
        )
    assert direct.documents["gpu-a"] and proxied.documents["gpu-a"]
    # Direct: the agents' credentials, never the caller's token; proxied: the API server's
    # own request, the caller's headers left behind.
    assert agents.authorizations[1:] == [basic(f"ledger-reader:{PASSWORD}"), None]
    assert api.requests["proxy"] == 1


def test_the_ca_verifies_the_chain_and_the_name_only_when_given(
    agents: Agents, tmp_path: Path
) -> None:
    # cert-manager's kind of certificate: the Service's DNS name, not the pod IP read.
    issued = issue(tmp_path / "agents", dns_names=("gpuledger.monitoring.svc",))
    other = issue(tmp_path / "other", dns_names=("gpuledger.monitoring.svc",), ca_name="other")
    sni: list[str] = []
    url = agents.serve(ledger("gpu-a"), tls=server_context(issued, sni))

    def read(**settings: Any) -> str:
        access = AgentAccess(tls=True, **settings)
        result = fetch_documents(
            [agent("gpu-a", url)], deadline_seconds=3, concurrency=1, access=access
        )
        return "read" if "gpu-a" in result.documents else result.failures["gpu-a"]

    assert read(ca_file=str(issued.ca_file)) == "read"  # the chain, not the IP
    assert sni == ["None"]  # no SNI for an IP address
    sni.clear()
    named = read(ca_file=str(issued.ca_file), server_name="gpuledger.monitoring.svc")
    assert named == "read" and sni == ["gpuledger.monitoring.svc"]
    assert read(ca_file=str(issued.ca_file), server_name="other.monitoring.svc").endswith(
        "(tls_error)"
    )
    assert read(ca_file=str(other.ca_file)).endswith("(tls_error)")  # another CA's chain
    assert read().endswith("(tls_error)")  # the system's CAs, and the IP as the name
    assert read(server_name="gpuledger.monitoring.svc").endswith("(tls_error)")
    # A server certificate is not a CA: trusting it alone verifies nothing it did not sign.
    assert read(ca_file=str(issued.cert_file)).endswith("(tls_error)")


def test_access_files_that_cannot_be_used_are_one_line_without_their_content(
    tmp_path: Path,
) -> None:
    def refused(**settings: Any) -> str:
        with pytest.raises(AgentAccessError) as caught:
            AgentAccess(**settings).credentials()
        message = str(caught.value)
        assert "\n" not in message and "do-not-print" not in message
        return message

    missing = str(tmp_path / "missing")
    assert refused(auth_file=missing) == (
        f"--agent-auth-file {missing}: cannot read it: No such file or directory"
    )
    assert refused(auth_file=str(tmp_path)).endswith("cannot read it: Is a directory")
    no_colon = PASSWORD.replace(":", "")
    for text in (no_colon, f":{PASSWORD}", f"user:{PASSWORD}\nmore", "x" * 5000 + ":y"):
        assert refused(auth_file=auth_file(tmp_path, text)).endswith(
            "expected one line USER:PASSWORD"
        )
    assert refused(ca_file=missing).endswith("cannot read it: No such file or directory")
    not_pem = tmp_path / "not-a-ca"
    not_pem.write_text(PASSWORD)
    assert refused(ca_file=str(not_pem)) == f"--agent-ca-file {not_pem}: no CA certificate in it"
    # Every agent read with access that cannot be used is named with the reason.
    broken = AgentAccess(auth_file=missing)
    result = fetch_documents(
        [agent("a", "http://127.0.0.1:1"), agent("b", "")],
        deadline_seconds=1,
        concurrency=1,
        access=broken,
    )
    assert result.failures["a"] == (
        f"gpuledger/pod-a: --agent-auth-file {missing}: cannot read it: No such file or directory"
    )
    assert set(result.failures) == {"a", "b"}


def test_credentials_are_read_each_time_and_never_printed(tmp_path: Path) -> None:
    path = auth_file(tmp_path)
    access = AgentAccess(auth_file=path)
    first = access.credentials()
    assert first.headers == {"Authorization": basic(f"ledger-reader:{PASSWORD}")}
    assert PASSWORD not in repr(first) and "Basic" not in repr(first)
    Path(path).write_text("ledger-reader:rotated\r\n")
    assert access.credentials().headers == {"Authorization": basic("ledger-reader:rotated")}
    assert AgentAccess().credentials().headers == {}
    assert AgentAccess().credentials().tls_context is None  # HttpClient's default
    assert AgentAccess(tls=True).scheme == "https" and AgentAccess().scheme == "http"
