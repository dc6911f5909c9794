"""Engine source: scrape engines' `/metrics` and map the few series the ledger needs.

:class:`EngineScraper` fetches many engines concurrently, each bounded in time and body
size, and turns every failure into that engine's own ``up=False`` plus a reason from
:data:`REASONS` (or ``http_<status>``). One bad engine never affects another, and
:meth:`EngineScraper.scrape` does not raise. :class:`EngineSource` is the pipeline's source: it
finds targets (:mod:`gpuledger.sources.engines.discovery`) and scrapes them. Parsing lives in
:mod:`gpuledger.sources.engines.exposition`; what differs per engine kind, in
:mod:`gpuledger.engines`. A target whose kind is unknown (a static URL, a prometheus.io
candidate) is read for every kind at once and is the first kind its body shows.

Secrets: response bodies and header values never reach an error message or a log line
(an error page may echo a token). URLs in messages lose userinfo, query and fragment.
"""

from __future__ import annotations

import codecs
import concurrent.futures
import functools
import logging
import ssl
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from gpuledger.engines import BY_NAME, KINDS
from gpuledger.engines.kinds import EngineKind, ExpositionNames
from gpuledger.identity.urls import safe_url
from gpuledger.model import Snapshots
from gpuledger.model.engines import (
    ENGINES,
    NOT_AN_ENGINE,
    EngineMetrics,
    EngineScrape,
    EnginesSnapshot,
    EngineTarget,
)
from gpuledger.model.kubernetes import PODS
from gpuledger.model.serverinfo import ServerInfo
from gpuledger.net.httpclient import HttpClient, HttpError
from gpuledger.sources.base import CpuMeter, Source
from gpuledger.sources.engines.discovery import discover_targets
from gpuledger.sources.engines.exposition import (
    ExpositionError,
    ExpositionReader,
    MarkerLines,
    read_engines,
)

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
    NOT_AN_ENGINE,  # parsable, but no engine kind's series (prometheus.io candidates)
    "invalid_url",
    "too_many_redirects",
    "internal_error",  # a bug: contained to this target
)


DEFAULT_TIMEOUT_SECONDS = 5.0
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_WORKERS = 8
# A server-info answer is about 20 KB (SGLang 0.5.23); it changes when the server
# restarts, so it is read again only after these many seconds, or when a scrape fails.
SERVER_INFO_MAX_BYTES = 1024 * 1024
SERVER_INFO_TTL_SECONDS = 300.0
SERVER_INFO_RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class _CachedInfo:
    info: ServerInfo | None
    error: str | None
    read_at: float

    def fresh(self, now: float) -> bool:
        ttl = SERVER_INFO_TTL_SECONDS if self.error is None else SERVER_INFO_RETRY_SECONDS
        return now - self.read_at < ttl


class _ScrapeFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class EngineScraper:
    """Scrapes engines concurrently, each bounded in time and body size.

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
        self._server_info: dict[str, _CachedInfo] = {}

    def scrape(
        self, targets: Sequence[EngineTarget], meter: CpuMeter | None = None
    ) -> EnginesSnapshot:
        """Every target's scrape, in order; never raises, returns by the deadline. The
        scrape threads' CPU goes to `meter` (the source's)."""
        self._forget_server_info({t.url for t in targets})
        if not targets:
            return EnginesSnapshot()
        started = time.monotonic()
        deadline = started + self.timeout_seconds
        executor = self._pool()
        meter = meter or CpuMeter()
        futures = [
            executor.submit(meter.run, functools.partial(self.scrape_one, t, deadline))
            for t in targets
        ]
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
        body = _Body(target)
        try:
            engines = self._scrape(target, deadline, body)
        except _ScrapeFailed as exc:
            return self._failed(target, started, exc.reason, exc.message, kind=body.kind)
        except HttpError as exc:
            return self._failed(
                target, started, exc.reason, exc.message, prefixed=True, kind=body.kind
            )
        except Exception as exc:  # a bug: contained to this target, type only
            log.warning(
                "Engine scrape of %s failed unexpectedly: %s",
                safe_url(target.url),
                type(exc).__name__,
            )
            return self._failed(target, started, "internal_error", type(exc).__name__)
        scrape = EngineScrape(target, True, None, None, engines, 0.0, body.kind)
        scrape = self._with_server_info(scrape, deadline)
        return replace(scrape, duration_seconds=time.monotonic() - started)

    def _with_server_info(self, scrape: EngineScrape, deadline: float) -> EngineScrape:
        """The scrape with its kind's server info, from the cache while it is fresh."""
        kind = BY_NAME.get(scrape.kind)
        if kind is None or kind.parse_server_info is None:
            return scrape
        url = scrape.target.url
        with self._lock:
            cached = self._server_info.get(url)
        if cached is None or not cached.fresh(time.monotonic()):
            cached = self._read_server_info(url, kind, deadline)
            with self._lock:
                self._server_info[url] = cached
        return replace(scrape, server_info=cached.info, server_info_error=cached.error)

    def _read_server_info(self, url: str, kind: EngineKind, deadline: float) -> _CachedInfo:
        """Read the first of the kind's server-info paths that exists; never raises."""
        assert kind.parse_server_info is not None
        error = "http_404"
        for path in kind.server_info_paths:
            try:
                response = HttpClient(
                    deadline_seconds=max(0.001, deadline - time.monotonic()),
                    max_body_bytes=SERVER_INFO_MAX_BYTES,
                    headers={"Accept": "application/json"},
                    tls_context=self._tls,
                ).get(urlsplit(url)._replace(path=path, query="", fragment="").geturl())
            except HttpError as exc:
                return _CachedInfo(None, exc.reason, time.monotonic())
            if response.status == 404:
                continue
            if response.status != 200:
                code = response.status if 100 <= response.status <= 599 else 0
                return _CachedInfo(None, f"http_{code}", time.monotonic())
            try:
                return _CachedInfo(kind.parse_server_info(response.body), None, time.monotonic())
            except ValueError:
                return _CachedInfo(None, "garbage", time.monotonic())
        return _CachedInfo(None, error, time.monotonic())

    def _forget_server_info(self, keep: set[str]) -> None:
        """Drop what targets no longer scraped held, so the cache follows the targets."""
        with self._lock:
            for url in [u for u in self._server_info if u not in keep]:
                del self._server_info[url]

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
                    max_workers=self.max_workers, thread_name_prefix="engine-scrape"
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
        kind: str | None = None,
    ) -> EngineScrape:
        # A failed scrape may be a restart: the server info is read again when it is back.
        with self._lock:
            self._server_info.pop(target.url, None)
        return EngineScrape(
            target,
            up=False,
            error_reason=reason,
            error_message=message if prefixed else f"{safe_url(target.url)}: {message}",
            engines=(),
            duration_seconds=time.monotonic() - started,
            kind=target.kind if kind is None else kind,
        )

    def _scrape(
        self, target: EngineTarget, deadline: float, body: _Body
    ) -> tuple[EngineMetrics, ...]:
        self._download(target.url, deadline, body)
        if body.bug is not None:
            log.warning(
                "Engine scrape of %s failed unexpectedly: %s", safe_url(target.url), body.bug
            )
            raise _ScrapeFailed("internal_error", body.bug)
        # A prometheus.io-annotated pod is only a candidate: decide "is it an engine"
        # before judging its syntax, so another app is dropped, not reported as garbage.
        if body.candidate and body.chosen() is None:
            raise _ScrapeFailed(NOT_AN_ENGINE, body.no_series())
        read = body.chosen() or body.reads[0]
        if read.error is None:
            try:
                return self._engines(body, read)
            except ExpositionError as exc:
                read.error = str(exc)  # raised below, without this error as context
        raise _ScrapeFailed("garbage", read.error or "not a Prometheus text exposition")

    def _engines(self, body: _Body, read: _Read) -> tuple[EngineMetrics, ...]:
        engines = read_engines(read.reader.relevant(), read.names)
        if not engines and body.chosen() is None:
            raise _ScrapeFailed(NOT_AN_ENGINE, body.no_series())
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


