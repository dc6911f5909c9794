"""Which vLLM engines this node agent scrapes: annotated pods here, then static URLs.

A pod opts in with `gpuledger.io/vllm-port` (and optional `-path`, `-scheme`), or is a
candidate through the common `prometheus.io/port` annotations: a candidate whose
exposition has no `vllm:` series is dropped, not reported. `gpuledger.io/vllm-port` may
list several ports (`8000,8001`): a pod running several API servers, one target each.
Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger.model.kubernetes import PodInfo
from gpuledger.model.engines import EngineTarget, Origin

PORT_ANNOTATION = "gpuledger.io/vllm-port"
PATH_ANNOTATION = "gpuledger.io/vllm-path"
SCHEME_ANNOTATION = "gpuledger.io/vllm-scheme"


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
    if PORT_ANNOTATION in notes:
        ports, path = notes[PORT_ANNOTATION].split(","), notes.get(PATH_ANNOTATION, "/metrics")
        scheme, origin = notes.get(SCHEME_ANNOTATION, "http"), "annotation"
    elif "prometheus.io/port" in notes and notes.get("prometheus.io/scrape") != "false":
        ports, path = [notes["prometheus.io/port"]], notes.get("prometheus.io/path", "/metrics")
        scheme, origin = notes.get("prometheus.io/scheme", "http"), "prometheus_annotation"
    else:
        return []
    ports = [p.strip() for p in ports[:MAX_PORTS_PER_POD]]
    if not all(p.isdigit() for p in ports) or scheme not in ("http", "https"):
        return []
    host = f"[{pod.pod_ip}]" if ":" in pod.pod_ip else pod.pod_ip
    return [_target(f"{scheme}://{host}:{p}/{path.lstrip('/')}", pod, origin) for p in ports]


def _target(url: str, pod: PodInfo | None, origin: Origin) -> EngineTarget:
    if pod is None:
        return EngineTarget(url=url, origin=origin)
    return EngineTarget(
        url=url,
        namespace=pod.namespace,
        pod=pod.name,
        pod_uid=pod.uid,
        workload=pod.workload,
        origin=origin,
    )
