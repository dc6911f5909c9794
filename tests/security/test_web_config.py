"""`--web-config-file` (gpuledger/web/webconfig.py): TLS, client certificates, basic auth and
extra headers in the exporter-toolkit format, as a scraper and a kubelet probe see them,
and one line + exit 2 for every file the exporter cannot use."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from gpuledger.sim.fake_apiserver import self_signed_certificate
from gpuledger.web import webconfig
from gpuledger.web.server import GatedHTTPServer, serve
from gpuledger.web.webconfig import WebConfig, WebConfigError, load_web_config
from tests.reliability.harness import Node
from tests.reliability.scenarios import churn_node
from tests.security.helpers import gpuledger

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    made = Node(churn_node(2), tmp_path_factory.mktemp("node"), deadline=2.0)
    made.cycle()
    yield made
    made.close()


def _hash(password: str) -> str:
    # $2y$ is what htpasswd writes and what the exporter-toolkit docs show.
    return (
        bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4))
        .decode()
        .replace("$2b$", "$2y$", 1)
    )


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return str(path)


class Served:
    def __init__(self, node: Node, web: WebConfig) -> None:
        self.httpd: GatedHTTPServer = serve(node.exporter, "127.0.0.1:0", "n", "node", web)
        self.port = int(self.httpd.server_address[1])
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(node: Node) -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for one in started:
        one.close()


def get(
    url: str,
    *,
    context: ssl.SSLContext | None = None,
    auth: tuple[str, str] | None = None,
    method: str = "GET",
) -> tuple[int, dict[str, str], bytes]:
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def client_context(ca: Path, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def test_tls_serves_metrics_and_refuses_plain_http(
    node: Node, served: list[Served], tmp_path: Path
) -> None:
    cert, key = self_signed_certificate(tmp_path)
    path = _write(tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    server = Served(node, load_web_config(path))
    served.append(server)
    status, _, body = get(f"https://127.0.0.1:{server.port}/metrics", context=client_context(cert))
    assert status == 200 and b"gpuledger_gpu_info" in body
    # Plain HTTP on the TLS port gets no answer, and costs the server nothing lasting.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        get(f"http://127.0.0.1:{server.port}/metrics")
    status, _, _ = get(f"https://127.0.0.1:{server.port}/healthz", context=client_context(cert))
    assert status == 200


def test_a_slow_tls_handshake_holds_no_one_else_up(
    node: Node, served: list[Served], tmp_path: Path
) -> None:
    cert, key = self_signed_certificate(tmp_path)
    path = _write(tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    server = Served(node, load_web_config(path))
    served.append(server)
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(50)]
    for sock in stalled:
        sock.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, then nothing
    try:
        started = time.monotonic()
        status, _, _ = get(f"https://127.0.0.1:{server.port}/metrics", context=client_context(cert))
        assert status == 200
        assert time.monotonic() - started < 5  # not behind 50 handshakes' head timeouts
    finally:
        for sock in stalled:
            sock.close()


def test_client_certificates_required_and_verified(
    node: Node, served: list[Served], tmp_path: Path
) -> None:
    cert, key = self_signed_certificate(tmp_path / "server")
    client_cert, client_key = self_signed_certificate(tmp_path / "client")
    path = _write(
        tmp_path,
        "tls_server_config:\n"
        f"  cert_file: {cert}\n  key_file: {key}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {client_cert}\n",
    )
    server = Served(node, load_web_config(path))
    served.append(server)
    url = f"https://127.0.0.1:{server.port}/metrics"
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(url, context=client_context(cert))
    status, _, _ = get(url, context=client_context(cert, (client_cert, client_key)))
    assert status == 200


def test_a_rotated_certificate_is_served_without_a_restart(
    node: Node, served: list[Served], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webconfig, "RELOAD_CHECK_SECONDS", 0.0)
    cert, key = self_signed_certificate(tmp_path)
    path = _write(tmp_path, f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    server = Served(node, load_web_config(path))
    served.append(server)

    def served_certificate() -> bytes:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            with context.wrap_socket(raw) as tls:
                der = tls.getpeercert(binary_form=True)
                assert der is not None
                return der

    before = served_certificate()
    rotated = tmp_path / "rotated"
    new_cert, new_key = self_signed_certificate(rotated)
    time.sleep(0.01)  # a later mtime than the first files'
    cert.write_bytes(new_cert.read_bytes())
    key.write_bytes(new_key.read_bytes())
    assert served_certificate() == ssl.PEM_cert_to_DER_cert(new_cert.read_text()) != before


def test_basic_auth_guards_data_but_not_probes(
    node: Node, served: list[Served], tmp_path: Path
) -> None:
    path = _write(
        tmp_path,
        f"basic_auth_users:\n  prometheus: '{_hash(PASSWORD)}'\n"
        "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
    )
    server = Served(node, load_web_config(path))
    served.append(server)
    base = f"http://127.0.0.1:{server.port}"
    for path_ in ("/metrics", "/ledger", "/ledger.json", "/"):
        status, headers, body = get(base + path_)
        assert status == 401, path_
        assert headers["WWW-Authenticate"] == 'Basic realm="gpuledger"'
        assert b"gpuledger_" not in body and b"GPU-" not in body
        assert get(base + path_, auth=("prometheus", "wrong"))[0] == 401
        assert get(base + path_, auth=("someone", PASSWORD))[0] == 401
        status, headers, _ = get(base + path_, auth=("prometheus", PASSWORD))
        assert status == 200, path_
        assert headers["X-Frame-Options"] == "deny"
    assert get(base + "/metrics", method="HEAD")[0] == 401
    # The kubelet's probes carry no credentials.
    assert get(base + "/healthz")[0] == 200
    assert get(base + "/readyz")[0] == 200


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config:\n  cert_file: /nope.crt\n  key_file: /nope.key\n", "/nope.crt"),
        ("tls_config:\n  cert_file: a\n", "unknown key 'tls_config'"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n",
            "cipher_suites is not supported",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS9\n",
            "min_version must be one of",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n"
            "  client_auth_type: RequireAndVerifyClientCert\n",
            "needs tls_server_config.client_ca",
        ),
        ("basic_auth_users:\n  alice: hunter2\n", "expected a bcrypt hash"),
        ("basic_auth_users: [alice]\n", "must be a mapping"),
        ("http_server_config:\n  http2: false\n", "http2 is not supported"),
        ("[unclosed\n", "is not YAML"),
    ],
)
def test_an_unusable_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(WebConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        load_web_config(_write(tmp_path, text))


def test_serve_exits_2_with_one_line_and_no_secret(tmp_path: Path) -> None:
    # A plain-text password where a hash belongs: refused, and never echoed.
    path = _write(tmp_path, "basic_auth_users:\n  alice: hunter2-plaintext\n")
    result = gpuledger("serve", "--web-config-file", path, "--kubernetes", "off")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--web-config-file" in lines[0] and "bcrypt hash" in lines[0]
    assert "hunter2" not in result.stderr + result.stdout
    missing = gpuledger("serve", "--web-config-file", str(tmp_path / "absent.yml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
