"""A Prometheus that answers badly costs the fleet page nothing but a clear line on it.

Malformed, flooding, nested, erroring and hanging answers to the page's instant queries
(explain/prometheus.py): the page still answers 200 within its deadline, names Prometheus
and the reason, and reads no node agent. The bearer token (a file) reaches Prometheus, and
no page, error, log line or repr.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuledger.document.v1 import SCHEMA, LedgerDocument
from gpuledger.explain.agents import Agent, AgentAccessError, FetchResult
from gpuledger.explain.prometheus import PrometheusAccess, PrometheusError, parse_vector
from gpuledger.web.fleet_page import FleetPage

OWN = LedgerDocument(schema=SCHEMA, node="cluster-view", mode="cluster")
DEADLINE = 1.0
CANARY = "canary-token-3f9a1c"


def _vector(series: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": series}}
    ).encode()


class FakePrometheus:
    """Answers every query with one body (and status), or never; records the headers."""

    def __init__(self, body: bytes, status: int = 200, hang: bool = False) -> None:
        self.authorizations: list[str | None] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.authorizations.append(self.headers.get("Authorization"))
                if hang:
                    time.sleep(DEADLINE * 3)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus() -> Iterator[Any]:
    made: list[FakePrometheus] = []

    def start(body: bytes, **kwargs: Any) -> FakePrometheus:
        made.append(FakePrometheus(body, **kwargs))
        return made[-1]

    yield start
    for server in made:
        server.close()


def _no_agent(agents: Any, _seconds: float) -> FetchResult:
    raise AssertionError(f"the page read agents: {agents}")


SERIES = {"metric": {"namespace": "a", "workload": "w", "stage": "idle"}, "value": [1, "1"]}
HOSTILE = {
    "html": (b"<html><body>502 Bad Gateway</body></html>", 200, "bad_response"),
    "truncated": (_vector([SERIES])[:-7], 200, "bad_response"),
    "nested": (b"[" * 100_000 + b"]" * 100_000, 200, "too_many_series"),
    "flood": (_vector([SERIES] * 20), 200, "too_many_series"),
    "matrix": (
        b'{"status":"success","data":{"resultType":"matrix","result":[]}}',
        200,
        "bad_response",
    ),
    "labels not strings": (
        _vector([{"metric": {"namespace": 1}, "value": [1, "1"]}]),
        200,
        "bad_response",
    ),
    "value not a number": (_vector([{"metric": {}, "value": [1, "many"]}]), 200, "bad_response"),
    "query error": (
        b'{"status":"error","errorType":"bad_data","error":"parse error"}',
        400,
        "http_400",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_bad_answer_is_one_line_on_the_page_and_no_agent_is_read(
    case: str, prometheus: Any
) -> None:
    body, status, reason = HOSTILE[case]
    server = prometheus(body, status=status)
    # A series cap of 10, so that "flood" floods it.
    page = FleetPage(_Capped(server.url), deadline_seconds=DEADLINE, fetch=_no_agent)
    code, html = page(OWN, "")
    assert code == 200
    error = html.split('id="prometheus-error"', 1)[1].split("</p>", 1)[0]
    assert f"({reason})" in error, error
    assert server.url.removeprefix("http://") in error


class _Capped(PrometheusAccess):
    def __init__(self, url: str) -> None:
        super().__init__(url)

    def client(self, deadline_seconds: float, max_series: int = 10, **kw: Any) -> Any:
        return super().client(deadline_seconds, max_series=10, **kw)


def test_a_hanging_prometheus_costs_the_deadline_and_nothing_else(prometheus: Any) -> None:
    server = prometheus(b"", hang=True)
    page = FleetPage(PrometheusAccess(server.url), deadline_seconds=DEADLINE, fetch=_no_agent)
    code, html = page(OWN, "")
    assert code == 200
    assert "(timeout)" in html.split('id="prometheus-error"', 1)[1]
    code, html = page(OWN, "workload=a%2Fw")
    assert code == 404  # no agent named, no document holds it
    assert "not read" in html and "(timeout)" in html


def test_the_parser_refuses_more_series_than_its_cap() -> None:
    with pytest.raises(PrometheusError) as caught:
        parse_vector(_vector([SERIES] * 3), max_series=2)
    assert caught.value.reason == "too_many_series"
    assert parse_vector(_vector([SERIES]))[0].labels["stage"] == "idle"


def test_the_bearer_token_reaches_prometheus_and_nothing_else(
    prometheus: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "token"
    token.write_text(CANARY + "\n")
    server = prometheus(b'{"status":"error","errorType":"bad_data","error":"nope"}', status=401)
    access = PrometheusAccess(server.url, bearer_token_file=str(token))
    page = FleetPage(access, deadline_seconds=DEADLINE, fetch=_no_agent)
    with caplog.at_level(logging.DEBUG):
        _, overview = page(OWN, "")
        _, workload = page(OWN, "workload=a%2Fw")
    assert server.authorizations and all(a == f"Bearer {CANARY}" for a in server.authorizations)
    assert "HTTP 401" in overview
    client = access.client(DEADLINE)
    with pytest.raises(PrometheusError) as caught:
        client.query("up")
    for text in (overview, workload, caplog.text, str(caught.value), repr(client), repr(access)):
        assert CANARY not in text


def test_a_token_file_that_cannot_be_used_names_the_file_not_its_content(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "token"
    bad.write_text(f"{CANARY}\nsecond line\n")
    with pytest.raises(AgentAccessError) as caught:
        PrometheusAccess("http://127.0.0.1:1", bearer_token_file=str(bad)).client(1.0)
    assert str(bad) in str(caught.value) and CANARY not in str(caught.value)
    page = FleetPage(
        PrometheusAccess("http://127.0.0.1:1", bearer_token_file=str(bad)),
        deadline_seconds=DEADLINE,
        fetch=_no_agent,
    )
    _, html = page(OWN, "")
    assert str(bad) in html and CANARY not in html


def test_a_workload_reads_the_agents_prometheus_names(prometheus: Any) -> None:
    holders = _vector(
        [
            {"metric": {"node": "n1", "instance": "10.0.0.1:9402"}, "value": [1, "1"]},
            {"metric": {"node": "n2", "instance": "10.0.0.2:9402"}, "value": [1, "1"]},
        ]
    )
    server = prometheus(holders)
    asked: list[Agent] = []

    def fetch(agents: Any, seconds: float) -> FetchResult:
        # The reads get what the question to Prometheus left of the one deadline.
        assert 0 < seconds < DEADLINE
        asked.extend(agents)
        return FetchResult({}, {a.key: "refused" for a in agents})

    page = FleetPage(PrometheusAccess(server.url), deadline_seconds=DEADLINE, fetch=fetch)
    _, html = page(OWN, "workload=a%2Fw")
    assert [(a.node, a.url) for a in asked] == [
        ("n1", "http://10.0.0.1:9402"),
        ("n2", "http://10.0.0.2:9402"),
    ]
    assert "Node agents: 0 of 2 read" in html and "refused" in html
    # A reload within the page's reuse time reads neither Prometheus nor the agents again.
    queries = len(server.authorizations)
    page(OWN, "workload=a%2Fw")
    assert len(asked) == 2 and len(server.authorizations) == queries
