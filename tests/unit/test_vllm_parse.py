"""vLLM exposition parsing: fixtures of three naming generations, edge cases, fuzzing."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.engines.vllm import METRICS, VLLM
from gpuledger.model.engines import EngineMetrics
from gpuledger.sim.fake_vllm import FakeEngine, render_exposition
from gpuledger.sources.engines.exposition import (
    MAX_ENGINES_PER_TARGET,
    MAX_LINE_CHARS,
    MAX_OTHER_LINE_CHARS,
    MAX_WANTED_CHARS,
    ExpositionError,
    ExpositionReader,
    MarkerLines,
    looks_like,
    parse_exposition,
    read_engines,
)

CACHE_CONFIG_LABELS = METRICS.cache_config_labels


def looks_like_vllm_text(text: str) -> bool:
    return looks_like(text, VLLM.markers)


def vllm_reader() -> ExpositionReader:
    return ExpositionReader(METRICS.wanted, METRICS.marker)


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "vllm-0.32-cpu"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
QWEN = "Qwen/Qwen3-0.6B"


def fixture(version: str) -> str:
    return (FIXTURES / f"vllm-{version}.txt").read_text()


def by_key(engines: tuple[EngineMetrics, ...]) -> dict[tuple[str, str], EngineMetrics]:
    return {(e.model_name, e.engine): e for e in engines}


# ------------------------------------------------------------------------ fixtures


def test_real_032_sample() -> None:
    (engine,) = parse_exposition(fixture("0.32"), VLLM)
    assert engine.model_name == "tiny"
    assert engine.engine == "0"
    # An idle engine after 54 completions: zeros, but present (not None).
    assert engine.requests_running == 0.0
    assert engine.requests_waiting == 0.0
    assert dict(engine.waiting_by_reason) == {"capacity": 0.0, "deferred": 0.0}
    assert engine.kv_cache_usage_ratio == 0.0
    assert engine.preemptions_total == 0.0
    assert dict(engine.cache_config) == {"num_gpu_blocks": "8192", "block_size": "128"}


# sha256 of ../shared/reference/vllm-0.32-cpu/metrics.txt, the real engine's exposition.
REFERENCE_SHA256 = "db3b7ad3474a96db5be4b415c66e117a050dd0ad54e188a3cb0a850e9d54fd70"


def test_032_fixture_is_the_reference_verbatim() -> None:
    # The shared reference is not in every checkout (CI): its recorded hash stands in.
    fixture_hash = hashlib.sha256(fixture("0.32").encode()).hexdigest()
    assert fixture_hash == REFERENCE_SHA256
    if REFERENCE.exists():
        assert fixture("0.32") == (REFERENCE / "metrics.txt").read_text()


def test_kv_usage_is_a_ratio_in_the_real_sample() -> None:
    # "perc" in the name, but the HELP text defines 1 as 100 percent.
    help_line = next(
        line
        for line in fixture("0.32").splitlines()
        if line.startswith("# HELP vllm:kv_cache_usage_perc")
    )
    assert "1 means 100 percent usage" in help_line


def test_old_010_names() -> None:
    (engine,) = parse_exposition(fixture("0.10"), VLLM)
    assert engine == EngineMetrics(
        model_name="mistralai/Mistral-7B-Instruct-v0.3",
        engine="0",  # no engine label before data-parallel ranks were labelled
        requests_running=5.0,
        requests_waiting=11.0,
        waiting_by_reason={},
        kv_cache_usage_ratio=0.9921875,  # from vllm:gpu_cache_usage_perc
        preemptions_total=27.0,
        cache_config={"num_gpu_blocks": "27423", "block_size": "16"},
    )


def test_033_several_models_and_data_parallel_ranks() -> None:
    engines = parse_exposition(fixture("0.33"), VLLM)
    # Sorted by model, then numeric rank; engine_healthy{engine} (no model_name, not a
    # value series) must not invent an engine.
    assert [(e.model_name, e.engine) for e in engines] == [
        (QWEN, "0"),
        (LLAMA, "0"),
        (LLAMA, "1"),
    ]
    found = by_key(engines)
    busy = found[(LLAMA, "0")]
    assert busy.requests_running == 48.0
    assert busy.requests_waiting == 17.0
    assert dict(busy.waiting_by_reason) == {"capacity": 15.0, "deferred": 2.0}
    assert busy.kv_cache_usage_ratio == 0.97265625
    assert busy.preemptions_total == 311.0
    idle = found[(LLAMA, "1")]
    assert (idle.requests_running, idle.requests_waiting) == (9.0, 0.0)
    assert idle.kv_cache_usage_ratio == 0.18359375
    assert dict(idle.cache_config) == {"num_gpu_blocks": "24576", "block_size": "16"}
    assert found[(QWEN, "0")].kv_cache_usage_ratio == 0.0234375


def test_033_ambiguous_cache_config_is_dropped_not_guessed() -> None:
    # Two engine="0" cache_config_info lines (one per model, no model_name label) with
    # different block counts: neither model may get the other's config.
    found = by_key(parse_exposition(fixture("0.33"), VLLM))
    assert dict(found[(LLAMA, "0")].cache_config) == {}
    assert dict(found[(QWEN, "0")].cache_config) == {}


@pytest.mark.parametrize("version", ["0.10", "0.32", "0.33"])
def test_cache_config_keeps_only_whitelisted_labels(version: str) -> None:
    for engine in parse_exposition(fixture(version), VLLM):
        assert set(engine.cache_config) <= set(CACHE_CONFIG_LABELS)


# ---------------------------------------------------------------- version mapping

OLD = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 4.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m"} 7.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="100",swap_space="4"} 1.0
"""

