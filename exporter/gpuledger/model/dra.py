"""Kubernetes Dynamic Resource Allocation (`resource.k8s.io/v1`, Kubernetes 1.34): the
devices this node's ResourceSlices publish, the ResourceClaims pending pods wait on, and
which nodes' slices publish GPUs at all."""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger.model.bundle import Key


@dataclass(frozen=True)
class SliceDevice:
    """One device of a ResourceSlice, by the names PodResources gives it."""

    driver: str
    pool: str
    name: str
    # The NVIDIA DRA driver's `uuid` attribute: GPU-… or, for a MIG device, MIG-….
    uuid: str
    parent_uuid: str | None = None  # `parentUUID` of a MIG device
    profile: str | None = None  # `profile` of a MIG device, e.g. 1g.10gb


@dataclass(frozen=True)
class ClaimInfo:
    """The fields of one ResourceClaim the cluster view uses."""

    namespace: str
    name: str
    # GPU device classes its requests name (spec.devices.requests[].exactly or the first
    # of firstAvailable), and the devices they ask of them ("All" counts one).
    device_classes: tuple[str, ...]
    gpus: int
    allocated: bool  # status.allocation is set
    reserved_for: int  # len(status.reservedFor)
    deleting: bool


@dataclass(frozen=True)
class NodeDevices:
    """Cluster mode: the devices with a `uuid` (GPUs, MIG devices) that one GPU driver's
    current ResourceSlices publish on one node. kube-state-metrics has no such series."""

    node: str  # spec.nodeName of the slices
    driver: str
    devices: int


@dataclass(frozen=True)
class DraSnapshot:
    # Node mode: the devices of this node's slices that carry a `uuid`, sorted.
    devices: tuple[SliceDevice, ...] = ()
    # Cluster mode: claims that request a GPU device class, sorted by namespace, name.
    claims: tuple[ClaimInfo, ...] = ()
    # Cluster mode: nodes whose slices publish GPU devices, sorted by node, driver.
    nodes: tuple[NodeDevices, ...] = ()
    # Cluster mode: why the cluster's slices could not be listed (a reason of the error
    # vocabulary, e.g. forbidden); `nodes` is then empty, the claims still good.
    nodes_error: str | None = None


# This source's snapshot in a cycle's Snapshots.
DRA: Key[DraSnapshot] = Key("dra")
