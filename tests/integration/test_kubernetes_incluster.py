"""The informer as the DaemonSet runs it: in-cluster config, HTTPS, a bearer token.

The fake API server serves TLS with its own certificate and answers 401 without the
token, so these tests exercise the client's in-cluster loader (service host/port from
the environment, token and CA from the service-account directory) end to end, and the
lean import of the client that keeps the node agent small (net/kubeapi.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuledger.sim.fake_apiserver import FakeApiServer, make_pod, self_signed_certificate
from gpuledger.sources.base import SourceError
from gpuledger.sources.kubernetes.pods import PodInformer

NODE = "gpu-node-1"
TOKEN = "in-cluster-token-7f3c"
EXPORTER = Path(__file__).resolve().parents[2] / "exporter"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def server(certificate: tuple[Path, Path]) -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.2, tls=certificate, token=TOKEN) as fake:
        fake.add_pod(make_pod("serving", "vllm-0", node=NODE))
        fake.add_pod(make_pod("other", "elsewhere", node="gpu-node-2"))
        yield fake


@pytest.fixture
def account(server: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The service account directory and environment a pod would get."""
    for name, value in server.service_account(tmp_path / "sa").items():
        monkeypatch.setenv(name, value)
    return tmp_path / "sa"


def informer_in_cluster(account: Path) -> PodInformer:
    return PodInformer(
        "node",
        node_name=NODE,
        service_account_dir=str(account),
        watch_timeout_seconds=2,
        request_timeout_seconds=2.0,
        backoff_base_seconds=0.05,
        backoff_cap_seconds=0.3,
    )


def outcome(informer: PodInformer, timeout: float = 8.0) -> tuple[str, str] | set[str]:
    """Pod names once synced, else the (reason, message) the source reports."""
    deadline = time.monotonic() + timeout
    result: tuple[str, str] | set[str] = ("never", "")
    while time.monotonic() < deadline:
        try:
            return {p.name for p in informer.fetch().pods}
        except SourceError as exc:
            result = (exc.reason, exc.message)
            if exc.reason not in ("not_synced",):
                return result
        time.sleep(0.05)
    return result


def test_in_cluster_config_over_tls_with_the_token(server: FakeApiServer, account: Path) -> None:
    informer = informer_in_cluster(account)
    try:
        assert outcome(informer) == {"vllm-0"}
        # The watch runs over the same authenticated TLS connection setup.
        server.add_pod(make_pod("serving", "vllm-1", node=NODE))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and outcome(informer) != {"vllm-0", "vllm-1"}:
            time.sleep(0.05)
        assert outcome(informer) == {"vllm-0", "vllm-1"}
    finally:
        informer.stop()


def test_wrong_token_is_unauthorized_and_never_printed(account: Path) -> None:
    (account / "token").write_text("stale-token-from-another-cluster")
    informer = informer_in_cluster(account)
    try:
        result = outcome(informer)
        assert isinstance(result, tuple)
        reason, message = result
        assert reason == "unauthorized"
        assert "stale-token" not in message and "127.0.0.1" in message
    finally:
        informer.stop()


def test_a_certificate_from_another_ca_is_refused(
    server: FakeApiServer, account: Path, tmp_path: Path
) -> None:
    other_cert, _ = self_signed_certificate(tmp_path / "other")
    (account / "ca.crt").write_bytes(other_cert.read_bytes())
    informer = informer_in_cluster(account)
    try:
        result = outcome(informer)
        assert isinstance(result, tuple) and result[0] == "tls"
        assert server.requests["list"] == 0  # no request got past the TLS handshake
    finally:
        informer.stop()


@pytest.mark.parametrize(
    ("remove", "expected"),
    [
        ("env", "Service host/port is not set."),
        ("token", "Service token file does not exist."),
        ("ca.crt", "Service certification file does not exist."),
    ],
)
def test_missing_in_cluster_pieces_are_a_config_error(
    account: Path, monkeypatch: pytest.MonkeyPatch, remove: str, expected: str
) -> None:
    if remove == "env":
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    else:
        (account / remove).unlink()
    informer = informer_in_cluster(account)
    try:
        assert outcome(informer) == (
            "config",
            f"cannot load the in-cluster Kubernetes configuration: {expected}",
        )
    finally:
        informer.stop()


# Loaded by `import kubernetes` or by the generated CoreV1Api, never used by the agent.
HEAVY_MODULES = (
    "kubernetes.client.api.core_v1_api",
    "kubernetes.client.models.v1_pod",
    "kubernetes.config.kube_config",
    "kubernetes.dynamic",
    "kubernetes.stream",
    "kubernetes.leaderelection",
    "oauthlib",
    "google.auth",
)

AGENT = """
import json, sys, time
from gpuledger.cli import main  # everything `gpuledger serve` imports
from gpuledger.sources.kubernetes.pods import PodInformer
informer = PodInformer("node", node_name=sys.argv[1], service_account_dir=sys.argv[2])
ok = informer.wait_synced(10)
names = sorted(p.name for p in informer.fetch().pods) if ok else []
informer.stop()
print(json.dumps({"names": names, "heavy": [m for m in sys.argv[3:] if m in sys.modules]}))
"""


def test_the_node_agent_loads_only_the_client_parts_it_uses(
    server: FakeApiServer, tmp_path: Path
) -> None:
    """A fresh process, as the DaemonSet starts: in-cluster sync works and none of the
    client's optional parts (dynamic client, OIDC/GCP auth, 250 API models; ~35 MB of
    RSS together) is imported."""
    env = {**os.environ, **server.service_account(tmp_path / "sa"), "PYTHONPATH": str(EXPORTER)}
    done = subprocess.run(
        [sys.executable, "-c", AGENT, NODE, str(tmp_path / "sa"), *HEAVY_MODULES],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"names": ["vllm-0"], "heavy": []}
