"""Which engines this node agent scrapes: annotated pods here, then static URLs.

A pod opts in with its engine kind's port annotation (and optional path and scheme
ones; gpuledger.engines), which names the target's kind, or is a candidate through the
common `prometheus.io/port` annotations: a candidate whose exposition shows no kind's
series is dropped, not reported. A port annotation may list several ports
(`8000,8001`): a pod running several API servers, one target each. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger.engines import KINDS
from gpuledger.model.engines import EngineTarget, Origin
from gpuledger.model.kubernetes import PodInfo


def discover_targets(pods: Sequence[PodInfo], static: Sequence[str]) -> tuple[EngineTarget, ...]:
    """Engines to scrape: annotated running pods on this node, then static URLs; one
    target per endpoint (the first wins), so no engine is scraped, or labelled, twice."""
    targets = [t for pod in pods for t in _annotated(pod)]
    by_ip = {p.pod_ip: p for p in pods if p.pod_ip}
    for url in static:
        host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
        targets.append(_target(url, by_ip.get(host), "static"))
    unique: dict[str, EngineTarget] = {}
    for target in targets:
        unique.setdefault(target.endpoint, target)
    return tuple(unique.values())


# Ports one pod's annotation may list: far more API servers than one pod's GPUs can hold.
MAX_PORTS_PER_POD = 16


def _annotated(pod: PodInfo) -> list[EngineTarget]:
    if pod.phase != "Running" or not pod.pod_ip or pod.deletion:
        return []
    notes = pod.annotations
    origin: Origin
    kind = next((k for k in KINDS if k.port_annotation in notes), None)
    if kind is not None:
        ports = notes[kind.port_annotation].split(",")
        path = notes.get(kind.path_annotation, "/metrics")
        scheme, origin = notes.get(kind.scheme_annotation, "http"), "annotation"
    elif "prometheus.io/port" in notes and notes.get("prometheus.io/scrape") != "false":
        ports, path = [notes["prometheus.io/port"]], notes.get("prometheus.io/path", "/metrics")
        scheme, origin = notes.get("prometheus.io/scheme", "http"), "prometheus_annotation"
    else:
        return []
    ports = [p.strip() for p in ports[:MAX_PORTS_PER_POD]]
    if not all(p.isdigit() for p in ports) or scheme not in ("http", "https"):
        return []
    host = f"[{pod.pod_ip}]" if ":" in pod.pod_ip else pod.pod_ip
    name = kind.name if kind is not None else ""
    return [_target(f"{scheme}://{host}:{p}/{path.lstrip('/')}", pod, origin, name) for p in ports]


def _target(url: str, pod: PodInfo | None, origin: Origin, kind: str = "") -> EngineTarget:
    if pod is None:
        return EngineTarget(url=url, origin=origin, kind=kind)
    return EngineTarget(
        url=url,
        namespace=pod.namespace,
        pod=pod.name,
        pod_uid=pod.uid,
        workload=pod.workload,
        origin=origin,
        kind=kind,
    )
