"""One collection cycle: run the sources under their deadlines, join them, publish.

Sources that need nothing from each other run at the same time; procfs (which needs
NVML's PIDs) and vLLM (which needs the pods on this node) run in a second stage. Each
source has its own deadline, so a cycle takes at most two deadlines, and a scrape never
waits on any of it: it renders the last published ledger.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpuledger.collector import Published
from gpuledger.identity.raynodes import PodNodes
from gpuledger.ledger import Ledger, build_ledger
from gpuledger.ledger.ray import RayCluster, build_ray_cluster
from gpuledger.model import SourceStatus
from gpuledger.model.kubernetes import PodInfo, PodsSnapshot
from gpuledger.model.ray import RayActor, RayNode, RaySnapshot
from gpuledger.model.vllm import EngineTarget, VllmSnapshot
from gpuledger.sources import nvml, procfs
from gpuledger.sources import podresources as podres
from gpuledger.sources.base import DISABLED, SourceRunner, Started
from gpuledger.sources.kubernetes import SOURCE as KUBERNETES
from gpuledger.sources.kubernetes import PodInformer
from gpuledger.sources.ray import SOURCE as RAY
from gpuledger.sources.ray import RayStateClient
from gpuledger.sources.vllm import SOURCE as VLLM
from gpuledger.sources.vllm import VllmScraper

log = logging.getLogger(__name__)
T = TypeVar("T")


PORT_ANNOTATION = "gpuledger.io/vllm-port"
PATH_ANNOTATION = "gpuledger.io/vllm-path"
SCHEME_ANNOTATION = "gpuledger.io/vllm-scheme"


@dataclass(frozen=True)
class PipelineConfig:
    node: str
    mode: str = "node"
    proc_root: str = "/proc"
    nvml_library: str | None = None
    source_deadline_seconds: float = 5.0
    # None: not configured here (e.g. a box without Kubernetes).
    podresources_socket: str | None = None
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-*")
    # Cluster mode: report unplaced pods that request no GPU too.
    pending_all_pods: bool = False
    kubernetes: bool = False
    kubeconfig: str | None = None
    vllm_targets: tuple[str, ...] = ()
    vllm_discovery: bool = True
    vllm_timeout_seconds: float = 3.0
    vllm_max_body_bytes: int = 8 * 1024 * 1024
    ray_address: str | None = None
    ray_token: str | None = field(default=None, repr=False)  # never printed
    # Cluster mode: the (namespace, workload) Ray's pending work is attributed to.
    ray_workload: tuple[str, str] = ("", "ray")


def vllm_targets(pods: Sequence[PodInfo], static: Sequence[str]) -> tuple[EngineTarget, ...]:
    """Engines to scrape: annotated pods on this node, then static URLs."""
    targets: list[EngineTarget] = []
    by_ip = {p.pod_ip: p for p in pods if p.pod_ip}
    for pod in pods:
        if pod.phase != "Running" or not pod.pod_ip or pod.deletion:
            continue
        notes = pod.annotations
        if PORT_ANNOTATION in notes:
            port, path = notes[PORT_ANNOTATION], notes.get(PATH_ANNOTATION, "/metrics")
            scheme, origin = notes.get(SCHEME_ANNOTATION, "http"), "annotation"
        elif "prometheus.io/port" in notes and notes.get("prometheus.io/scrape") != "false":
            port, path = notes["prometheus.io/port"], notes.get("prometheus.io/path", "/metrics")
            scheme, origin = notes.get("prometheus.io/scheme", "http"), "prometheus_annotation"
        else:
            continue
        if not port.isdigit() or scheme not in ("http", "https"):
            continue
        host = f"[{pod.pod_ip}]" if ":" in pod.pod_ip else pod.pod_ip
        url = f"{scheme}://{host}:{port}/{path.lstrip('/')}"
        targets.append(_target(url, pod, origin))
    for url in static:
        host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
        targets.append(_target(url, by_ip.get(host), "static"))
    return tuple(targets)


LocalRay = tuple[tuple[RaySnapshot, RayNode, PodInfo | None], ...]
RayResult = LocalRay | RayCluster


def local_ray_nodes(
    nodes: Sequence[RayNode], pods: Sequence[PodInfo] | None
) -> list[tuple[RayNode, PodInfo | None]]:
    """The Ray nodes that run here: pods on this node (by IP, else name), or, outside
    Kubernetes, the node with this host's name (or the only node)."""
    if pods is not None:
        index = PodNodes(nodes)
        found: list[tuple[RayNode, PodInfo | None]] = []
        for pod in pods:
            if pod.phase == "Running" and pod.pod_ip:
                match = index.of(pod.pod_ip, pod.name)
                if match is not None:
                    found.append((match, pod))
        return found
    alive = [n for n in nodes if n.state == "ALIVE"]
    here = socket.gethostname()
    mine = [n for n in alive if n.hostname == here]
    return [(n, None) for n in (mine or (alive if len(alive) == 1 else []))]


