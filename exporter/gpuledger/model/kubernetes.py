"""Kubernetes' view: the pods the ledger needs, with their placement state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuledger.model.base import frozen_map
from gpuledger.model.bundle import Key


@dataclass(frozen=True)
class PodInfo:
    """The fields of one Pod the ledger uses."""

    uid: str
    namespace: str
    name: str
    node_name: str | None
    phase: str
    labels: Mapping[str, str]
    workload: str
    pod_ip: str | None
    # Container name -> bare runtime id (64 hex for containerd/cri-o/docker), the key
    # the cgroup path gives (identity rule 2). Containers not started yet are absent.
    container_ids: Mapping[str, str]
    # GPUs the Pod asks for: limits of the configured GPU resource names.
    gpu_requests: int
    # Why it is not placed (scheduling.PENDING_REASONS); None once PodScheduled=True.
    pending_reason: str | None
    # lastTransitionTime of PodScheduled=False, epoch seconds.
    pending_since: float | None
    ready: bool
    # metadata.deletionTimestamp is set: terminating.
    deletion: bool
    # Only the annotations gpuledger reads (ANNOTATION_PREFIXES): discovery hints.
    annotations: Mapping[str, str] = field(default_factory=frozen_map)
    # The ResourceClaims (names, in the pod's namespace) of spec.resourceClaims: named
    # directly, or made from a template (status.resourceClaimStatuses). DRA GPUs are
    # counted in gpu_requests by the ledger, which knows the claims' device classes.
    claims: tuple[str, ...] = ()
    # Nodes the scheduler's message counts for pending_reason ("6 cannot allocate all
    # claims"); None when placed or not counted.
    pending_nodes: int | None = None


@dataclass(frozen=True)
class PodsSnapshot:
    pods: tuple[PodInfo, ...]
    # False only from `cached()` while the informer is not in sync with the API server.
    synced: bool


# This source's snapshot in a cycle's Snapshots.
PODS: Key[PodsSnapshot] = Key("kubernetes")
