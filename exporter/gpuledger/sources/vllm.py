"""vLLM source: scrape engines' `/metrics` and map the few series the ledger needs.

:class:`VllmScraper` fetches many engines concurrently, each bounded in time and body
size, and turns every failure into that engine's own ``up=False`` plus a reason from
:data:`REASONS` (or ``http_<status>``). One bad engine never affects another, and
:meth:`VllmScraper.fetch` does not raise. The parsing itself lives in
:mod:`gpuledger.sources.vllm_metrics`.

Secrets: response bodies and header values never reach an error message or a log line
(an error page may echo a token). URLs in messages lose userinfo, query and fragment.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterator, Sequence

import requests
import urllib3.exceptions

from gpuledger import __version__
from gpuledger.bounded import BodyTimedOut, BodyTooLarge, read_bounded
from gpuledger.httpclient import safe_url
from gpuledger.model.vllm import EngineMetrics, EngineScrape, EngineTarget, VllmSnapshot
from gpuledger.sources.vllm_metrics import ExpositionError, looks_like_vllm, parse_exposition

log = logging.getLogger(__name__)

SOURCE = "vllm"


class _PathOnly(logging.Filter):
    """urllib3 logs every request line at DEBUG with its query string, and a target's
    query may carry a token (`/metrics?token=...`): keep the path, drop the query."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                f"{a.split('?', 1)[0]}?<query removed>"
                if isinstance(a, str) and a.startswith("/") and "?" in a
                else a
                for a in record.args
            )
        return True


logging.getLogger("urllib3.connectionpool").addFilter(_PathOnly())

# Bounded vocabulary for EngineScrape.error_reason, plus "http_<status>".
REASONS: tuple[str, ...] = (
    "timeout",  # connect/read timeout, or the whole scrape ran past its deadline
    "refused",  # nothing listens on the port (typical while the model still loads)
    "unreachable",  # reset, DNS failure, no route: any other connection failure
    "tls_error",
    "truncated",  # the body ended before its declared length
    "too_large",  # decoded body exceeded the cap
    "garbage",  # not a Prometheus text exposition, or not decodable
    "not_vllm",  # parsable, but no vllm: series (prometheus.io annotation candidates)
    "invalid_url",
    "too_many_redirects",
    "internal_error",  # a bug: contained to this target
)


DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_WORKERS = 8

_MAX_REDIRECTS = 3


class _ScrapeFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps: requests nests urllib3 nests OSError."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack and len(seen) < 32:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked.extend(a for a in current.args if isinstance(a, BaseException))
        stack.extend(e for e in linked if isinstance(e, BaseException))


def _classify(exc: Exception) -> str:
    """Map a requests/urllib3 failure to a reason. Only types are inspected, never text."""
    chain = list(_causes(exc))

    def has(*types: type[BaseException]) -> bool:
        return any(isinstance(e, types) for e in chain)

    if has(
        requests.exceptions.InvalidURL,
        requests.exceptions.MissingSchema,
        requests.exceptions.InvalidSchema,
        requests.exceptions.URLRequired,
    ):
        return "invalid_url"
    if has(requests.exceptions.TooManyRedirects):
        return "too_many_redirects"
    if has(ConnectionRefusedError):
        return "refused"
    # urllib3's NewConnectionError (and NameResolutionError) subclass ConnectTimeoutError
    # for history's sake: a failed connect or DNS lookup is not a timeout.
    timeouts = (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)
    if any(
        isinstance(e, timeouts) and not isinstance(e, urllib3.exceptions.NewConnectionError)
        for e in chain
    ):
        return "timeout"
    if has(requests.exceptions.SSLError, urllib3.exceptions.SSLError):
        return "tls_error"
    if has(urllib3.exceptions.IncompleteRead, requests.exceptions.ChunkedEncodingError):
        return "truncated"
    if has(requests.exceptions.ContentDecodingError, urllib3.exceptions.DecodeError):
        return "garbage"
    return "unreachable"


_MESSAGES: dict[str, str] = {
    "invalid_url": "not a valid http(s) URL",
    "too_many_redirects": f"more than {_MAX_REDIRECTS} redirects",
    "refused": "connection refused (engine not listening yet, or wrong port)",
    "tls_error": "TLS handshake or certificate verification failed",
    "truncated": "connection closed before the whole body arrived",
    "garbage": "body could not be decoded",
    "unreachable": "connection failed (reset, DNS or routing)",
}


