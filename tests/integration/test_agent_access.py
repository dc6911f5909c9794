"""Reading node agents behind `--web-config-file` (agents.AgentAccess, docs/explain.md,
docs/install.md "Restricting access"): the cluster view's cluster-wide /ledger and
`gpuledger explain`'s discovery, with the --agent-* flags and without.

Each agent is gpuledger's real HTTP server (server.serve) with a real web config file:
TLS from a certificate a test CA signed for `gpuledger.monitoring.svc` (not for the pod IP
it is read at, as with cert-manager) and basic auth with a bcrypt hash. Its /ledger.json
is the document of a simulated scenario run through the pipeline. Two simulated clusters,
each a fake API server listing the agents' pods: `protected` (TLS and basic auth) and
`tls_only` (TLS, no auth: what the API server's pod proxy can read).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import pytest

from gpuledger.cli import main
from gpuledger.cli.flags import build_parser
from gpuledger.cli.serve import cluster_ledger_page, serve_config
from gpuledger.document.v1 import LedgerDocument
from gpuledger.export.document import ledger_document
from gpuledger.export.published import Published
from gpuledger.pipeline import Pipeline
from gpuledger.sim.fake_apiserver import FakeApiServer, make_agent_pod, make_pod
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import load_scenario
from gpuledger.web.server import Exporter, GatedHTTPServer, serve
from gpuledger.web.webconfig import load_web_config
from tests.certs import Issued, issue
from tests.conftest import REPO

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
USER = "ledger-reader"
PASSWORD = "pw-of-the-cluster-view-do-not-print"
SERVER_NAME = "gpuledger.monitoring.svc"
TOKEN = "agent-access-api-token"
AGENTS = {"gpu-node-7": "explain-node", "e2e-node-1": "e2e-node"}


def _published(scenario: str) -> Published:
    """A scenario's snapshot once every simulated source answered (settled_document's
    loop, keeping what the exporter publishes rather than the document)."""
    with SimulatedNode(load_scenario(SCENARIOS / f"{scenario}.yaml")) as node:
        pipeline = Pipeline(node.pipeline_config(5.0))
        try:
            pipeline.warm_up(5.0)
            give_up = time.monotonic() + 5.0
            while True:
                published = pipeline.cycle()
                down = [s for s in published.ledger.sources if s.state == "down"]
                if not down or time.monotonic() > give_up:
                    return published
                time.sleep(0.1)
        finally:
            pipeline.close()


class Agent:
    """gpuledger's server for one published snapshot, behind a web config file."""

    def __init__(self, published: Published, web_config: Path, mode: str) -> None:
        exporter = Exporter(lambda: published, interval_seconds=60)
        exporter.run_once()
        node = published.ledger.node
        self.httpd: GatedHTTPServer = serve(
            exporter, "127.0.0.1:0", node, mode, load_web_config(str(web_config))
        )
        self.port = int(self.httpd.server_address[1])
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class Cluster:
    api: FakeApiServer
    kubeconfig: Path
    agents: dict[str, Agent] = field(default_factory=dict)  # node name or "cluster"


@dataclass
class World:
    issued: Issued
    other_ca: Path  # a CA that signed nothing the agents serve
    auth_file: Path
    cluster_doc: LedgerDocument
    protected: Cluster
    tls_only: Cluster
    stack: contextlib.ExitStack

    def access_flags(self, *, auth: bool = True) -> list[str]:
        flags = ["--agent-tls", "--agent-ca-file", str(self.issued.ca_file)]
        return flags + (["--agent-auth-file", str(self.auth_file)] if auth else [])


def _web_configs(directory: Path) -> tuple[Path, Path]:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    tls = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n"
    protected, tls_only = directory / "web-config.yml", directory / "web-tls-only.yml"
    protected.write_text(f"{tls}basic_auth_users:\n  {USER}: '{hashed}'\n")
    tls_only.write_text(tls)
    return protected, tls_only


