"""Scraping simulated vLLM engines over real HTTP: every fault stays with its own engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpuledger.model.engines import EngineScrape, EnginesSnapshot, EngineTarget
from gpuledger.sim.fake_vllm import FAULTS, FakeEngine, FakeVllmServer, Fault
from gpuledger.sources.engines.source import EngineScraper

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TIMEOUT = 0.5
CAP = 1024 * 1024  # the real-sized exposition is ~50 KB per engine


@pytest.fixture
def servers() -> Iterator[list[FakeVllmServer]]:
    started: list[FakeVllmServer] = []
    yield started
    for server in started:
        server.stop()


def serve(
    servers: list[FakeVllmServer],
    fault: Fault = "ok",
    engines: list[FakeEngine] | None = None,
    **kwargs: object,
) -> FakeVllmServer:
    default = [FakeEngine(MODEL, 0, running=7, waiting=3)]
    server = FakeVllmServer(default if engines is None else engines, fault=fault, **kwargs)  # type: ignore[arg-type]
    servers.append(server.start())
    return server


def scraper(**kwargs: object) -> EngineScraper:
    options: dict[str, object] = {"timeout_seconds": TIMEOUT, "max_body_bytes": CAP}
    options.update(kwargs)
    return EngineScraper(**options)  # type: ignore[arg-type]


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def only(snapshot: EnginesSnapshot) -> EngineScrape:
    (scrape,) = snapshot.scrapes
    return scrape


EXPECTED: dict[Fault, str | None] = {
    "ok": None,
    "hang": "timeout",
    "refuse": "refused",
    "http_500": "http_500",
    "garbage": "garbage",
    "truncated": "truncated",
    "huge": "too_large",
    "slow": "timeout",  # slow_seconds (3 s) is past the 0.5 s timeout
    "trickle": "timeout",  # each piece arrives in time, the whole body does not
}


def test_every_fault_mode_is_covered() -> None:
    assert set(EXPECTED) == set(FAULTS)


def test_each_fault_fails_only_its_own_engine(servers: list[FakeVllmServer]) -> None:
    healthy = [
        serve(servers, engines=[FakeEngine(MODEL, 0, running=7, waiting=3, kv_cache_usage=0.5)]),
        serve(servers, engines=[FakeEngine(MODEL, 0, running=1), FakeEngine(MODEL, 1, running=2)]),
    ]
    faulty = {fault: serve(servers, fault, slow_seconds=3.0) for fault in FAULTS if fault != "ok"}
    targets = [EngineTarget(s.url, pod=f"ok-{i}") for i, s in enumerate(healthy)]
    targets += [EngineTarget(s.url, pod=fault) for fault, s in faulty.items()]
    with scraper(max_workers=len(targets)) as scrape:
        started = time.monotonic()
        snapshot = scrape.scrape(targets)
        elapsed = time.monotonic() - started

    assert elapsed < 5.0  # hung and slow engines are bounded by the timeout
    assert [s.target for s in snapshot.scrapes] == targets  # order preserved
    by_pod = {s.target.pod: s for s in snapshot.scrapes}
    for fault, server in faulty.items():
        result = by_pod[fault]
        assert (result.up, result.error_reason) == (False, EXPECTED[fault]), fault
        assert result.engines == ()
        assert result.error_message and result.error_message.startswith(server.url)
    first, second = by_pod["ok-0"], by_pod["ok-1"]
    assert first.up and first.error_reason is None
    (engine,) = first.engines
    assert (engine.model_name, engine.requests_running, engine.requests_waiting) == (
        MODEL,
        7.0,
        3.0,
    )
    assert engine.kv_cache_usage_ratio == 0.5
    assert [e.engine for e in second.engines] == ["0", "1"]


def test_slow_within_the_timeout_is_fine(servers: list[FakeVllmServer]) -> None:
    server = serve(servers, "slow", slow_seconds=0.1)
    result = only(scraper(timeout_seconds=3.0).scrape([EngineTarget(server.url)]))
    assert result.up, result.error_message
    assert result.duration_seconds >= 0.1


def test_gzip_is_asked_for_and_decoded(servers: list[FakeVllmServer]) -> None:
    server = serve(servers)
    result = only(scraper().scrape([EngineTarget(server.url)]))
    assert result.up
    assert server.last_content_encoding == "gzip"
    assert result.engines[0].requests_running == 7.0


def test_cap_applies_to_decoded_bytes(servers: list[FakeVllmServer]) -> None:
    # Padding compresses ~1000:1, so the wire bytes stay far below the cap.
    server = serve(servers, "huge", huge_bytes=8 * CAP)
    result = only(scraper().scrape([EngineTarget(server.url)]))
    assert server.last_content_encoding == "gzip"
    assert (result.up, result.error_reason) == (False, "too_large")


def test_declared_length_over_the_cap_is_refused_before_reading(
    servers: list[FakeVllmServer],
) -> None:
    server = serve(servers, gzip_enabled=False)
    result = only(scraper(max_body_bytes=10_000).scrape([EngineTarget(server.url)]))
    assert server.last_content_encoding == "identity"
    assert result.error_reason == "too_large"
    assert result.error_message is not None and "10000 bytes" in result.error_message


def test_huge_below_the_cap_parses(servers: list[FakeVllmServer]) -> None:
    server = serve(servers, "huge", huge_bytes=CAP // 2, gzip_enabled=False)
    result = only(scraper().scrape([EngineTarget(server.url)]))
    assert result.up, result.error_message


def test_no_targets_is_an_empty_snapshot() -> None:
    assert scraper().scrape([]) == EnginesSnapshot(())


def test_not_vllm_for_candidates_and_declared_targets(servers: list[FakeVllmServer]) -> None:
    plain = serve(servers, engines=[])  # python/process series only, no vllm:
    garbage = serve(servers, "garbage")
    snapshot = scraper().scrape(
        [
            EngineTarget(plain.url, origin="prometheus_annotation"),
            EngineTarget(plain.url, origin="static"),
            # A prometheus.io candidate serving something else entirely is not vLLM, not
            # a broken vLLM; a declared target serving it is broken.
            EngineTarget(garbage.url, origin="prometheus_annotation"),
            EngineTarget(garbage.url, origin="annotation"),
        ]
    )
    assert [s.error_reason for s in snapshot.scrapes] == [
        "not_vllm",
        "not_vllm",
        "not_vllm",
        "garbage",
    ]
    assert not any(s.up for s in snapshot.scrapes)


def test_http_status_and_bad_urls(servers: list[FakeVllmServer]) -> None:
    server = serve(servers, path="/metrics")
    base = server.url.removesuffix("/metrics")
    snapshot = scraper().scrape(
        [
            EngineTarget(base + "/not-metrics"),
            EngineTarget("127.0.0.1:8000/metrics"),  # no scheme
            EngineTarget("http://"),
        ]
    )
    assert [s.error_reason for s in snapshot.scrapes] == ["http_404", "invalid_url", "invalid_url"]


def test_messages_carry_no_body_no_userinfo_no_query(servers: list[FakeVllmServer]) -> None:
    garbage = serve(servers, "garbage")
    failing = serve(servers, "http_500")
    secret_url = garbage.url.replace("http://", "http://admin:hunter2@") + "?token=sk-abc"
    other = failing.url + "?api_key=sk-def#frag"
    snapshot = scraper().scrape([EngineTarget(secret_url), EngineTarget(other)])
    for result in snapshot.scrapes:
        message = result.error_message or ""
        for leaked in (
            "hunter2",
            "admin",
            "token",
            "sk-abc",
            "sk-def",
            "frag",
            "nginx",
            "Bad Gateway",
            "Internal Server Error",
        ):
            assert leaked not in message, (leaked, message)
    assert snapshot.scrapes[0].error_message == f"{garbage.url}: " + (
        "not a Prometheus text exposition (malformed line)"
    )


def test_faults_change_at_run_time(servers: list[FakeVllmServer]) -> None:
    server = serve(servers)
    scrape = scraper()
    target = [EngineTarget(server.url)]
    assert only(scrape.scrape(target)).up

    server.set_fault("refuse")  # model reloading: the port is closed
    assert only(scrape.scrape(target)).error_reason == "refused"

    server.set_fault("ok")  # listening again on the same port
    server.set_engines(
        [FakeEngine(MODEL, 0, running=1, waiting=99, waiting_by_reason={"deferred": 99})]
    )
    result = only(scrape.scrape(target))
    assert result.up
    (engine,) = result.engines
    assert engine.requests_waiting == 99.0
    assert dict(engine.waiting_by_reason) == {"deferred": 99.0}

    server.set_fault("http_500")
    assert only(scrape.scrape(target)).error_reason == "http_500"
    scrape.close()


def test_starting_refused_then_up(servers: list[FakeVllmServer]) -> None:
    server = serve(servers, "refuse")  # pod Running, engine not listening yet
    url = server.url
    assert only(scraper().scrape([EngineTarget(url)])).error_reason == "refused"
    server.set_fault("ok")
    assert server.url == url
    assert only(scraper().scrape([EngineTarget(url)])).up


def test_old_style_engine_scrapes_like_a_new_one(servers: list[FakeVllmServer]) -> None:
    old = serve(
        servers,
        engines=[FakeEngine(MODEL, running=4, waiting=2, kv_cache_usage=0.25, style="0.10")],
    )
    (engine,) = only(scraper().scrape([EngineTarget(old.url)])).engines
    assert (engine.engine, engine.requests_running, engine.kv_cache_usage_ratio) == ("0", 4.0, 0.25)


def test_stop_leaves_no_threads_even_with_a_hung_client(servers: list[FakeVllmServer]) -> None:
    before = {t.ident for t in threading.enumerate()}
    server = FakeVllmServer(fault="hang").start()
    # A client still waiting when the server stops: stop() must not wait on it forever.
    holder = threading.Thread(
        target=lambda: scraper(timeout_seconds=30).scrape([EngineTarget(server.url)])
    )
    holder.start()
    assert wait_for(lambda: server.requests_served == 1)
    started = time.monotonic()
    server.stop()
    holder.join(timeout=10)
    assert time.monotonic() - started < 5
    assert not holder.is_alive()
    leftover = [
        t
        for t in threading.enumerate()
        if t.ident not in before and t.name.startswith(("fake-vllm", "Thread"))
    ]
    assert leftover == []


def test_many_engines_concurrently_with_a_small_pool(servers: list[FakeVllmServer]) -> None:
    good = [serve(servers, engines=[FakeEngine(f"m{i}", 0, running=i)]) for i in range(6)]
    hung = [serve(servers, "hang") for _ in range(2)]
    targets = [EngineTarget(s.url) for s in good + hung]
    snapshot = scraper(max_workers=3).scrape(targets)
    assert [s.up for s in snapshot.scrapes] == [True] * 6 + [False] * 2
    assert [s.engines[0].requests_running for s in snapshot.scrapes[:6]] == [
        float(i) for i in range(6)
    ]
