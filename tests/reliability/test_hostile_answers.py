"""Fault matrix, hostile answers: every HTTP source meets a peer that trickles its status
line and headers a byte a second, or answers huge and pathological bodies (50 MB, a gzip
bomb, deep nesting, millions of empty objects, 200k series, lines past every bound).

Each source sits in the full simulated node (tests/reliability/scenarios.py) behind a
`HostileServer` that relays to the simulated server while healthy. For vLLM the hostile
target is one of three engines. Each cell asserts: the source returns within its deadline;
the reason is counted in gpuledger_source_errors_total (and, for Ray, source_up is 0);
nothing else changes (the other engines' series stay exactly as they were, in the same
cycle); the test process's RSS grows by less than RSS_BOUND; and one cycle after the fault
ends, every series is back as before. What each cell measured goes to
test-artifacts/hostile-answers.json (docs/reliability.md, "Hostile answers").
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuledger.explain.chain import ExplainError, fetch_document
from gpuledger.model import Snapshots
from gpuledger.model.ray import RAY_LOCAL, LocalRayNode, RayNode, RaySnapshot
from gpuledger.pipeline import PipelineConfig
from gpuledger.sources.base import SourceRunner
from gpuledger.sources.ray.serve import ServeClient, ServeSource
from tests.conftest import REPO, Sample, pick
from tests.reliability.harness import Node, errors, rss_bytes, series, source_up, status_of
from tests.reliability.hostile import (
    MIB,
    Answer,
    Behaviour,
    HostileServer,
    Relay,
    Stream,
    TrickleHead,
    base_of,
    fetch,
    gzip_bomb,
)
from tests.reliability.scenarios import SOURCES, full_node
from tests.reliability.test_fault_matrix import AFFECTS, OWN, changed_families

# Production-like: vLLM gets min(3 s, deadline / 2), Ray 0.8 x deadline per request.
DEADLINE = 3.0
VLLM_TIMEOUT = DEADLINE / 2
RAY_TIMEOUT = DEADLINE * 0.8
SLACK = 0.5
RSS_BOUND = 64 * MIB
BAD_MODEL = "bad"

RAY_ENVELOPE = b'{"result": true, "msg": "", "data": {"result": {"result": ['
RAY_END = b"]}}}"


@dataclass(frozen=True)
class Cell:
    fault: str
    how: str  # for the docs and failure messages
    behaviour: Callable[[str], Behaviour]  # given the healthy upstream's base URL
    reasons: tuple[str, ...] = ()  # () : the answer is read, the target stays up


def _valid_lines(size: int) -> Stream:
    return Stream(b'other_metric{engine="0"} 1\n', size)


def _upstream_with(extra: Stream) -> Callable[[str], Behaviour]:
    """The healthy engine's own exposition, then `extra`."""

    def make(upstream: str) -> Behaviour:
        status, own, _ = fetch(upstream + "/metrics")
        assert status == 200
        return Answer(dataclasses.replace(extra, head=own), declare_length=False)

    return make


TRICKLE = Cell(
    "trickled-headers",
    "status line and headers, one byte a second",
    lambda _: TrickleHead(1.0),
    ("timeout",),
)
BIG_DECLARED = Cell(
    "50mb-declared",
    "a 50 MB body, declared in Content-Length",
    lambda _: Answer(_valid_lines(50 * MIB)),
    ("too_large",),
)

