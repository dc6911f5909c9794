"""Which Ray node is a pod (docs/design.md, identity rule 8). Pure."""

from __future__ import annotations

from collections.abc import Iterable

from gpuledger.model.ray import RayNode


class PodNodes:
    """Which live Ray node is a pod: node IP = pod IP, else node_name = pod name; the first
    live node in Ray's order wins. Indexed once for all the pods of a node.

    DEAD nodes are skipped: a restarted pod keeps its name (and may get its old IP back)
    while Ray keeps the previous incarnation's node in its table.
    """

    def __init__(self, nodes: Iterable[RayNode]) -> None:
        self._by_ip: dict[str, RayNode] = {}
        self._by_name: dict[str, RayNode] = {}
        for node in nodes:
            if node.state != "ALIVE":
                continue
            if node.node_ip:
                self._by_ip.setdefault(node.node_ip, node)
            if node.hostname:
                self._by_name.setdefault(node.hostname, node)

    def of(self, pod_ip: str, pod_name: str) -> RayNode | None:
        found = self._by_ip.get(pod_ip) if pod_ip else None
        if found is None and pod_name:
            found = self._by_name.get(pod_name)
        return found


def node_for_pod(nodes: Iterable[RayNode], pod_ip: str, pod_name: str) -> RayNode | None:
    """The live Ray node that is this pod (see PodNodes)."""
    return PodNodes(nodes).of(pod_ip, pod_name)
