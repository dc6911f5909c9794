"""An engine's Ray job and its workers (docs/design.md, identity rule 9). Pure.

On the Ray executor an engine's core process is the driver of a Ray job
(`driver_info.pid` = its PID, the entrypoint its title) and its workers are actors of
that job, of the classes and names its kind's RayExecutor describes (engines/ray.py
recognises them).

The engine's identity on every node is (job id, driver's node id): both come from Ray's
state API, which every node agent reads alike, and outlive an agent's restart. A job id
is unique in its Ray cluster (the GCS counter), a node id is random per raylet start, so
two Ray clusters' job `01000000` stay apart and a restarted engine is a new job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger.model.ray import RayJob, RayNode


@dataclass(frozen=True, order=True)
class RayEngineId:
    """What names one Ray-executor engine on every node: ray_job_id, ray_driver_node_id."""

    job_id: str
    driver_node_id: str


@dataclass(frozen=True)
class WorkerRanks:
    """Ranks from a RayExecutorV2 actor name; None for the legacy executor's unnamed
    actors (it ranks them by sorting their IPs, which Ray does not show)."""

    tp: int | None
    pp: int | None


def driver_node(job: RayJob, nodes: Iterable[RayNode]) -> RayNode | None:
    """The live Ray node the job's driver runs on: its driver_node_id when Ray sends
    one, else the only ALIVE node with the driver's IP (two raylets on one address, as
    outside Kubernetes, cannot be told apart: None)."""
    alive = [n for n in nodes if n.state == "ALIVE"]
    if job.driver_node_id:
        return next((n for n in alive if n.node_id == job.driver_node_id), None)
    found = [n for n in alive if job.driver_node_ip and n.node_ip == job.driver_node_ip]
    return found[0] if len(found) == 1 else None


def engine_id(job: RayJob, nodes: Iterable[RayNode]) -> RayEngineId | None:
    node = driver_node(job, nodes)
    return RayEngineId(job.job_id, node.node_id) if node is not None else None