VLLM_CELLS = [
    TRICKLE,
    BIG_DECLARED,
    Cell("50mb-streamed", "50 MB of well-formed lines, no Content-Length",
         lambda _: Answer(_valid_lines(50 * MIB), declare_length=False), ("too_large",)),
    Cell("50mb-garbage", "50 MB of binary garbage, no Content-Length",
         lambda _: Answer(Stream(bytes(range(256)), 50 * MIB), declare_length=False),
         ("garbage",)),
    Cell("gzip-bomb", "32 MiB of well-formed lines in a 33 KB gzip",
         lambda _: Answer(gzip_bomb(b"other_metric 1\n", 32 * MIB), gzipped=True),
         ("too_large",)),
    Cell("long-line", "one 1 MiB line of another family",
         lambda _: Answer(b"other_metric{a=\"" + b"x" * MIB + b"\"} 1\n"), ("garbage",)),
    Cell("wanted-lines-past-bound", "600 KiB of vllm: lines (the bound is 512 KiB)",
         lambda _: Answer(Stream(b'vllm:num_requests_running{engine="0"} 1\n', 600 * 1024)),
         ("garbage",)),
    Cell("200k-series", "its own exposition, then 200,000 series of another family",
         _upstream_with(Stream(b'other_metric{engine="0",instance="i"} 1\n', 200_000 * 40))),
]  # fmt: skip

# The same hostile answers from an SGLang target, and bounds met with SGLang's lines: one
# SGLang engine of three (a static target, so read for every kind until its body says).
SGLANG_CELLS = [
    *(c for c in VLLM_CELLS if c.fault != "wanted-lines-past-bound"),
    Cell("wanted-lines-past-bound", "600 KiB of sglang: lines (the bound is 512 KiB)",
         lambda _: Answer(Stream(b'sglang:num_queue_reqs{dp_rank="0"} 1\n', 600 * 1024)),
         ("garbage",)),
    Cell("underscore-lines-past-bound", "600 KiB of sglang_ lines (the same bound)",
         lambda _: Answer(Stream(b'sglang_num_queue_reqs{dp_rank="0"} 1\n', 600 * 1024)),
         ("garbage",)),
    Cell("300-ranks", "300 data-parallel ranks (MAX_ENGINES_PER_TARGET is 256)",
         lambda _: Answer(b"".join(b'sglang:num_running_reqs{dp_rank="%d"} 1\n' % i
                                   for i in range(300))), ("garbage",)),
    Cell("priority-parts", "its own exposition, then 5,000 priorities beside the total",
         _upstream_with(Stream(b'sglang:num_queue_reqs{priority="7"} 9\n', 5_000 * 38))),
]  # fmt: skip

RAY_CELLS = [
    TRICKLE,
    BIG_DECLARED,
    Cell("50mb-streamed", "50 MB, no Content-Length",
         lambda _: Answer(Stream(b" ", 50 * MIB), declare_length=False), ("too_large",)),
    Cell("many-empty-objects", "31 MiB of [{},{},...] in a state API envelope",
         lambda _: Answer(Stream(b"{},", 31 * MIB, RAY_ENVELOPE, b"{}" + RAY_END),
                          declare_length=False), ("too_large",)),
    Cell("deep-nesting", "100,000 nested arrays",
         lambda _: Answer(b"[" * 100_000 + b"]" * 100_000), ("bad_response",)),
    Cell("gzip-bomb", "128 MiB of spaces in a 130 KB gzip",
         lambda _: Answer(gzip_bomb(b" ", 128 * MIB), gzipped=True), ("too_large",)),
    Cell("200k-rows", "200,000 node rows (the client asks for 10,000 at most)",
         lambda _: Answer(Stream(b'{"node_id": "n"},', 200_000 * 17, RAY_ENVELOPE,
                                 b'{"node_id": "n"}' + RAY_END)), ("too_large",)),
]  # fmt: skip

# What each cell measured (docs/reliability.md).
MEASURED: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    if MEASURED:
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "hostile-answers.json").write_text(json.dumps(MEASURED, indent=1))


@dataclass
class Setup:
    node: Node
    proxy: HostileServer
    upstream: str
    baseline: frozenset[Any]
    name: str = ""  # what its cells are reported under, when not the source's name


def _all_up(current: list[Sample]) -> bool:
    return all(source_up(current, s) == 1 for s in SOURCES)


