"""The source interface, and running a source under a deadline.

A source has a name (its Key's), declares the earlier snapshots it reads (`needs`), and
returns one typed snapshot from `fetch`. The pipeline runs sources in dependency order,
each in its own thread under its own deadline; every failure becomes a SourceStatus.
See docs/design.md, "Sources".
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from gpuledger.model import NOT_CONFIGURED, Key, Snapshots, SourceStatus

T = TypeVar("T")
R = TypeVar("R")

# Reason of a source that is not configured here: state `not_configured` (source_up 0),
# never counted as an error.
DISABLED = NOT_CONFIGURED
log = logging.getLogger(__name__)


class SourceError(Exception):
    """A source failed in a way it understands.

    `reason` is a short label value (bounded vocabulary); the message is one line a
    person can act on and must never carry environment values or command-line arguments.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def release(error: BaseException) -> None:
    """Let go of what a failed read's exceptions hold: the frames of their tracebacks
    keep the read's locals (the body so far) alive, and an exception raised while another
    was handled often sits in a cycle with a frame, which only a full garbage collection
    would free. Call it once the reason and message have been read."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


class CpuMeter:
    """The CPU seconds one source has spent, so a regression names its source
    (`gpuledger_source_cpu_seconds_total`): its fetches' thread time in the runner thread,
    plus what it runs for them in helper threads (`run`: the engine scrapes) and in its own
    long-lived thread (`tick`: the informer's watch). Thread time, so waiting on the
    network costs nothing and other threads' work is not counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent = 0.0
        self._last = threading.local()  # per thread: its thread_time at its last tick

    def run(self, fn: Callable[[], R]) -> R:
        """`fn()`, its CPU counted."""
        start = time.thread_time()
        try:
            return fn()
        finally:
            self.add(time.thread_time() - start)

    def tick(self) -> None:
        """Count this thread's CPU since its previous tick (a thread that never ends)."""
        now = time.thread_time()
        last: float | None = getattr(self._last, "value", None)
        self._last.value = now
        if last is not None:
            self.add(now - last)

    def add(self, seconds: float) -> None:
        with self._lock:
            self._spent += max(0.0, seconds)

    @property
    def total(self) -> float:
        with self._lock:
            return self._spent


class Source(ABC, Generic[T]):
    """One source of the ledger: a name, what it reads first, one snapshot per cycle."""

    # What it produces; `key.name` is the `source` label of its self-metrics.
    key: Key[T]
    # Snapshots of earlier sources it reads from `fetch`'s inputs. The pipeline runs it
    # after them; a needed source that failed gives None, which the fetch must handle.
    needs: tuple[Key[Any], ...] = ()

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def cpu(self) -> CpuMeter:
        """What this source's threads have spent (made on first use: subclasses need not
        call a base __init__)."""
        meter: CpuMeter | None = self.__dict__.get("_cpu_meter")
        if meter is None:
            meter = self.__dict__.setdefault("_cpu_meter", CpuMeter())
        return meter

    @abstractmethod
    def fetch(self, inputs: Snapshots) -> T:
        """One snapshot. Raises SourceError for failures it understands."""

    def warm_up(self, timeout_seconds: float) -> None:
        """Begin background work (a watch) and give it up to `timeout_seconds`, so the
        first snapshot already has its data."""

    def fallback(self) -> T | None:
        """The best knowledge when `fetch` fails (a cache), or None."""
        return None

    def item_errors(self, snapshot: T) -> Iterable[str]:
        """Reasons of parts that failed inside a successful fetch (one engine of many):
        counted in errors_total without marking the whole source down."""
        return ()

    def close(self) -> None:
        """Release connections and threads."""


class NotConfigured(Source[Any]):
    """A source this exporter was not configured for: reported, never fetched."""

    def __init__(self, key: Key[Any]) -> None:
        self.key = key

    def fetch(self, inputs: Snapshots) -> Any:
        raise AssertionError("a source that is not configured is never fetched")


class SourceRunner(Generic[T]):
    """Calls one source's fetch function in its own worker thread, bounded by a deadline.

    A fetch that hangs past the deadline is abandoned, not killed (Python cannot kill a
    thread): the next cycle reports `still_running` instead of piling up more threads,
    so one hung source costs at most one thread.
    """

    def __init__(self, source: str, deadline_seconds: float) -> None:
        self.source = source
        self.deadline_seconds = deadline_seconds
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"source-{source}"
        )
        self._pending: concurrent.futures.Future[T] | None = None

    def run(self, fetch: Callable[[], T]) -> tuple[T | None, SourceStatus]:
        return self.start(fetch).wait()

    def start(self, fetch: Callable[[], T]) -> Started[T]:
        """Begin a fetch; `wait()` on the result gives it until the deadline counted from now."""
        started = time.monotonic()
        if self._pending is not None and not self._pending.done():
            return Started(self, None, started)
        self._pending = self._executor.submit(fetch)
        return Started(self, self._pending, started)

    def _finish(
        self, future: concurrent.futures.Future[T] | None, started: float
    ) -> tuple[T | None, SourceStatus]:
        if future is None:
            return None, self._status(
                started,
                "still_running",
                f"previous fetch still running after the {self.deadline_seconds:g}s deadline",
            )
        remaining = max(0.0, self.deadline_seconds - (time.monotonic() - started))
        try:
            # exception() rather than result(): re-raising here would add this frame,
            # which holds the future, to the error's traceback (a cycle).
            error = future.exception(timeout=remaining)
        except concurrent.futures.TimeoutError:
            return None, self._status(
                started, "timeout", f"no answer within the {self.deadline_seconds:g}s deadline"
            )
        except concurrent.futures.CancelledError:  # closed while the cycle waited
            return None, self._status(started, "internal_error", "CancelledError")
        if self._pending is future:
            self._pending = None  # done: nothing of this fetch outlives the cycle
        if error is None:
            return future.result(), SourceStatus(self.source, True, time.monotonic() - started)
        status = self._failed(started, error)
        release(error)
        return None, status

    def _failed(self, started: float, error: BaseException) -> SourceStatus:
        if isinstance(error, SourceError):
            return self._status(started, error.reason, error.message)
        # A bug or an unexpected library error: contained. Only the type: exception text
        # may quote the data being parsed.
        log.warning("source %s failed unexpectedly: %s", self.source, type(error).__name__)
        return self._status(started, "internal_error", type(error).__name__)

    def _status(self, started: float, reason: str, message: str) -> SourceStatus:
        return SourceStatus(
            self.source,
            up=False,
            duration_seconds=time.monotonic() - started,
            error_reason=reason,
            error_message=message,
        )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class Started(Generic[T]):
    """A fetch in flight; several can run at once, each under its own deadline."""

    def __init__(
        self,
        runner: SourceRunner[T] | None,
        future: concurrent.futures.Future[T] | None,
        started: float,
        source: str = "",
    ) -> None:
        self._runner, self._future, self._started = runner, future, started
        self._source = source

    @classmethod
    def disabled(cls, source: str) -> Started[T]:
        """A source not configured on this exporter: reported down, never an error."""
        return cls(None, None, time.monotonic(), source)

    def wait(self) -> tuple[T | None, SourceStatus]:
        if self._runner is None:
            return None, SourceStatus(
                self._source, False, 0.0, DISABLED, "not configured on this exporter"
            )
        return self._runner._finish(self._future, self._started)
