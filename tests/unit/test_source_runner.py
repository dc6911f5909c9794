"""A source that hangs, fails or crashes is contained and reported, never raised."""

from __future__ import annotations

import concurrent.futures
import gc
import threading
import time
import weakref

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.export.collector import LedgerCollector
from gpuledger.export.exposition import render_text
from gpuledger.model import Key, Snapshots
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sources.base import Source, SourceError, SourceRunner


def test_success() -> None:
    value, status = SourceRunner[int]("x", 1.0).run(lambda: 42)
    assert value == 42 and status.up and status.error_reason is None


def test_source_error_keeps_reason_and_message() -> None:
    def fail() -> int:
        raise SourceError("socket_missing", "no socket at /x")

    value, status = SourceRunner[int]("x", 1.0).run(fail)
    assert value is None and not status.up
    assert (status.error_reason, status.error_message) == ("socket_missing", "no socket at /x")


def test_unexpected_exception_reports_type_only() -> None:
    def crash() -> int:
        raise ValueError("secret-value-in-message")

    _, status = SourceRunner[int]("x", 1.0).run(crash)
    assert status.error_reason == "internal_error"
    assert status.error_message == "ValueError"


def test_hung_fetch_times_out_and_does_not_pile_up_threads() -> None:
    release = threading.Event()
    runner = SourceRunner[int]("slow", 0.2)
    started = time.monotonic()
    value, status = runner.run(lambda: int(release.wait(30)))
    assert value is None and status.error_reason == "timeout"
    assert time.monotonic() - started < 5
    threads = threading.active_count()
    for _ in range(5):
        _, status = runner.run(lambda: 1)
        assert status.error_reason == "still_running"
    assert threading.active_count() == threads
    release.set()
    # Recovers once the hung call returns: until then a run answers still_running.
    give_up = time.monotonic() + 10
    while (result := runner.run(lambda: 7))[1].error_reason == "still_running":
        assert time.monotonic() < give_up, "the runner never noticed the hung call returned"
        time.sleep(0.01)  # poll interval, not a wait for the thread
    value, status = result
    assert value == 7 and status.up
    runner.close()


def test_a_failed_fetch_frees_what_it_held_without_the_collector() -> None:
    """The error's traceback holds the fetch's frames (the body it read); re-raised in the
    runner's frame, which holds the future, which holds the error, that was a cycle only
    a full collection freed (issue 14)."""

    class Body:
        pass

    held: list[weakref.ref[Body]] = []

    def fetch() -> None:
        body = Body()
        held.append(weakref.ref(body))
        raise SourceError("too_large", "answered too much")

    runner: SourceRunner[None] = SourceRunner("t", 5.0)
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            _, status = runner.run(fetch)
            assert status.error_reason == "too_large"
        assert [ref() for ref in held] == [None, None, None]
    finally:
        gc.enable()
        runner.close()


# ------------------------------------------------------------- what each source costs


def _spin(seconds: float) -> None:
    """Burn `seconds` of this thread's CPU."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


class _Burner(Source[int]):
    key = Key[int]("burner")

    def fetch(self, inputs: Snapshots) -> int:
        _spin(0.1)
        return 1


class _Sleeper(Source[int]):
    key = Key[int]("sleeper")

    def fetch(self, inputs: Snapshots) -> int:
        time.sleep(0.1)
        return 1


class _Helpers(Source[int]):
    """Does its work in helper threads, as the engine source scrapes."""

    key = Key[int]("helpers")

    def __init__(self) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(2)

    def fetch(self, inputs: Snapshots) -> int:
        jobs = [self.pool.submit(self.cpu.run, lambda: _spin(0.05)) for _ in range(2)]
        return sum(1 for j in jobs if j.result() is None)

    def close(self) -> None:
        self.pool.shutdown()


def test_a_source_that_burns_cpu_shows_it_and_one_that_sleeps_does_not() -> None:
    pipeline = Pipeline(PipelineConfig(node="n1"), sources=[_Burner(), _Sleeper(), _Helpers()])
    try:
        pipeline.cycle()
        published = pipeline.cycle()
    finally:
        pipeline.close()
    cpu = {s.source: s.cpu_seconds for s in published.ledger.sources}
    assert 0.09 <= cpu["burner"] < 0.5  # this cycle's fetch, not the total
    assert cpu["sleeper"] < 0.02
    assert 0.09 <= cpu["helpers"] < 0.5  # the helper threads' CPU is the source's
    text = render_text(LedgerCollector(lambda: (published, time.time())).families()).decode()
    totals = {
        labels["source"]: value
        for family in text_string_to_metric_families(text)
        for name, labels, value, *_ in family.samples
        if name == "gpuledger_source_cpu_seconds_total"
    }
    assert totals.keys() == {"burner", "sleeper", "helpers"}
    assert totals["burner"] >= 0.19 and totals["helpers"] >= 0.19  # two cycles
    assert totals["sleeper"] < 0.04
