"""The fast exposition parser against the implementation it replaced, kept here verbatim.

parse_exposition skips most lines with one regex pass and reads the wanted ones with a
strict subset of the text format, deferring to prometheus_client for anything else. The
reference below is the code from before that change (a per-line Python loop, then
prometheus_client for every wanted line): for any text, both must return equal results
or raise the same error with the same message.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.model import frozen_map
from gpuledger.model.vllm import EngineMetrics
from gpuledger.sources.vllm_metrics import (
    CACHE_CONFIG_LABELS,
    MAX_ENGINES_PER_TARGET,
    MAX_WAITING_REASONS,
    ExpositionError,
    looks_like_vllm,
    parse_exposition,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"

# ------------------------------------------------------- reference (the old code path)

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
_KV_USAGE = "vllm:kv_cache_usage_perc"
_KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
_PREEMPTIONS = frozenset({"vllm:num_preemptions_total", "vllm:num_preemptions"})
_CACHE_CONFIG = "vllm:cache_config_info"
_VALUE_SERIES = frozenset(
    {_RUNNING, _WAITING, _WAITING_BY_REASON, _KV_USAGE, _KV_USAGE_OLD, *_PREEMPTIONS}
)
_WANTED = (_RUNNING, _WAITING, _KV_USAGE, _KV_USAGE_OLD, "vllm:num_preemptions", _CACHE_CONFIG)
_SAMPLE_SHAPE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(?:\{.*\})?[ \t]+\S+(?:[ \t]+\S+)?[ \t]*")
_COMMENT_PREFIXES = ("# HELP ", "# TYPE ")


def _reference_looks_like_vllm(text: str) -> bool:
    return any(line.lstrip().startswith("vllm:") for line in text.splitlines())


@dataclass
class _Builder:
    running: float | None = None
    waiting: float | None = None
    by_reason: dict[str, float] = field(default_factory=dict)
    kv_new: float | None = None
    kv_old: float | None = None
    preemptions: float | None = None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _reference_relevant_lines(text: str) -> str:
    kept: list[str] = []
    for line in text.split("\n"):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            name = stripped[7:] if stripped.startswith(_COMMENT_PREFIXES) else ""
            if name.startswith(_WANTED):
                kept.append(line)
            continue
        if stripped.startswith(_WANTED):
            kept.append(line)
        elif _SAMPLE_SHAPE.fullmatch(stripped) is None:
            raise ExpositionError("not a Prometheus text exposition (malformed line)")
    return "\n".join(kept) + "\n"


def _reference_samples(relevant: str) -> Iterator[tuple[str, Mapping[str, str], float]]:
    try:
        for family in text_string_to_metric_families(relevant):
            for sample in family.samples:
                yield sample.name, sample.labels, float(sample.value)
    except ExpositionError:
        raise
    except Exception as exc:
        raise ExpositionError(f"not a Prometheus text exposition ({type(exc).__name__})") from None


def _reference_parse_exposition(text: str) -> tuple[EngineMetrics, ...]:
    builders: dict[tuple[str, str], _Builder] = {}
    configs: dict[tuple[str | None, str | None], dict[str, str] | None] = {}

    relevant = _reference_relevant_lines(text)
    declared = {  # fixed like the exporter's: a cut TYPE line crashed (IndexError)
        fields[2]
        for fields in (line.split() for line in relevant.splitlines() if line.startswith("# TYPE "))
        if len(fields) > 2
    }
    for name, labels, raw in _reference_samples(relevant):
        if name == _CACHE_CONFIG:
            key = (labels.get("model_name"), labels.get("engine"))
            kept = {k: labels[k] for k in CACHE_CONFIG_LABELS if k in labels}
            if key in configs and configs[key] != kept:
                configs[key] = None
            else:
                configs[key] = kept
            continue
        if name not in _VALUE_SERIES:
            continue
        engine_key = (labels.get("model_name", ""), labels.get("engine", "0"))
        builder = builders.get(engine_key)
        if builder is None:
            if len(builders) >= MAX_ENGINES_PER_TARGET:
                raise ExpositionError(
                    f"more than {MAX_ENGINES_PER_TARGET} (model_name, engine) pairs"
                )
            builder = builders[engine_key] = _Builder()
        value = _finite(raw)
        if name == _RUNNING:
            builder.running = value
        elif name == _WAITING:
            builder.waiting = value
        elif name == _WAITING_BY_REASON:
            reason = labels.get("reason")
            if (
                value is not None
                and reason is not None
                and (reason in builder.by_reason or len(builder.by_reason) < MAX_WAITING_REASONS)
            ):
                builder.by_reason[reason] = value
        elif name == _KV_USAGE:
            builder.kv_new = value
        elif name == _KV_USAGE_OLD:
            builder.kv_old = value
        else:
            builder.preemptions = value

    def config_for(model: str, engine: str) -> Mapping[str, str]:
        for key in ((model, engine), (None, engine), (model, None), (None, None)):
            if key in configs:
                found = configs[key]
                return frozen_map(found) if found is not None else frozen_map()
        return frozen_map()

    for b in builders.values():
        if b.running is None and _RUNNING in declared:
            b.running = 0.0
        if b.waiting is None and _WAITING in declared:
            b.waiting = 0.0
        if b.kv_new is None and b.kv_old is None and _KV_USAGE in declared:
            b.kv_new = 0.0
    return tuple(
        EngineMetrics(
            model_name=model,
            engine=engine,
            requests_running=b.running,
            requests_waiting=b.waiting,
            waiting_by_reason=frozen_map(b.by_reason),
            kv_cache_usage_ratio=b.kv_new if b.kv_new is not None else b.kv_old,
            preemptions_total=b.preemptions,
            cache_config=config_for(model, engine),
        )
        for (model, engine), b in sorted(builders.items(), key=lambda kv: _order(kv[0]))
    )


def _order(key: tuple[str, str]) -> tuple[str, int, str]:
    model, engine = key
    numeric = engine.isascii() and engine.isdigit()  # fixed: int("²") crashed
    return (model, int(engine) if numeric else 1 << 62, engine)


# ------------------------------------------------------------------------ comparison


def _outcome(parse: Callable[[str], tuple[EngineMetrics, ...]], text: str) -> tuple[str, str]:
    """What a parser did with the text: its result (repr keeps -0.0 apart from 0.0) or
    the error it raised, with the message."""
    try:
        result = parse(text)
    except ExpositionError as exc:
        return "ExpositionError", str(exc)
    except Exception as exc:  # the same crash on both sides still counts as "identical"
        return "crash", type(exc).__name__
    return "ok", repr(result)


def assert_same_as_reference(text: str) -> None:
    assert _outcome(parse_exposition, text) == _outcome(_reference_parse_exposition, text)
    assert looks_like_vllm(text) == _reference_looks_like_vllm(text)


# ------------------------------------------------------------------------ strategies

FIXTURE_LINES = sorted(
    {line for path in FIXTURES.glob("vllm-*.txt") for line in path.read_text().splitlines()}
)
WANTED_FIXTURE_LINES = [line for line in FIXTURE_LINES if any(w in line for w in _WANTED)]

NAMES = [
    *_WANTED,
    _WAITING_BY_REASON,
    "vllm:num_preemptions_total",
    "vllm:num_preemptions_created",
    "vllm:num_requests_running_total",
    "vllm:kv_cache_usage_perc_sum",
    "vllm:kv_cache_usage_perc_count",
    "vllm:kv_cache_usage_perc_bucket",
    "vllm:other",
    "up",
    ":x",
    "9x",
    "vllm:num_requests_running-x",
]
LABEL_NAMES = ["model_name", "engine", "reason", "num_gpu_blocks", "block_size", "x"]
ODD_LABEL_NAMES = ["__name__", "__x", "a:b", "é", '"q"', "1a", "", " engine "]
VALUE_TOKENS = [
    "0", "1", "7", "0.0", "-0", "-0.0", "+5", "007", "1e3", "1E-3", "1.5e+09", ".5", "5.",
    "+Inf", "-Inf", "Inf", "inf", "NaN", "nan", "-nan", "infinity", "1_000", "0x10", "١٢",
    "1e400", "9" * 320, "9" * 300, "1" * 20, "", "x", "1.0.0", "--1", "0.99",
]  # fmt: skip
TYPES = [
    "gauge", "counter", "summary", "histogram", "untyped", "unknown", "info", "stateset",
    "gaugehistogram", "Gauge", "gauge extra", "", "foo",
]  # fmt: skip
SPACES = ["", " ", "\t", "\r", "\x0b", "\x85", "\u2028", "\x1c", "\xa0"]

label_text = st.text(
    alphabet=st.sampled_from(list('a0"\\n\n}{,= \té\r#')) | st.characters(), max_size=8
)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


label_value = st.one_of(
    st.sampled_from(["0", "1", "2", "10", "m", "n", "capacity", "deferred", "16"]),
    label_text.map(escape),
    label_text.map(escape),
    label_text.filter(lambda v: "\n" not in v),  # raw: quotes and backslashes unescaped
)
label_pair = st.tuples(
    st.sampled_from(LABEL_NAMES * 6 + ODD_LABEL_NAMES),
    label_value,
    st.sampled_from([True] * 9 + [False]),  # quoted
)
label_pairs = st.lists(label_pair, max_size=4, unique_by=lambda p: p[0]) | st.lists(
    label_pair, max_size=4
)


def render_labels(pairs: list[tuple[str, str, bool]], separator: str = ",") -> str:
    return separator.join(f'{k}="{v}"' if quoted else f"{k}={v}" for k, v, quoted in pairs)


label_block = st.one_of(
    st.just(""),
    st.builds(
        lambda pairs, trailing: "{" + render_labels(pairs) + ("," if trailing else "") + "}",
        label_pairs,
        st.booleans(),
    ),
    st.builds(lambda pairs: "{ " + render_labels(pairs, " , ") + " }", label_pairs),
)
number = st.one_of(
    st.sampled_from(VALUE_TOKENS),
    st.floats().map(repr),
    st.floats().map(lambda f: f"{f:g}"),
    st.integers().map(str),
)
sample_line = st.builds(
    lambda name, labels, sep, value, timestamp: f"{name}{labels}{sep}{value}{timestamp}",
    st.sampled_from(NAMES),
    label_block,
    st.sampled_from([" "] * 6 + ["  ", "\t", ""]),
    st.sampled_from(["0", "1.5", "17", "0.25", "2e3"]) | number,
    st.one_of(
        st.just(""), st.sampled_from([" ", "  ", "\t"]).flatmap(lambda s: number.map(s.__add__))
    ),
)
comment_line = st.one_of(
    st.builds(
        lambda keyword, name, sep, rest: f"# {keyword} {name}{sep}{rest}",
        st.sampled_from(["HELP", "TYPE"]),
        st.sampled_from(NAMES),
        st.sampled_from([" ", " ", "\t", "  ", "", "\x0b"]),
        st.sampled_from(TYPES[:4] * 3 + TYPES) | st.text(max_size=10),
    ),
    st.sampled_from(["#", "# foo", "# HELP", "# TYPE", "#HELP vllm:num_requests_running x"]),
)
mutated_line = st.builds(
    lambda line, at, cut, insert: line[:at] + insert + line[at + cut :],
    st.sampled_from(FIXTURE_LINES),
    st.integers(0, 120),
    st.integers(0, 3),
    st.text(alphabet=st.sampled_from(list('" {},=\\\t#x0')) | st.characters(), max_size=3),
)
any_line = st.one_of(
    st.sampled_from(WANTED_FIXTURE_LINES),
    st.sampled_from(FIXTURE_LINES),
    sample_line,
    sample_line,
    comment_line,
    mutated_line,
    st.sampled_from(SPACES),
    st.text(max_size=20),
)


@st.composite
def families(draw: st.DrawFn) -> str:
    """A family as exposed: HELP, TYPE, then samples (the type decides which samples join
    the family, and a counter's are renamed), sometimes typed again."""
    name = draw(st.sampled_from(NAMES[:10]))
    lines = [f"# HELP {name} doc"] if draw(st.booleans()) else []
    lines.append(f"# TYPE {name} {draw(st.sampled_from(TYPES[:8]))}")
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 5)) == 0:
            lines.append(f"# TYPE {name} {draw(st.sampled_from(TYPES[:8]))}")
        suffix = draw(st.sampled_from(["", "", "_total", "_count", "_sum", "_bucket", "_created"]))
        pairs = draw(
            st.lists(
                st.tuples(
                    st.sampled_from(LABEL_NAMES),
                    st.sampled_from(["0", "1", "m", "capacity", "16"]) | label_text.map(escape),
                    st.just(True),
                ),
                max_size=3,
                unique_by=lambda p: p[0],
            )
        )
        value = draw(st.sampled_from(["0", "1", "-0", "2.5", "-0.0", "NaN", "+Inf", "1e3"]))
        lines.append(f"{name}{suffix}{{{render_labels(pairs)}}} {value}")
    return "\n".join(lines)


