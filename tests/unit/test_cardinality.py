"""Cardinality bounds (docs/scaling.md, "Series budget per node"): oversized inputs through
the pure ledger and the real collector stay within the documented bounds, the Ray fold
keeps totals, and gpuledger_series_dropped_total counts what a cap kept out."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.export.collector import dropped_series, snapshot_families
from gpuledger.export.published import Published
from gpuledger.ledger import caps
from gpuledger.ledger.ray import RayActorGpus, RayActorMemory, RayNodeView, fold_actor_classes
from gpuledger.model import Snapshots
from gpuledger.model.dra import DraSnapshot, NodeDevices
from gpuledger.model.engines import EnginesSnapshot, EngineTarget
from gpuledger.model.ray import RAY_LOCAL, LocalRayNode, RayActor
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sources.base import Source
from tests.conftest import REPO
from tests.unit.ledger_inputs import (
    NODE,
    actor,
    allocations,
    exposition,
    gpus,
    ledger,
    local_ray,
    per_family,
    pod,
    pods,
    process,
    procs,
    ray_node,
    repeated,
    scrape,
    series,
)

SCALING = REPO / "docs" / "scaling.md"
_ROW = re.compile(r"^\| `(gpuledger_\w+)` \|.*\| ([\d,]+) \|$")
_TOTAL = re.compile(r"^\| \*\*total\*\* \|.*\| \*\*([\d,]+)\*\* \|$")


def budget(mode: str) -> tuple[dict[str, int], int]:
    """docs/scaling.md's table for `mode`: family -> worst case, and the total."""
    text = SCALING.read_text().split(f"### {mode.capitalize()} mode\n", 1)[1]
    rows: dict[str, int] = {}
    total = -1
    for line in text.split("\n#", 1)[0].splitlines():
        if found := _ROW.match(line):
            rows[found[1]] = int(found[2].replace(",", ""))
        elif found := _TOTAL.match(line):
            total = int(found[1].replace(",", ""))
    return rows, total


def within_budget(text: str, mode: str) -> Counter[str]:
    rows, total = budget(mode)
    counts = Counter({name: n for name, n in per_family(text).items()})
    for name, n in counts.items():
        assert name in rows, f"{name} has no bound in docs/scaling.md"
        assert n <= rows[name], f"{name}: {n} series, documented worst case {rows[name]}"
    assert sum(counts.values()) <= total
    assert not repeated(text)
    return counts


@pytest.mark.parametrize("mode", ["node", "cluster"])
def test_the_budget_tables_add_up(mode: str) -> None:
    rows, total = budget(mode)
    assert rows and sum(rows.values()) == total


def family_names(published: Published) -> set[str]:
    return {
        f.name + ("_total" if f.type == "counter" else "")
        for f in snapshot_families(published, 0.0)
    }


@pytest.mark.parametrize("mode", ["node", "cluster"])
def test_every_family_the_collector_writes_has_a_documented_bound(mode: str) -> None:
    published = Published(ledger(mode, nvml=gpus(1)), dropped_total={"x": 1})
    rows, _ = budget(mode)
    assert family_names(published) - set(rows) == set()


# ------------------------------------------------------------------------------ Ray


def many_actors(count: int, node_id: str) -> list[RayActor]:
    """`count` actors, each its own class: every 1000th holds 8 GPUs, the rest hold 1 or
    ask for 0.5 (PENDING_CREATION); a few say a state Ray does not have."""
    found = []
    for i in range(count):
        if i % 1000 == 0:
            found.append(actor(i, f"Big{i}", node_id, 8.0))
        elif i % 3 == 0:
            found.append(actor(i, f"Cls{i}", node_id, 0.5, "PENDING_CREATION"))
        elif i % 97 == 0:
            found.append(actor(i, f"Cls{i}", node_id, 1.0, f"WEIRD_{i}"))
        else:
            found.append(actor(i, f"Cls{i}", node_id, 1.0))
    return found


def test_100k_actor_classes_fold_into_other_with_totals_kept() -> None:
    actors = many_actors(100_000, "r1")
    ray_pod = pod(1, name="ray-worker")
    result = ledger(ray=(local_ray(ray_node("r1", 8.0), ray_pod, actors),))
    text = exposition(result)
    counts = within_budget(text, "node")
    exported = [s for s in series(text) if s[0] == "gpuledger_ray_actor_gpus"]
    classes = {dict(labels)["class_name"] for _, labels in exported}
    assert len(classes) == caps.MAX_RAY_ACTOR_CLASSES + 1
    assert caps.OTHER_CLASS in classes
    # The classes holding the most GPUs stay (ties by name): 64 of the 100 "Big" ones.
    big = sorted(f"Big{i * 1000}" for i in range(100))
    assert classes - {caps.OTHER_CLASS} == set(big[: caps.MAX_RAY_ACTOR_CLASSES])
    assert {dict(labels)["state"] for _, labels in exported} <= {
        "ALIVE",
        "PENDING_CREATION",
        "UNKNOWN",
    }
    # Totals per state survive the fold.
    by_state: dict[str, float] = {}
    for row in result.ray.actor_gpus if result.ray else ():
        by_state[row.state] = by_state.get(row.state, 0.0) + row.gpus
    want: dict[str, float] = {}
    for a in actors:
        state = a.state if a.state in ("ALIVE", "PENDING_CREATION") else "UNKNOWN"
        want[state] = want.get(state, 0.0) + a.num_gpus
    assert by_state == pytest.approx(want)
    # Every (class, state) row not exported on its own is counted.
    rows = {(a.class_name, a.state) for a in actors}
    other = [s for s in exported if dict(s[1])["class_name"] == caps.OTHER_CLASS]
    own = counts["gpuledger_ray_actor_gpus"] - len(other)
    assert dropped_series(result)["gpuledger_ray_actor_gpus"] == len(rows) - own
    assert len(text) < 64 * 1024