def _cluster(
    stack: contextlib.ExitStack,
    kubeconfig: Path,
    published: dict[str, Published],
    web_config: Path,
    nodes: tuple[str, ...],
) -> Cluster:
    api = stack.enter_context(FakeApiServer(token=TOKEN))
    made = Cluster(api, api.kubeconfig(kubeconfig))
    for key in (*nodes, "cluster"):
        role = "cluster" if key == "cluster" else "node"
        agent = Agent(published[key], web_config, role)
        stack.callback(agent.close)
        made.agents[key] = agent
        api.add_pod(
            make_agent_pod(
                "monitoring",
                f"gpuledger-{role}-{key}",
                component=role,
                node=None if role == "cluster" else key,
                port=agent.port,
            )
        )
    api.add_pod(make_pod("serve", "llama-0", node="gpu-node-7", owner=("StatefulSet", "llama")))
    api.add_pod(make_pod("e2e-kv", "kv-0", node="e2e-node-1"))
    return made


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    directory = tmp_path_factory.mktemp("agent-access")
    issued = issue(directory / "web", dns_names=(SERVER_NAME,))
    other = issue(directory / "other", dns_names=(SERVER_NAME,), ca_name="other-ca")
    protected_config, tls_only_config = _web_configs(directory / "web")
    auth_file = directory / "auth"
    auth_file.write_text(f"{USER}:{PASSWORD}\n")
    published = {node: _published(scenario) for node, scenario in AGENTS.items()}
    published["cluster"] = _published("explain-cluster")
    with contextlib.ExitStack() as stack:
        yield World(
            issued=issued,
            other_ca=other.ca_file,
            auth_file=auth_file,
            cluster_doc=ledger_document(published["cluster"]),
            protected=_cluster(
                stack,
                directory / "protected.kubeconfig",
                published,
                protected_config,
                tuple(AGENTS),
            ),
            tls_only=_cluster(
                stack,
                directory / "tls-only.kubeconfig",
                published,
                tls_only_config,
                ("gpu-node-7",),
            ),
            stack=stack,
        )


SECRETS = (PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


def explain(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, *args: str
) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["explain", "--kubeconfig", str(cluster.kubeconfig), "--timeout", "5", *args])
    out, err = capsys.readouterr()
    assert_no_secret(out, err)
    return code, out, err


@pytest.fixture(autouse=True)
def _logs_hold_no_secret(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    assert_no_secret(caplog.text)


# --- explain ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [[], ["--agent-server-name", SERVER_NAME]])
def test_explain_direct_reads_agents_behind_tls_and_basic_auth(
    world: World, capsys: pytest.CaptureFixture[str], name: list[str]
) -> None:
    code, out, err = explain(
        capsys,
        world.protected,
        "--pod",
        "serve/llama-0",
        "--via",
        "direct",
        *world.access_flags(),
        *name,
    )
    assert code == 0, err
    assert "verdict: ENGINE QUEUEING" in out
    assert "could not be read" not in out


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--agent-tls", "--agent-ca-file", "{ca}"], "HTTP 401"),  # no credentials
        (["--agent-auth-file", "{auth}"], "(unreachable)"),  # plain HTTP to a TLS port
        (["--agent-tls", "--agent-auth-file", "{auth}"], "(tls_error)"),  # the system's CAs
        (
            ["--agent-tls", "--agent-ca-file", "{other}", "--agent-auth-file", "{auth}"],
            "(tls_error)",
        ),
        (
            ["--agent-tls", "--agent-ca-file", "{ca}", "--agent-server-name", "other.svc"],
            "(tls_error)",
        ),
    ],
)
def test_explain_names_protected_agents_it_cannot_read(
    world: World, capsys: pytest.CaptureFixture[str], flags: list[str], reason: str
) -> None:
    paths = {"ca": world.issued.ca_file, "other": world.other_ca, "auth": world.auth_file}
    given = [f.format(**paths) for f in flags]
    code, _, err = explain(
        capsys, world.protected, "--pod", "serve/llama-0", "--via", "direct", *given
    )
    assert code == 3  # neither the node agent nor the cluster view could be read
    warnings = [line for line in err.splitlines() if "could not read" in line]
    assert len(warnings) == 2, err
    assert all(reason in line for line in warnings), err
    assert "no ledger could be read" in err