class _Read:
    """One naming of one engine kind, read from a body: its wanted lines, whether any
    line shows its marker, and the first malformed line (said without quoting it)."""

    def __init__(self, kind: EngineKind, names: ExpositionNames) -> None:
        self.kind = kind
        self.names = names
        self.reader = ExpositionReader(names.wanted, names.marker)
        self.lines = MarkerLines((names.marker,))
        self.error: str | None = None

    def feed(self, text: str) -> None:
        self.lines.feed(text)
        if self.error is None:
            try:
                self.reader.feed(text)
            except ExpositionError as exc:
                self.error = str(exc)


class _Body:
    """One engine's answer, read as it arrives (HttpClient.get's `consume`): decoded,
    each line checked or kept when it ends (exposition.ExpositionReader), for each
    naming of the target's kind (of every kind, when unknown), and watched for their
    markers. Only the lines of the families read are held, never the body."""

    def __init__(self, target: EngineTarget) -> None:
        self.candidate = target.origin == "prometheus_annotation"
        known = BY_NAME.get(target.kind)
        kinds = (known,) if known is not None else KINDS
        self.reads = [_Read(kind, names) for kind in kinds for names in kind.metrics]
        self.target_kind = target.kind
        self.bug: str | None = None  # the type of an unexpected exception
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._stopped = False

    @property
    def kind(self) -> str:
        chosen = self.chosen()
        return chosen.kind.name if chosen is not None else self.target_kind

    def chosen(self) -> _Read | None:
        """The first naming whose marker a line showed."""
        return next((r for r in self.reads if r.lines.seen), None)

    def no_series(self) -> str:
        markers = " or ".join(r.names.marker for r in self.reads)
        return f"no {markers} series in the exposition"

    def __call__(self, chunk: bytes) -> bool:
        try:
            self._take(self._decode(chunk))
        except Exception as exc:  # a bug: the client must not read it as a transport error
            self.bug = type(exc).__name__
        # After a malformed line only a candidate still reads on: whether any line shows
        # a marker decides between not an engine and garbage.
        readable = any(r.error is None for r in self.reads)
        more = self.bug is None and (readable or (self.candidate and self.chosen() is None))
        self._stopped = not more
        return more

    def end(self) -> None:
        """The body is complete: what the decoder still holds."""
        if not self._stopped:
            self._take(self._decode(b"", final=True))

    def _take(self, text: str) -> None:
        for read in self.reads:
            read.feed(text)


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
        return self.scraper.scrape(discover_targets(discovered, self.static_targets), self.cpu)

    def item_errors(self, snapshot: EnginesSnapshot) -> Iterable[str]:
        # One engine failing is not the source failing, but its reason counts; so does
        # a server info that could not be read (the flags then stand).
        failed = (
            s.error_reason or "unknown"
            for s in snapshot.scrapes
            if not s.up and s.error_reason != NOT_AN_ENGINE
        )
        info = (
            f"server_info_{s.server_info_error}" for s in snapshot.scrapes if s.server_info_error
        )
        return (*failed, *info)

    def close(self) -> None:
        self.scraper.close()
