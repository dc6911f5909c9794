"""vLLM's `/metrics` text exposition, parsed into the few series the ledger needs.

:func:`parse_exposition` is pure: Prometheus text in, one :class:`EngineMetrics` per
(model_name, engine) out. It tolerates every naming generation we know of (see the
``_*`` name constants) and keeps nothing it does not need: ``vllm:cache_config_info``
grows a label every release, so only :data:`CACHE_CONFIG_LABELS` survive.

:class:`ExpositionReader` and :class:`VllmLines` do the same for a body read piece by
piece as it arrives (sources/engines/source.py): each line is checked or kept as soon as it ends,
so a scrape holds the lines of the families read and one line, never the body.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.model import frozen_map
from gpuledger.model.engines import EngineMetrics

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
# Lines, each ending in \n, that _keep_line passes without keeping, if none holds the
# wanted families' common prefix (vllm:): blank, a comment, or a sample (ASCII blanks
# only; anything else takes the slow path).
_OTHER_LINES = re.compile(
    r"(?:[ \t\r]*+(?:#[^\n]*+|[A-Za-z_:][A-Za-z0-9_:]*+(?:\{[^\n]*\})?[ \t]+\S+(?:[ \t]+\S+)?)?"
    r"[ \t\r]*+\n)*+"
)

# prometheus_client's parser reads about a character a microsecond, and more on hostile
# lines (a label value of escaped quotes: 20 ms at 16 KiB, 0.6 s at 256 KiB). A real
# engine's longest wanted line is cache_config_info (~1 KiB) and its wanted lines are under
# 2 KiB per engine, so MAX_ENGINES_PER_TARGET engines fit. Only hostile text is refused,
# and it costs about as much as before the parser was prometheus_client's
# (docs/performance.md, benchmarks/bench_parse.py).
MAX_LINE_CHARS = 8 * 1024
MAX_WANTED_CHARS = 512 * 1024
# Other lines are only shape-checked, but each is held until its end arrives, so it is
# bounded too: real expositions' lines are under 4 KiB; a longer one is hostile.
MAX_OTHER_LINE_CHARS = 64 * 1024
_PIECE = 64 * 1024

# str.splitlines() boundaries (all of them whitespace as well).
_LINE_BREAKS = r"\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_VLLM_FIRST_LINE = re.compile(f"[^\\S{_LINE_BREAKS}]*+vllm:")
_VLLM_LATER_LINE = re.compile(f"[{_LINE_BREAKS}][^\\S{_LINE_BREAKS}]*+vllm:")
# A line break, blanks and the beginning of "vllm:" at the end of a piece: what the next
# piece may complete into a vllm: line.
_VLLM_LINE_OPEN = re.compile(f"[{_LINE_BREAKS}][^\\S{_LINE_BREAKS}]*+(v(?:l(?:lm?)?)?)?\\Z")


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


def _keep_line(line: str, wanted: tuple[str, ...] = _WANTED) -> bool:
    """Whether the line belongs to a family we read; raises ExpositionError if any other
    line is not shaped like an exposition line (garbage must not pass for an empty engine).
    """
    stripped = line.strip()
    if not stripped:
        return False
    if stripped.startswith("#"):
        name = stripped[7:] if stripped.startswith(_COMMENT_PREFIXES) else ""
        return name.startswith(wanted)
    if stripped.startswith(wanted):
        return True
    if _SAMPLE_SHAPE.fullmatch(stripped) is None:
        raise ExpositionError("not a Prometheus text exposition (malformed line)")
    return False


class VllmLines:
    """Whether any line of a text read piece by piece is a `vllm:` series: the answer
    looks_like_vllm gives for the whole text, holding a few characters between pieces."""

    def __init__(self) -> None:
        self.seen = False
        self._open = "\n"  # the text begins at a line start

    def feed(self, text: str) -> None:
        if self.seen or not text:
            return
        window = self._open + text
        self.seen = _VLLM_LATER_LINE.search(window) is not None
        tail = _VLLM_LINE_OPEN.search(window)
        self._open = "\n" + (tail.group(1) or "") if tail is not None else ""


def _too_long(limit: int) -> ExpositionError:
    return ExpositionError(f"not a Prometheus text exposition (a line over {limit} characters)")


class ExpositionReader:
    """The lines of the families read, from an exposition fed piece by piece.

    Each line is shape-checked, or kept, when its end arrives; `feed` raises
    ExpositionError at the first line that is malformed or too long (MAX_LINE_CHARS for a
    wanted line, MAX_OTHER_LINE_CHARS for any other), past `max_wanted_chars` of wanted
    lines in all, or past `max_samples` wanted samples. `wanted` are the families' names
    (vLLM's by default; sources/ray/serve_metrics.py reads Ray Serve's), `marker` a string
    every line of them holds (their common prefix).
    """

    def __init__(
        self,
        wanted: tuple[str, ...] = _WANTED,
        marker: str = "vllm:",
        max_wanted_chars: int = MAX_WANTED_CHARS,
        max_samples: int | None = None,
    ) -> None:
        if not marker or not all(name.startswith(marker) for name in wanted):
            raise ValueError("marker must be a prefix of every wanted name")
        self.wanted = wanted
        self.max_wanted_chars = max_wanted_chars
        self.max_samples = max_samples
        self._marker = marker
        self._kept: list[str] = []
        self._size = 0
        self._samples = 0
        self._open: list[str] = []  # the pieces of the line not ended yet
        self._open_chars = 0

    def feed(self, text: str) -> None:
        end = text.rfind("\n")
        if end < 0:
            self._hold(text)
            return
        first = text.find("\n")
        self._open.append(text[:first])
        line = "".join(self._open)
        self._open, self._open_chars = [], 0
        self._line(line)
        self._lines(text[first + 1 : end + 1])
        self._hold(text[end + 1 :])

    def _hold(self, piece: str) -> None:
        if piece:
            self._open_chars += len(piece)
            if self._open_chars > MAX_OTHER_LINE_CHARS:
                raise _too_long(MAX_OTHER_LINE_CHARS)
            self._open.append(piece)

    def _lines(self, block: str) -> None:
        """Complete lines, each ending in \\n."""
        # Lines of other families only, all well-formed: one regex at C speed instead of
        # a Python loop over lines (a padded or hostile body is mostly such lines).
        if (
            len(block) <= MAX_OTHER_LINE_CHARS
            and self._marker not in block
            and _OTHER_LINES.fullmatch(block) is not None
        ):
            return
        for line in filter(None, block.split("\n")):  # empty lines skipped at C speed
            self._line(line)

    def relevant(self) -> str:
        """The kept lines once the text has ended (its last line need not end in \\n)."""
        last = "".join(self._open)
        self._open, self._open_chars = [], 0
        self._line(last)
        return "\n".join(self._kept) + "\n"

    def engines(self) -> tuple[EngineMetrics, ...]:
        """The engines of the text once it has ended; see parse_exposition."""
        return _engines(self.relevant())

    def _line(self, line: str) -> None:
        if len(line) > MAX_OTHER_LINE_CHARS:
            raise _too_long(MAX_OTHER_LINE_CHARS)
        if not _keep_line(line, self.wanted):
            return
        self._size += len(line) + 1
        if len(line) > MAX_LINE_CHARS or self._size > self.max_wanted_chars:
            raise ExpositionError(
                f"{self._marker} series longer than {MAX_LINE_CHARS} characters a line"
                f" or {self.max_wanted_chars} in all"
            )
        if self.max_samples is not None and not line.lstrip().startswith("#"):
            self._samples += 1
            if self._samples > self.max_samples:
                raise ExpositionError(f"more than {self.max_samples} {self._marker} series")
        self._kept.append(line)


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


def parse_exposition(text: str) -> tuple[EngineMetrics, ...]:
    """Map a vLLM `/metrics` text exposition to one EngineMetrics per (model, engine).

    Engines are those that expose at least one of the value series (running, waiting,
    waiting by reason, KV-cache usage, preemptions); `cache_config_info` only attaches
    to them. Raises :class:`ExpositionError` for text the Prometheus parser rejects, or
    with more than MAX_ENGINES_PER_TARGET engines.
    """
    reader = ExpositionReader()
    for at in range(0, len(text), _PIECE):  # as a scrape reads it: never split whole
        reader.feed(text[at : at + _PIECE])
    return reader.engines()


def _engines(relevant: str) -> tuple[EngineMetrics, ...]:
    """The engines of the kept lines (ExpositionReader.relevant)."""
    builders: dict[tuple[str, str], _Builder] = {}
    # (model_name or None, engine or None): None where the label is absent. A key that
    # saw two different configs is ambiguous (several models behind one endpoint with
    # no model_name on the info series) and is dropped rather than guessed.
    configs: dict[tuple[str | None, str | None], dict[str, str] | None] = {}

    # An idle engine's gauges may have no sample at all until its first request (vLLM
    # declares them with # TYPE only): a declared gauge without a sample reads 0.
    declared = {
        fields[2]
        for fields in (
            line.split() for line in relevant.splitlines() if line.lstrip().startswith("# TYPE ")
        )
        if len(fields) > 2  # splitlines() also breaks at \x85 and friends: a TYPE may be cut
    }
    for name, labels, raw in _samples(relevant):
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
