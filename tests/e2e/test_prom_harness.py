"""The e2e harness's Prometheus API client: a slow or briefly failing server is retried,
a query Prometheus rejects fails at once (tests/e2e/prom_harness.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.e2e import prom_harness
from tests.e2e.prom_harness import Prometheus, PrometheusError

OK = {"status": "success", "data": {"resultType": "vector", "result": []}}


class Script:
    """The answers of a fake Prometheus, one per request, the last one repeated."""

    def __init__(self, *answers: tuple[str, int, dict[str, Any]]) -> None:
        self.answers = list(answers)
        self.requests = 0
        self.release = threading.Event()

    def next(self) -> tuple[str, int, dict[str, Any]]:
        self.requests += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.fixture
def fake() -> Iterator[tuple[Prometheus, Script]]:
    script = Script(("answer", 200, OK))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            kind, code, doc = script.next()
            if kind == "hang":
                script.release.wait(30)  # past the client's attempt timeout
                return
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    prom = Prometheus.__new__(Prometheus)  # the client half only: no server process
    prom.base = f"http://127.0.0.1:{server.server_address[1]}"
    prom.proc = type("Running", (), {"poll": staticmethod(lambda: None)})()  # type: ignore[assignment]
    try:
        yield prom, script
    finally:
        script.release.set()
        server.shutdown()
        server.server_close()


def test_a_slow_or_overloaded_prometheus_is_asked_again(
    fake: tuple[Prometheus, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    prom, script = fake
    monkeypatch.setattr(prom_harness, "ATTEMPT_TIMEOUT", 1.0)
    busy = {"status": "error", "errorType": "timeout", "error": "query timed out"}
    script.answers = [("hang", 0, {}), ("answer", 503, busy), ("answer", 200, OK)]
    assert prom.query("up") == []
    assert script.requests == 3


def test_a_query_prometheus_rejects_fails_at_once(fake: tuple[Prometheus, Script]) -> None:
    prom, script = fake
    bad = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    script.answers = [("answer", 400, bad)]
    started = time.monotonic()
    with pytest.raises(PrometheusError, match="bad_data: parse error"):
        prom.query("up{")
    assert script.requests == 1 and time.monotonic() - started < 5


def test_no_answer_within_the_deadline_fails(
    fake: tuple[Prometheus, Script], monkeypatch: pytest.MonkeyPatch
) -> None:
    prom, script = fake
    monkeypatch.setattr(prom_harness, "API_DEADLINE", 3.0)
    monkeypatch.setattr(prom_harness, "ATTEMPT_TIMEOUT", 1.0)
    script.answers = [("hang", 0, {})]
    with pytest.raises(PrometheusError, match="no answer in 3s"):
        prom.query("up")
    assert script.requests >= 2
