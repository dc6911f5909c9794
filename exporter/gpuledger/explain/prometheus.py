"""A small reader of the Prometheus query API: instant queries, typed answers.

The fleet page (`--prometheus-url`) reads every workload's stage from the mixin's recording
rules instead of every node agent. Each query is one GET of `/api/v1/query` through the
one HttpClient (a deadline from connect to last byte, a byte cap, no redirects), and its
JSON is read in one place, `parse_vector`, into frozen `Sample`s, with a series cap counted
on the bytes before json.loads sees them. Credentials as for the agents: a bearer token
read from a file on every query (rotated tokens work without a restart), and TLS verified
against a CA file, with an optional server name. The token is in no message, log or page.

Interface:

    PrometheusAccess(url, bearer_token_file, ca_file, server_name)
    PrometheusAccess.client(deadline_seconds, ...) -> Prometheus  # files read now
    Prometheus.query(expr, deadline_seconds=None) -> tuple[Sample, ...]
    PrometheusError(reason, message)                              # one safe line
    parse_vector(body, max_series) -> tuple[Sample, ...]
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from gpuledger.explain.agents import AgentAccessError, verified_tls_context
from gpuledger.identity.urls import safe_url
from gpuledger.net.httpclient import HttpClient, HttpError

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_SERIES",
    "Prometheus",
    "PrometheusAccess",
    "PrometheusError",
    "Sample",
    "parse_vector",
    "promql_string",
]

MAX_ANSWER_BYTES = 32 * 1024 * 1024  # one query's answer, inflated
MAX_SERIES = 100_000  # series in one answer: 1,000 nodes' workloads with room
MAX_TOKEN_FILE_BYTES = 16 * 1024  # a service-account JWT is ~1 KiB
QUERY_PATH = "/api/v1/query"
# A vector answer's series is `{"metric":{…},"value":[…]}`: two objects and one array; the
# envelope a few more. Counted on the bytes, so json.loads never meets a flood of them.
_VALUES_PER_SERIES = 3
_ENVELOPE_VALUES = 16


class PrometheusError(Exception):
    """A query that failed: `reason` a short label, `message` one line with no secret."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels (`__name__` included) and value."""

    labels: Mapping[str, str]
    value: float

    def get(self, name: str) -> str:
        return self.labels.get(name, "")


