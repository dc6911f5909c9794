"""The cluster view's /ledger in a real headless Chromium, over real node agents.

Three `gpuledger simulate` node agents (two found through the fake API server's pod list by
the chart's labels, one given by --agent-url), one agent that accepts and never answers,
and `gpuledger serve --mode cluster` reading a simulated API server and Ray dashboard.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpuledger.sim.fake_apiserver import make_pod
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import load_scenario
from tests.conftest import REPO
from tests.e2e.prom_harness import Simulated, _stop, free_port
from tests.e2e.test_ledger_page import ARTIFACTS, HOSTILE, Table, _browse

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
DEADLINE = 2.0  # --source-deadline: also the page's one deadline for reading the agents


class CountingProxy:
    """Forwards GETs to one agent and counts its /ledger.json reads."""

    def __init__(self, target: str) -> None:
        self.ledger_reads = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/ledger.json"):
                    proxy.ledger_reads += 1
                with urllib.request.urlopen(f"http://{target}{self.path}", timeout=5) as r:
                    body = r.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HangingAgent:
    """Accepts connections, reads nothing, answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def agent_pod(node: str, port: int, component: str = "node") -> dict[str, Any]:
    """A pod of the chart's DaemonSet (or Deployment): its labels and `metrics` port."""
    pod = make_pod(
        "monitoring",
        f"gpuledger-{component}-{node}",
        node=node,
        labels={
            "app.kubernetes.io/name": "gpuledger",
            "app.kubernetes.io/part-of": "gpuledger",
            "app.kubernetes.io/component": component,
        },
        pod_ip="127.0.0.1",
    )
    pod["spec"]["containers"][0]["ports"] = [
        {"name": "metrics", "containerPort": port, "protocol": "TCP"}
    ]
    return pod


class ClusterView:
    """`gpuledger serve --mode cluster` on the simulated API server and Ray dashboard."""

    def __init__(self, sim: SimulatedNode, agent_urls: list[str]) -> None:
        assert sim.apiserver is not None and sim.ray is not None
        self.target = f"127.0.0.1:{free_port()}"
        flags = [f"--agent-url={u}" for u in agent_urls]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuledger",
                "serve",
                "--mode",
                "cluster",
                "--listen",
                self.target,
                "--interval",
                "0.5",
                "--source-deadline",
                str(DEADLINE),
                "--log-level",
                "warning",
                "--node-name",
                "gpuledger-cluster",
                "--kubeconfig",
                str(sim.kubeconfig),
                "--ray-address",
                sim.ray.url,
                "--ray-workload",
                "ml/raycluster-big",
                *flags,
            ],
            env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        give_up = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.target}/ledger.json", timeout=2) as r:
                    doc = json.loads(r.read())
                # Every configured source up (DRA is not_configured: the fake API
                # server serves no resource.k8s.io here, as a cluster without DRA).
                if doc["pending"] and all(
                    s["up"] or s.get("state") == "not_configured" for s in doc["sources"]
                ):
                    return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                stderr = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"the cluster view exited:\n{stderr[-3000:]}")
            assert time.monotonic() < give_up, "the cluster view never saw the pending pods"
            time.sleep(0.2)

    def get(self, path: str) -> tuple[int, str, float]:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://{self.target}{path}", timeout=30) as r:
                return r.status, r.read().decode(), time.monotonic() - started
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), time.monotonic() - started

    def close(self) -> None:
        _stop(self.proc)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class Cluster:
    def __init__(self, stack: list[Any]) -> None:
        self.stack = stack
        nodes = [Simulated(SCENARIOS / f"cluster-node-{n}.yaml") for n in ("a", "b")]
        hostile = Simulated(HOSTILE)
        stack.extend([*nodes, hostile])
        for agent in (*nodes, hostile):
            agent.wait_ready()
        self.proxy = CountingProxy(nodes[1].target)  # node b is read through it
        self.hanging = HangingAgent()
        self.sim = SimulatedNode(load_scenario(SCENARIOS / "cluster-view.yaml"))
        stack.extend([self.proxy, self.hanging, self.sim])
        assert self.sim.apiserver is not None
        self.sim.apiserver.add_pod(agent_pod("gpu-node-a", nodes[0].port))
        self.sim.apiserver.add_pod(agent_pod("gpu-node-b", self.proxy.port))
        self.view = ClusterView(self.sim, [f"http://{hostile.target}", self.hanging.url])
        stack.append(self.view)
        # The cluster view's own pod carries the labels too: it is not a node agent.
        port = int(self.view.target.rsplit(":", 1)[1])
        self.sim.apiserver.add_pod(agent_pod("cpu-node-1", port, "cluster"))
        self.view.wait_ready()
        # The first load reads every agent: it must not wait past the one deadline.
        self.first = self.view.get("/ledger")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    stack: list[Any] = []
    try:
        yield Cluster(stack)
    finally:
        for item in reversed(stack):
            item.close()


def page_of(dom: str) -> Table:
    page = Table()
    page.feed(dom)
    return page


