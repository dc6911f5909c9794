"""kubelet PodResources v1 over gRPC: device allocations per container on this node.

`api.proto` holds the messages used; `api_pb2*.py(i)` are generated from it by
`scripts/gen-podresources.sh` and committed, so the image needs no protoc.
"""

from gpuledger.model.podresources import DeviceAllocation, PodResourcesSnapshot
from gpuledger.sources.podresources.source import (
    DEFAULT_RESOURCE_NAMES,
    DEFAULT_SOCKET_PATH,
    PodResourcesSource,
    ResourcePatterns,
)

__all__ = [
    "DEFAULT_RESOURCE_NAMES",
    "DEFAULT_SOCKET_PATH",
    "DeviceAllocation",
    "PodResourcesSnapshot",
    "PodResourcesSource",
    "ResourcePatterns",
]
