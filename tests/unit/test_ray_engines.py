"""Identity rule 9 (docs/design.md): a Ray-executor vLLM engine, its job and its workers.

Rows parsed from the real captures (tests/fixtures/ray/vllm-0.32-ray/), and the pure
ledger on built snapshots: the link from engine to job, ranks from actor names, the
worker rows under the engine's cross-node identity, caps, and the unknown cases.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from gpuledger.engines.ray import engine_dp_rank, is_worker, worker_ranks
from gpuledger.export.collector import dropped_series
from gpuledger.identity.rayjobs import RayEngineId, WorkerRanks, driver_node, engine_id
from gpuledger.ledger import caps
from gpuledger.model.engines import EnginesSnapshot, EngineTarget
from gpuledger.model.ray import LocalRayNode, RayActor, RayJob, RayNode, RaySnapshot
from gpuledger.sim.fake_ray import placement_group_entry
from gpuledger.sources.ray.state import parse_actor, parse_job, parse_node, parse_placement_group
from tests.conftest import REPO
from tests.unit.ledger_inputs import (
    exposition,
    gpus,
    ledger,
    pod,
    pods,
    process,
    procs,
    repeated,
    scrape,
    series,
    uuid,
)

CAPTURE = REPO / "tests" / "fixtures" / "ray" / "vllm-0.32-ray"
NODE_ID = "a0afe47a7634b9b3d02f9a08580f26517851fce2db57019755280500"


def _rows(name: str) -> list[Any]:
    rows: list[Any] = json.loads((CAPTURE / name).read_text())["data"]["result"]["result"]
    return rows


def _actors(name: str) -> list[RayActor]:
    return [a for a in map(parse_actor, _rows(name)) if a is not None]


# ------------------------------------------------------------------- from the captures


def test_jobs_from_both_job_apis_parse_alike() -> None:
    (v0,) = [parse_job(r) for r in _rows("ray_v0_jobs.json")]
    (api,) = [parse_job(r) for r in json.loads((CAPTURE / "ray_api_jobs.json").read_text())]
    assert v0 == api
    assert v0 == RayJob("01000000", "DRIVER", "RUNNING", 7137, "<ip>", None, "VLLM::EngineCore")
    assert engine_dp_rank(v0) == 0
    (node,) = [parse_node(r) for r in _rows("ray_nodes_detail.json")]
    assert node is not None
    assert engine_id(v0, [node]) == RayEngineId("01000000", NODE_ID)


def test_worker_actors_of_both_executors() -> None:
    current = {a.name: a for a in _actors("ray_actors.json")}
    tp0 = current["vllm_Worker_1796132130615376518_TP0"]
    assert (tp0.class_name, tp0.pid, tp0.job_id, tp0.bundle_index) == (
        "RayWorkerProc",
        7438,
        "01000000",
        0,
    )
    assert is_worker(tp0) and worker_ranks(tp0) == WorkerRanks(0, 0)
    tp1 = current["vllm_Worker_1796132130615376518_TP1"]
    assert (worker_ranks(tp1), tp1.bundle_index, tp1.num_gpus) == (WorkerRanks(1, 0), 1, 1.0)
    legacy = [a for a in _actors("legacy-executor_ray_actors.json") if a.state == "ALIVE"]
    assert {(a.class_name, a.name, a.bundle_index) for a in legacy} == {
        ("RayWorkerWrapper", None, 0),
        ("RayWorkerWrapper", None, 1),
    }
    assert all(is_worker(a) and worker_ranks(a) == WorkerRanks(None, None) for a in legacy)
    dead = [a for a in _actors("legacy-executor_ray_actors.json") if a.state == "DEAD"]
    proxy = [a for a in dead if a.class_name == "CompiledDAG.DAGDriverProxyActor"]
    assert proxy and not is_worker(proxy[0])


def test_placement_group_gives_the_world_size() -> None:
    (group,) = [parse_placement_group(r) for r in _rows("ray_placement_groups.json")]
    assert group is not None and group.creator_job_id == "01000000"
    assert [b.gpus for b in group.bundles] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("name", "ranks"),
    [
        ("vllm_Worker_1796132130615376518_TP3", WorkerRanks(3, 0)),
        ("vllm_Worker_1796132130615376518_TP1_PP2", WorkerRanks(1, 2)),
        ("vllm_Worker_1796132130615376518_PP1_TP0", WorkerRanks(0, 1)),
        ("vllm_Worker_1796132130615376518_TP2_PP1_PCP1", WorkerRanks(2, 1)),
        ("vllm_Worker_x", WorkerRanks(0, 0)),
        ("Worker_TP0", WorkerRanks(None, None)),
        ("", WorkerRanks(None, None)),
    ],
)
def test_ranks_from_actor_names(name: str, ranks: WorkerRanks) -> None:
    assert worker_ranks(replace(ACTOR, name=name)) == ranks


@pytest.mark.parametrize(
    ("title", "rank"),
    [
        ("VLLM::EngineCore", 0),
        ("VLLM::EngineCore_DP3", 3),
        ("VLLM::EngineCoreX", None),
        ("python", None),
        ("", None),
    ],
)
def test_engine_titles(title: str, rank: int | None) -> None:
    assert engine_dp_rank(replace(JOB, entrypoint_title=title)) == rank


def test_driver_node_by_ip_needs_one_live_node() -> None:
    a = RayNode("a" * 56, "10.0.0.1", None, "ALIVE", True)
    dead = RayNode("d" * 56, "10.0.0.1", None, "DEAD", False)
    assert driver_node(JOB, [dead, a]) == a
    twin = RayNode("b" * 56, "10.0.0.1", None, "ALIVE", False)
    assert driver_node(JOB, [a, twin]) is None  # two raylets on one address
    by_id = replace(JOB, driver_node_id="b" * 56)
    assert driver_node(by_id, [a, twin]) == twin
    assert driver_node(replace(JOB, driver_node_ip=None), [a]) is None


# ------------------------------------------------------------------- the pure ledger

HEAD = RayNode("h" * 56, "10.0.0.1", "ray-head", "ALIVE", True, {"GPU": 2.0})
JOB = RayJob("01000000", "DRIVER", "RUNNING", 11, "10.0.0.1", None, "VLLM::EngineCore")
ACTOR = RayActor(
    actor_id="a0",
    class_name="RayWorkerProc",
    state="ALIVE",
    pid=21,
    node_id=HEAD.node_id,
    num_gpus=1.0,
    job_id="01000000",
    placement_group_id="g" * 28 + "01000000",
    ray_namespace=None,
    name="vllm_Worker_1_TP0",
    bundle_index=0,
)
HEAD_POD = pod(1, name="ray-head", ip="10.0.0.1")
TARGET = EngineTarget(
    "http://10.0.0.1:8000/metrics",
    namespace="ns",
    pod="ray-head",
    pod_uid=HEAD_POD.uid,
    workload="ray-head",
)


def workers(tp: int, host_pids: list[int] | None = None) -> tuple[list[RayActor], list[Any]]:
    """`tp` worker actors on HEAD (Ray PIDs 21…) and their processes (host PIDs 201…)."""
    actors = [
        replace(ACTOR, actor_id=f"a{r}", pid=21 + r, name=f"vllm_Worker_1_TP{r}", bundle_index=r)
        for r in range(tp)
    ]
    found = [
        process(201 + r, title="ray::RayWorkerProc.run", uid=HEAD_POD.uid, nspid=(201 + r, 21 + r))
        for r in range(tp)
    ]
    return actors, found


def head(actors: list[RayActor], jobs: tuple[RayJob, ...] | None = (JOB,)) -> LocalRayNode:
    group = parse_placement_group(
        placement_group_entry(
            "",
            [{"GPU": 1.0}] * len(actors),
            state="CREATED",
            placement_group_id="g" * 28 + "01000000",
        )
    )
    assert group is not None
    return LocalRayNode(
        RaySnapshot(nodes=(HEAD,), actors=tuple(actors), jobs=jobs),
        HEAD,
        HEAD_POD,
        driven_actors=tuple(actors),
        driven_groups=(group,),
    )


def engine_ledger(
    actors: list[RayActor], found: list[Any], holders: dict[int, list[int]], **more: Any
) -> Any:
    return ledger(
        nvml=gpus(4, holders),
        procs=procs(found),
        pods=pods([HEAD_POD]),
        vllm=EnginesSnapshot((scrape(TARGET, [("m", "0")]),)),
        ray=(head(actors, **more),),
    )


def test_engine_links_to_its_job_and_workers_carry_its_identity() -> None:
    actors, found = workers(2)
    result = engine_ledger(actors, found, {0: [201], 1: [202]})
    (engine,) = result.engines
    assert engine.ray is not None
    assert engine.ray.id == RayEngineId("01000000", HEAD.node_id)
    assert (engine.gpus_configured, engine.gpus_in_use) == (2, None)
    assert dict(engine.ray.workers) == {"ALIVE": 2}
    assert result.ray is not None
    assert [(w.ranks.tp, w.host_pid, [u for u, _ in w.memory]) for w in result.ray.workers] == [
        (0, 201, [uuid(0)]),
        (1, 202, [uuid(1)]),
    ]
    text = exposition(result)
    assert not repeated(text)
    info = [dict(labels) for name, labels in series(text) if name == "gpuledger_ray_worker_info"]
    assert {(i["ray_job_id"], i["ray_driver_node_id"], i["tp_rank"]) for i in info} == {
        ("01000000", HEAD.node_id, "0"),
        ("01000000", HEAD.node_id, "1"),
    }


def test_a_worker_holding_no_gpu_is_still_reported() -> None:
    actors, found = workers(4)
    # procfs reads the processes NVML lists: the fourth worker's is not among them.
    result = engine_ledger(actors, found[:3], {0: [201], 1: [202], 2: [203]})
    assert result.ray is not None
    assert [len(w.memory) for w in result.ray.workers] == [1, 1, 1, 0]
    assert result.ray.workers[3].host_pid is None
    assert result.engines[0].gpus_configured == 4


def test_api_server_flags_win_over_the_placement_group() -> None:
    actors, found = workers(2)
    server = process(100, title="vllm", uid=HEAD_POD.uid)
    server = replace(
        server,
        flags={"tensor_parallel_size": "4", "distributed_executor_backend": "ray"},
    )
    core = process(101, ppid=100, title="VLLM::EngineCore", uid=HEAD_POD.uid, nspid=(101, 11))
    result = engine_ledger(actors, [*found, server, core], {0: [201, 101], 1: [202]})
    (engine,) = result.engines
    assert (engine.gpus_configured, engine.gpus_in_use) == (4, None)


def test_ray_backend_without_a_link_has_no_local_gpu_count() -> None:
    """Ray down (or the job not told): the EngineCore's own GPU is not the engine's."""
    server = replace(
        process(100, title="vllm", uid=HEAD_POD.uid),
        flags={"distributed_executor_backend": "ray"},
    )
    core = process(101, ppid=100, title="VLLM::EngineCore", uid=HEAD_POD.uid)
    result = ledger(
        nvml=gpus(1, {0: [101]}),
        procs=procs([server, core]),
        pods=pods([HEAD_POD]),
        vllm=EnginesSnapshot((scrape(TARGET, [("m", "0")]),)),
    )
    (engine,) = result.engines
    assert engine.ray is None
    assert (engine.gpus_configured, engine.gpus_in_use) == (1, None)


def test_unknown_jobs_link_nothing_and_name_no_worker() -> None:
    actors, found = workers(2)
    result = engine_ledger(actors, found, {0: [201], 1: [202]}, jobs=None)
    assert result.engines[0].ray is None
    assert result.ray is not None and result.ray.workers == ()


def test_finished_job_and_dead_actors_leave_nothing() -> None:
    actors, found = workers(2)
    dead = [replace(a, state="DEAD") for a in actors]
    result = engine_ledger(dead, found, {0: [201], 1: [202]}, jobs=())
    assert result.engines[0].ray is None
    assert result.ray is not None and result.ray.workers == ()
    assert "gpuledger_ray_worker" not in exposition(result)


def test_two_jobs_on_one_key_are_told_apart_by_the_engine_core_pid() -> None:
    actors, found = workers(2)
    other = replace(JOB, job_id="02000000", driver_pid=12)
    core = process(101, ppid=100, title="VLLM::EngineCore", uid=HEAD_POD.uid, nspid=(101, 12))
    result = engine_ledger(actors, [*found, core], {0: [201], 1: [202]}, jobs=(JOB, other))
    assert result.engines[0].ray is not None
    assert result.engines[0].ray.id.job_id == "02000000"
    # Without the EngineCore in procfs the two cannot be told apart: no link.
    blind = engine_ledger(actors, found, {0: [201], 1: [202]}, jobs=(JOB, other))
    assert blind.engines[0].ray is None


def test_dp_rank_picks_the_engine() -> None:
    actors, found = workers(1)
    dp1 = replace(JOB, job_id="02000000", entrypoint_title="VLLM::EngineCore_DP1")
    result = ledger(
        nvml=gpus(1, {0: [201]}),
        procs=procs(found),
        pods=pods([HEAD_POD]),
        vllm=EnginesSnapshot((scrape(TARGET, [("m", "0"), ("m", "1")]),)),
        ray=(head(actors, jobs=(JOB, dp1)),),
    )
    assert [(e.engine, e.ray.id.job_id if e.ray else None) for e in result.engines] == [
        ("0", "01000000"),
        ("1", "02000000"),
    ]


def test_workers_are_capped_and_counted() -> None:
    count = caps.MAX_GPU_ROWS + 5
    actors = [
        replace(ACTOR, actor_id=f"a{i:05d}", pid=10_000 + i, name=f"vllm_Worker_1_TP{i}")
        for i in range(count)
    ]
    found = [
        process(20_000 + i, uid=HEAD_POD.uid, nspid=(20_000 + i, 10_000 + i)) for i in range(count)
    ]
    result = ledger(
        nvml=gpus(2, {0: [p.pid for p in found]}),
        procs=procs(found),
        pods=pods([HEAD_POD]),
        ray=(head(actors),),
    )
    assert result.ray is not None and len(result.ray.workers) == caps.MAX_GPU_ROWS
    assert result.overflow.ray is not None and len(result.overflow.ray.workers) == 5
    dropped = dropped_series(result)
    assert dropped["gpuledger_ray_worker_info"] == 5
    assert dropped["gpuledger_ray_worker_gpu_memory_used_bytes"] == 5


def test_two_unnamed_workers_outside_a_bundle_do_not_repeat_a_series() -> None:
    actors, found = workers(2)
    twins = [replace(a, name=None, bundle_index=None) for a in actors]
    result = engine_ledger(twins, found, {0: [201], 1: [202]})
    assert result.ray is not None and len(result.ray.workers) == 1
    assert not repeated(exposition(result))
