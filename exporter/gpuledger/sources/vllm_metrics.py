"""vLLM's `/metrics` text exposition, parsed into the few series the ledger needs.

:func:`parse_exposition` is pure: Prometheus text in, one :class:`EngineMetrics` per
(model_name, engine) out. It tolerates every naming generation we know of (see the
``_*`` name constants) and keeps nothing it does not need: ``vllm:cache_config_info``
grows a label every release, so only :data:`CACHE_CONFIG_LABELS` survive.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.model import frozen_map
from gpuledger.model.vllm import EngineMetrics

# The only cache_config_info labels kept; every other label is dropped unread.
CACHE_CONFIG_LABELS: tuple[str, ...] = ("num_gpu_blocks", "block_size")

# A hostile or broken exposition must not explode the ledger's cardinality.
MAX_ENGINES_PER_TARGET = 256
MAX_WAITING_REASONS = 16

# Series names across releases. Older engines (V0, before the rename in 0.9/0.10) used
# gpu_cache_usage_perc and had no `engine` label; newer ones expose both for a while.
_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # 0.20+
_KV_USAGE = "vllm:kv_cache_usage_perc"  # a 0-1 ratio despite "perc" (HELP: 1 = 100%)
_KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # same 0-1 ratio, the pre-rename name
# The parser keeps a counter's `_total` on its samples; a counter exposed without the
# suffix (or an untyped series) arrives under the bare name.
_PREEMPTIONS = frozenset({"vllm:num_preemptions_total", "vllm:num_preemptions"})
_CACHE_CONFIG = "vllm:cache_config_info"
_VALUE_SERIES = frozenset(
    {_RUNNING, _WAITING, _WAITING_BY_REASON, _KV_USAGE, _KV_USAGE_OLD, *_PREEMPTIONS}
)
# Families whose lines (samples, HELP, TYPE) are parsed. A real engine exposes about 600
# lines of which these are a dozen; every other line only gets a shape check.
_WANTED = (_RUNNING, _WAITING, _KV_USAGE, _KV_USAGE_OLD, "vllm:num_preemptions", _CACHE_CONFIG)
# The shape every other sample line must have, matched against the stripped line.
_SAMPLE_SHAPE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(?:\{.*\})?[ \t]+\S+(?:[ \t]+\S+)?[ \t]*")
_COMMENT_PREFIXES = ("# HELP ", "# TYPE ")

# The fast path: one C-level regex pass over the document, then a few regex matches per
# wanted line. On a real exposition that is a quarter of the cost of the per-line Python
# loop plus prometheus_client's char-by-char parser, paid per engine and cycle. Those stay
# the reference: any line or sample the fast path is not certain about goes to them, so
# results and errors are the same as theirs.
_WANTED_NAME = "(?:" + "|".join(map(re.escape, _WANTED)) + ")"
_METRIC_NAME = "[A-Za-z_:][A-Za-z0-9_:]*+"
# Each match skips a run of lines that are certainly neither wanted nor malformed, then
# captures one line: a wanted line (group 1, kept as is: its rule only reads a prefix) or
# any other line (group 2, judged by _keep_line, e.g. indented or oddly shaped lines).
# Possessive quantifiers keep every line's work linear: the only backtracking is the one
# over `}` positions within a line that _SAMPLE_SHAPE itself does.
_LINE_SCAN = re.compile(
    "(?:"
    # another family's sample: strips to a line that _SAMPLE_SHAPE accepts
    f"(?!{_WANTED_NAME}){_METRIC_NAME}"
    r"(?:\{[^\n]*\})?[ \t]++\S++(?:[ \t]++\S++)?+[^\S\n]*+\n"
    # a comment other than a wanted family's HELP or TYPE
    f"|#(?! (?:HELP|TYPE) {_WANTED_NAME})[^\n]*+\n"
    # a blank line
    r"|[^\S\n]*+\n"
    ")*+"
    f"(?:((?:# (?:HELP|TYPE) )?{_WANTED_NAME}[^\n]*+)|([^\n]++)|\\Z)"
)

# A strict subset of the text format, for the wanted lines: a line it does not match in
# full (or a sample prometheus_client would reject: duplicate or reserved label names) makes
# the whole document go through prometheus_client instead.
_FAST_HELP = re.compile(f"# HELP ({_METRIC_NAME})(?:[ \t].*)?")
# Exactly the types prometheus_client's Metric accepts; it rejects any other TYPE.
_FAST_TYPE = re.compile(
    f"# TYPE ({_METRIC_NAME})[ \t]++"
    "(counter|gauge|summary|histogram|gaugehistogram|unknown|info|stateset|untyped)"
)
_LABEL_VALUE = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
# `__` names are reserved (rejected by prometheus_client), as is `__name__` in particular.
_FAST_LABEL = f"(?!__)[A-Za-z_][A-Za-z0-9_]*+={_LABEL_VALUE}"
_LABEL_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*+)="([^"\\]*+(?:\\.[^"\\]*+)*+)"')
# prometheus_client reads a value with int() first, then float(): -0 is 0.0, not -0.0, and
# past ~308 digits int() gives an OverflowError where float() would give inf. Integers are
# capped so that the fast path never meets either edge; longer ones take the slow path.
_INTEGER = "[+-]?[0-9]{1,300}+"
_FLOAT = (
    r"[+-]?(?:[0-9]++\.[0-9]*+|\.[0-9]++)(?:[eE][+-]?[0-9]++)?+"
    r"|[+-]?[0-9]++[eE][+-]?[0-9]++"
    r"|[+-]?(?:Inf|inf|NaN|nan)"
)
# name{labels} value [timestamp], single spaces or runs of them (prometheus_client splits on
# tabs only when the line has no space); a trailing comma in the labels is allowed there.
_FAST_SAMPLE = re.compile(
    f"({_METRIC_NAME})"
    f"(?:\\{{((?:{_FAST_LABEL},)*+(?:{_FAST_LABEL})?+)\\}})?"
    f" ++(?:({_INTEGER})|({_FLOAT}))"
    f"(?: ++(?:{_INTEGER}|{_FLOAT}))?+"
)
# The escapes prometheus_client undoes in label values; any other backslash stays.
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
# Which sample names a TYPE admits into its family (prometheus_client's table).
_FAMILY_SUFFIXES: dict[str, tuple[str, ...]] = {
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
# str.splitlines() boundaries (all of them whitespace as well).
_LINE_BREAKS = r"\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_VLLM_FIRST_LINE = re.compile(f"[^\\S{_LINE_BREAKS}]*+vllm:")
_VLLM_LATER_LINE = re.compile(f"[{_LINE_BREAKS}][^\\S{_LINE_BREAKS}]*+vllm:")


class ExpositionError(ValueError):
    """The text is not a Prometheus text exposition we can read.

    The message never quotes the text: an error page can carry tokens.
    """


def looks_like_vllm(text: str) -> bool:
    """True when any sample line is a `vllm:` series. Cheap, never raises, no parsing.

    That is: some line of `text.splitlines()` starts with `vllm:` once lstrip()ped.
    """
    return bool(_VLLM_FIRST_LINE.match(text) or _VLLM_LATER_LINE.search(text))


@dataclass
class _Builder:
    running: float | None = None
    waiting: float | None = None
    by_reason: dict[str, float] = field(default_factory=dict)
    kv_new: float | None = None
    kv_old: float | None = None
    preemptions: float | None = None


def _finite(value: float) -> float | None:
    # NaN/Inf in a gauge means "unknown", not a number to export.
    return value if math.isfinite(value) else None


def _keep_line(line: str) -> bool:
    """Whether the line belongs to a family we read; raises ExpositionError if any other
    line is not shaped like an exposition line (garbage must not pass for an empty engine).
    """
    stripped = line.strip()
    if not stripped:
        return False
    if stripped.startswith("#"):
        name = stripped[7:] if stripped.startswith(_COMMENT_PREFIXES) else ""
        return name.startswith(_WANTED)
    if stripped.startswith(_WANTED):
        return True
    if _SAMPLE_SHAPE.fullmatch(stripped) is None:
        raise ExpositionError("not a Prometheus text exposition (malformed line)")
    return False


def _relevant_lines(text: str) -> list[str]:
    """The lines of the families we read, in order: exactly those `_keep_line` keeps when
    given every line of `text.split("\\n")`, raising as it would."""
    kept: list[str] = []
    wanted: str
    other: str
    for wanted, other in _LINE_SCAN.findall(text):
        if wanted or (other and _keep_line(other)):
            kept.append(wanted or other)
    return kept


def _samples(relevant: str) -> Iterator[tuple[str, Mapping[str, str], float]]:
    try:
        for family in text_string_to_metric_families(relevant):
            for sample in family.samples:
                yield sample.name, sample.labels, float(sample.value)
    except ExpositionError:
        raise
    except Exception as exc:
        # The parser reports malformed input as ValueError, IndexError, KeyError or
        # TypeError depending on where it breaks; all mean "not an exposition". Its
        # messages quote the offending line, so only the type is kept.
        raise ExpositionError(f"not a Prometheus text exposition ({type(exc).__name__})") from None


_Sample = tuple[str, Mapping[str, str], float]


def _fast_sample(line: str) -> _Sample | None:
    """One stripped sample line as prometheus_client reads it, or None if unsure."""
    match = _FAST_SAMPLE.fullmatch(line)
    if match is None:
        return None
    name, block, integer, number = match.groups()
    labels: dict[str, str] = {}
    if block:
        pairs: list[tuple[str, str]] = _LABEL_PAIR.findall(block)
        labels = dict(pairs)
        if len(labels) != len(pairs):
            return None  # a duplicate label name: prometheus_client rejects the line
        if "\\" in block:
            labels = {k: _ESCAPE.sub(_unescaped, v) for k, v in labels.items()}
    return name, labels, float(int(integer)) if integer else float(number)


def _unescaped(escape: re.Match[str]) -> str:
    return _UNESCAPED[escape.group()]


def _fast_samples(lines: list[str]) -> list[_Sample] | None:
    """What `_samples` yields for these lines, or None where it might differ (or raise).

    Replays prometheus_client's family state, the one part of it that changes a sample:
    a counter family whose name lacks `_total` gets it added to its samples' names.
    """
    samples: list[_Sample] = []
    family, family_type = "", "untyped"
    members: tuple[str, ...] = ()  # the sample names the family admits
    pending: list[_Sample] = []  # the family's samples, named once its type is final

    def flush() -> None:
        if family_type == "counter" and not family.endswith("_total"):
            samples.extend((f"{name}_total", labels, value) for name, labels, value in pending)
        else:
            samples.extend(pending)

    for raw in lines:
        line = raw.strip()
        if line.startswith("# HELP "):
            help_match = _FAST_HELP.fullmatch(line)
            if help_match is None:
                return None
            if help_match[1] != family:
                flush()
                family, family_type, pending = help_match[1], "untyped", []
                members = (family,)
        elif line.startswith("# TYPE "):
            type_match = _FAST_TYPE.fullmatch(line)
            if type_match is None:
                return None
            if type_match[1] != family:
                flush()
                family, pending = type_match[1], []
            family_type = type_match[2]
            members = tuple(family + s for s in _FAMILY_SUFFIXES.get(family_type, ("",)))
        else:
            sample = _fast_sample(line)
            if sample is None:
                return None
            if sample[0] in members:
                pending.append(sample)
            else:  # prometheus_client ends the family; the sample stands alone, untyped
                flush()
                family, family_type, members, pending = "", "untyped", (), []
                samples.append(sample)
    flush()
    return samples


def parse_exposition(text: str) -> tuple[EngineMetrics, ...]:
    """Map a vLLM `/metrics` text exposition to one EngineMetrics per (model, engine).

    Engines are those that expose at least one of the value series (running, waiting,
    waiting by reason, KV-cache usage, preemptions); `cache_config_info` only attaches
    to them. Raises :class:`ExpositionError` for text the Prometheus parser rejects, or
    with more than MAX_ENGINES_PER_TARGET engines.
    """
    builders: dict[tuple[str, str], _Builder] = {}
    # (model_name or None, engine or None): None where the label is absent. A key that
    # saw two different configs is ambiguous (several models behind one endpoint with
    # no model_name on the info series) and is dropped rather than guessed.
    configs: dict[tuple[str | None, str | None], dict[str, str] | None] = {}

    relevant_lines = _relevant_lines(text)
    relevant = "\n".join(relevant_lines) + "\n"
    # An idle engine's gauges may have no sample at all until its first request (vLLM
    # declares them with # TYPE only): a declared gauge without a sample reads 0.
    declared = {
        fields[2]
        for fields in (line.split() for line in relevant.splitlines() if line.startswith("# TYPE "))
        if len(fields) > 2  # splitlines() also breaks at \x85 and friends: a TYPE may be cut
    }
    # Lazily from prometheus_client when the fast path is unsure: an error there then
    # surfaces after the same samples as before.
    fast = _fast_samples(relevant_lines)
    for name, labels, raw in _samples(relevant) if fast is None else fast:
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
        else:  # preemptions, under either name
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
    # Numeric ranks sort numerically (2 before 10); anything else after them.
    # isascii: "²".isdigit() is true, but int("²") raises.
    numeric = engine.isascii() and engine.isdigit()
    return (model, int(engine) if numeric else 1 << 62, engine)