@pytest.fixture(scope="module")
def ray_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    proxy = HostileServer(Relay(""))
    upstream: list[str] = []

    def through_proxy(config: PipelineConfig) -> PipelineConfig:
        upstream.append(config.ray_address or "")
        proxy.behaviour = Relay(config.ray_address or "")
        return dataclasses.replace(config, ray_address=proxy.url)

    node = Node(full_node(), tmp_path_factory.mktemp("ray"), DEADLINE, adjust=through_proxy)
    try:
        baseline = series(node.until(_all_up))
        yield Setup(node, proxy, upstream[0], baseline)
    finally:
        proxy.close()
        node.close()


@pytest.fixture(scope="module")
def vllm_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    doc = full_node()
    doc["vllm"] += [
        {"engines": [{"model_name": "m2", "running": 3}]},
        {"engines": [{"model_name": BAD_MODEL, "running": 5}]},
    ]
    proxy = HostileServer(Relay(""))
    upstream: list[str] = []

    def third_through_proxy(config: PipelineConfig) -> PipelineConfig:
        *others, bad = config.engine_targets
        upstream.append(base_of(bad))
        proxy.behaviour = Relay(base_of(bad))
        return dataclasses.replace(
            config, engine_targets=(*others, proxy.url + bad.removeprefix(base_of(bad)))
        )

    node = Node(doc, tmp_path_factory.mktemp("vllm"), DEADLINE, adjust=third_through_proxy)
    try:
        baseline = series(node.until(lambda s: _all_up(s) and _engines_up(s) == 3))
        yield Setup(node, proxy, upstream[0], baseline)
    finally:
        proxy.close()
        node.close()


@pytest.fixture(scope="module")
def sglang_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    doc = full_node()
    doc["engines"] = [
        *({"kind": "vllm", **e} for e in doc.pop("vllm")),
        {"kind": "vllm", "engines": [{"model_name": "m2", "running": 3}]},
        {"kind": "sglang", "engines": [{"model_name": BAD_MODEL, "running": 5, "waiting": 2}]},
    ]
    proxy = HostileServer(Relay(""))
    upstream: list[str] = []

    def third_through_proxy(config: PipelineConfig) -> PipelineConfig:
        *others, bad = config.engine_targets
        upstream.append(base_of(bad))
        proxy.behaviour = Relay(base_of(bad))
        return dataclasses.replace(
            config, engine_targets=(*others, proxy.url + bad.removeprefix(base_of(bad)))
        )

    node = Node(doc, tmp_path_factory.mktemp("sglang"), DEADLINE, adjust=third_through_proxy)
    try:
        baseline = series(node.until(lambda s: _all_up(s) and _engines_up(s) == 3))
        kinds = {
            labels.get("engine_kind")
            for _, labels, _ in pick(node.scrape(), "gpuledger_engine_config_info")
        }
        assert kinds == {"vllm", "sglang"}
        yield Setup(node, proxy, upstream[0], baseline, "sglang")
    finally:
        proxy.close()
        node.close()


def _engines_up(current: list[Sample]) -> int:
    return sum(1 for _, _, v in pick(current, "gpuledger_engine_up") if v == 1)


def _is_bad(entry: tuple[str, tuple[tuple[str, str], ...]], port: str) -> bool:
    return any(v == BAD_MODEL or port in v for _, v in entry[1])


def _duration(current: list[Sample], source: str) -> float:
    found = pick(current, "gpuledger_source_duration_seconds", source=source)
    return found[0][2] if found else 0.0


def _counted(before: dict[str, float], current: list[Sample], source: str, cell: Cell) -> bool:
    now = errors(current, source)
    return any(now.get(r, 0) > before.get(r, 0) for r in cell.reasons)


