"""The weakest link among the GPUs of one engine on this node (NVML's topology). Pure.

Tensor parallelism all-reduces across every rank each layer, so the slowest pair sets its
pace: an engine's link is the weakest of all pairs of its GPUs here (its TP peers; for a
Ray-executor engine, its workers' GPUs on this node). A pair NVML did not describe is
`unknown`, and so is the engine, unless a known pair is already `system` (nothing is
weaker). A MIG device counts as its GPU.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from gpuledger.ledger import caps
from gpuledger.ledger.engines import Engine
from gpuledger.ledger.ray import RayEngineLink, RayWorker
from gpuledger.model.nvml import LINK_LEVELS, Gpu, GpuLink

_WEAKEST_KNOWN = LINK_LEVELS.index("system")


@dataclass(frozen=True)
class Topology:
    """This node's GPU pairs by UUID pair, and each MIG device's GPU."""

    links: dict[tuple[str, str], str]
    parents: dict[str, str]

    @classmethod
    def of(cls, gpus: Sequence[Gpu], links: Sequence[GpuLink]) -> Topology:
        parents = {m.uuid: g.uuid for g in gpus for m in g.mig_devices}
        pairs = {(min(x.a, x.b), max(x.a, x.b)): x.link for x in links}
        return cls(pairs, parents)

    def weakest(self, uuids: Iterable[str]) -> str | None:
        """The weakest link among these GPUs; None for fewer than two."""
        chosen = sorted({self.parents.get(u, u) for u in uuids})
        if len(chosen) < 2:
            return None
        worst, unknown = 0, False
        for pair in combinations(chosen, 2):
            level = self.links.get(pair, "unknown")
            if level == "unknown":
                unknown = True
            else:
                worst = max(worst, LINK_LEVELS.index(level))
        return "unknown" if unknown and worst < _WEAKEST_KNOWN else LINK_LEVELS[worst]


def ray_engine_links(
    workers: Sequence[RayWorker], topology: Topology
) -> tuple[tuple[RayEngineLink, ...], tuple[RayEngineLink, ...]]:
    """Per (pod, engine) the weakest link among its workers' GPUs here, for those on two
    GPUs or more; at most MAX_ENGINES, and what that cap left out."""
    held: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    first: dict[tuple[str, str, str], RayWorker] = {}
    for w in workers:
        key = (w.node.pod.uid if w.node.pod else "", w.engine.job_id, w.engine.driver_node_id)
        first.setdefault(key, w)
        held[key].update(uuid for uuid, _ in w.memory)
    found = []
    for key in sorted(held):
        link = topology.weakest(held[key])
        if link is not None:
            w = first[key]
            found.append(RayEngineLink(w.node, w.engine, tuple(sorted(held[key])), link))
    kept, surplus = caps.split(found, caps.MAX_ENGINES)
    return tuple(kept), tuple(surplus)


def with_links(engines: Sequence[Engine], topology: Topology) -> tuple[Engine, ...]:
    """Each engine with the weakest link among its GPUs here."""
    return tuple(replace(e, gpu_link=topology.weakest(g.gpu_uuid for g in e.gpus)) for e in engines)
