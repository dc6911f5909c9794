"""What gpuledger needs to know of one inference engine kind, as data. Pure.

An :class:`EngineKind` names, for one engine (vLLM, ...), everything the generic engine
layer reads differently per kind: which `/metrics` series fill the generic fields and
how a scrape body is recognised (:class:`ExpositionNames`), the API-server flags that
are its configuration and their defaults, its process titles and what they say of a
process's role and ranks, the pod annotations that opt a pod in, and how it runs on
the Ray executor. Each kind lives in one module beside this one; `engines.KINDS` lists
them. Nothing here does I/O, so the join, the sources and the simulator all read it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from gpuledger.model.serverinfo import ServerInfo

# The generic configuration keys (the config_info labels) the join itself reads.
TENSOR_PARALLEL_SIZE = "tensor_parallel_size"
PIPELINE_PARALLEL_SIZE = "pipeline_parallel_size"
DATA_PARALLEL_SIZE = "data_parallel_size"

ENGINE_CORE = "engine_core"
WORKER = "worker"


@dataclass(frozen=True)
class EngineProcess:
    """One engine process, known by its title: its role and the ranks the title names."""

    pid: int
    role: str  # ENGINE_CORE | WORKER
    dp_rank: int | None
    pp_rank: int | None
    tp_rank: int | None
    kind: str = ""


@dataclass(frozen=True)
class ExpositionNames:
    """Which series of one naming of a kind's `/metrics` fill EngineMetrics' fields.

    `marker` is the prefix every family here starts with: a body with a sample line
    starting with it is this kind's (discovery), and lines without it are only
    shape-checked. Where releases renamed a series, every name is listed, the newest
    first: the newest one present wins.
    """

    marker: str
    running: str
    waiting: str
    waiting_by_reason: str  # "" when the kind has none
    kv_usage: tuple[str, ...]  # a 0-1 ratio
    # Counter sample names: with `_total`, and bare (a counter exposed without the
    # suffix, or untyped).
    preemptions: frozenset[str]
    cache_config: str  # an info series; only cache_config_labels are kept; "" for none
    cache_config_labels: tuple[str, ...]
    model_label: str = "model_name"
    rank_label: str = "engine"  # the data-parallel rank; "0" where absent
    reason_label: str = "reason"
    # A label that splits the value series into parts beside their total (SGLang's
    # `priority`: the total under `priority=""`): only samples without it, or with it
    # empty, are read, so the parts are never added to the total. "" for none.
    split_label: str = ""

    @property
    def value_series(self) -> frozenset[str]:
        by_reason = (self.waiting_by_reason,) if self.waiting_by_reason else ()
        return frozenset(
            {self.running, self.waiting, *by_reason, *self.kv_usage, *self.preemptions}
        )

    @property
    def wanted(self) -> tuple[str, ...]:
        """Family name prefixes whose lines are parsed (a prefix covers its suffixed
        samples and siblings, e.g. waiting covers waiting_by_reason)."""
        bare = tuple(sorted({n.removesuffix("_total") for n in self.preemptions}))
        config = (self.cache_config,) if self.cache_config else ()
        return (self.running, self.waiting, *self.kv_usage, *bare, *config)

    def is_part(self, labels: Mapping[str, str]) -> bool:
        """A sample of one part (one priority), not the total: not read."""
        return bool(self.split_label and labels.get(self.split_label))


Version = tuple[int, ...]
Status = Literal["absent", "shown", "hidden", "removed"]


def _bump(version: Version, releases: int) -> Version:
    """The release `releases` minor versions after `version` (0.10 -> 0.11)."""
    major, minor = (*version, 0, 0)[:2]
    return (major, minor + releases)


@dataclass(frozen=True)
class MetricName:
    """One engine series name and the releases that expose it (a kind's version map).

    `deprecated`: the release that deprecated it. The kind's deprecation rule (vLLM's)
    is that it is still shown there, hidden in the next release (shown only with the
    engine's escape-hatch flag) and removed in the one after. `after_event`: no sample
    until its event first happens (a labelled counter in a multiprocess registry), so a
    capture may rightly lack it.
    """

    name: str
    since: Version = ()
    deprecated: Version | None = None
    after_event: bool = False

    def status(self, version: Version) -> Status:
        if version < self.since:
            return "absent"
        if self.deprecated is None or version <= self.deprecated:
            return "shown"
        return "hidden" if version < _bump(self.deprecated, 2) else "removed"


@dataclass(frozen=True)
class RayExecutor:
    """How a kind's engine looks when its workers are Ray actors (identity rule 9)."""

    # The driver's title; group 1, when present, is the data-parallel rank.
    driver_title: re.Pattern[str]
    driver: str  # that title at DP rank 0
    worker_classes: frozenset[str]
    # A worker actor's name; group 2 holds its `_TP<t>_PP<p>…` ranks.
    worker_name: re.Pattern[str]
    worker_prefix: str  # what that name starts with, before the instance id


@dataclass(frozen=True)
class RequestSpans:
    """How a kind's engine reports one finished request over OTLP (docs/spans.md): the
    span's name, and the attributes read, each by name (a release that lacks one leaves
    the field None). Nothing else of a span is read: attributes can carry prompts."""

    span_name: str
    request_id: str  # the span attribute with the engine's request id
    process_id: str  # the resource attribute with the API server's PID in its namespace
    # Span attribute -> model.spans.EngineRequestSpan field, in seconds.
    latencies: Mapping[str, str]
    # Span attribute -> EngineRequestSpan field, an integer count.
    counts: Mapping[str, str]
    model: str = ""  # the span attribute naming the model; "" when the kind sends none


@dataclass(frozen=True)
class EngineKind:
    """One inference engine kind (see the module docstring)."""

    name: str  # the engine_kind label value
    # Namings its /metrics may come under, in the order they are tried.
    metrics: tuple[ExpositionNames, ...]
    # Every process the engine retitles starts with it: their nearest ancestor without
    # it is the API server, and their environ is no longer theirs (setproctitle).
    title_prefix: str
    parse_title: Callable[[str, int], EngineProcess | None]
    # Whitelisted API-server flags (and short aliases) -> generic configuration key.
    flags: Mapping[str, str]
    # Values of configuration keys when the flag is absent.
    flag_defaults: Mapping[str, str]
    # Environment variables of its processes that are read (identity rule 5).
    env: frozenset[str]
    port_annotation: str
    path_annotation: str
    scheme_annotation: str
    ray: RayExecutor | None = None
    # Every /metrics name gpuledger reads or its docs cite, by release: the kind's one
    # version map (tests/unit/test_version_maps.py holds it to every capture).
    versions: tuple[MetricName, ...] = ()
    # The server's own account of its resolved configuration: paths tried in order
    # (the next on HTTP 404), and the pure parser of that body; () when it has none.
    server_info_paths: tuple[str, ...] = ()
    parse_server_info: Callable[[bytes], ServerInfo] | None = None
    # Its request spans, when it sends them (vLLM's --otlp-traces-endpoint).
    spans: RequestSpans | None = None

    @property
    def markers(self) -> tuple[str, ...]:
        return tuple(m.marker for m in self.metrics)

    def names_shown(self, version: Version) -> tuple[MetricName, ...]:
        """The mapped names an exposition of `version` shows by default."""
        return tuple(n for n in self.versions if n.status(version) == "shown")


_PART = re.compile(r"_([A-Z]+)(\d+)")


def title_ranks(suffix: str) -> dict[str, int]:
    """`_DP1_PP0_TP3` -> {DP: 1, PP: 0, TP: 3}: the rank suffixes engines put in titles."""
    return {k: int(v) for k, v in _PART.findall(suffix)}
