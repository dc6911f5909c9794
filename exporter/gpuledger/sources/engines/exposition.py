"""An engine's `/metrics` text exposition, parsed into the few series the ledger needs.

:func:`parse_exposition` is pure: Prometheus text in, one :class:`EngineMetrics` per
(model_name, engine) out. Which series fill which field is the engine kind's
(:class:`~gpuledger.engines.kinds.ExpositionNames`), every naming generation of them
included; nothing else is kept: an info series that grows a label every release keeps
only the kind's `cache_config_labels`.

:class:`ExpositionReader` and :class:`MarkerLines` do the same for a body read piece by
piece as it arrives (sources/engines/source.py): each line is checked or kept as soon as
it ends, so a scrape holds the lines of the families read and one line, never the body.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.engines.kinds import EngineKind, ExpositionNames
from gpuledger.model import frozen_map
from gpuledger.model.engines import EngineMetrics

# A hostile or broken exposition must not explode the ledger's cardinality.
MAX_ENGINES_PER_TARGET = 256
MAX_WAITING_REASONS = 16

# The shape every other sample line must have, matched against the stripped line.
_SAMPLE_SHAPE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(?:\{.*\})?[ \t]+\S+(?:[ \t]+\S+)?[ \t]*")
_COMMENT_PREFIXES = ("# HELP ", "# TYPE ")
# Lines, each ending in \n, that _keep_line passes without keeping, if none holds the
# wanted families' common prefix (the marker): blank, a comment, or a sample (ASCII
# blanks only; anything else takes the slow path).
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
_BLANKS = f"[^\\S{_LINE_BREAKS}]*+"


class ExpositionError(ValueError):
    """The text is not a Prometheus text exposition we can read.

    The message never quotes the text: an error page can carry tokens.
    """


def _alternatives(words: set[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=lambda w: (-len(w), w)))


def looks_like(text: str, markers: tuple[str, ...]) -> bool:
    """True when any sample line starts with one of the markers (an engine kind's
    prefixes). Cheap, never raises, no parsing.

    That is: some line of `text.splitlines()` starts with a marker once lstrip()ped.
    """
    watch = MarkerLines(markers)
    watch.feed(text)
    return watch.seen


@dataclass
class _Builder:
    running: float | None = None
    waiting: float | None = None
    by_reason: dict[str, float] = field(default_factory=dict)
    kv: dict[str, float | None] = field(default_factory=dict)  # by series name
    preemptions: float | None = None


def _finite(value: float) -> float | None:
    # NaN/Inf in a gauge means "unknown", not a number to export.
    return value if math.isfinite(value) else None


def _keep_line(line: str, wanted: tuple[str, ...]) -> bool:
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


# What of a piece's end MarkerLines keeps looking at: a line break, blanks and the start of
# a marker.
_TAIL_CHARS = 256


class MarkerLines:
    """Whether any line of a text read piece by piece starts with one of `markers`: the
    answer looks_like gives for the whole text, holding a few characters between pieces."""

    def __init__(self, markers: tuple[str, ...]) -> None:
        if not markers or not all(markers):
            raise ValueError("at least one marker, none empty")
        self.markers = markers
        self.seen = False
        self._open = "\n"  # the text begins at a line start
        self._line = re.compile(f"[{_LINE_BREAKS}]{_BLANKS}(?:{_alternatives(set(markers))})")
        # A line break, blanks and the beginning of a marker at the end of a piece: what
        # the next piece may complete into a marked line.
        begun = {m[:i] for m in markers for i in range(1, len(m))}
        opening = f"({_alternatives(begun)})?" if begun else "()?"
        self._line_open = re.compile(f"[{_LINE_BREAKS}]{_BLANKS}{opening}\\Z")

    def feed(self, text: str) -> None:
        if self.seen or not text:
            return
        window = self._open + text
        # No marker anywhere (a substring test at C speed): no marked line in this piece,
        # only its end may begin one. Most of a padded or hostile body is such pieces.
        if any(m in window for m in self.markers):
            self.seen = self._line.search(window) is not None
        # The line a marker may begin at the piece's end starts within its last few
        # characters: searched there only (blanks longer than that are hostile text).
        tail = self._line_open.search(window[-_TAIL_CHARS:])
        self._open = "\n" + (tail.group(1) or "") if tail is not None else ""


def _too_long(limit: int) -> ExpositionError:
    return ExpositionError(f"not a Prometheus text exposition (a line over {limit} characters)")


class ExpositionReader:
    """The lines of the families read, from an exposition fed piece by piece.

    Each line is shape-checked, or kept, when its end arrives; `feed` raises
    ExpositionError at the first line that is malformed or too long (MAX_LINE_CHARS for a
    wanted line, MAX_OTHER_LINE_CHARS for any other), past `max_wanted_chars` of wanted
    lines in all, or past `max_samples` wanted samples. `wanted` are the families' names
    (an engine kind's ExpositionNames.wanted; sources/ray/serve_metrics.py reads Ray
    Serve's), `marker` a string every line of them holds (their common prefix).
    """

    def __init__(
        self,
        wanted: tuple[str, ...],
        marker: str,
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


def parse_exposition(text: str, kind: EngineKind) -> tuple[EngineMetrics, ...]:
    """Map an engine's `/metrics` text exposition to one EngineMetrics per (model, engine),
    read with the first of the kind's namings whose marker a line shows (else its first).

    Engines are those that expose at least one of the value series (running, waiting,
    waiting by reason, KV-cache usage, preemptions); the cache config only attaches
    to them. Raises :class:`ExpositionError` for text the Prometheus parser rejects, or
    with more than MAX_ENGINES_PER_TARGET engines.
    """
    names = next((n for n in kind.metrics if looks_like(text, (n.marker,))), kind.metrics[0])
    reader = ExpositionReader(names.wanted, names.marker)
    for at in range(0, len(text), _PIECE):  # as a scrape reads it: never split whole
        reader.feed(text[at : at + _PIECE])
    return read_engines(reader.relevant(), names)


def _declared(relevant: str) -> set[str]:
    """Families with a # TYPE line."""
    return {
        fields[2]
        for fields in (
            line.split() for line in relevant.splitlines() if line.lstrip().startswith("# TYPE ")
        )
        if len(fields) > 2  # splitlines() also breaks at \x85 and friends: a TYPE may be cut
    }


# (model_name or None, engine or None): None where the label is absent; the kept cache
# config labels, or None where one key saw two different configs.
_Configs = dict[tuple[str | None, str | None], dict[str, str] | None]


def _add_config(configs: _Configs, names: ExpositionNames, labels: Mapping[str, str]) -> None:
    # A key that saw two different configs is ambiguous (several models behind one
    # endpoint with no model_name on the info series) and is dropped rather than guessed.
    key = (labels.get(names.model_label), labels.get(names.rank_label))
    kept = {k: labels[k] for k in names.cache_config_labels if k in labels}
    configs[key] = None if key in configs and configs[key] != kept else kept


def _config_for(configs: _Configs, model: str, engine: str) -> Mapping[str, str]:
    for key in ((model, engine), (None, engine), (model, None), (None, None)):
        if key in configs:
            found = configs[key]
            return frozen_map(found) if found is not None else frozen_map()
    return frozen_map()


def _set_value(
    builder: _Builder, names: ExpositionNames, name: str, labels: Mapping[str, str], raw: float
) -> None:
    value = _finite(raw)
    if name == names.running:
        builder.running = value
    elif name == names.waiting:
        builder.waiting = value
    elif name == names.waiting_by_reason:
        reason = labels.get(names.reason_label)
        if (
            value is not None
            and reason is not None
            and (reason in builder.by_reason or len(builder.by_reason) < MAX_WAITING_REASONS)
        ):
            builder.by_reason[reason] = value
    elif name in names.kv_usage:
        builder.kv[name] = value
    else:  # preemptions, under any of its names
        builder.preemptions = value


def _builder(builders: dict[tuple[str, str], _Builder], key: tuple[str, str]) -> _Builder:
    found = builders.get(key)
    if found is None:
        if len(builders) >= MAX_ENGINES_PER_TARGET:
            raise ExpositionError(f"more than {MAX_ENGINES_PER_TARGET} (model_name, engine) pairs")
        found = builders[key] = _Builder()
    return found


def _zero_declared(b: _Builder, names: ExpositionNames, declared: set[str]) -> None:
    # An idle engine's gauges may have no sample at all until its first request (vLLM
    # declares them with # TYPE only): a declared gauge without a sample reads 0.
    if b.running is None and names.running in declared:
        b.running = 0.0
    if b.waiting is None and names.waiting in declared:
        b.waiting = 0.0
    if all(v is None for v in b.kv.values()) and names.kv_usage[0] in declared:
        b.kv[names.kv_usage[0]] = 0.0


def read_engines(relevant: str, names: ExpositionNames) -> tuple[EngineMetrics, ...]:
    """The engines of the kept lines (ExpositionReader.relevant) of one naming."""
    builders: dict[tuple[str, str], _Builder] = {}
    configs: _Configs = {}
    value_series = names.value_series
    for name, labels, raw in _samples(relevant):
        if names.cache_config and name == names.cache_config:
            _add_config(configs, names, labels)
        elif name in value_series and not names.is_part(labels):
            key = (labels.get(names.model_label, ""), labels.get(names.rank_label, "0"))
            _set_value(_builder(builders, key), names, name, labels, raw)
    declared = _declared(relevant)
    for b in builders.values():
        _zero_declared(b, names, declared)
    return tuple(
        EngineMetrics(
            model_name=model,
            engine=engine,
            requests_running=b.running,
            requests_waiting=b.waiting,
            waiting_by_reason=frozen_map(b.by_reason),
            kv_cache_usage_ratio=next(
                (b.kv[n] for n in names.kv_usage if b.kv.get(n) is not None), None
            ),
            preemptions_total=b.preemptions,
            cache_config=_config_for(configs, model, engine),
        )
        for (model, engine), b in sorted(builders.items(), key=lambda kv: _order(kv[0]))
    )


def _order(key: tuple[str, str]) -> tuple[str, int, str]:
    model, engine = key
    # Numeric ranks sort numerically (2 before 10); anything else after them.
    # isascii: "²".isdigit() is true, but int("²") raises.
    numeric = engine.isascii() and engine.isdigit()
    return (model, int(engine) if numeric else 1 << 62, engine)
