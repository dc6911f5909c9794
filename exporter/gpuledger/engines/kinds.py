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
    cache_config: str  # an info series; only cache_config_labels are kept
    cache_config_labels: tuple[str, ...]
    model_label: str = "model_name"
    rank_label: str = "engine"  # the data-parallel rank; "0" where absent
    reason_label: str = "reason"

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
        return (self.running, self.waiting, *self.kv_usage, *bare, self.cache_config)


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

    @property
    def markers(self) -> tuple[str, ...]:
        return tuple(m.marker for m in self.metrics)


_PART = re.compile(r"_([A-Z]+)(\d+)")


def title_ranks(suffix: str) -> dict[str, int]:
    """`_DP1_PP0_TP3` -> {DP: 1, PP: 0, TP: 3}: the rank suffixes engines put in titles."""
    return {k: int(v) for k, v in _PART.findall(suffix)}
