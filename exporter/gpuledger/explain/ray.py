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
from typing import Any

Doc = Mapping[str, Any]


class RayWorkers:
    """Every document's `ray.workers`, by their engine's (job id, driver node id)."""

    def __init__(self, docs: Sequence[Doc]) -> None:
        self.by_engine: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for doc in docs:
            for w in (doc.get("ray") or {}).get("workers") or []:
                key = (str(w["job_id"]), str(w["driver_node_id"]))
                self.by_engine[key].append({**w, "node": doc["node"]})
        # Ray nodes some document reports workers of: their agents were read.
        self.ray_nodes = {str(w["ray_node_id"]) for ws in self.by_engine.values() for w in ws}


def footprint(workers: RayWorkers, engine: Doc) -> dict[str, Any] | None:
    """The engine's Ray job with its workers on every node read; None off the Ray executor.
    `gpus_in_use` counts distinct (node, GPU) and is None while a worker Ray lists ALIVE
    is on a Ray node whose agent was not read."""
    ray = engine.get("ray")
    if not ray:
        return None
    found = sorted(
        workers.by_engine.get((str(ray["job_id"]), str(ray["driver_node_id"])), []),
        key=_rank_order,
    )
    unread = [n for n in ray["worker_nodes"] if n["ray_node_id"] not in workers.ray_nodes]
    alive = int(ray["workers"].get("ALIVE", 0))
    gpus = {(w["node"], g["gpu_uuid"]) for w in found for g in w["gpus"]}
    # No worker counts: Ray's side of the job was not read (the engine's node says why).
    complete = bool(ray["workers"]) and not unread and len(found) >= alive
    return {
        **ray,
        "found": found,
        "unread": unread,
        "gpus_in_use": len(gpus) if complete else None,
        "nodes": sorted({node for node, _ in gpus}),
    }


def _rank_order(w: Doc) -> tuple[int, int, int]:
    def number(value: Any) -> int:
        return -1 if value is None else int(value)

    return number(w["pp_rank"]), number(w["tp_rank"]), number(w["bundle_index"])


def with_footprints(workers: RayWorkers, engines: Sequence[Doc]) -> list[dict[str, Any]]:
    return [{**e, "ray_footprint": footprint(workers, e)} for e in engines]


def footprint_lines(engine: Doc) -> list[str]:
    """The chain under an engine line: its Ray job, each worker, then the footprint."""
    fp = engine.get("ray_footprint")
    if not fp:
        return []
    configured = engine.get("gpus_configured")
    # Without the API server's flags, TP x PP is the GPU bundles vLLM asked Ray for.
    source = "TP x PP" if engine["config"].get("tensor_parallel_size") else "its placement group"
    states = ", ".join(f"{n} {state}" for state, n in sorted(fp["workers"].items()))
    states = states or "workers unknown"
    lines = [
        f"      Ray job {fp['job_id']}: driver EngineCore pid {fp['driver_pid'] or '?'} on Ray "
        f"node {fp['driver_node_id'][:12]} ({fp['driver_node_ip']}), "
        f"{fp['worker_class'] or 'workers'}: {states}"
    ]
    lines.extend(_worker_line(w) for w in fp["found"])
    for n in fp["unread"]:
        lines.append(
            f"        {n['workers']} worker(s) on Ray node {n['ray_node_id'][:12]} "
            f"({n['node_ip']}): not reported, its node agent was not read"
        )
    in_use = fp["gpus_in_use"]
    where = f" on {len(fp['nodes'])} node(s) ({', '.join(fp['nodes'])})" if fp["nodes"] else ""
    lines.append(
        f"      GPUs in use by its workers: {'?' if in_use is None else in_use}{where}, "
        f"configured {'?' if configured is None else configured} ({source})"
    )
    return lines


def _worker_line(w: Doc) -> str:
    if w["tp_rank"] is None:  # the legacy executor's workers carry no rank
        rank = f"bundle {w['bundle_index']}"
    else:
        rank = f"TP{w['tp_rank']} PP{w['pp_rank']} (bundle {w['bundle_index']})"
    held = ", ".join(f"{g['gpu_uuid']} {g['used_bytes'] / 2**30:.1f} GiB" for g in w["gpus"])
    pod = f"{w['namespace']}/{w['pod']}" if w["pod"] else "no pod"
    return (
        f"        worker {rank} {w['class_name']}  pod {pod} on {w['node']}  "
        f"pid {w['pid'] or '?'} (host {w['host_pid'] or '?'})  "
        + (f"holds {held}" if held else "holds no GPU")
    )


def footprint_unknowns(workers: RayWorkers, docs: Sequence[Doc]) -> list[str]:
    """Ray-executor engines whose workers are on nodes whose agents were not read."""
    notes = []
    for doc in docs:
        for e in doc.get("engines") or []:
            fp = footprint(workers, e)
            if fp and fp["unread"]:
                count = sum(int(n["workers"]) for n in fp["unread"])
                notes.append(
                    f"{doc['node']}: engine {e['namespace']}/{e['pod']}:{e['engine']}: "
                    f"{count} of its Ray workers are on Ray nodes whose agents were not read "
                    f"({', '.join(n['node_ip'] for n in fp['unread'])}): its GPUs in use unknown"
                )
    return notes


def ray_worker_ips(docs: Sequence[Doc]) -> set[str]:
    """The IPs of the Ray nodes holding workers of the documents' Ray-executor engines:
    explain reads the agents of those pods' nodes too."""
    return {
        str(n["node_ip"])
        for doc in docs
        for e in doc.get("engines") or []
        if e.get("ray")
        for n in e["ray"]["worker_nodes"]
        if n.get("node_ip")
    }
