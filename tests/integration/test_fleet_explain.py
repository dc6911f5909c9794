"""`gpuledger explain` finding the agents by itself (agents.py, docs/explain.md).

A simulated cluster: three node agents and the cluster view, each a loopback server
answering /ledger.json with the real document of a scenario run through the pipeline;
their pods (chart labels, pod IP 127.0.0.1, port `metrics`) and the workloads' pods in
the fake API server, which also serves the pods/proxy subresource.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import tomllib
from collections.abc import Iterator
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli import kubectl_main, main
from gpuledger.explain import agents as agents_module
from gpuledger.export.document import document_bytes
from gpuledger.sim.fake_apiserver import (
    FakeApiServer,
    make_agent_pod,
    make_pod,
    pod_scheduled_false,
    self_signed_certificate,
)
from gpuledger.sim.harness import settled_document
from gpuledger.sim.scenario import load_scenario
from tests.conftest import REPO

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
NODES = {"gpu-node-7": "explain-node", "e2e-node-1": "e2e-node", "e2e-node-2": "e2e-phases"}
TOKEN = "fleet-explain-token"
TIMEOUT = 2.0


@cache
def document(scenario: str) -> bytes:
    return document_bytes(settled_document(load_scenario(SCENARIOS / f"{scenario}.yaml")))


class AgentServer:
    """One exporter's /ledger.json: answers, hangs (headers a byte a second) or is down."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.behaviour = "ok"
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests += 1
                if outer.behaviour == "hang":
                    with contextlib.suppress(OSError):
                        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"z" * 60:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(1)
                    return
                self.send_response(200 if self.path == "/ledger.json" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def down(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Cluster:
    def __init__(self, api: FakeApiServer, kubeconfig: Path) -> None:
        self.api = api
        self.kubeconfig = kubeconfig
        self.agents: dict[str, AgentServer] = {}

    def counts(self) -> dict[str, int]:
        return {key: agent.requests for key, agent in self.agents.items()}

    def explain(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["explain", "--kubeconfig", str(self.kubeconfig), *args])
        out, err = capsys.readouterr()
        return code, out, err


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with FakeApiServer(token=TOKEN) as api:
        api.proxy_deadline = 5.0  # a hanging agent holds the proxy's read no longer
        made = Cluster(api, api.kubeconfig(tmp_path / "kubeconfig"))
        for node, scenario in NODES.items():
            made.agents[node] = AgentServer(document(scenario))
            api.add_pod(
                make_agent_pod(
                    "monitoring",
                    f"gpuledger-node-{node}",
                    component="node",
                    node=node,
                    port=made.agents[node].port,
                )
            )
        made.agents["cluster"] = AgentServer(document("explain-cluster"))
        api.add_pod(
            make_agent_pod(
                "monitoring",
                "gpuledger-cluster-0",
                component="cluster",
                port=made.agents["cluster"].port,
            )
        )
        for name in ("chat-0", "chat-1", "llama-0"):
            owner = ("StatefulSet", name.split("-")[0])
            api.add_pod(make_pod("serve", name, node="gpu-node-7", owner=owner))
        api.add_pod(
            make_pod(
                "serve",
                "chat-2",
                phase="Pending",
                owner=("StatefulSet", "chat"),
                conditions=[pod_scheduled_false("Unschedulable", "0/12 nodes are available")],
            )
        )
        api.add_pod(make_pod("e2e-kv", "kv-0", node="e2e-node-1"))
        yield made
        for agent in made.agents.values():
            with contextlib.suppress(OSError):
                agent.down()


@pytest.mark.parametrize("via", ["proxy", "direct"])
def test_a_pod_is_explained_from_its_node_and_the_cluster_view_only(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], via: str
) -> None:
    code, out, err = cluster.explain(capsys, "--pod", "serve/llama-0", "--via", via)
    assert code == 0, err
    assert "workload serve/llama\n" in out
    assert "  pod serve/llama-0  uid cccccccc-5555-4666-8777-cccccccccccc  node gpu-node-7" in out
    assert "    engine vllm meta-llama/Llama-3.1-70B-Instruct  DP rank 0  up  TP 4 x PP 1" in out
    assert "ordinal 3 -> GPU-45000000-0000-4000-8000-000000000005  host index 5" in out
    assert "process 3003 VLLM::Worker_TP1  holds cuda:1 = GPU-43000000" in out
    assert "  verdict: ENGINE QUEUEING (requests wait inside the engine) — kv_cache" in out
    assert "could not be read" not in out
    assert cluster.counts() == {"gpu-node-7": 1, "e2e-node-1": 0, "e2e-node-2": 0, "cluster": 1}
    assert cluster.api.requests["proxy"] == (2 if via == "proxy" else 0)


def test_the_default_outside_the_cluster_is_the_proxy(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cluster.explain(capsys, "--workload", "serve/chat", "--output", "json")
    assert code == 0, err
    assert cluster.api.requests["proxy"] == 2
    assert cluster.counts() == {"gpu-node-7": 1, "e2e-node-1": 0, "e2e-node-2": 0, "cluster": 1}


def test_a_pending_pod_is_answered_by_the_cluster_view(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cluster.explain(capsys, "--workload", "serve/chat", "--output", "json")
    assert code == 0, err
    result = json.loads(out)
    verdict = result["workloads"][0]["verdict"]
    assert (verdict["stage"], verdict["reason"]) == ("pending_placement", "insufficient_gpu")
    assert result["unreadable"] == {}
    code, out, _ = cluster.explain(capsys, "--pod", "serve/chat-2")
    assert code == 0
    assert "pod serve/chat-2  uid ffffffff-5555-4666-8777-ffffffffffff  NOT PLACED" in out
    # chat-2 has no node: its query reads the cluster view alone.
    assert cluster.counts()["cluster"] == 2 and cluster.counts()["gpu-node-7"] == 1


@pytest.mark.parametrize("via", ["proxy", "direct"])
def test_a_hanging_and_a_dead_agent_are_named_and_the_rest_explained(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], via: str
) -> None:
    cluster.agents["e2e-node-1"].behaviour = "hang"
    cluster.agents["e2e-node-2"].down()
    started = time.monotonic()
    code, out, err = cluster.explain(
        capsys, "--gpu", "GPU-47", "--via", via, "--timeout", str(TIMEOUT), "--output", "json"
    )
    elapsed = time.monotonic() - started
    assert code == 0, err
    assert elapsed < TIMEOUT + 3, f"{elapsed:.1f}s for a {TIMEOUT}s deadline"
    result = json.loads(out)
    assert [w["workload"] for w in result["workloads"]] == ["notebook-bob"]
    unreadable = result["unreadable"]
    assert sorted(unreadable) == ["e2e-node-1", "e2e-node-2"]
    assert unreadable["e2e-node-1"].startswith("monitoring/gpuledger-node-e2e-node-1: ")
    assert "(timeout)" in unreadable["e2e-node-1"]
    assert "refused" in unreadable["e2e-node-2"]
    assert TOKEN not in out and TOKEN not in err
    assert any(u.startswith("e2e-node-1: could not be read: ") for u in result["unknowns"])
    capsys.readouterr()
    code = main(["explain", "--kubeconfig", str(cluster.kubeconfig), "--gpu", "GPU-47",
                 "--via", via, "--timeout", str(TIMEOUT)])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0
    assert "unknown: e2e-node-2: could not be read: monitoring/gpuledger-node-e2e-node-2" in text
    assert "GPU GPU-47000000-0000-4000-8000-000000000007  index 7 on node gpu-node-7" in text


def test_a_node_without_an_agent_is_named(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.api.add_pod(make_pod("serve", "lone-0", node="gpu-node-99"))
    code, _, err = cluster.explain(capsys, "--pod", "serve/lone-0")
    assert code == 1  # in no ledger read
    assert "could not read gpu-node-99: no gpuledger node agent found on this node" in err


def test_agents_namespace_narrows_the_search(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cluster.explain(
        capsys, "--pod", "serve/llama-0", "--agents-namespace", "elsewhere"
    )
    assert code == 3
    assert "could not read gpu-node-7: no gpuledger node agent found" in err
    assert "no ledger could be read" in err
    assert sum(cluster.counts().values()) == 0


def test_an_api_server_that_cannot_be_used_is_one_line_and_exit_3(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    assert main(["explain", "--kubeconfig", str(missing), "--pod", "serve/llama-0"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot load kubeconfig {missing}" in err
    cluster.api.set_fault("forbidden")
    code, _, err = cluster.explain(capsys, "--pod", "serve/llama-0")
    assert code == 3 and err.count("\n") == 1 and "HTTP 403: pods is forbidden" in err
    cluster.api.set_fault("hang")
    started = time.monotonic()
    code, _, err = cluster.explain(capsys, "--pod", "serve/llama-0", "--timeout", "1")
    assert code == 3 and "(timeout)" in err and time.monotonic() - started < 4
    cluster.api.set_fault("refuse")
    code, _, err = cluster.explain(capsys, "--pod", "serve/llama-0")
    assert code == 3 and err.count("\n") == 1
    assert "cannot reach the Kubernetes API" in err and "(refused)" in err
    assert "Traceback" not in err and TOKEN not in err


def test_from_wins_over_the_kubeconfig(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.api.set_fault("refuse")  # not asked at all
    url = f"http://127.0.0.1:{cluster.agents['gpu-node-7'].port}"
    code, out, err = cluster.explain(capsys, "--from", url, "--pod", "serve/llama-0")
    assert code == 0, err
    assert "verdict: ENGINE QUEUEING" in out
    with socket.create_server(("127.0.0.1", 0)) as closed:
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    code, out, err = cluster.explain(
        capsys, "--from", url, "--from", dead, "--pod", "serve/llama-0"
    )
    assert code == 0
    assert f"unknown: {dead}: could not be read: " in out


def test_in_cluster_reads_the_pod_ips_with_the_service_account(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = self_signed_certificate(tmp_path / "tls")
    with FakeApiServer(tls=tls, token=TOKEN) as api:
        agent = AgentServer(document("explain-node"))
        view = AgentServer(document("explain-cluster"))
        api.add_pod(make_agent_pod("g", "n", component="node", node="gpu-node-7", port=agent.port))
        api.add_pod(make_agent_pod("g", "c", component="cluster", port=view.port))
        api.add_pod(make_pod("serve", "llama-0", node="gpu-node-7"))
        for key, value in api.service_account(tmp_path / "sa").items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(agents_module, "SERVICE_ACCOUNT_DIR", str(tmp_path / "sa"))
        code = main(["explain", "--pod", "serve/llama-0"])
        out = capsys.readouterr().out
        agent.down()
        view.down()
    assert code == 0
    assert "verdict: ENGINE QUEUEING" in out
    assert api.requests["proxy"] == 0  # direct, the in-cluster default
    assert (agent.requests, view.requests) == (1, 1)


def test_the_kubectl_plugin_is_explain(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-gpuledger"] == "gpuledger.cli:kubectl_main"
    capsys.readouterr()
    code = kubectl_main(["--kubeconfig", str(cluster.kubeconfig), "--pod", "serve/llama-0"])
    assert code == 0
    assert "verdict: ENGINE QUEUEING" in capsys.readouterr().out
