"""Per-node cardinality caps (docs/scaling.md, "Series budget per node"). Pure.

Every family the exporter writes has a bound. Most come from the hardware or from fixed
vocabularies; the rows that grow with what runs on the node (containers, engines, Ray
actors) are capped here. Rows past a cap are kept out of the ledger and handed to the
collector as `Overflow`, which counts them in `gpuledger_series_dropped_total`: a cap
that bites is visible, never silent. Ray actor classes past their cap are folded into
one class, so the node's totals stay right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, TypeVar

T = TypeVar("T")

# Rows keyed by (something, GPU) per family: container usage, device maps, allocations,
# each discrepancy kind, engine GPU rows, Ray actor memory. A dense node has 32 per
# family; 1,024 is 110 pods (kubelet's default max-pods) on 8 GPUs each, and more.
MAX_GPU_ROWS: Final = 1024
# GPU pods per node (gpuledger_pod_starting); kubelet's default max-pods is 110.
MAX_GPU_PODS: Final = 256
# vLLM engines per node, over all its targets (one target may already expose 256).
MAX_ENGINES: Final = 256
# Ray nodes (Ray pods) per node, those with the most GPUs first: one per GPU on a
# 16-GPU server.
MAX_RAY_NODES: Final = 16
# Ray actor classes per Ray node, those holding the most GPUs; the rest fold into
# OTHER_CLASS.
MAX_RAY_ACTOR_CLASSES: Final = 64
OTHER_CLASS: Final = "_other"
# Ray Serve deployments with a router or a replica on this node (rows keyed by workload,
# application and deployment), and Serve replicas on this node's Ray nodes.
MAX_SERVE_DEPLOYMENTS: Final = 256
MAX_SERVE_REPLICAS: Final = 1024
# Cluster mode: unplaced GPU pods (three series each).
MAX_PENDING_PODS: Final = 10_000
# Cluster mode: (node, DRA driver) rows of GPU devices in ResourceSlices; Kubernetes
# supports 5,000 nodes.
MAX_DRA_NODES: Final = 5_000
# Cluster mode: InferencePools (each with up to its source's member cap of pods).
MAX_POOLS: Final = 1_000
# Cluster mode: (pool, pod) member rows over every pool.
MAX_POOL_MEMBERS: Final = 10_000


def split(rows: Sequence[T], limit: int) -> tuple[tuple[T, ...], tuple[T, ...]]:
    """The first `limit` rows, and the rest. Callers pass rows in a stable order (by
    identity), so the same rows stay in from one snapshot to the next."""
    return tuple(rows[:limit]), tuple(rows[limit:])
