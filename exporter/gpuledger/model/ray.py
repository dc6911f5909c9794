"""Ray's view: nodes, actors and placement groups as the dashboard's state API reports them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from gpuledger.model.base import frozen_map
from gpuledger.model.bundle import Key
from gpuledger.model.kubernetes import PodInfo

GPU: Final = "GPU"  # the logical resource name Ray counts GPUs by


@dataclass(frozen=True)
class RayNode:
    """One Ray node (a raylet); on Kubernetes, one Ray pod."""

    node_id: str
    node_ip: str
    # `node_name`: what `ray start --node-name` set, else the node IP.
    hostname: str | None
    state: str  # ALIVE | DEAD
    is_head: bool
    # Logical resources as Ray counts them (`num_gpus`), not what the hardware has.
    resources_total: Mapping[str, float] = field(default_factory=frozen_map)
    # From cluster_status; None when Ray did not report this node's usage.
    resources_available: Mapping[str, float] | None = None
    labels: Mapping[str, str] = field(default_factory=frozen_map)

    @property
    def gpus_total(self) -> float:
        return self.resources_total.get(GPU, 0.0)

    @property
    def gpus_available(self) -> float | None:
        if self.resources_available is None:
            return None
        return self.resources_available.get(GPU, 0.0)


@dataclass(frozen=True)
class RayActor:
    actor_id: str
    class_name: str
    state: str  # DEPENDENCIES_UNREADY | PENDING_CREATION | ALIVE | RESTARTING | DEAD
    # PID inside the worker's PID namespace (the Ray pod's); None until the actor runs.
    pid: int | None
    node_id: str | None
    # Logical GPUs the actor holds (ALIVE) or asks for (pending); 0 for CPU actors.
    num_gpus: float
    job_id: str | None
    placement_group_id: str | None
    ray_namespace: str | None
    name: str | None = None
    # The placement group bundle it runs in (`GPU_group_<index>_<pg>` of its resources).
    bundle_index: int | None = None


@dataclass(frozen=True)
class RayBundle:
    index: int
    gpus: float
    # Where the bundle is reserved; None while it is not placed.
    node_id: str | None


@dataclass(frozen=True)
class RayPlacementGroup:
    pg_id: str
    name: str | None
    state: str  # PENDING | PREPARED | CREATED | REMOVED | RESCHEDULING
    # stats.scheduling_state: QUEUED, NO_RESOURCES (waits for capacity held by others),
    # INFEASIBLE (never fits this cluster), FINISHED, ...; None where not reported.
    scheduling_state: str | None
    # Not in the 2.60 state API rows; kept when a dashboard does send it.
    strategy: str | None
    bundles: tuple[RayBundle, ...] = ()
    creator_job_id: str | None = None
    is_detached: bool | None = None
    # stats.creation_request_received_ns, in seconds.
    created_timestamp_seconds: float | None = None

    @property
    def gpus(self) -> float:
        """GPUs asked by all bundles together."""
        return sum(b.gpus for b in self.bundles)


@dataclass(frozen=True)
class RayJob:
    """One Ray job (`/api/v0/jobs`): a driver process, e.g. a vLLM EngineCore that runs
    its workers as Ray actors (docs/design.md, identity rule 9)."""

    job_id: str
    type: str  # DRIVER | SUBMISSION
    status: str  # PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED
    # driver_info.pid: PID in the driver's PID namespace (a string in Ray's answer).
    driver_pid: int | None
    # driver_info.node_ip_address: the Ray node IP the driver runs at.
    driver_node_ip: str | None
    # driver_node_id, where Ray sends it (submission jobs); drivers started by hand
    # (vLLM's EngineCore) have only the IP.
    driver_node_id: str | None
    # First word of the entrypoint: the driver's process title when the job started
    # (`VLLM::EngineCore`, `VLLM::EngineCore_DP1`).
    entrypoint_title: str


@dataclass(frozen=True)
class RaySnapshot:
    nodes: tuple[RayNode, ...] = ()
    actors: tuple[RayActor, ...] = ()
    placement_groups: tuple[RayPlacementGroup, ...] = ()
    # Non-fatal: partial failures, truncation, unreadable rows, cluster_status missing.
    warnings: tuple[str, ...] = ()
    # Node mode: the RUNNING jobs of the whole cluster; None when they were not read.
    jobs: tuple[RayJob, ...] | None = None


@dataclass(frozen=True)
class LocalRayNode:
    """Node mode: one Ray node that runs here, with its own actors and its pod."""

    snapshot: RaySnapshot  # every node, but only this node's actors
    node: RayNode  # with its availability
    pod: PodInfo | None  # None outside Kubernetes
    # The vLLM jobs whose driver (EngineCore) runs on this Ray node: their worker actors
    # on every node, and their placement groups (what their engines were given).
    driven_actors: tuple[RayActor, ...] = ()
    driven_groups: tuple[RayPlacementGroup, ...] = ()
    # Those of them whose actors or placement group could not be read.
    driven_unread: tuple[str, ...] = ()


@dataclass(frozen=True)
class RayClusterSnapshot:
    """Cluster mode: the whole Ray cluster, and the workload its unplaced work is
    attributed to (configured: the state API does not know its Kubernetes owner)."""

    state: RaySnapshot
    namespace: str
    workload: str


# Node mode: the Ray nodes on this node. Cluster mode: the whole cluster's state.
RAY_LOCAL: Key[tuple[LocalRayNode, ...]] = Key("ray")
RAY_CLUSTER: Key[RayClusterSnapshot] = Key("ray")