def fetch_local_ray(client: RayStateClient, pods: Sequence[PodInfo] | None) -> LocalRay:
    """Node mode: the nodes once, then the actors of the local Ray nodes only."""
    chosen: list[tuple[RayNode, PodInfo | None]] = []

    def select(nodes: tuple[RayNode, ...]) -> list[str]:
        chosen.extend(local_ray_nodes(nodes, pods))
        return [node.node_id for node, _ in chosen]

    snapshot = client.fetch_local(select)
    # The snapshot's copies of the chosen nodes carry their availability.
    by_id = {node.node_id: node for node in snapshot.nodes}
    actors_by_node: dict[str | None, list[RayActor]] = {}
    for actor in snapshot.actors:
        actors_by_node.setdefault(actor.node_id, []).append(actor)
    return tuple(
        (
            RaySnapshot(
                nodes=snapshot.nodes,
                actors=tuple(actors_by_node.get(node.node_id, ())),
                warnings=snapshot.warnings,
            ),
            by_id.get(node.node_id, node),
            pod,
        )
        for node, pod in chosen
    )


def _target(url: str, pod: PodInfo | None, origin: Any) -> EngineTarget:
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


class Pipeline:
    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        deadline = config.source_deadline_seconds
        self._runners: dict[str, SourceRunner[Any]] = {}
        self._closers: list[Callable[[], None]] = []
        self._nvml: nvml.NvmlSource | None = None
        self._procfs: procfs.ProcfsSource | None = None
        self._podres: podres.PodResourcesSource | None = None
        self._informer: PodInformer | None = None
        self._vllm: VllmScraper | None = None
        if config.mode == "node":
            self._nvml = nvml.NvmlSource(config.nvml_library)
            self._procfs = procfs.ProcfsSource(config.proc_root)
            self._closers.append(self._nvml.close)
            if config.podresources_socket:
                self._podres = podres.PodResourcesSource(
                    config.podresources_socket,
                    config.gpu_resources,
                    timeout_seconds=max(0.1, deadline * 0.8),
                )
                self._closers.append(self._podres.close)
            if config.vllm_targets or (config.vllm_discovery and config.kubernetes):
                self._vllm = VllmScraper(
                    timeout_seconds=min(config.vllm_timeout_seconds, deadline / 2),
                    max_body_bytes=config.vllm_max_body_bytes,
                )
                self._closers.append(self._vllm.close)
        self._ray: RayStateClient | None = None
        if config.ray_address:
            self._ray = RayStateClient(
                config.ray_address,
                token=config.ray_token,
                timeout_seconds=max(0.1, deadline * 0.8),
            )
            self._closers.append(self._ray.close)
        if config.kubernetes:
            self._informer = PodInformer(
                "node" if config.mode == "node" else "cluster",
                node_name=config.node if config.mode == "node" else None,
                kubeconfig=config.kubeconfig,
                gpu_resources=config.gpu_resources,
                pending_gpu_only=config.mode == "cluster" and not config.pending_all_pods,
            )
            self._closers.append(self._informer.stop)
        for name in (nvml.SOURCE, procfs.SOURCE, podres.SOURCE, KUBERNETES, VLLM, RAY):
            self._runners[name] = SourceRunner(name, deadline)
        self._known_engines: dict[str, list[tuple[str, str]]] = {}
        self._errors: Counter[tuple[str, str]] = Counter()
        self._last_success: dict[str, float] = {}
        self._last_reason: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def _start(self, name: str, fetch: Callable[[], T] | None) -> Started[T]:
        return Started.disabled(name) if fetch is None else self._runners[name].start(fetch)

    def warm_up(self, timeout_seconds: float) -> None:
        """Give the pod informer up to `timeout_seconds` to list once, so the first
        snapshot already carries pod names (later ones would anyway)."""
        if self._informer is not None:
            self._informer.start()
            if not self._informer.wait_synced(timeout_seconds):
                log.info("pod informer not synced after %gs; continuing", timeout_seconds)

    def cycle(self) -> Published:
        """Take one coherent snapshot of every source and join it."""
        started = time.time()
        nvml_started = self._start(nvml.SOURCE, self._nvml.fetch if self._nvml else None)
        podres_started = self._start(podres.SOURCE, self._podres.fetch if self._podres else None)
        pods_started = self._start(KUBERNETES, self._informer.fetch if self._informer else None)
        nvml_snap, nvml_status = nvml_started.wait()
        podres_snap, podres_status = podres_started.wait()
        pods_snap, pods_status = pods_started.wait()
        if pods_snap is None and self._informer is not None and self._informer.stats().lists:
            # The API server went away after a first list: pod identities in the cache are
            # still the best knowledge. The source stays down and its last success
            # timestamp ages, so the staleness is visible.
            pods_snap = self._informer.cached()

        pids = [p.pid for g in nvml_snap.gpus for p in g.processes] if nvml_snap else []
        proc_fetch = self._procfs.fetch if self._procfs else None
        proc_started = self._start(
            procfs.SOURCE, (lambda: proc_fetch(pids)) if proc_fetch else None
        )
        vllm_started = self._start_vllm(pods_snap)
        ray_started = self._start_ray(pods_snap)
        proc_snap, proc_status = proc_started.wait()
        vllm_snap, vllm_status = vllm_started.wait()
        ray_result, ray_status = ray_started.wait()

        node_mode = self.config.mode == "node"
        all_statuses = (
            nvml_status,
            proc_status,
            podres_status,
            pods_status,
            vllm_status,
            ray_status,
        )
        statuses = tuple(s for s in all_statuses if node_mode or s.source in (KUBERNETES, RAY))
        ray_local = ray_result if node_mode and isinstance(ray_result, tuple) else None
        ray_cluster = ray_result if isinstance(ray_result, RayCluster) else None
        ledger = build_ledger(
            node=self.config.node,
            mode=self.config.mode,
            taken_at=time.time(),
            nvml=nvml_snap,
            procs=proc_snap,
            sources=statuses,
            pods=pods_snap if node_mode else None,
            podresources=podres_snap,
            vllm=vllm_snap,
            known_engines=dict(self._known_engines),
            pending=None if node_mode else pods_snap,
            ray_local=ray_local,
            ray_cluster=ray_cluster,
        )
        self._remember_engines(vllm_snap)
        self._account(statuses, started)
        self._account_engines(vllm_snap)
        return self.published(ledger)

    def _start_vllm(self, pods: PodsSnapshot | None) -> Started[VllmSnapshot]:
        scraper = self._vllm
        if scraper is None:
            return Started.disabled(VLLM)
        discovered = pods.pods if pods is not None and self.config.vllm_discovery else ()
        targets = vllm_targets(discovered, self.config.vllm_targets)
        return self._runners[VLLM].start(lambda: scraper.fetch(targets))

    def _start_ray(self, pods: PodsSnapshot | None) -> Started[RayResult]:
        client = self._ray
        if client is None:
            return Started.disabled(RAY)
        if self.config.mode == "cluster":
            namespace, workload = self.config.ray_workload
            return self._runners[RAY].start(
                lambda: build_ray_cluster(client.fetch_cluster(), namespace, workload)
            )
        local_pods = pods.pods if pods is not None else None
        return self._runners[RAY].start(lambda: fetch_local_ray(client, local_pods))

    def _remember_engines(self, snapshot: VllmSnapshot | None) -> None:
        if snapshot is None:
            return
        current = {s.target.url for s in snapshot.scrapes}
        for url in list(self._known_engines):
            if url not in current:
                del self._known_engines[url]  # no longer a target: forget its engines
        for scrape in snapshot.scrapes:
            if scrape.up and scrape.engines:
                self._known_engines[scrape.target.url] = [
                    (e.model_name, e.engine) for e in scrape.engines
                ]

    def _account(self, statuses: tuple[SourceStatus, ...], when: float) -> None:
        with self._lock:
            for status in statuses:
                if status.up:
                    self._last_success[status.source] = when
                elif status.error_reason != DISABLED:
                    self._errors[(status.source, status.error_reason or "unknown")] += 1
                # Log transitions only: a source down for hours must not flood the log.
                reason = None if status.up else status.error_reason
                if self._last_reason.get(status.source, "") != reason:
                    if status.up:
                        log.info("source %s is up", status.source)
                    elif reason == DISABLED:
                        log.info("source %s is not configured", status.source)
                    else:
                        log.warning(
                            "source %s is down (%s): %s",
                            status.source,
                            reason,
                            status.error_message,
                        )
                    self._last_reason[status.source] = reason

    def _account_engines(self, snapshot: VllmSnapshot | None) -> None:
        """One engine failing is not the vllm source failing, but its reason counts."""
        if snapshot is None:
            return
        with self._lock:
            for scrape in snapshot.scrapes:
                if not scrape.up and scrape.error_reason not in (None, "not_vllm"):
                    self._errors[(VLLM, scrape.error_reason or "unknown")] += 1

    def published(self, ledger: Ledger) -> Published:
        with self._lock:
            return Published(
                ledger=ledger,
                errors_total=dict(self._errors),
                last_success=dict(self._last_success),
            )

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()
        for close in self._closers:
            try:
                close()
            except Exception:  # closing must not stop the others from closing
                log.debug("close failed", exc_info=True)


__all__ = ["Pipeline", "PipelineConfig", "vllm_targets"]
