"""Kubernetes Dynamic Resource Allocation (`resource.k8s.io/v1`, Kubernetes 1.34): the
devices this node's ResourceSlices publish, and the ResourceClaims pending pods wait on."""

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
class DraSnapshot:
    # Node mode: the devices of this node's slices that carry a `uuid`, sorted.
    devices: tuple[SliceDevice, ...] = ()
    # Cluster mode: claims that request a GPU device class, sorted by namespace, name.
    claims: tuple[ClaimInfo, ...] = ()


# This source's snapshot in a cycle's Snapshots.
DRA: Key[DraSnapshot] = Key("dra")
