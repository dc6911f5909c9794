"""vLLM source: scrape engines' `/metrics` and map the few series the ledger needs.

:class:`EngineScraper` fetches many engines concurrently, each bounded in time and body
size, and turns every failure into that engine's own ``up=False`` plus a reason from
:data:`REASONS` (or ``http_<status>``). One bad engine never affects another, and
:meth:`EngineScraper.scrape` does not raise. :class:`EngineSource` is the pipeline's source: it
finds targets (:mod:`gpuledger.sources.engines.discovery`) and scrapes them. Parsing lives in
:mod:`gpuledger.sources.engines.exposition`.

Secrets: response bodies and header values never reach an error message or a log line
(an error page may echo a token). URLs in messages lose userinfo, query and fragment.
"""

from __future__ import annotations

import codecs
import concurrent.futures
import logging
import ssl
import threading
import time
from collections.abc import Iterable, Sequence

from gpuledger.identity.urls import safe_url
from gpuledger.model import Snapshots
from gpuledger.model.kubernetes import PODS
from gpuledger.model.engines import ENGINES, EngineMetrics, EngineScrape, EngineTarget, EnginesSnapshot
from gpuledger.net.httpclient import HttpClient, HttpError
from gpuledger.sources.base import Source
from gpuledger.sources.engines.discovery import discover_targets
from gpuledger.sources.engines.exposition import ExpositionError, ExpositionReader, VllmLines

log = logging.getLogger(__name__)


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


class _ScrapeFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class EngineScraper:
    """Scrapes vLLM engines concurrently, each bounded in time and body size.

    One `fetch` has one deadline, `timeout_seconds` from its start, shared by all its
    targets: a target still being read then (trickling, hung) is `timeout`, and a target
    not reached yet because every worker is held by such targets is `timeout` too.
    The fetch itself always returns by the deadline, with every other engine's answer.
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
        self._tls = ssl.create_default_context()
        if not verify_tls:
            self._tls.check_hostname = False
            self._tls.verify_mode = ssl.CERT_NONE
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def scrape(self, targets: Sequence[EngineTarget]) -> EnginesSnapshot:
        """Every target's scrape, in order; never raises, returns by the deadline."""
        if not targets:
            return EnginesSnapshot()
        started = time.monotonic()
        deadline = started + self.timeout_seconds
        executor = self._pool()
        futures = [executor.submit(self.scrape_one, t, deadline) for t in targets]
        done, _ = concurrent.futures.wait(futures, timeout=self.timeout_seconds + 0.5)
        return EnginesSnapshot(
            tuple(
                f.result() if f in done else self._failed(t, started, "timeout", self._late())
                for f, t in zip(futures, targets, strict=True)
            )
        )

    def scrape_one(self, target: EngineTarget, deadline: float | None = None) -> EngineScrape:
        """Scrape one target; never raises."""
        started = time.monotonic()
        deadline = deadline if deadline is not None else started + self.timeout_seconds
        if started >= deadline:
            return self._failed(target, started, "timeout", self._late())
        try:
            engines = self._scrape(target, deadline)
        except _ScrapeFailed as exc:
            return self._failed(target, started, exc.reason, exc.message)
        except HttpError as exc:
            return self._failed(target, started, exc.reason, exc.message, prefixed=True)
        except Exception as exc:  # a bug: contained to this target, type only
            log.warning(
                "vLLM scrape of %s failed unexpectedly: %s",
                safe_url(target.url),
                type(exc).__name__,
            )
            return self._failed(target, started, "internal_error", type(exc).__name__)
        return EngineScrape(target, True, None, None, engines, time.monotonic() - started)

    def __enter__(self) -> EngineScraper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None

    def _late(self) -> str:
        return f"no complete answer within {self.timeout_seconds:g}s"

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.max_workers, thread_name_prefix="vllm-scrape"
                )
            return self._executor

    def _failed(
        self,
        target: EngineTarget,
        started: float,
        reason: str,
        message: str,
        *,
        prefixed: bool = False,
    ) -> EngineScrape:
        return EngineScrape(
            target,
            up=False,
            error_reason=reason,
            error_message=message if prefixed else f"{safe_url(target.url)}: {message}",
            engines=(),
            duration_seconds=time.monotonic() - started,
        )

    def _scrape(self, target: EngineTarget, deadline: float) -> tuple[EngineMetrics, ...]:
        body = _Body(candidate=target.origin == "prometheus_annotation")
        self._download(target.url, deadline, body)
        if body.bug is not None:
            log.warning("vLLM scrape of %s failed unexpectedly: %s", safe_url(target.url), body.bug)
            raise _ScrapeFailed("internal_error", body.bug)
        # A prometheus.io-annotated pod is only a candidate: decide "is it vLLM" before
        # judging its syntax, so a non-vLLM app is dropped, not reported as garbage.
        if body.candidate and not body.vllm.seen:
            raise _ScrapeFailed("not_vllm", "no vllm: series in the exposition")
        if body.error is None:
            try:
                return self._engines(body)
            except ExpositionError as exc:
                body.error = str(exc)  # raised below, without this error as context
        raise _ScrapeFailed("garbage", body.error or "not a Prometheus text exposition")

    def _engines(self, body: _Body) -> tuple[EngineMetrics, ...]:
        engines = body.reader.engines()
        if not engines and not body.vllm.seen:
            raise _ScrapeFailed("not_vllm", "no vllm: series in the exposition")
        return engines

    def _download(self, url: str, deadline: float, body: _Body) -> None:
        client = HttpClient(
            deadline_seconds=max(0.001, deadline - time.monotonic()),
            max_body_bytes=self.max_body_bytes,
            # Plain text format: prometheus_client's text parser is what we run.
            headers={
                "Accept": "text/plain;version=0.0.4;q=1.0, */*;q=0.1",
                "Accept-Encoding": "gzip",
            },
            tls_context=self._tls,
        )
        response = client.get(url, consume=body)
        if response.status != 200:
            code = response.status if 100 <= response.status <= 599 else 0
            raise _ScrapeFailed(f"http_{code}", f"HTTP status {code}")
        body.end()


