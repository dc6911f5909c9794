"""Engine processes on the Ray executor, recognised by the kinds' RayExecutor. Pure.

The driver of an engine's Ray job is its engine core (the entrypoint is its title), its
workers are actors of the classes and names the kind declares (identity rule 9).
"""

from __future__ import annotations

import re
from typing import Final

from gpuledger.engines import KINDS
from gpuledger.engines.kinds import RayExecutor, title_ranks
from gpuledger.identity.rayjobs import WorkerRanks
from gpuledger.model.ray import RayActor, RayJob

_EXECUTORS: Final[tuple[RayExecutor, ...]] = tuple(k.ray for k in KINDS if k.ray is not None)
WORKER_CLASSES: Final = frozenset(c for x in _EXECUTORS for c in x.worker_classes)


def engine_dp_rank(job: RayJob) -> int | None:
    """The data-parallel rank of an engine core driver (0 without a rank in its title);
    None when the job's driver is not an engine core."""
    for executor in _EXECUTORS:
        match = executor.driver_title.match(job.entrypoint_title)
        if match is not None:
            return int(match.group(1) or 0)
    return None


def _worker_name(name: str | None) -> re.Match[str] | None:
    matches = (x.worker_name.match(name) for x in _EXECUTORS if name is not None)
    return next((m for m in matches if m is not None), None)


def is_worker(actor: RayActor) -> bool:
    return actor.class_name in WORKER_CLASSES or _worker_name(actor.name) is not None


def worker_ranks(actor: RayActor) -> WorkerRanks:
    """A named worker's TP and PP ranks (PP 0 where the name has none, as engines name
    it only when pipeline parallel); an unnamed legacy worker -> unknown."""
    match = _worker_name(actor.name)
    if match is None:
        return WorkerRanks(None, None)
    parts = title_ranks(match.group(2))
    return WorkerRanks(parts.get("TP", 0), parts.get("PP", 0))