def test_every_workload_stage_across_nodes_pending_and_ray(cluster: Cluster) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "ledger-cluster.png"
    dom = _browse(f"http://{cluster.view.target}/ledger", shot)
    page = page_of(dom)
    assert shot.stat().st_size > 10_000
    assert "SIMULATED DATA: node node-&lt;b&gt;bold&lt;/b&gt;, gpu-node-a, gpu-node-b" in dom
    workloads = {row[0]: row for row in page.tables["workloads"][1:]}
    stages = {name: row[3] for name, row in workloads.items()}
    assert stages == {
        "serve/chat": "routing (imbalance)",  # a queue on node a, headroom on node b
        "serve/llama": "engine_queueing (kv_cache)",
        "serve/qwen": "starting (pod_not_ready)",
        "research/notebook-bob": "no_engine",
        "batch/train": "pending_placement (insufficient_gpu)",
        "ml/raycluster-big": "pending_placement (ray_infeasible)",
        '<script>alert(1)</script>/evil"pod': "pending_placement (scheduling_gated)",
        "<img src=x onerror=alert(1)>/<script>alert(3)</script>": "engine_queueing (kv_cache)",
    }
    assert workloads["serve/chat"][1] == "gpu-node-agpu-node-b"  # one per line
    pending = {row[0]: row for row in page.tables["pending"][1:]}
    assert pending["batch/train-0"][2:4] == ["insufficient_gpu", "8"]
    assert '<script>alert(1)</script>/evil"pod' in pending
    ray = page.tables["ray"][1:]
    assert [(r[0], r[2]) for r in ray] == [("ml/raycluster-big", "1 PENDING (INFEASIBLE)")]
    agents = {row[0]: row for row in page.tables["agents"][1:]}
    assert agents["gpu-node-a"][1] == "monitoring/gpuledger-node-gpu-node-a"
    assert agents["gpu-node-a"][3] == agents["node-<b>bold</b>"][3] == "read"
    for tag in ("script", "img", "svg", "b", "i"):  # hostile names stay text
        assert tag not in page.elements, tag


def test_a_workload_chain_spans_its_nodes(cluster: Cluster) -> None:
    shot = ARTIFACTS / "ledger-cluster-workload.png"
    page = page_of(_browse(f"http://{cluster.view.target}/ledger?workload=serve%2Fchat", shot))
    pods = ("serve/chat-0", "serve/chat-1")  # the pod cell: name, then its UID
    chain = {p: row for row in page.tables["chain"][1:] for p in pods if row[0].startswith(p)}
    assert chain["serve/chat-0"][1] == "gpu-node-a" and chain["serve/chat-1"][1] == "gpu-node-b"
    assert "25 waiting, 32 running" in chain["serve/chat-0"][3]
    assert "GPU-b0000000-0000-4000-8000-000000000000" in chain["serve/chat-1"][4]
    assert "VLLM::EngineCore holds cuda:0" in chain["serve/chat-0"][5]
    status, body, _ = cluster.view.get("/ledger?workload=serve%2Fnone")
    assert status == 404 and "is in no ledger read" in body


def test_a_hanging_agent_is_named_and_the_page_keeps_its_deadline(cluster: Cluster) -> None:
    status, body, seconds = cluster.first
    assert status == 200
    assert seconds < DEADLINE + 1.5, f"the first page load took {seconds:.1f}s"
    unread = page_of(body)
    agents = {row[2]: row for row in unread.tables["agents"][1:]}
    assert agents[cluster.hanging.url][3].startswith("not read:")
    assert "(timeout)" in agents[cluster.hanging.url][3]
    assert "Node agents: 3 of 4 read" in body


def test_reads_are_reused_across_page_loads(cluster: Cluster) -> None:
    before = cluster.proxy.ledger_reads
    assert before >= 1  # the earlier loads read node b through the proxy
    held = len(cluster.hanging.held)
    first = cluster.view.get("/ledger")
    after_first = cluster.proxy.ledger_reads
    second = cluster.view.get("/ledger?workload=serve%2Fchat")
    assert first[0] == second[0] == 200
    assert after_first - before <= 1  # at most one refresh, if the earlier read expired
    assert cluster.proxy.ledger_reads == after_first  # the second load read nothing
    assert len(cluster.hanging.held) - held <= 1  # the hanging agent was not asked again


def test_the_node_agent_page_is_unchanged(cluster: Cluster) -> None:
    node = cluster.stack[0]
    status, body = 0, ""
    with urllib.request.urlopen(f"http://{node.target}/ledger?workload=serve%2Fchat") as r:
        status, body = r.status, r.read().decode()
    assert status == 200 and "GPU ledger of node" in body and 'id="gpus"' in body


def test_the_landing_pages_say_what_each_ledger_covers(cluster: Cluster) -> None:
    status, body, _ = cluster.view.get("/")
    assert status == 200 and "mode <b>cluster</b>" in body
    assert "every workload in the cluster" in body and "this node's ledger" not in body
    node = cluster.stack[0]
    with urllib.request.urlopen(f"http://{node.target}/") as r:
        assert "this node's ledger" in r.read().decode()