class _Body:
    """One engine's answer, read as it arrives (HttpClient.get's `consume`): decoded,
    each line checked or kept when it ends (vllm_metrics.ExpositionReader), and watched
    for vllm: series. Only the lines of the families read are held, never the body."""

    def __init__(self, candidate: bool) -> None:
        self.candidate = candidate
        self.reader = ExpositionReader()
        self.vllm = VllmLines()
        self.error: str | None = None  # the first malformed line, said without quoting it
        self.bug: str | None = None  # the type of an unexpected exception
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._stopped = False

    def __call__(self, chunk: bytes) -> bool:
        try:
            self._take(self._decode(chunk))
        except Exception as exc:  # a bug: the client must not read it as a transport error
            self.bug = type(exc).__name__
        # After a malformed line only a candidate still reads on: whether any line is a
        # vllm: series decides between not_vllm and garbage.
        more = self.bug is None and (self.error is None or (self.candidate and not self.vllm.seen))
        self._stopped = not more
        return more

    def end(self) -> None:
        """The body is complete: what the decoder still holds."""
        if not self._stopped:
            self._take(self._decode(b"", final=True))

    def _take(self, text: str) -> None:
        self.vllm.feed(text)
        if self.error is None:
            try:
                self.reader.feed(text)
            except ExpositionError as exc:
                self.error = str(exc)


class EngineSource(Source[EnginesSnapshot]):
    """The engines of this node: annotated pods (when the pod list is known) and static
    targets, each scraped on its own."""

    key = ENGINES
    needs = (PODS,)

    def __init__(
        self, scraper: EngineScraper, static_targets: Sequence[str], discovery: bool
    ) -> None:
        self.scraper = scraper
        self.static_targets = tuple(static_targets)
        self.discovery = discovery

    def fetch(self, inputs: Snapshots) -> EnginesSnapshot:
        pods = inputs.get(PODS)
        discovered = pods.pods if pods is not None and self.discovery else ()
        return self.scraper.scrape(discover_targets(discovered, self.static_targets))

    def item_errors(self, snapshot: EnginesSnapshot) -> Iterable[str]:
        # One engine failing is not the source failing, but its reason counts.
        return (
            s.error_reason or "unknown"
            for s in snapshot.scrapes
            if not s.up and s.error_reason != "not_vllm"
        )

    def close(self) -> None:
        self.scraper.close()