def _run(setup: Setup, cell: Cell, source: str, shown: Callable[[list[Sample]], bool]) -> Any:
    """Start the fault, cycle until `shown`, one more cycle; then end it: one cycle."""
    node, started_rss = setup.node, rss_bytes()
    before = errors(node.scrape(), source)
    setup.proxy.behaviour = cell.behaviour(setup.upstream)
    started = time.monotonic()
    try:
        first = node.until(shown, timeout=30)
        shown_after = time.monotonic() - started
        cycle = node.last_cycle_seconds
        second = node.cycle_and_scrape()
        cycle = max(cycle, node.last_cycle_seconds)
        grew = rss_bytes() - started_rss
    finally:
        setup.proxy.behaviour = Relay(setup.upstream)
    recovered = node.cycle_and_scrape()
    counted = errors(second, source)
    MEASURED[f"{setup.name or source}-{cell.fault}"] = {
        "how": cell.how,
        "reasons": sorted(r for r, n in counted.items() if n > before.get(r, 0)),
        "source_seconds": round(max(_duration(first, source), _duration(second, source)), 3),
        "cycle_seconds": round(cycle, 3),
        "shown_after_s": round(shown_after, 2),
        "rss_growth_mib": round(grew / MIB, 1),
    }
    assert grew < RSS_BOUND, (cell.fault, grew / MIB)
    assert node.last_scrape_seconds < 1.0
    return first, second, recovered


@pytest.mark.parametrize("cell", VLLM_CELLS, ids=lambda c: c.fault)
def test_vllm_one_hostile_engine_of_three(cell: Cell, vllm_setup: Setup) -> None:
    _one_hostile_engine_of_three(cell, vllm_setup)


@pytest.mark.parametrize("cell", SGLANG_CELLS, ids=lambda c: c.fault)
def test_sglang_one_hostile_engine_of_three(cell: Cell, sglang_setup: Setup) -> None:
    """An SGLang target beside two vLLM ones costs only its own series (the engines
    source's `source` label stays "vllm", every kind's)."""
    _one_hostile_engine_of_three(cell, sglang_setup)


def _one_hostile_engine_of_three(cell: Cell, setup: Setup) -> None:
    vllm_setup = setup
    node, baseline = vllm_setup.node, vllm_setup.baseline
    port = vllm_setup.proxy.url.rsplit(":", 1)[1]
    before = errors(node.scrape(), "vllm")

    def shown(current: list[Sample]) -> bool:
        if not cell.reasons:
            return _engines_up(current) == 3
        return _engines_up(current) == 2 and _counted(before, current, "vllm", cell)

    first, second, recovered = _run(vllm_setup, cell, "vllm", shown)
    others = {e for e in baseline if not _is_bad(e, port)}
    for current in (first, second):
        # The others are there, in the very cycle that shows the fault, as they were.
        assert {e for e in series(current) if not _is_bad(e, port)} == others
        assert source_up(current, "vllm") == 1
        assert _duration(current, "vllm") < VLLM_TIMEOUT + SLACK, status_of(current)
    if cell.reasons:
        bad_up = [v for _, labels, v in pick(second, "gpuledger_engine_up") if port in str(labels)]
        assert bad_up == [0.0], pick(second, "gpuledger_engine_up")
    else:
        assert series(second) == baseline  # the 200k other series are never kept
    assert _engines_up(recovered) == 3 and series(recovered) == baseline


@pytest.mark.parametrize("cell", RAY_CELLS, ids=lambda c: c.fault)
def test_ray_hostile_dashboard(cell: Cell, ray_setup: Setup) -> None:
    node, baseline = ray_setup.node, ray_setup.baseline
    before = errors(node.scrape(), "ray")

    def shown(current: list[Sample]) -> bool:
        return source_up(current, "ray") == 0 and _counted(before, current, "ray", cell)

    first, second, recovered = _run(ray_setup, cell, "ray", shown)
    for current in (first, second):
        assert _duration(current, "ray") < DEADLINE + SLACK, status_of(current)
        assert node.last_cycle_seconds < 2 * DEADLINE + SLACK
        stray = changed_families(baseline, series(current)) - AFFECTS["ray"]
        assert not stray, stray
        assert not {n for n, _ in series(current)} & OWN["ray"]
        assert all(source_up(current, s) == 1 for s in SOURCES if s != "ray")
    assert source_up(recovered, "ray") == 1 and series(recovered) == baseline