@dataclass(frozen=True)
class PrometheusAccess:
    """Where Prometheus (or Thanos Query, Mimir) is, and how it is read.

    * `url`: its base URL, `http(s)://HOST:PORT[/PREFIX]` (the API is at PREFIX/api/v1).
    * `bearer_token_file`: a file whose content (one line) is sent as `Authorization:
      Bearer …`; a file, never a flag's value, so it is in no process listing.
    * `ca_file`, `server_name`: as the agents' `--agent-ca-file` and `--agent-server-name`.
    * `selector`: label matchers every query adds, e.g. `cluster="prod"`, where one
      Prometheus (Thanos, Mimir) holds several clusters' series.
    """

    url: str
    bearer_token_file: str | None = None
    ca_file: str | None = None
    server_name: str | None = None
    # Label matchers added to every query (`cluster="prod"`): one cluster of several.
    selector: str = ""

    def client(
        self,
        deadline_seconds: float,
        max_series: int = MAX_SERIES,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> Prometheus:
        """A reader with the files as they are now; AgentAccessError when one cannot be
        used (the message names the flag and the file, never its content)."""
        tls = verified_tls_context(self.ca_file, self.server_name, ca_flag="--prometheus-ca-file")
        return Prometheus(
            self.url.rstrip("/"),
            self._headers(),
            tls,
            deadline_seconds,
            max_series,
            max_answer_bytes,
        )

    def _headers(self) -> dict[str, str]:
        if not self.bearer_token_file:
            return {}
        name = f"--prometheus-bearer-token-file {self.bearer_token_file}"
        try:
            with open(self.bearer_token_file, "rb") as f:
                raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise AgentAccessError(f"{name}: cannot read it: {why}") from None
        token = raw.strip()
        if len(raw) > MAX_TOKEN_FILE_BYTES or not token or not _printable(token):
            raise AgentAccessError(f"{name}: expected one line holding the token")
        return {"Authorization": "Bearer " + token.decode("ascii")}


def _printable(token: bytes) -> bool:
    return all(0x21 <= b <= 0x7E for b in token)


@dataclass(frozen=True)
class Prometheus:
    """Instant queries against one Prometheus; thread-safe (one connection a query)."""

    url: str
    headers: Mapping[str, str] = field(repr=False)  # the bearer token
    tls_context: ssl.SSLContext | None = field(repr=False)
    deadline_seconds: float
    max_series: int = MAX_SERIES
    max_answer_bytes: int = MAX_ANSWER_BYTES

    def query(self, expr: str, deadline_seconds: float | None = None) -> tuple[Sample, ...]:
        """The instant vector `expr` evaluates to now; PrometheusError when it cannot be
        had whole within the deadline, the caps, and as a vector."""
        seconds = self.deadline_seconds if deadline_seconds is None else deadline_seconds
        if seconds <= 0:
            raise PrometheusError("timeout", f"{self._where()}: no time left for a query")
        target = f"{self.url}{QUERY_PATH}?{urlencode({'query': expr})}"
        counter = _ValueCounter(self.max_series * _VALUES_PER_SERIES + _ENVELOPE_VALUES)
        client = HttpClient(
            deadline_seconds=seconds,
            max_body_bytes=self.max_answer_bytes,
            headers={**self.headers, "Accept": "application/json"},
            tls_context=self.tls_context,
            max_redirects=0,  # the token goes to this server only
        )
        try:
            response = client.get(target, consume=counter.take)
        except HttpError as exc:
            raise PrometheusError(exc.reason, exc.message) from None
        if counter.over:
            raise PrometheusError(
                "too_many_series",
                f"{self._where()}: more than {self.max_series} series in one answer",
            )
        body = b"".join(counter.chunks)
        if response.status != 200:
            raise PrometheusError(
                f"http_{response.status}",
                f"{self._where()}: HTTP {response.status}{_api_error(body)}",
            )
        try:
            return parse_vector(body, self.max_series)
        except PrometheusError as exc:
            raise PrometheusError(exc.reason, f"{self._where()}: {exc.message}") from None

    def _where(self) -> str:
        return safe_url(self.url + QUERY_PATH)


class _ValueCounter:
    """Keeps the body's pieces while the JSON objects and arrays in them fit the bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.values = 0
        self.over = False

    def take(self, piece: bytes) -> bool:
        self.values += piece.count(b"{") + piece.count(b"[")
        if self.values > self.limit:
            self.over = True
            self.chunks.clear()  # a refused answer is never kept
            return False
        self.chunks.append(piece)
        return True


def parse_vector(body: bytes, max_series: int = MAX_SERIES) -> tuple[Sample, ...]:
    """The one reader of the query API's JSON: a `success` answer of `resultType`
    `vector`, each series `{"metric": {name: str}, "value": [time, "number"]}`. Anything
    else is PrometheusError (`bad_response`, or `query_error` with Prometheus' own words)."""
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        raise PrometheusError("bad_response", "not JSON") from None
    if not isinstance(answer, dict):
        raise PrometheusError("bad_response", "not a Prometheus API answer")
    if answer.get("status") != "success":
        raise PrometheusError("query_error", "query failed" + _error_text(answer))
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        raise PrometheusError("bad_response", "not an instant vector")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError("bad_response", "no result list")
    if len(result) > max_series:
        raise PrometheusError("too_many_series", f"more than {max_series} series")
    return tuple(_sample(item, i) for i, item in enumerate(result))


def _sample(item: Any, i: int) -> Sample:
    metric = item.get("metric") if isinstance(item, dict) else None
    value = item.get("value") if isinstance(item, dict) else None
    if not isinstance(metric, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metric.items()
    ):
        raise PrometheusError("bad_response", f"series {i}: labels are not strings")
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str):
        raise PrometheusError("bad_response", f"series {i}: value is not [time, string]")
    try:
        number = float(value[1])
    except ValueError:
        raise PrometheusError("bad_response", f"series {i}: value is not a number") from None
    return Sample(dict(metric), number)


def _error_text(answer: Mapping[str, Any]) -> str:
    """Prometheus' own error words, short and on one line."""
    error, kind = answer.get("error"), answer.get("errorType")
    if not isinstance(error, str) or not error:
        return ""
    prefix = f"{kind}: " if isinstance(kind, str) and kind else ""
    return ": " + " ".join(f"{prefix}{error}".split())[:200]


def _api_error(body: bytes) -> str:
    try:
        answer = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    return _error_text(answer) if isinstance(answer, dict) else ""


def promql_string(value: str) -> str:
    """`value` as a PromQL string literal: a label matcher's value, whatever it holds."""
    return json.dumps(value, ensure_ascii=True)


def remaining(end: float) -> float:
    """Seconds left until `end` (time.monotonic()), for a query sharing a page's deadline."""
    return end - time.monotonic()
