"""Which vLLM engines this node agent scrapes: annotated pods here, then static URLs.

A pod opts in with `gpuledger.io/vllm-port` (and optional `-path`, `-scheme`), or is a
candidate through the common `prometheus.io/port` annotations: a candidate whose
exposition has no `vllm:` series is dropped, not reported. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger.model.kubernetes import PodInfo
from gpuledger.model.vllm import EngineTarget, Origin

PORT_ANNOTATION = "gpuledger.io/vllm-port"
PATH_ANNOTATION = "gpuledger.io/vllm-path"
SCHEME_ANNOTATION = "gpuledger.io/vllm-scheme"


def discover_targets(pods: Sequence[PodInfo], static: Sequence[str]) -> tuple[EngineTarget, ...]:
    """Engines to scrape: annotated running pods on this node, then static URLs; one
    target per endpoint (the first wins), so no engine is scraped, or labelled, twice."""
    targets = [t for t in map(_annotated, pods) if t is not None]
    by_ip = {p.pod_ip: p for p in pods if p.pod_ip}
    for url in static:
        host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
        targets.append(_target(url, by_ip.get(host), "static"))
    unique: dict[str, EngineTarget] = {}
    for target in targets:
        unique.setdefault(target.endpoint, target)
    return tuple(unique.values())


def _annotated(pod: PodInfo) -> EngineTarget | None:
    if pod.phase != "Running" or not pod.pod_ip or pod.deletion:
        return None
    notes = pod.annotations
    origin: Origin
    if PORT_ANNOTATION in notes:
        port, path = notes[PORT_ANNOTATION], notes.get(PATH_ANNOTATION, "/metrics")
        scheme, origin = notes.get(SCHEME_ANNOTATION, "http"), "annotation"
    elif "prometheus.io/port" in notes and notes.get("prometheus.io/scrape") != "false":
        port, path = notes["prometheus.io/port"], notes.get("prometheus.io/path", "/metrics")
        scheme, origin = notes.get("prometheus.io/scheme", "http"), "prometheus_annotation"
    else:
        return None
    if not port.isdigit() or scheme not in ("http", "https"):
        return None
    host = f"[{pod.pod_ip}]" if ":" in pod.pod_ip else pod.pod_ip
    return _target(f"{scheme}://{host}:{port}/{path.lstrip('/')}", pod, origin)


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
