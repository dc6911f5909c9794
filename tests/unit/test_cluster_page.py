"""The cluster page's agent reads: reused for the TTL, bounded, failures named, escaped."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli import main
from gpuledger.document.codec import from_json
from gpuledger.document.v1 import SCHEMA, LedgerDocument
from gpuledger.explain.agents import Agent, ClusterError, FetchResult
from gpuledger.web.cluster_page import (
    AgentRead,
    AgentReader,
    Discovery,
    Reading,
    render,
    static_agents,
)


def agent(node: str) -> Agent:
    return Agent(
        node=node, namespace="monitoring", pod=f"gl-{node}", url=f"http://{node}", role="node"
    )


class Fetcher:
    """Answers for every agent: a document, or a failure for the nodes in `failing`."""

    def __init__(self, failing: Sequence[str] = ()) -> None:
        self.failing = set(failing)
        self.asked: list[list[str]] = []

    def __call__(self, agents: Sequence[Agent]) -> FetchResult:
        self.asked.append([a.key for a in agents])
        docs = {
            a.key: LedgerDocument(schema=SCHEMA, node=a.key)
            for a in agents
            if a.key not in self.failing
        }
        failures = {
            a.key: f"{a.namespace}/{a.pod}: {a.url}/ledger.json: no answer (timeout)"
            for a in agents
            if a.key in self.failing
        }
        return FetchResult(docs, failures)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reader(agents: list[Agent], fetch: Fetcher, clock: Clock, **kw: Any) -> AgentReader:
    return AgentReader(
        lambda: (list(agents), []), deadline_seconds=1, fetch=fetch, clock=clock, **kw
    )


def test_a_read_is_reused_for_the_ttl_then_read_again() -> None:
    fetch, clock = Fetcher(failing=["b"]), Clock()
    r = reader([agent("a"), agent("b")], fetch, clock, ttl_seconds=10)
    first = r.read()
    clock.now += 9.9
    r.read()
    assert fetch.asked == [["a", "b"]]
    clock.now += 0.1
    r.read()
    assert fetch.asked == [["a", "b"], ["a", "b"]]
    by_key = {x.url: x for x in first.reads}
    assert by_key["http://a"].document is not None and by_key["http://a"].error is None
    assert by_key["http://b"].error == "http://b/ledger.json: no answer (timeout)"
    assert by_key["http://b"].pod == "monitoring/gl-b"


def test_page_loads_at_once_read_each_agent_once() -> None:
    fetch, gate = Fetcher(), threading.Event()

    def slow(agents: Sequence[Agent]) -> FetchResult:
        gate.wait(5)
        return fetch(agents)

    r = AgentReader(lambda: ([agent("a")], []), deadline_seconds=1, fetch=slow)
    threads = [threading.Thread(target=r.read) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    gate.set()
    for t in threads:
        t.join(5)
    assert fetch.asked == [["a"]]


def test_the_cache_holds_only_agents_still_found_and_at_most_max_agents() -> None:
    fetch, clock = Fetcher(), Clock()
    found = [agent(f"n{i}") for i in range(5)]
    r = reader(found, fetch, clock, max_agents=3, ttl_seconds=10)
    reading = r.read()
    assert [x.url for x in reading.reads] == ["http://n0", "http://n1", "http://n2"]
    assert reading.problems == ["5 node agents found; the page reads the first 3 by node name"]
    found[:] = [agent("n1")]
    clock.now += 10
    assert [x.url for x in r.read().reads] == ["http://n1"]
    assert len(r._cache) == 1


def test_static_urls_and_a_failed_listing() -> None:
    assert [a.url for a in static_agents(["http://x:9402/", "http://x:9402/ledger.json"])] == [
        "http://x:9402"
    ]
    calls = {"n": 0}

    class Lister:
        def list_pods(self, **_: Any) -> list[dict[str, Any]]:
            calls["n"] += 1
            if calls["n"] > 1:
                raise ClusterError("cannot reach the Kubernetes API: refused")
            return [
                {
                    "metadata": {
                        "namespace": "monitoring",
                        "name": f"gl-{role}",
                        "labels": {"app.kubernetes.io/component": role},
                    },
                    "spec": {
                        "nodeName": "gpu-1",
                        "containers": [{"ports": [{"name": "metrics", "containerPort": 9402}]}],
                    },
                    "status": {"podIP": "10.0.0.9", "phase": "Running"},
                }
                for role in ("node", "cluster")
            ]

    find = Discovery(["http://10.1.1.1:9402"], Lister, "monitoring")
    agents, problems = find()
    assert [a.url for a in agents] == ["http://10.1.1.1:9402", "http://10.0.0.9:9402"]
    assert problems == []
    again, problems = find()  # the API is down: the agents it listed last are read
    assert again == agents
    assert problems == ["node agents not listed: cannot reach the Kubernetes API: refused"]


def test_hostile_values_are_escaped() -> None:
    own = from_json({"schema": SCHEMA, "node": "view", "sources": [], "pending": []})
    evil = '<script>alert(1)</script>"'
    read = AgentRead(evil, "", "http://x", None, f"{evil} (timeout)", time.time())
    status, page = render(own, Reading([read], [evil]), "", 10)
    assert status == 200 and "<script>" not in page and "&lt;script&gt;" in page
    status, page = render(own, Reading([read]), f"workload={evil}/x", 10)
    assert status == 404 and "<script>" not in page


def test_a_bad_agent_url_is_a_usage_error(capsys: Any) -> None:
    argv = ["serve", "--mode", "cluster", "--kubernetes", "off", "--agent-url", "ftp://x"]
    assert main([*argv, "--listen", "127.0.0.1:0"]) == 2
    assert "--agent-url 'ftp://x': expected http(s)://HOST:PORT" in capsys.readouterr().err


def test_agent_access_that_cannot_be_used_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    secret = "pw-do-not-print"
    (tmp_path / "auth").write_text(secret)  # no USER:
    (tmp_path / "ca").write_text(secret)  # no certificate
    missing = tmp_path / "missing"
    argv = ["serve", "--mode", "cluster", "--kubernetes", "off", "--listen", "127.0.0.1:0"]
    for flags, message in (
        (["--agent-ca-file", str(missing)], f"--agent-ca-file {missing}: cannot read it: "),
        (["--agent-ca-file", str(tmp_path / "ca")], "no CA certificate in it"),
        (["--agent-auth-file", str(missing)], f"--agent-auth-file {missing}: cannot read it"),
        (["--agent-auth-file", str(tmp_path / "auth")], "expected one line USER:PASSWORD"),
    ):
        assert main([*argv, *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("gpuledger: error: ") and message in err
        assert err.count("\n") == 1 and secret not in err
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--agent-server-name", "not a name"])
    assert exited.value.code == 2
    assert "'not a name' is not a DNS name or an IP address" in capsys.readouterr().err