# ------------------------------------------------------------------------ Ray Serve

SERVE_FIXTURES = REPO / "tests" / "fixtures" / "ray" / "ray-2.60-serve"
SERVE_NODE = "7cc0021f8fcc6b248d693dcf14978f1d1aa83da30d5be155e6e4e1df"
SERVE_TIMEOUT = DEADLINE * 0.8  # as the pipeline gives it; the 32 MiB cap takes ~0.8 s

SERVE_DASHBOARD_CELLS = [
    Cell("trickled-headers", "the applications answer: status line and headers, a byte a second",
         lambda _: TrickleHead(1.0), ("timeout",)),
    Cell("many-empty-objects", "the applications answer: 31 MiB of [{},{},...]",
         lambda _: Answer(Stream(b"{},", 31 * MIB, b"[", b"{}]"), declare_length=False),
         ("too_large",)),
    Cell("deep-nesting", "the applications answer: 100,000 nested arrays",
         lambda _: Answer(b"[" * 100_000 + b"]" * 100_000), ("bad_response",)),
    Cell("gzip-bomb", "the applications answer: 128 MiB of spaces in a gzip",
         lambda _: Answer(gzip_bomb(b" ", 128 * MIB), gzipped=True), ("too_large",)),
]  # fmt: skip
SERVE_METRICS_CELLS = [
    Cell("trickled-headers", "a node's metrics: status line and headers, a byte a second",
         lambda _: TrickleHead(1.0), ("metrics_timeout",)),
    Cell("50mb-streamed", "a node's metrics: 50 MB of well-formed lines, no length",
         lambda _: Answer(_valid_lines(50 * MIB), declare_length=False),
         ("metrics_too_large",)),
    Cell("50mb-garbage", "a node's metrics: 50 MB of binary garbage, no length",
         lambda _: Answer(Stream(bytes(range(256)), 50 * MIB), declare_length=False),
         ("metrics_bad_response",)),
    Cell("gzip-bomb", "a node's metrics: 64 MiB of well-formed lines in a 65 KB gzip",
         lambda _: Answer(gzip_bomb(b"other_metric 1\n", 64 * MIB), gzipped=True),
         ("metrics_too_large",)),
    Cell("200k-series", "a node's metrics: the capture, then 200,000 other series",
         lambda _: Answer(Stream(b'other_metric{engine="0",instance="i"} 1\n', 200_000 * 40,
                                 (SERVE_FIXTURES / "ray_serve_metrics_idle.txt").read_bytes()),
                          declare_length=False)),
]  # fmt: skip


@dataclass
class ServeSetup:
    dashboard: HostileServer
    metrics: HostileServer
    routes: dict[str, Behaviour]  # the healthy dashboard's
    metrics_ok: Behaviour
    source: ServeSource
    runner: SourceRunner[Any]
    inputs: Snapshots