def test_fold_sums_memory_and_actors_without_memory() -> None:
    view = RayNodeView(ray_node("r1", 8.0), None, None)
    rows = [
        RayActorGpus(view, "A", "ALIVE", 4.0, 1),
        RayActorGpus(view, "B", "ALIVE", 2.0, 2),
        RayActorGpus(view, "B", "RESTARTING", 1.0, None),
        RayActorGpus(view, "C", "ALIVE", 1.0, 3),
    ]
    memory = [
        RayActorMemory(view, "A", "GPU-0", 10),
        RayActorMemory(view, "B", "GPU-0", 20),
        RayActorMemory(view, "C", "GPU-0", 30),
        RayActorMemory(view, "C", "GPU-1", 40),
    ]
    kept, kept_memory, folded, folded_memory = fold_actor_classes(rows, memory, limit=1)
    assert [(r.class_name, r.state, r.gpus, r.without_memory) for r in kept] == [
        ("A", "ALIVE", 4.0, 1),
        ("_other", "ALIVE", 3.0, 5),
        ("_other", "RESTARTING", 1.0, None),
    ]
    assert [(m.class_name, m.gpu_uuid, m.used_bytes) for m in kept_memory] == [
        ("A", "GPU-0", 10),
        ("_other", "GPU-0", 50),
        ("_other", "GPU-1", 40),
    ]
    assert len(folded) == 3 and len(folded_memory) == 3


def test_ray_nodes_are_capped_those_with_most_gpus_first() -> None:
    count = caps.MAX_RAY_NODES + 4
    local = tuple(
        local_ray(ray_node(f"r{i}", float(i)), pod(i), [actor(i, "W", f"r{i}", 1.0)])
        for i in range(count)
    )
    result = ledger(ray=local)
    text = exposition(result)
    within_budget(text, "node")
    kept = {dict(labels)["ray_node_id"] for name, labels in series(text) if "node_gpus" in name}
    assert kept == {f"r{i}" for i in range(4, count)}
    dropped = dropped_series(result)
    assert dropped["gpuledger_ray_actor_gpus"] == 4
    assert dropped["gpuledger_ray_node_gpus"] == 4 * 2  # total and available: no allocation


# -------------------------------------------------------------------------- engines


def test_1000_engines_are_capped_and_counted() -> None:
    targets = [EngineTarget(f"http://10.0.0.1:{8000 + t}/metrics") for t in range(4)]
    scrapes = tuple(scrape(target, [(f"model-{e}", "0") for e in range(250)]) for target in targets)
    result = ledger(vllm=EnginesSnapshot(scrapes))
    text = exposition(result)
    counts = within_budget(text, "node")
    assert counts["gpuledger_engine_up"] == caps.MAX_ENGINES
    dropped = dropped_series(result)
    assert dropped["gpuledger_engine_up"] == 1000 - caps.MAX_ENGINES
    assert dropped["gpuledger_engine_requests"] == 2 * (1000 - caps.MAX_ENGINES)


def test_engine_gpu_rows_are_capped() -> None:
    workers = 2 * caps.MAX_GPU_ROWS
    table = [process(100, title="vllm"), process(101, ppid=100, title="VLLM::EngineCore")]
    table += [process(200 + i, ppid=101, title=f"VLLM::Worker_TP{i}") for i in range(workers)]
    holders = {g: [200 + i for i in range(workers) if i % 16 == g] for g in range(16)}
    target = EngineTarget("http://127.0.0.1:8000/metrics")
    result = ledger(
        nvml=gpus(16, holders),
        procs=procs(table),
        vllm=EnginesSnapshot((scrape(target, [("m", "0")]),)),
    )
    text = exposition(result)
    counts = within_budget(text, "node")
    assert counts["gpuledger_engine_gpu_info"] == caps.MAX_GPU_ROWS
    assert dropped_series(result)["gpuledger_engine_gpu_info"] == workers - caps.MAX_GPU_ROWS
    # in_use still counts every GPU the engine's processes hold.
    assert result.engines[0].gpus_in_use == 16


# ------------------------------------------------- containers, processes, pods


