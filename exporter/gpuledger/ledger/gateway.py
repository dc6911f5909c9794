"""The gateway joined: each InferencePool with what its endpoint picker reported. Pure.

A pool's members are pods keyed by Pod UID, as everything else in the ledger is, so a
node agent's engine (which carries its pod's UID) finds its pool wherever the two meet:
explain's Fleet, the /ledger page, and the recording rules (on `pod_uid`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger.model.gateway import (
    InferencePool,
    PickerReading,
    PickersSnapshot,
    PoolMember,
    PoolsSnapshot,
)


@dataclass(frozen=True)
class Pool:
    """An InferencePool and its picker's reading this cycle (None: no picker, or not read)."""

    pool: InferencePool
    picker: PickerReading | None


def build_pools(pools: PoolsSnapshot | None, pickers: PickersSnapshot | None) -> tuple[Pool, ...]:
    """Every pool, sorted by namespace and name, with its picker's reading (the ledger's
    cap, caps.MAX_POOLS, cuts the rest after the join)."""
    if pools is None:
        return ()
    readings = {(r.namespace, r.pool): r for r in (pickers.readings if pickers else ())}
    ordered = sorted(pools.pools, key=lambda p: (p.namespace, p.name))
    return tuple(Pool(p, readings.get((p.namespace, p.name))) for p in ordered)


@dataclass(frozen=True)
class PoolMemberRow:
    """One (pool, pod) pair: a row of gpuledger_inference_pool_member."""

    namespace: str
    pool: str
    member: PoolMember


def pool_members(pools: tuple[Pool, ...]) -> tuple[PoolMemberRow, ...]:
    """Every pool's members as rows, in pool order, then by pod name (the ledger's cap,
    caps.MAX_POOL_MEMBERS, cuts past it)."""
    return tuple(
        PoolMemberRow(p.pool.namespace, p.pool.name, m)
        for p in pools
        for m in sorted(p.pool.members, key=lambda m: (m.name, m.uid))
    )
