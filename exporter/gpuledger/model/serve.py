"""Ray Serve's view: applications, deployments and replicas from the dashboard's
`/api/serve/applications/`, and the queues Serve's routers and replicas report in the
metrics of the Ray nodes that run here."""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger.model.bundle import Key


@dataclass(frozen=True)
class ServeDeployment:
    application: str
    deployment: str
    status: str  # HEALTHY | UPDATING | UPSCALING | DOWNSCALING | UNHEALTHY | DEPLOY_FAILED ...
    # deployment_config: requests one replica takes at once; the rest wait at the router.
    max_ongoing_requests: int | None = None
    target_replicas: int | None = None


@dataclass(frozen=True)
class ServeReplica:
    """One replica actor of a deployment, on one of the Ray nodes that run here."""

    application: str
    deployment: str
    replica: str  # Serve's replica id, the `replica` label of its metrics
    state: str  # STARTING | UPDATING | RECOVERING | RUNNING | STOPPING | PENDING_MIGRATION
    node_id: str | None
    # In the Ray pod's PID namespace, as Ray reports actor PIDs; None until it runs.
    pid: int | None
    actor_id: str | None = None


@dataclass(frozen=True)
class ServeRouterQueue:
    """What the routers (proxies and deployment handles) on one Ray node hold for one
    deployment, summed over their handles."""

    application: str
    deployment: str
    # ray_serve_deployment_queued_queries: waiting to be assigned to a replica.
    queued: float
    # ray_serve_num_ongoing_requests_at_replicas: assigned, not finished yet.
    at_replicas: float | None = None


@dataclass(frozen=True)
class ServeReplicaLoad:
    application: str
    deployment: str
    replica: str
    # ray_serve_replica_processing_queries: requests the replica runs now.
    ongoing: float


@dataclass(frozen=True)
class ServeNodeMetrics:
    """One local Ray node's metrics endpoint, as read this cycle."""

    node_id: str
    url: str  # scheme, host, port and path only
    up: bool
    routers: tuple[ServeRouterQueue, ...] = ()
    replicas: tuple[ServeReplicaLoad, ...] = ()
    error_reason: str | None = None
    error_message: str | None = None


@dataclass(frozen=True)
class ServeSnapshot:
    """Node mode: the deployments of the Ray cluster, their replicas on the Ray nodes that
    run here, and those nodes' Serve metrics."""

    deployments: tuple[ServeDeployment, ...] = ()
    replicas: tuple[ServeReplica, ...] = ()
    nodes: tuple[ServeNodeMetrics, ...] = ()
    # The (namespace, workload) of what runs on a Ray node that is no pod (outside
    # Kubernetes): --ray-workload, as cluster mode attributes Ray's pending work.
    namespace: str = ""
    workload: str = ""


SERVE: Key[ServeSnapshot] = Key("serve")
