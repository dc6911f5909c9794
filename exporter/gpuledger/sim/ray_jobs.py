"""A scenario's `ray.jobs`: vLLM engines on the Ray executor, as the state API shows them.

Each job is what vLLM 0.32 makes (tests/fixtures/ray/vllm-0.32-ray/): a DRIVER job whose
driver is the EngineCore (`driver_info.pid`, the padded `VLLM::EngineCore` entrypoint), a
placement group of one `{"GPU": 1}` bundle per worker created by that job, and one worker
actor per bundle: `RayWorkerProc` named `vllm_Worker_<instance>_TP<t>[_PP<p>]`
(RayExecutorV2), or the legacy executor's unnamed `RayWorkerWrapper`. A job that is not
RUNNING has DEAD actors and a REMOVED group, as after the engine exits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuledger.engines import DEFAULT_RAY
from gpuledger.sim.fake_ray import actor_entry, job_entry, placement_group_entry, ray_id
from gpuledger.sim.scenario import SimRay, SimRayJob

WORKER_CLASS = {"ray": "RayWorkerProc", "legacy": "RayWorkerWrapper"}
Rows = list[dict[str, Any]]


def ray_job_rows(
    sim: SimRay, node_ids: Mapping[str, str], node_ips: Mapping[str, str], seed: str
) -> tuple[Rows, Rows, Rows]:
    """(job rows for /api/jobs/, placement groups, worker actors) of every job."""
    jobs: Rows = []
    groups: Rows = []
    actors: Rows = []
    for job in sim.jobs:
        running = job.status == "RUNNING"
        jobs.append(
            job_entry(
                job.id,
                driver_pid=job.driver_pid,
                driver_node_ip=node_ips[job.driver_node],
                entrypoint=job.entrypoint,
                status=job.status,
            )
        )
        group = placement_group_entry(
            "",
            [{"GPU": 1.0}] * len(job.workers),
            state="CREATED" if running else "REMOVED",
            node_ids=[node_ids[w.node] for w in job.workers],
            placement_group_id=ray_id("placement_group", f"{seed}/{job.id}", job.id),
            creator_job_id=job.id,
        )
        groups.append(group)
        actors.extend(_workers(job, group["placement_group_id"], node_ids, seed))
    return jobs, groups, actors


def _workers(job: SimRayJob, group_id: str, node_ids: Mapping[str, str], seed: str) -> Rows:
    pipeline = any(w.pp for w in job.workers)  # vLLM names the PP rank only then
    found = []
    for bundle, worker in enumerate(job.workers):
        name = ""
        if job.executor == "ray":
            name = f"{DEFAULT_RAY.worker_prefix}{_instance(job, seed)}_TP{worker.tp}"
            name += f"_PP{worker.pp}" if pipeline else ""
        state = worker.state if job.status == "RUNNING" else "DEAD"
        placed = state in ("ALIVE", "DEAD")  # Ray sends no node and pid 0 before placement
        found.append(
            actor_entry(
                WORKER_CLASS[job.executor],
                state=state,
                node_id=node_ids[worker.node] if placed else None,
                pid=worker.pid if placed else 0,
                name=name,
                actor_id=ray_id("actor", f"{seed}/{job.id}/{bundle}", job.id),
                job_id=job.id,
                placement_group_id=group_id,
                bundle_index=bundle,
            )
        )
    return found


def _instance(job: SimRayJob, seed: str) -> str:
    """vLLM's instance id: `time.time_ns()` when its config was made; stable here."""
    return str(1796132130615376518 + sum(map(ord, f"{seed}/{job.id}")))
