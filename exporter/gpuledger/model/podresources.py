"""The kubelet's PodResources view: which device it gave to which container."""

from __future__ import annotations

from dataclasses import dataclass

from gpuledger.model.bundle import Key


@dataclass(frozen=True)
class DeviceAllocation:
    """One device the kubelet says it gave to one container."""

    namespace: str
    pod: str
    container: str
    resource: str  # e.g. nvidia.com/gpu, nvidia.com/mig-1g.10gb
    device_id: str  # as the kubelet reports it, e.g. GPU-<uuid>::1
    # device_id without a time-slicing/MPS replica suffix: the GPU or MIG UUID under the
    # device plugin's default `uuid` strategy (an index under its `index` strategy).
    gpu_uuid: str
    # Ordinal of this GPU among the container's distinct GPUs (all matching resources), in
    # the kubelet's list order. Replicas of one GPU share a position. CUDA itself numbers
    # a container's devices in PCI order: the ledger resolves that with NVML.
    position: int


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a ResourceClaim as the kubelet reports it (PodResources v1
    `DynamicResource` / `ClaimResource`): the DRA driver's names, not a GPU UUID."""

    claim_namespace: str
    claim_name: str
    driver: str  # e.g. gpu.nvidia.com
    pool: str  # the driver's pool, usually the node name
    device: str  # e.g. gpu-2, gpu-0-mig-9-4-1 (kubernetes-sigs/dra-driver-nvidia-gpu)
    # Set when one device is shared by several claims (consumable capacity); else "".
    share_id: str = ""

    @property
    def qualified(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class ClaimAllocation:
    """The kubelet says this container holds this claim's device."""

    namespace: str
    pod: str
    container: str
    device: ClaimDevice


@dataclass(frozen=True)
class PodResourcesSnapshot:
    # Sorted by namespace, pod, container, position, device_id.
    allocations: tuple[DeviceAllocation, ...]
    # Device ids (as reported) of the matching resources the kubelet can allocate; None
    # when the kubelet does not offer GetAllocatableResources (before 1.21, or its
    # feature gate off before 1.23). That is a fact about the kubelet, not a failure.
    allocatable: tuple[str, ...] | None
    # DRA devices of the configured GPU drivers, sorted like `allocations`.
    claims: tuple[ClaimAllocation, ...] = ()


# This source's snapshot in a cycle's Snapshots.
PODRESOURCES: Key[PodResourcesSnapshot] = Key("podresources")