# Mostly lines a parser may accept: a garbage line anywhere makes the whole text an error.
readable_line = st.one_of(
    st.sampled_from(WANTED_FIXTURE_LINES),
    st.sampled_from(FIXTURE_LINES),
    sample_line,
    comment_line,
    families(),
    families(),
    st.just(""),
)


def documents(lines: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    padded = st.one_of(
        lines,
        st.builds(
            lambda a, b, c: a + b + c, st.sampled_from(SPACES), lines, st.sampled_from(SPACES)
        ),
    )
    return st.builds(
        lambda lines, newline, trailing: newline.join(lines) + (newline if trailing else ""),
        st.lists(padded, max_size=30),
        st.sampled_from(["\n", "\n", "\n", "\r\n"]),
        st.booleans(),
    )


# From texts the fast path reads in full to texts that are mostly errors.
expositions = st.one_of(
    documents(families() | st.sampled_from(WANTED_FIXTURE_LINES)),
    documents(readable_line),
    documents(any_line),
)


# ---------------------------------------------------------------------- differential


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expositions)
def test_same_as_reference_on_generated_expositions(text: str) -> None:
    assert_same_as_reference(text)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(FIXTURES.glob("vllm-*.txt"))), st.integers(0, 10**6), st.text())
def test_same_as_reference_on_spliced_fixtures(path: Path, at: int, insert: str) -> None:
    text = path.read_text()
    at %= len(text) + 1
    assert_same_as_reference(text[:at] + insert + text[at:])


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("vllm-*.txt")), ids=lambda p: p.name)
def test_same_as_reference_on_fixtures(path: Path) -> None:
    text = path.read_text()
    assert parse_exposition(text)  # the real samples all hold engines
    assert_same_as_reference(text)
    assert_same_as_reference(text.replace("\n", "\r\n"))
    assert_same_as_reference("".join(f"  {line}\n" for line in text.splitlines()))