class VllmScraper:
    """Scrapes vLLM engines concurrently, each bounded in time and body size.

    `timeout_seconds` bounds connect, each read, and the whole body transfer: a scrape
    ends at the deadline even against a server that trickles bytes, so one target costs
    at most about twice `timeout_seconds` (a read already waiting when the deadline
    passes finishes first).
    """

    def __init__(
        self,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_workers: int = DEFAULT_MAX_WORKERS,
        verify_tls: bool = True,
    ) -> None:
        if timeout_seconds <= 0 or max_body_bytes <= 0 or max_workers <= 0:
            raise ValueError("timeout_seconds, max_body_bytes and max_workers must be > 0")
        self.timeout_seconds = timeout_seconds
        self.max_body_bytes = max_body_bytes
        self.max_workers = max_workers
        self.verify_tls = verify_tls
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._sessions: list[requests.Session] = []

    def fetch(self, targets: Sequence[EngineTarget]) -> VllmSnapshot:
        if not targets:
            return VllmSnapshot()
        executor = self._pool()
        futures = [executor.submit(self.scrape_one, t) for t in targets]
        return VllmSnapshot(tuple(f.result() for f in futures))

    def scrape_one(self, target: EngineTarget) -> EngineScrape:
        """Scrape one target; never raises."""
        started = time.monotonic()
        try:
            engines = self._scrape(target, started + self.timeout_seconds)
        except _ScrapeFailed as exc:
            return self._failed(target, started, exc.reason, exc.message)
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            reason = _classify(exc)
            if reason == "timeout":
                message = f"no answer within {self.timeout_seconds:g}s"
            else:
                message = _MESSAGES[reason]
            return self._failed(target, started, reason, message)
        except Exception as exc:  # a bug: contained to this target, type only
            log.warning(
                "vLLM scrape of %s failed unexpectedly: %s",
                safe_url(target.url),
                type(exc).__name__,
            )
            return self._failed(target, started, "internal_error", type(exc).__name__)
        return EngineScrape(target, True, None, None, engines, time.monotonic() - started)

    def __enter__(self) -> VllmScraper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.max_workers, thread_name_prefix="vllm-scrape"
                )
            return self._executor

    def _failed(
        self, target: EngineTarget, started: float, reason: str, message: str
    ) -> EngineScrape:
        return EngineScrape(
            target,
            up=False,
            error_reason=reason,
            error_message=f"{safe_url(target.url)}: {message}",
            engines=(),
            duration_seconds=time.monotonic() - started,
        )

    def _scrape(self, target: EngineTarget, deadline: float) -> tuple[EngineMetrics, ...]:
        body = self._download(target.url, deadline)
        text = body.decode("utf-8", errors="replace")
        # A prometheus.io-annotated pod is only a candidate: decide "is it vLLM" before
        # judging its syntax, so a non-vLLM app is dropped, not reported as garbage.
        if target.origin == "prometheus_annotation" and not looks_like_vllm(text):
            raise _ScrapeFailed("not_vllm", "no vllm: series in the exposition")
        try:
            engines = parse_exposition(text)
        except ExpositionError as exc:
            raise _ScrapeFailed("garbage", str(exc)) from None
        if not engines and not looks_like_vllm(text):
            raise _ScrapeFailed("not_vllm", "no vllm: series in the exposition")
        return engines

    def _session(self) -> requests.Session:
        """One keep-alive session per worker thread: engines are scraped every cycle, and a
        new TCP connection (and session) per scrape doubled the client's CPU."""
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            # Pod IPs must not go through a proxy from the environment; no .netrc either.
            session.trust_env = False
            session.max_redirects = _MAX_REDIRECTS
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def _download(self, url: str, deadline: float) -> bytes:
        response = self._session().get(
            url,
            headers={
                # Plain text format: prometheus_client's text parser is what we run.
                "Accept": "text/plain;version=0.0.4;q=1.0, */*;q=0.1",
                "Accept-Encoding": "gzip",
                "User-Agent": f"gpuledger/{__version__}",
            },
            timeout=(self.timeout_seconds, self.timeout_seconds),
            stream=True,
            verify=self.verify_tls,
        )
        with response:
            status = response.status_code
            if status != 200:
                code = status if 100 <= status <= 599 else 0
                raise _ScrapeFailed(f"http_{code}", f"HTTP status {code}")
            declared = response.headers.get("Content-Length", "")
            encoded = response.headers.get("Content-Encoding", "identity") != "identity"
            if not encoded and declared.isdigit() and int(declared) > self.max_body_bytes:
                raise self._too_large()
            try:
                return read_bounded(response.raw, self.max_body_bytes, deadline)
            except BodyTooLarge:
                raise self._too_large() from None
            except BodyTimedOut:
                raise _ScrapeFailed(
                    "timeout", f"body not complete within {self.timeout_seconds:g}s"
                ) from None

    def _too_large(self) -> _ScrapeFailed:
        return _ScrapeFailed("too_large", f"body larger than {self.max_body_bytes} bytes")
