"""The ledger (join): pure functions from source snapshots to one Ledger. No I/O."""

from gpuledger.ledger.engines import Engine, EngineGpu
from gpuledger.ledger.node import (
    Allocation,
    ContainerGpuUsage,
    ContainerRef,
    DeviceMapping,
    Discrepancy,
    Ledger,
    Overflow,
    PodState,
    ProcessView,
    build_ledger,
    container_of,
    overflow_view,
)

__all__ = [
    "Allocation",
    "ContainerGpuUsage",
    "ContainerRef",
    "DeviceMapping",
    "Discrepancy",
    "Engine",
    "EngineGpu",
    "Ledger",
    "Overflow",
    "PodState",
    "ProcessView",
    "build_ledger",
    "container_of",
    "overflow_view",
]