def engines(count: int, *, typed: bool = False) -> str:
    head = "# TYPE vllm:num_requests_running gauge\n" if typed else ""
    return head + "".join(
        f'vllm:num_requests_running{{engine="{r}",model_name="m"}} 1\n' for r in range(count)
    )


@pytest.mark.parametrize(
    "text",
    [
        # error precedence: too many engines is reported before a later unreadable line,
        # unless the engines' family is still open (prometheus_client yields it late)
        engines(MAX_ENGINES_PER_TARGET + 1) + "vllm:num_requests_waiting{engine=0} 1\n",
        engines(MAX_ENGINES_PER_TARGET + 1, typed=True) + "vllm:num_requests_waiting{x} 1\n",
        engines(MAX_ENGINES_PER_TARGET + 1) + "garbage line\n",
        # counters: the parser adds _total to a counter family's samples
        "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions 3\n",
        "# TYPE vllm:num_requests_running counter\nvllm:num_requests_running 3\n",
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
        "# TYPE vllm:num_requests_running counter\n",
        "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total 3\n",
        "# HELP vllm:num_preemptions x\n# TYPE vllm:num_preemptions counter\n"
        "vllm:num_preemptions 3\n# HELP vllm:num_preemptions y\nvllm:num_preemptions 4\n",
        "# TYPE vllm:num_preemptions counter\n"
        "vllm:num_preemptions_created 1\nvllm:num_preemptions 2\n",
        "# TYPE vllm:kv_cache_usage_perc histogram\nvllm:kv_cache_usage_perc 0.5\n",
        "# TYPE vllm:kv_cache_usage_perc summary\nvllm:kv_cache_usage_perc 0.5\n",
        # which samples join a family shows when a later TYPE turns it into a counter
        "# TYPE vllm:num_requests_running histogram\nvllm:num_requests_running 1\n"
        "# TYPE vllm:num_requests_running counter\n",
        "# TYPE vllm:num_requests_running summary\nvllm:num_requests_running_count 1\n"
        "vllm:num_requests_running 2\n# TYPE vllm:num_requests_running counter\n",
        "# TYPE vllm:kv_cache_usage_perc bogus\nvllm:kv_cache_usage_perc 0.5\n",
        "# TYPE vllm:kv_cache_usage_perc\n",
        # values: int() before float(), as prometheus_client reads them
        "vllm:num_requests_running -0\nvllm:num_requests_waiting -0.0\n",
        f"vllm:num_requests_running {'9' * 400}\n",
        f"vllm:num_requests_running 1 {'9' * 400}\n",
        "vllm:num_requests_running 1 2 3\n",
        "vllm:num_requests_running\t1\n",
        "vllm:num_requests_running{}1\n",
        # labels
        'vllm:num_requests_running{model_name="a\\\\\\"b\\n\\t}",engine="0",} 1\n',
        'vllm:num_requests_running{engine="0",engine="1"} 1\n',
        'vllm:num_requests_running{__name__="x"} 1\n',
        'vllm:num_requests_running{__x="x"} 1\n',
        'vllm:num_requests_running{a:b="x"} 1\n',
        'vllm:num_requests_running{,engine="0"} 1\n',
        'vllm:num_requests_running{ engine = "0" } 1\n',
        'vllm:num_requests_running{engine="²"} 1\n',  # crashed before (int("²"))
        # lines
        "  vllm:num_requests_running 1\r\n  # TYPE vllm:num_requests_running gauge\r\n",
        "vllm:num_requests_running 1\x85# TYPE vllm:kv_cache_usage_perc gauge\n",
        "vllm:num_requests_running 1\x85# TYPE \n",  # crashed before (IndexError)
        "\u2028vllm:num_requests_running 1",
        'up{a="}"} 1 }\n',
        'up{a="}"} 1 } 2\n',
        "",
        "\n\n\n",
    ],
)
def test_same_as_reference_on_edge_cases(text: str) -> None:
    assert_same_as_reference(text)