def test_explain_from_a_port_forward_with_tls_and_basic_auth(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the docs offer instead of the proxy: kubectl port-forward, then --from.
    url = f"https://127.0.0.1:{world.protected.agents['gpu-node-7'].port}"
    code, out, err = explain(
        capsys, world.protected, "--from", url, "--pod", "serve/llama-0", *world.access_flags()
    )
    assert code == 0, err
    assert "verdict: ENGINE QUEUEING" in out
    code, out, _ = explain(capsys, world.protected, "--from", url, "--pod", "serve/llama-0")
    assert code == 3  # the system's CAs do not know the test CA


def test_explain_through_the_proxy_reads_tls_agents(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    api = world.tls_only.api
    before = api.requests["proxy"]
    code, out, err = explain(
        capsys, world.tls_only, "--pod", "serve/llama-0", "--via", "proxy", "--agent-tls"
    )
    assert code == 0, err
    assert "verdict: ENGINE QUEUEING" in out and "could not be read" not in out
    assert api.requests["proxy"] - before == 2  # the node agent and the cluster view
    # Without --agent-tls the API server speaks plain HTTP to a TLS port.
    code, _, err = explain(capsys, world.tls_only, "--pod", "serve/llama-0", "--via", "proxy")
    assert code == 3 and "HTTP 503: error trying to reach service" in err
    # Agents with basic auth cannot be read through the proxy: the answer is theirs, 401.
    code, _, err = explain(
        capsys, world.protected, "--pod", "serve/llama-0", "--via", "proxy", "--agent-tls"
    )
    assert code == 3 and "HTTP 401" in err


@pytest.mark.parametrize("via", [["--via", "proxy"], []])  # [] : proxy, the default outside
def test_an_auth_file_through_the_proxy_is_a_usage_error(
    world: World, capsys: pytest.CaptureFixture[str], via: list[str]
) -> None:
    before = world.protected.api.requests["proxy"]
    code, out, err = explain(
        capsys, world.protected, "--pod", "serve/llama-0", *via, *world.access_flags()
    )
    assert code == 2 and not out
    assert err.count("\n") == 1, err
    assert "--agent-auth-file cannot be used with --via proxy" in err
    assert "--via direct" in err and "kubectl port-forward" in err
    assert world.protected.api.requests["proxy"] == before


# --- the cluster view's /ledger --------------------------------------------------------------


def cluster_page(world: World, *flags: str) -> str:
    args = build_parser().parse_args(
        [
            "serve",
            "--mode",
            "cluster",
            "--kubeconfig",
            str(world.protected.kubeconfig),
            "--source-deadline",
            "5",
            *flags,
        ]
    )
    page = cluster_ledger_page(serve_config(args), args)
    assert page is not None
    status, html = page(world.cluster_doc, "")
    assert status == 200
    assert_no_secret(html)
    return html


def test_the_cluster_page_reads_protected_agents_with_the_flags(world: World) -> None:
    html = cluster_page(world, *world.access_flags())
    assert "Node agents: 2 of 2 read" in html
    assert "serve/llama" in html  # a workload of gpu-node-7's document
    for key in AGENTS:
        assert f"https://127.0.0.1:{world.protected.agents[key].port}" in html
    # An https:// --agent-url is read with the same CA and credentials.
    url = f"https://127.0.0.1:{world.tls_only.agents['gpu-node-7'].port}"
    html = cluster_page(world, *world.access_flags(), "--agent-url", url)
    assert "Node agents: 3 of 3 read" in html


def test_the_cluster_page_takes_the_settings_from_the_variables(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULEDGER_AGENT_TLS", "true")
    monkeypatch.setenv("GPULEDGER_AGENT_CA_FILE", str(world.issued.ca_file))
    monkeypatch.setenv("GPULEDGER_AGENT_SERVER_NAME", SERVER_NAME)
    monkeypatch.setenv("GPULEDGER_AGENT_AUTH_FILE", str(world.auth_file))
    assert "Node agents: 2 of 2 read" in cluster_page(world)


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        ([], "connection failed"),  # plain HTTP to a TLS port
        (["--agent-tls", "--agent-ca-file", "{ca}"], "HTTP 401"),
        (["--agent-tls", "--agent-auth-file", "{auth}"], "TLS handshake or certificate"),
        (["--agent-tls", "--agent-ca-file", "{other}", "--agent-auth-file", "{auth}"], "TLS"),
    ],
)
def test_the_cluster_page_names_agents_it_cannot_read(
    world: World, flags: list[str], reason: str
) -> None:
    paths = {"ca": world.issued.ca_file, "other": world.other_ca, "auth": world.auth_file}
    html = cluster_page(world, *(f.format(**paths) for f in flags))
    assert "Node agents: 0 of 2 read" in html
    unread = html.split('<ul id="unread">', 1)[1].split("</ul>", 1)[0]
    assert unread.count("<li>") == 2
    assert unread.count(reason) == 2, unread