NEW = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100",kv_cache_layout="NHD"} 1.0
"""


def test_old_and_new_names_give_the_same_fields() -> None:
    assert parse_exposition(OLD, VLLM) == parse_exposition(NEW, VLLM)
    (engine,) = parse_exposition(NEW, VLLM)
    assert engine.engine == "0"
    assert engine.kv_cache_usage_ratio == 0.5
    assert dict(engine.cache_config) == {"num_gpu_blocks": "100", "block_size": "16"}


@pytest.mark.parametrize("new_first", [True, False])
def test_renamed_kv_usage_wins_over_the_deprecated_one(new_first: bool) -> None:
    # 0.9-0.10 V1 engines exposed both names for a release; the new one is canonical.
    lines = [
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.75',
    ]
    text = "\n".join(lines if new_first else lines[::-1]) + "\n"
    (engine,) = parse_exposition(text, VLLM)
    assert engine.kv_cache_usage_ratio == 0.25


def test_untyped_preemptions_without_total_suffix() -> None:
    (engine,) = parse_exposition('vllm:num_preemptions{engine="0",model_name="m"} 9\n', VLLM)
    assert engine.preemptions_total == 9.0
    assert engine.requests_running is None  # absent, not zero


def test_engines_sort_numerically_and_missing_series_are_none() -> None:
    text = "".join(
        f'vllm:num_requests_waiting{{engine="{r}",model_name="m"}} {r}\n' for r in (10, 2, 0)
    )
    engines = parse_exposition(text, VLLM)
    assert [e.engine for e in engines] == ["0", "2", "10"]
    assert engines[2].requests_waiting == 10.0
    assert engines[2].kv_cache_usage_ratio is None
    assert dict(engines[2].waiting_by_reason) == {}


def test_non_finite_values_are_unknown() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n'
        'vllm:num_requests_running{engine="0",model_name="m"} +Inf\n'
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} NaN\n'
    )
    (engine,) = parse_exposition(text, VLLM)
    assert engine.kv_cache_usage_ratio is None
    assert engine.requests_running is None
    assert dict(engine.waiting_by_reason) == {}


def test_cache_config_never_keeps_other_labels() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="9",'
        'secret_path="/home/me/.cache",api_key="sk-do-not-keep"} 1\n'
    )
    (engine,) = parse_exposition(text, VLLM)
    assert dict(engine.cache_config) == {"num_gpu_blocks": "9", "block_size": "16"}


def test_cache_config_alone_makes_no_engine() -> None:
    assert parse_exposition('vllm:cache_config_info{block_size="16"} 1\n', VLLM) == ()


def test_no_vllm_series_is_an_empty_result_not_an_error() -> None:
    text = "# TYPE up gauge\nup 1\n"
    assert parse_exposition(text, VLLM) == ()
    assert parse_exposition("", VLLM) == ()
    assert not looks_like_vllm_text(text)


def test_looks_like_vllm_text() -> None:
    assert looks_like_vllm_text(fixture("0.32"))
    assert looks_like_vllm_text(fixture("0.10"))
    assert not looks_like_vllm_text("# HELP vllm:x only a comment\nup 1\n")
    assert not looks_like_vllm_text("\x00\xff garbage")


def test_too_many_engines_is_rejected() -> None:
    text = "".join(
        f'vllm:num_requests_running{{engine="{r}",model_name="m"}} 1\n'
        for r in range(MAX_ENGINES_PER_TARGET + 1)
    )
    with pytest.raises(ExpositionError):
        parse_exposition(text, VLLM)


def test_waiting_reasons_are_bounded() -> None:
    text = "".join(
        f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",reason="r{i}"}} 1\n'
        for i in range(100)
    )
    (engine,) = parse_exposition(text, VLLM)
    assert 0 < len(engine.waiting_by_reason) <= 16


# ------------------------------------------------------------------------ garbage

SECRET = "sk-live-0123456789abcdef"


@pytest.mark.parametrize(
    "text",
    [
        f"<html><body>502 Bad Gateway {SECRET}</body></html>\n",
        f'vllm:num_requests_running{{engine="0",model_name="{SECRET}',  # truncated mid-line
        f'vllm:num_requests_running{{engine="0"}} notanumber {SECRET}\n',
        '{"error": "' + SECRET + '"}\n',
    ],
)
def test_garbage_raises_exposition_error_without_quoting(text: str) -> None:
    with pytest.raises(ExpositionError) as info:
        parse_exposition(text, VLLM)
    assert SECRET not in str(info.value)
    assert info.value.__cause__ is None


def test_real_sample_truncated_mid_line_is_garbage() -> None:
    text = fixture("0.32")
    cut = text.index("vllm:kv_cache_usage_perc{engine") + 30
    with pytest.raises(ExpositionError):
        parse_exposition(text[:cut], VLLM)


def _outcome(text: str) -> None:
    try:
        result = parse_exposition(text, VLLM)
    except ExpositionError:
        return
    assert isinstance(result, tuple)
    for engine in result:
        assert isinstance(engine, EngineMetrics)
        for value in (engine.requests_running, engine.kv_cache_usage_ratio):
            assert value is None or math.isfinite(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_fuzz_arbitrary_text_only_raises_exposition_error(text: str) -> None:
    _outcome(text)
    looks_like_vllm_text(text)


SAMPLE_LINES = fixture("0.32").splitlines()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(SAMPLE_LINES), max_size=40),
    st.integers(min_value=0, max_value=4000),
    st.text(max_size=8),
)
def test_fuzz_mutated_real_lines(lines: list[str], cut: int, noise: str) -> None:
    # Near-valid input finds parser paths that random text never reaches.
    text = "\n".join(lines) + "\n"
    _outcome(text[:cut])
    _outcome(text[:cut] + noise + text[cut:])


# -------------------------------------------------------------------- round trips


def test_rendered_032_style_mirrors_the_real_sample() -> None:
    rendered = render_exposition([FakeEngine()])

    def shape(text: str) -> list[str]:
        # HELP/TYPE lines, and every series' name and labels without its value
        return [
            line if line.startswith("#") else line.rsplit(" ", 1)[0] for line in text.splitlines()
        ]

    assert shape(rendered) == shape(fixture("0.32"))


def test_rendered_exposition_round_trips() -> None:
    engines = [
        FakeEngine(
            LLAMA,
            0,
            running=256,
            waiting=40,
            waiting_by_reason={"capacity": 30, "deferred": 10},
            kv_cache_usage=0.99,
            preemptions_total=1200,
            num_gpu_blocks=30000,
            block_size=16,
        ),
        FakeEngine(
            LLAMA, 1, running=12, waiting=0, kv_cache_usage=0.1, num_gpu_blocks=30000, block_size=16
        ),
    ]
    parsed = by_key(parse_exposition(render_exposition(engines), VLLM))
    first = parsed[(LLAMA, "0")]
    assert (first.requests_running, first.requests_waiting) == (256.0, 40.0)
    assert dict(first.waiting_by_reason) == {"capacity": 30.0, "deferred": 10.0}
    assert (first.kv_cache_usage_ratio, first.preemptions_total) == (0.99, 1200.0)
    assert dict(first.cache_config) == {"num_gpu_blocks": "30000", "block_size": "16"}
    second = parsed[(LLAMA, "1")]
    assert dict(second.waiting_by_reason) == {"capacity": 0.0, "deferred": 0.0}


def test_old_and_new_rendered_styles_agree() -> None:
    new = FakeEngine(
        "m",
        running=3,
        waiting=5,
        kv_cache_usage=0.5,
        preemptions_total=2,
        num_gpu_blocks=77,
        block_size=32,
    )
    old = FakeEngine(
        "m",
        running=3,
        waiting=5,
        kv_cache_usage=0.5,
        preemptions_total=2,
        num_gpu_blocks=77,
        block_size=32,
        style="0.10",
    )
    (from_new,) = parse_exposition(render_exposition([new]), VLLM)
    (from_old,) = parse_exposition(render_exposition([old]), VLLM)
    assert dict(from_new.waiting_by_reason) == {"capacity": 5.0, "deferred": 0.0}
    assert dict(from_old.waiting_by_reason) == {}
    assert from_old == EngineMetrics(**{**from_new.__dict__, "waiting_by_reason": {}})
    assert "engine=" not in render_exposition([old])


def test_mixed_styles_behind_one_endpoint_are_refused() -> None:
    with pytest.raises(ValueError):
        render_exposition([FakeEngine(), FakeEngine(style="0.10")])


finite = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(
    running=finite,
    waiting=finite,
    kv=st.floats(0, 1),
    preempted=finite,
    model=st.text(min_size=1, max_size=40),
    rank=st.integers(0, 63),
)
def test_round_trip_property(
    running: float, waiting: float, kv: float, preempted: float, model: str, rank: int
) -> None:
    engine = FakeEngine(
        model,
        rank,
        running=running,
        waiting=waiting,
        kv_cache_usage=kv,
        preemptions_total=preempted,
    )
    (parsed,) = parse_exposition(render_exposition([engine]), VLLM)
    assert (parsed.model_name, parsed.engine) == (model, str(rank))
    assert parsed.requests_running == running
    assert parsed.requests_waiting == waiting
    assert parsed.kv_cache_usage_ratio == kv
    assert parsed.preemptions_total == preempted


def test_idle_engine_with_declared_but_unsampled_gauges_reads_zero() -> None:
    # Real capture: data parallel 2 behind two API servers, before the first request.
    text = (FIXTURES / "vllm-0.32-cpu-dp2-idle.txt").read_text()
    engines = {e.engine: e for e in parse_exposition(text, VLLM)}
    assert set(engines) == {"0", "1"}
    for engine in engines.values():
        assert engine.model_name == "tiny"
        assert (engine.requests_running, engine.requests_waiting) == (0.0, 0.0)
        assert engine.kv_cache_usage_ratio == 0.0
        assert engine.preemptions_total == 0.0


# ----------------------------------------------------------------- edges and hostility


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("vllm-*.txt")), ids=lambda p: p.name)
def test_line_endings_and_indentation_do_not_change_the_result(path: Path) -> None:
    text = path.read_text()
    engines = parse_exposition(text, VLLM)
    assert engines  # every real sample holds engines
    assert parse_exposition(text.replace("\n", "\r\n"), VLLM) == engines
    assert parse_exposition("".join(f"  {line}\n" for line in text.splitlines()), VLLM) == engines


@pytest.mark.parametrize(
    ("text", "preemptions"),
    [
        # prometheus_client adds _total to a counter family's samples
        ("# TYPE vllm:num_preemptions counter\nvllm:num_preemptions 3\n", 3.0),
        ("# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total 4\n", 4.0),
        # a _created sample is another series, not the count
        (
            "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_created 1\n"
            "vllm:num_preemptions 2\n",
            2.0,
        ),
    ],
)
def test_preemption_counters_in_every_spelling(text: str, preemptions: float) -> None:
    (engine,) = parse_exposition(text, VLLM)
    assert engine.preemptions_total == preemptions


def test_escaped_label_values_are_unescaped() -> None:
    text = 'vllm:num_requests_running{model_name="a\\\\\\"b\\n\\t}",engine="0",} 1\n'
    (engine,) = parse_exposition(text, VLLM)
    assert engine.model_name == 'a\\"b\n\\t}'


def test_inputs_that_once_crashed_are_parsed_or_refused_cleanly() -> None:
    """Both raised a bare ValueError/IndexError (reported as internal_error) once."""
    text = 'vllm:num_requests_running{engine="²"} 1\nvllm:num_requests_running{engine="2"} 3\n'
    assert [e.engine for e in parse_exposition(text, VLLM)] == ["2", "²"]  # numeric ranks first
    with pytest.raises(ExpositionError):  # a TYPE line cut at U+0085: garbage, said so
        parse_exposition("vllm:num_requests_running 1\x85# TYPE \n", VLLM)


@pytest.mark.parametrize(
    "text",
    [
        'vllm:num_requests_running{engine="0",engine="1"} 1\n',
        'vllm:num_requests_running{__name__="x"} 1\n',
        "vllm:num_requests_running{engine=0} 1\n",
        'vllm:num_requests_running{engine="0"\n',
        "vllm:num_requests_running x\n",
        f"vllm:num_requests_running {'9' * 400}\n",
        "# TYPE vllm:kv_cache_usage_perc bogus\nvllm:kv_cache_usage_perc 0.5\n",
    ],
)
def test_malformed_wanted_lines_are_exposition_errors(text: str) -> None:
    with pytest.raises(ExpositionError, match="not a Prometheus text exposition"):
        parse_exposition(text, VLLM)


MEGABYTE = 1 << 20
RUNNING = "vllm:num_requests_running"


@pytest.mark.parametrize(
    "line",
    [
        f'{RUNNING}{{a="' + "\\" * MEGABYTE + '"} 1',
        f'{RUNNING}{{a="' + '\\"' * (MEGABYTE // 2) + '"} 1',
        RUNNING + "{" + 'a="",' * (MEGABYTE // 5) + "} 1",
        "a{" + "}" * MEGABYTE,  # another family's line, not shaped like a sample
        "a " + "x " * (MEGABYTE // 2),
    ],
    ids=range(5),
)
def test_megabyte_lines_are_refused(line: str) -> None:
    # A wanted line this long never reaches prometheus_client, whose label parser slows
    # down more than linearly on such lines (benchmarks/bench_parse.py measures it).
    with pytest.raises(ExpositionError):
        parse_exposition(line + "\n", VLLM)
    assert looks_like_vllm_text(line) == line.startswith("vllm:")


LONGEST_OTHER = MAX_OTHER_LINE_CHARS


@pytest.mark.parametrize(
    "line",
    ["a{" + "} x" * ((LONGEST_OTHER - 2) // 3), "# " * (LONGEST_OTHER // 2)],
    ids=["sample", "comment"],
)
def test_long_lines_of_other_families_are_only_shape_checked(line: str) -> None:
    assert len(line) <= MAX_OTHER_LINE_CHARS
    assert parse_exposition(line + "\n", VLLM) == ()
    # Past the bound a line is refused: it is held whole until it ends (sources/engines/source.py
    # reads bodies piece by piece), and no real exposition has one.
    with pytest.raises(ExpositionError, match="line over"):
        parse_exposition(line + "x" * (MAX_OTHER_LINE_CHARS - len(line) + 1) + "\n", VLLM)


def test_wanted_lines_are_bounded_in_length_and_in_all() -> None:
    label = 'vllm:num_requests_running{{engine="0",model_name="{}"}} 1\n'
    longest = label.format("m" * (MAX_LINE_CHARS - len(label.format(""))))
    assert parse_exposition(longest, VLLM)
    with pytest.raises(ExpositionError, match="longer than"):
        parse_exposition(label.format("m" * MAX_LINE_CHARS), VLLM)
    many = label.format("m" * 1000) * (MAX_WANTED_CHARS // 1000)
    with pytest.raises(ExpositionError, match="longer than"):
        parse_exposition(many, VLLM)
    # Other families' lines do not count: a large exposition of other series is fine.
    assert parse_exposition(longest + "other_series 1\n" * (MAX_WANTED_CHARS // 10), VLLM)


# ------------------------------------------------------------ read piece by piece


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def _read(pieces: list[str]) -> tuple[EngineMetrics, ...] | str:
    reader = vllm_reader()
    try:
        for piece in pieces:
            reader.feed(piece)
        return read_engines(reader.relevant(), METRICS)
    except ExpositionError:
        return "error"


def _whole(text: str) -> tuple[EngineMetrics, ...] | str:
    try:
        return parse_exposition(text, VLLM)
    except ExpositionError:
        return "error"


PIECE_TEXT = st.one_of(
    st.text(alphabet='vlm: \n\r\t\x85\u2028#{}="01xa_', max_size=200),
    st.lists(st.sampled_from(SAMPLE_LINES), max_size=30).map(lambda ls: "\n".join(ls) + "\n"),
)


@settings(max_examples=300, deadline=None)
@given(PIECE_TEXT, st.lists(st.integers(min_value=0, max_value=4000), max_size=8))
def test_a_text_read_in_pieces_reads_as_the_whole(text: str, cuts: list[int]) -> None:
    pieces = _pieces(text, cuts)
    assert _read(pieces) == _whole(text)
    watch = MarkerLines(VLLM.markers)
    for piece in pieces:
        watch.feed(piece)
    assert watch.seen == looks_like_vllm_text(text)


def test_the_real_sample_read_a_byte_at_a_time() -> None:
    text = fixture("0.32")
    assert _read(list(text)) == parse_exposition(text, VLLM)
    watch = MarkerLines(VLLM.markers)
    for char in text:
        watch.feed(char)
    assert watch.seen


def test_a_line_is_refused_while_it_is_still_arriving() -> None:
    reader = vllm_reader()
    reader.feed("a" * MAX_OTHER_LINE_CHARS)
    with pytest.raises(ExpositionError, match="line over"):
        reader.feed("a")


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.text(alphabet=' \t\r\x0b\x85#{}="01ax_:é', max_size=24).filter(lambda t: "\n" not in t),
        max_size=12,
    )
)
def test_the_fast_path_accepts_only_lines_the_line_check_passes(lines: list[str]) -> None:
    from gpuledger.sources.engines.exposition import _OTHER_LINES, _keep_line

    block = "".join(f"{line}\n" for line in lines)
    if _OTHER_LINES.fullmatch(block) is None:
        return
    for line in lines:
        assert _keep_line(line, METRICS.wanted) is False  # neither kept nor refused
