"""The family declarations (export/families.py) and the ledger agree: every row the Ledger
holds is some family's, every capped family's rows overflow into a field of the same name,
and the dropped-series view counts exactly the series of the rows it was given."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from gpuledger.export import families as F
from gpuledger.export.collector import dropped_series
from gpuledger.export.published import Published
from gpuledger.ledger import EngineGpu, Ledger, Overflow
from gpuledger.ledger.gateway import build_pools, pool_members
from gpuledger.model.dra import NodeDevices
from gpuledger.model.engines import EngineMetrics
from gpuledger.model.gateway import (
    InferencePool,
    PickerReading,
    PickerRef,
    PickersSnapshot,
    PoolMember,
    PoolsSnapshot,
)
from tests.unit.ledger_inputs import (
    allocations,
    claim_allocations,
    exposition,
    gpus,
    ledger,
    per_family,
    pod,
    pods,
    process,
    procs,
)
from tests.unit.test_ray_engines import engine_ledger, workers
from tests.unit.test_serve import capture_snapshot, serve_ledger

# Ledger fields that are no family's rows: which ledger it is, and what only
# /ledger.json and explain read (PIDs have no place in a series).
IDENTITY = {"node", "mode", "taken_at", "driver_version"}
# `claims`: the ResourceClaims pending pods name, for their explain lines; `engine_history`:
# each engine's recent states, for explain --request.
NOT_EXPORTED = {"processes", "unknowns", "overflow", "claims", "engine_history"}
LEDGER = {f.name: f for f in fields(Ledger)}
OVERFLOW = {f.name: f for f in fields(Overflow)}


def test_every_ledger_field_is_the_rows_of_a_declared_family() -> None:
    declared = {spec.rows for spec in F.FAMILIES}
    assert set(LEDGER) - IDENTITY - NOT_EXPORTED - declared == set()
    published = {f.name for f in fields(Published)}
    assert declared - set(LEDGER) - published == set()


def test_overflow_fields_mirror_the_ledger_fields_they_overflow() -> None:
    for name, f in OVERFLOW.items():
        if name == "engine_gpus":  # kept engines' GPU rows: no Ledger field of its own
            continue
        assert name in LEDGER, name
        assert f.type == LEDGER[name].type, name


def test_every_capped_family_overflows_into_a_counted_field() -> None:
    for spec in F.FAMILIES:
        if spec.dropped:
            assert spec.rows in OVERFLOW, spec.name


def test_a_cap_that_is_not_in_caps_py_is_refused() -> None:
    with pytest.raises(ValueError, match="MAX_NOTHING"):
        F.declare(
            "gpuledger_nothing",
            F.GAUGE,
            F.SELF,
            help="",
            labels=(),
            stability=F.EXPERIMENTAL,
            rows="sources",
            budget=(),
            meaning="",
            cap="MAX_NOTHING",
        )


def rich_ledgers() -> list[Ledger]:
    """Ledgers that, together, have a row in every family a cap can bite."""
    p = pod(1)
    table = [process(10, uid=p.uid, container=p.container_ids["c"])]
    # GPU 1 through the device plugin, GPU 0 through a DRA claim.
    podresources, dra = claim_allocations(allocations([(p, 1)]), [(p, 0)])
    containers = ledger(
        nvml=gpus(2, {0: [10]}),
        procs=procs(table),
        pods=pods([p]),
        podresources=podresources,
        dra=dra,
    )
    actors, found = workers(2)
    ray = engine_ledger(actors, found, {0: [201], 1: [202]})
    # Every series an engine can have: its queues, a flag, a GPU row.
    metrics = EngineMetrics("m", "0", 1.0, 2.0, {"capacity": 2.0}, 0.5, 3.0)
    engine = replace(
        ray.engines[0],
        metrics=metrics,
        config={**ray.engines[0].config, "max_num_seqs": "8"},
        gpus=(EngineGpu(ray.gpus[0].uuid, "worker", "0"),),
        gpu_link="system",  # its GPUs meet across NUMA nodes
    )
    serve = serve_ledger(capture_snapshot())
    waiting = replace(pod(2), node_name=None, pending_since=1.0)
    # The cluster view's count of a node's GPU devices in its ResourceSlices.
    slices = (NodeDevices("gpu-node-9", "gpu.nvidia.com", 8),)
    # An InferencePool with a Ready member and a picker that reports every series.
    member = PoolMember("uid-m", "vllm-a-x", "vllm-a", "gpu-node-1", "10.0.0.11", True)
    pool = InferencePool(
        "llm",
        "pool-a",
        "uid-p",
        {"app": "vllm-a"},
        (8000,),
        PickerRef("pool-a-epp", 9002, "FailOpen"),
        "http://10.96.0.50:9090/metrics",
        (member,),
    )
    picker = PickerReading(
        "llm",
        "pool-a",
        "http://10.96.0.50:9090/metrics",
        True,
        queued_requests=30.0,
        ready_endpoints=1.0,
        saturation=0.2,
    )
    pools = build_pools(PoolsSnapshot((pool,)), PickersSnapshot((picker,)))
    pending = replace(
        ledger("cluster", pods=pods([waiting])),
        dra_nodes=slices,
        pools=pools,
        pool_members=pool_members(pools),
    )
    return [containers, replace(ray, engines=(engine,)), serve, pending]


def as_overflow(full: Ledger) -> Ledger:
    """The ledger with every row it has also in its overflow, as if a cap cut them all."""
    rows = {name: getattr(full, name) for name in OVERFLOW if name in LEDGER}
    return replace(full, overflow=Overflow(**rows))


def test_the_dropped_view_counts_every_series_of_the_rows_it_was_given() -> None:
    seen: set[str] = set()
    for full in rich_ledgers():
        exported = per_family(exposition(Published(full)))
        want = {
            name: count
            for name, count in exported.items()
            if F.BY_NAME[name].rows in OVERFLOW and F.BY_NAME[name].dropped
        }
        assert dropped_series(as_overflow(full)) == want
        seen |= set(want)
    capped = {spec.name for spec in F.FAMILIES if spec.cap is not None}
    assert capped - seen == set(), "no rich ledger has rows of these capped families"


def test_the_surplus_gpu_rows_of_kept_engines_count_only_engine_gpu_info() -> None:
    full = rich_ledgers()[1]
    cut = replace(full, overflow=Overflow(engine_gpus=full.engines))
    rows = sum(len(e.gpus) for e in full.engines)
    assert rows > 0
    assert dropped_series(cut) == {F.ENGINE_GPU_INFO.name: rows}