# ------------------------------------------------------------------- adversarial input

MEGABYTE = 1 << 20


@pytest.mark.parametrize(
    "line",
    [
        "a{" + "}" * MEGABYTE,
        "a{" + "} " * (MEGABYTE // 2),
        "a{" + "} x" * (MEGABYTE // 3),
        "a " + "x " * (MEGABYTE // 2),
        "# " * (MEGABYTE // 2),
        "\n" * MEGABYTE,
        " " * MEGABYTE,
        'vllm:num_requests_running{a="' + "\\" * MEGABYTE + '"} 1',
        'vllm:num_requests_running{a="' + '\\"' * (MEGABYTE // 2) + '"} 1',
    ],
    ids=range(9),
)
def test_megabyte_lines_take_linear_time(line: str) -> None:
    started = time.monotonic()
    with contextlib.suppress(ExpositionError):
        parse_exposition(line + "\n")
    looks_like_vllm(line)
    # Linear work is a few milliseconds; backtracking over a megabyte would be hours.
    assert time.monotonic() - started < 2.0


def test_inputs_that_used_to_crash_are_parsed_or_refused_cleanly() -> None:
    """Both raised a bare ValueError/IndexError (reported as internal_error) before."""
    text = 'vllm:num_requests_running{engine="²"} 1\nvllm:num_requests_running{engine="2"} 3\n'
    assert [e.engine for e in parse_exposition(text)] == ["2", "²"]  # numeric ranks first
    with pytest.raises(ExpositionError):  # a TYPE line cut at U+0085: garbage, said so
        parse_exposition("vllm:num_requests_running 1\x85# TYPE \n")