@pytest.fixture(scope="module")
def serve_setup() -> Iterator[ServeSetup]:
    metrics_ok = Answer((SERVE_FIXTURES / "ray_serve_metrics_idle.txt").read_bytes())
    metrics = HostileServer(metrics_ok)
    detail = json.loads((SERVE_FIXTURES / "ray_dashboard_nodes_node_id.json").read_text())
    detail["data"]["detail"]["raylet"]["metricsExportPort"] = int(metrics.url.rsplit(":", 1)[1])
    routes: dict[str, Behaviour] = {
        "/api/serve/applications/": Answer(
            (SERVE_FIXTURES / "serve_applications_under_load.json").read_bytes()
        ),
        "/nodes/": Answer(json.dumps(detail).encode()),
    }
    dashboard = HostileServer(Answer(b"", status=404), dict(routes))
    node = RayNode(SERVE_NODE, "127.0.0.1", None, "ALIVE", True)
    local = (LocalRayNode(RaySnapshot(nodes=(node,)), node, None),)
    source = ServeSource(ServeClient(dashboard.url, timeout_seconds=SERVE_TIMEOUT))
    runner: SourceRunner[Any] = SourceRunner("serve", DEADLINE)
    try:
        inputs = Snapshots({RAY_LOCAL: local})
        yield ServeSetup(dashboard, metrics, routes, metrics_ok, source, runner, inputs)
    finally:
        runner.close()
        dashboard.close()
        metrics.close()


def _serve_once(setup: ServeSetup) -> tuple[Any, Any, float]:
    started = time.monotonic()
    value, status = setup.runner.run(lambda: setup.source.fetch(setup.inputs))
    return value, status, time.monotonic() - started


def _serve_cell(setup: ServeSetup, cell: Cell, where: str, start: Callable[[], None]) -> None:
    value, status, _ = _serve_once(setup)
    assert status.up and value is not None and value.nodes, status  # healthy first
    started_rss = rss_bytes()
    try:
        start()
        value, status, took = _serve_once(setup)
        grew = rss_bytes() - started_rss
    finally:
        setup.dashboard.routes = dict(setup.routes)
        setup.metrics.behaviour = setup.metrics_ok
    MEASURED[f"serve-{where}-{cell.fault}"] = {
        "how": cell.how,
        "reasons": [status.error_reason] if not status.up else [],
        "source_seconds": round(took, 3),
        "rss_growth_mib": round(grew / MIB, 1),
    }
    assert took < SERVE_TIMEOUT + SLACK, (cell.fault, took)
    assert grew < RSS_BOUND, (cell.fault, grew / MIB)
    if cell.reasons:
        assert not status.up and status.error_reason in cell.reasons, status
    else:
        assert status.up and value is not None and all(n.up for n in value.nodes), status
    value, status, _ = _serve_once(setup)  # the fault ended: the next fetch is whole
    assert status.up and value is not None and all(n.up for n in value.nodes), status


@pytest.mark.parametrize("cell", SERVE_DASHBOARD_CELLS, ids=lambda c: c.fault)
def test_serve_hostile_dashboard(cell: Cell, serve_setup: ServeSetup) -> None:
    def start() -> None:
        serve_setup.dashboard.routes["/api/serve/applications/"] = cell.behaviour("")

    _serve_cell(serve_setup, cell, "dashboard", start)


@pytest.mark.parametrize("cell", SERVE_METRICS_CELLS, ids=lambda c: c.fault)
def test_serve_hostile_node_metrics(cell: Cell, serve_setup: ServeSetup) -> None:
    def start() -> None:
        serve_setup.metrics.behaviour = cell.behaviour("")

    _serve_cell(serve_setup, cell, "metrics", start)


# ----------------------------------------------------------- the other HTTP readers


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    server = HostileServer(Answer(b"{}"))
    yield server
    server.close()


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        (TrickleHead(1.0), "timeout"),
        (Answer(_valid_lines(80 * MIB), declare_length=False), "too_large"),
        (Answer(gzip_bomb(b" ", 128 * MIB), gzipped=True), "too_large"),
    ],
    ids=["trickled-headers", "80mb-streamed", "gzip-bomb"],
)
def test_explain_reads_are_bounded_too(
    hostile: HostileServer, behaviour: Behaviour, reason: str
) -> None:
    hostile.behaviour = behaviour
    started = time.monotonic()
    with pytest.raises(ExplainError) as caught:
        fetch_document(hostile.url, timeout=1.0)
    assert time.monotonic() - started < 1.0 + SLACK
    assert f"({reason})" in str(caught.value)