def crowded_node() -> Iterator[object]:
    """16 GPUs; 1,500 GPU pods with 2 processes each; 5,000 host processes; each pod
    allocated one GPU, and 1,500 more allocations of pods the processes do not match."""
    pod_list = [pod(i) for i in range(1500)]
    table = []
    holders: dict[int, list[int]] = {g: [] for g in range(16)}
    for i, p in enumerate(pod_list):
        for k in range(2):
            pid = 10_000 + 2 * i + k
            table.append(process(pid, uid=p.uid, container=p.container_ids["c"]))
            holders[i % 16].append(pid)
    for h in range(5000):
        table.append(process(100_000 + h))
        holders[h % 16].append(100_000 + h)
    extra = [pod(5000 + i) for i in range(1500)]
    yield gpus(16, holders)
    yield procs(table)
    yield pods([*pod_list, *extra])
    yield allocations([(p, i % 16) for i, p in enumerate([*pod_list, *extra])])


def test_thousands_of_processes_and_pods_stay_within_the_budget() -> None:
    nvml, table, pod_snapshot, podresources = crowded_node()
    result = ledger(nvml=nvml, procs=table, pods=pod_snapshot, podresources=podresources)
    text = exposition(result)
    counts = within_budget(text, "node")
    limit = caps.MAX_GPU_ROWS
    for family in (
        "gpuledger_container_gpu_memory_used_bytes",
        "gpuledger_container_gpu_processes",
        "gpuledger_gpu_allocation_info",
        "gpuledger_gpu_allocated_unused",
        "gpuledger_gpu_unallocated_use",
    ):
        assert counts[family] == limit, family
    assert counts["gpuledger_unattributed_gpu_memory_used_bytes"] == 16
    assert counts["gpuledger_pod_starting"] == caps.MAX_GPU_PODS
    dropped = dropped_series(result)
    assert dropped["gpuledger_container_gpu_memory_used_bytes"] == 1500 - limit
    assert dropped["gpuledger_gpu_allocation_info"] == 3000 - limit
    assert dropped["gpuledger_gpu_allocated_unused"] == 3000 - limit
    assert dropped["gpuledger_pod_starting"] == 3000 - caps.MAX_GPU_PODS
    # Host processes are one row per GPU, and every byte of theirs is there.
    assert sum(result.unattributed.values()) == 5000 << 20


def test_pending_pods_are_capped_in_cluster_mode() -> None:
    pending = [
        replace(pod(i), node_name=None, pending_reason="insufficient_gpu")
        for i in range(caps.MAX_PENDING_PODS + 2000)
    ]
    result = ledger("cluster", pods=pods(pending))
    text = exposition(result)
    counts = within_budget(text, "cluster")
    assert counts["gpuledger_pod_pending_placement"] == caps.MAX_PENDING_PODS
    assert dropped_series(result) == {
        "gpuledger_pod_pending_placement": 2000,
        "gpuledger_pod_pending_gpus": 2000,
    }


def test_dra_gpu_nodes_are_capped_in_cluster_mode() -> None:
    rows = tuple(
        NodeDevices(f"node-{i:05d}", "gpu.nvidia.com", 8) for i in range(caps.MAX_DRA_NODES + 300)
    )
    result = ledger("cluster", dra=DraSnapshot(nodes=rows))
    counts = within_budget(exposition(result), "cluster")
    assert counts["gpuledger_dra_node_gpu_devices"] == caps.MAX_DRA_NODES
    assert dropped_series(result) == {"gpuledger_dra_node_gpu_devices": 300}


def test_a_repeated_gpu_uuid_is_one_gpu() -> None:
    nvml = gpus(2)
    twice = replace(nvml, gpus=(*nvml.gpus, nvml.gpus[0]))
    result = ledger(nvml=twice)
    text = exposition(result)
    assert per_family(text)["gpuledger_gpu_info"] == 2
    assert not repeated(text)
    assert dropped_series(result)["gpuledger_gpu_info"] == 1


# --------------------------------------------------------- the counter and its family


def test_the_dropped_counter_adds_up_over_snapshots_in_the_pipeline() -> None:
    local = (local_ray(ray_node("r1", 8.0), None, many_actors(1000, "r1")),)

    class Ray(Source[tuple[LocalRayNode, ...]]):
        key = RAY_LOCAL

        def fetch(self, inputs: Snapshots) -> tuple[LocalRayNode, ...]:
            return local

    pipeline = Pipeline(PipelineConfig(node=NODE), sources=[Ray()])
    try:
        pipeline.cycle()
        published = pipeline.cycle()
    finally:
        pipeline.close()
    once = dropped_series(published.ledger)["gpuledger_ray_actor_gpus"]
    assert once > 0
    assert published.dropped_total["gpuledger_ray_actor_gpus"] == 2 * once
    text = exposition(published)
    found = [
        value
        for family in text_string_to_metric_families(text)
        for name, labels, value, *_ in family.samples
        if name == "gpuledger_series_dropped_total"
    ]
    assert found == [2 * once]
    assert '{family="gpuledger_ray_actor_gpus",node="n1"}' in text
