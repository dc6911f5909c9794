"""A source that hangs, fails or crashes is contained and reported, never raised."""

from __future__ import annotations

import gc
import threading
import time
import weakref

from gpuledger.sources.base import SourceError, SourceRunner


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
