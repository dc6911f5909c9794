"""`gpuledger explain`'s chain for a vLLM engine on the Ray executor, across nodes.

The engine's node agent knows its Ray job and what Ray says of the job's workers; each
node agent knows the workers on its own node (docs/design.md, identity rule 9). Joined on
(job id, driver node id) over every document read: engine -> Ray job -> each worker's
ranks, pod, node, process and GPUs, and the GPUs in use on all nodes against TP x PP, or
which Ray nodes' agents were not read (then the count is unknown, not short).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from gpuledger.document.v1 import EngineDoc, LedgerDocument, RayEngineLinkDoc
from gpuledger.explain.result import Footprint, RayLinkEntry, RayWorkerEntry
from gpuledger.model.nvml import LINK_MEANING


class RayWorkers:
    """Every document's `ray.workers`, by their engine's (job id, driver node id)."""

    def __init__(self, docs: Sequence[LedgerDocument]) -> None:
        self.by_engine: dict[tuple[str, str], list[RayWorkerEntry]] = defaultdict(list)
        self.links: dict[tuple[str, str], list[tuple[str, RayEngineLinkDoc]]] = defaultdict(list)
        for doc in docs:
            for w in doc.ray.workers:
                entry = RayWorkerEntry(**vars(w), node=doc.node)
                self.by_engine[(w.job_id, w.driver_node_id)].append(entry)
            for x in doc.ray.engine_links:
                self.links[(x.job_id, x.driver_node_id)].append((doc.node, x))
        # Ray nodes some document reports workers of: their agents were read.
        self.ray_nodes = {w.ray_node_id for ws in self.by_engine.values() for w in ws}


def footprint(
    workers: RayWorkers, engine: EngineDoc, indices: Mapping[str, int] | None = None
) -> Footprint | None:
    """The engine's footprint; None off the Ray executor. `indices`: GPU UUID -> host
    index, for its links' lines."""
    ray = engine.ray
    if ray is None:
        return None
    known = indices or {}
    found = sorted(workers.by_engine.get((ray.job_id, ray.driver_node_id), []), key=_rank_order)
    unread = tuple(n for n in ray.worker_nodes if n.ray_node_id not in workers.ray_nodes)
    alive = int(ray.workers.get("ALIVE", 0))
    gpus = {(w.node, g.gpu_uuid) for w in found for g in w.gpus}
    # No worker counts: Ray's side of the job was not read (the engine's node says why).
    complete = bool(ray.workers) and not unread and len(found) >= alive
    return Footprint(
        **vars(ray),
        found=tuple(found),
        unread=unread,
        gpus_in_use=len(gpus) if complete else None,
        nodes=tuple(sorted({node for node, _ in gpus})),
        links=tuple(
            RayLinkEntry(
                **vars(x),
                node=node,
                gpu_indices=tuple(sorted(known[u] for u in x.gpus if u in known)),
            )
            for node, x in sorted(workers.links.get((ray.job_id, ray.driver_node_id), []))
        ),
    )


def link_text(what: str, indices: Sequence[int], link: str) -> str:
    """`TP 4 over GPUs 0,1,4,5: weakest link system (crosses NUMA)`."""
    over = f" over GPUs {','.join(str(i) for i in indices)}" if indices else ""
    return f"{what}{over}: weakest link {link} ({LINK_MEANING.get(link, link)})"


def _rank_order(w: RayWorkerEntry) -> tuple[int, int, int]:
    def number(value: int | None) -> int:
        return -1 if value is None else value

    return number(w.pp_rank), number(w.tp_rank), number(w.bundle_index)


def footprint_lines(engine: EngineDoc, fp: Footprint | None) -> list[str]:
    """The chain under an engine line: its Ray job, each worker, then the footprint."""
    if fp is None:
        return []
    ray, configured = fp, engine.gpus_configured
    # Without the API server's flags, TP x PP is the GPU bundles vLLM asked Ray for.
    source = "TP x PP" if engine.config.get("tensor_parallel_size") else "its placement group"
    states = ", ".join(f"{n} {state}" for state, n in sorted(ray.workers.items()))
    states = states or "workers unknown"
    lines = [
        f"      Ray job {ray.job_id}: driver EngineCore pid {ray.driver_pid or '?'} on Ray "
        f"node {ray.driver_node_id[:12]} ({ray.driver_node_ip}), "
        f"{ray.worker_class or 'workers'}: {states}"
    ]
    lines.extend(_worker_line(w) for w in fp.found)
    for n in fp.unread:
        lines.append(
            f"        {n.workers} worker(s) on Ray node {n.ray_node_id[:12]} "
            f"({n.node_ip}): not reported, its node agent was not read"
        )
    in_use = fp.gpus_in_use
    where = f" on {len(fp.nodes)} node(s) ({', '.join(fp.nodes)})" if fp.nodes else ""
    lines.append(
        f"      GPUs in use by its workers: {'?' if in_use is None else in_use}{where}, "
        f"configured {'?' if configured is None else configured} ({source})"
    )
    for x in fp.links:
        pod = f"pod {x.namespace}/{x.pod}" if x.pod else "no pod"
        lines.append("        " + link_text(f"ranks on {x.node} ({pod})", x.gpu_indices, x.link))
    return lines


def _worker_line(w: RayWorkerEntry) -> str:
    if w.tp_rank is None:  # the legacy executor's workers carry no rank
        rank = f"bundle {w.bundle_index}"
    else:
        rank = f"TP{w.tp_rank} PP{w.pp_rank} (bundle {w.bundle_index})"
    held = ", ".join(f"{g.gpu_uuid} {(g.used_bytes or 0) / 2**30:.1f} GiB" for g in w.gpus)
    pod = f"{w.namespace}/{w.pod}" if w.pod else "no pod"
    return (
        f"        worker {rank} {w.class_name}  pod {pod} on {w.node}  "
        f"pid {w.pid or '?'} (host {w.host_pid or '?'})  "
        + (f"holds {held}" if held else "holds no GPU")
    )


def footprint_unknowns(workers: RayWorkers, docs: Sequence[LedgerDocument]) -> list[str]:
    """Ray-executor engines whose workers are on nodes whose agents were not read."""
    notes = []
    for doc in docs:
        for e in doc.engines:
            fp = footprint(workers, e)
            if fp and fp.unread:
                count = sum(n.workers for n in fp.unread)
                notes.append(
                    f"{doc.node}: engine {e.namespace}/{e.pod}:{e.engine}: "
                    f"{count} of its Ray workers are on Ray nodes whose agents were not read "
                    f"({', '.join(n.node_ip for n in fp.unread)}): its GPUs in use unknown"
                )
    return notes


def ray_worker_ips(docs: Sequence[LedgerDocument]) -> set[str]:
    """The IPs of the Ray nodes holding workers of the documents' Ray-executor engines:
    explain reads the agents of those pods' nodes too."""
    return {
        n.node_ip
        for doc in docs
        for e in doc.engines
        if e.ray is not None
        for n in e.ray.worker_nodes
        if n.node_ip
    }
