"""`gpuledger explain`: the object chain from a workload down to the silicon, and a verdict.

Reads the `/ledger.json` of one or more exporters (node agents and the cluster view), or a
scenario run on the harness, and prints for the asked pod, GPU, workload or engine:
workload -> pods (UID) -> engine (model, DP rank, config) -> processes (role, rank) ->
container ordinal -> host GPU (UUID, index) -> node, then where the work waits and why,
then any ledger disagreement, then what could not be known.

The documents are typed (gpuledger/document/); the result `explain` returns is the JSON of
`explain --json` (explain/result.py's types), which `render_text` reads back typed.

Exit codes: 0 explained; 1 nothing matched the query; 2 usage error; 3 no source could be
read.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger.document.codec import DocumentError, decode, from_json, to_json
from gpuledger.document.v1 import (
    ContainerDoc,
    DiscrepancyDoc,
    EngineDoc,
    GpuDoc,
    LedgerDocument,
    MigDeviceDoc,
    PendingDoc,
    PodDoc,
    PoolDoc,
    PoolMemberDoc,
    ProcessDoc,
    RayActorDoc,
    RayClusterDoc,
    RayNodeDoc,
    ServeDeploymentDoc,
    SourceDoc,
)
from gpuledger.explain.ray import (
    RayWorkers,
    footprint,
    footprint_lines,
    footprint_unknowns,
    link_text,
)
from gpuledger.explain.result import (
    ContainerEntry,
    DeviceEntry,
    EngineEntry,
    ExplainResult,
    GpuShown,
    HostProcess,
    PodEntry,
    ProcessEntry,
    ServeEntry,
    VerdictShown,
    WorkloadResult,
)
from gpuledger.explain.verdict import (
    STAGES,
    Thresholds,
    Verdict,
    ray_pending_reason,
    workload_verdict,
)
from gpuledger.identity.urls import safe_url
from gpuledger.net.httpclient import HttpClient, HttpError

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


class ExplainError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def fetch_document(
    url: str,
    timeout: float = 5.0,
    *,
    headers: Mapping[str, str] | None = None,
    tls_context: ssl.SSLContext | None = None,
) -> LedgerDocument:
    """GET <exporter>/ledger.json, bounded in total time and size; `headers` (basic auth)
    and `tls_context` (a CA) for an exporter behind --web-config-file."""
    target = url.rstrip("/")
    if not target.endswith("/ledger.json"):
        target += "/ledger.json"
    client = HttpClient(
        deadline_seconds=timeout,
        max_body_bytes=MAX_DOCUMENT_BYTES,
        headers={**(headers or {}), "Accept": "application/json"},
        tls_context=tls_context,
        max_redirects=0 if headers else 3,  # credentials go to the exporter named only
    )
    try:
        response = client.get(target)
    except HttpError as exc:
        raise ExplainError(EXIT_UNREACHABLE, f"{exc.message} ({exc.reason})") from None
    if response.status != 200:
        raise ExplainError(EXIT_UNREACHABLE, f"{safe_url(target)}: HTTP {response.status}")
    try:
        obj = json.loads(response.body)
    except ValueError:
        raise ExplainError(EXIT_UNREACHABLE, f"{safe_url(target)}: not JSON") from None
    try:
        return from_json(obj)
    except DocumentError as exc:
        raise ExplainError(EXIT_UNREACHABLE, f"{safe_url(target)}: {exc}") from None


def source_state(status: SourceDoc) -> str:
    """up, down or not_configured; a document older than `state` says reason `disabled`."""
    if status.state is not None:
        return status.state
    if status.up:
        return "up"
    return "not_configured" if status.reason == "disabled" else "down"


@dataclass(frozen=True)
class OnNode:
    """A document's row with the node whose document holds it."""

    node: str
    row: Any


@dataclass(frozen=True)
class Device:
    """A GPU or a MIG device as explain shows it: a MIG device with its GPU's host index,
    model and PCI bus (what makes it a MIG device here is its `parent_uuid`)."""

    device: GpuDoc | MigDeviceDoc
    gpu: GpuDoc  # the GPU itself, or the MIG device's GPU
    node: str

    @property
    def uuid(self) -> str:
        return self.device.uuid

    @property
    def parent_uuid(self) -> str:
        return self.device.parent_uuid if isinstance(self.device, MigDeviceDoc) else ""

    def shown(self) -> dict[str, Any]:
        """Its JSON in explain's result: the device's fields, a MIG device's index as
        `mig_index` and its GPU's index, model and bus in their place."""
        if isinstance(self.device, GpuDoc):
            return dict(to_json(self.device))
        g = self.gpu
        return {
            **to_json(self.device),
            "index": g.index,
            "mig_index": self.device.index,
            "model": g.model,
            "pci_bus_id": g.pci_bus_id,
            "mig_mode": g.mig_mode,
            "utilization_ratio": None,  # NVML has none for a MIG device
        }


@dataclass
class Workload:
    namespace: str
    name: str
    pods: dict[str, PodDoc] = field(default_factory=dict)  # uid -> pod, node filled in
    pending: list[PendingDoc] = field(default_factory=list)
    engines: list[OnNode] = field(default_factory=list)  # EngineDoc rows
    discrepancies: list[DiscrepancyDoc] = field(default_factory=list)
    ray_nodes: list[RayNodeDoc] = field(default_factory=list)
    ray_actors: list[RayActorDoc] = field(default_factory=list)
    # Ray Serve deployment rows of every node (a node has the routers and replicas it runs).
    serve: list[OnNode] = field(default_factory=list)  # ServeDeploymentDoc rows
    # InferencePools with a member pod of the workload (the cluster view's document).
    pools: list[PoolDoc] = field(default_factory=list)

    def engine_docs(self) -> list[EngineDoc]:
        return [e.row for e in self.engines]

    def serve_docs(self) -> list[ServeDeploymentDoc]:
        return [d.row for d in self.serve]

    def verdict(self, t: Thresholds) -> Verdict:
        pods = list(self.pods.values())
        return workload_verdict(
            self.pending, pods, self.engine_docs(), t, self.serve_docs(), pools=self.pools
        )


def device_name(gpu: GpuShown) -> str:
    """`GPU-…`, or for a MIG device `MIG-… (GPU-… instance 3, 1g.10gb)`: the GPU instance
    as nvidia-smi numbers it (GI), and the compute instance (CI) where it is not 0."""
    if not gpu.parent_uuid:
        return gpu.uuid
    ci = gpu.compute_instance_id
    compute = f" compute instance {ci}" if ci else ""
    gi = "?" if gpu.gpu_instance_id is None else gpu.gpu_instance_id
    profile = gpu.profile or "profile ?"
    return f"{gpu.uuid} ({gpu.parent_uuid} instance {gi}{compute}, {profile})"


def _device_name(d: Device) -> str:
    return device_name(decode(GpuShown, d.shown()))


class Fleet:
    """Every document joined: nodes by name, GPUs and MIG devices by UUID, workloads by
    (ns, name)."""

    def __init__(self, docs: Sequence[LedgerDocument]) -> None:
        self.docs = docs
        self.gpus: dict[str, Device] = {}
        self.workloads: dict[tuple[str, str], Workload] = {}
        self.pools: dict[tuple[str, str], PoolDoc] = {}  # InferencePools, by (ns, name)
        self.unknowns = [f"{d.node}: {u}" for d in docs for u in d.unknowns]
        # Sources an exporter is not set up to read: said apart from the unknowns (failures).
        self.not_configured = {
            d.node: [s.source for s in d.sources if source_state(s) == "not_configured"]
            for d in docs
        }
        self.simulated = sorted({d.node for d in docs if d.simulated})
        clusters: list[RayClusterDoc] = []
        for doc in docs:
            self._read(doc)
            if doc.ray.cluster is not None:
                clusters.append(doc.ray.cluster)
        # After every document: a namespace-less Ray cluster joins the workloads of its name.
        for cluster in clusters:
            self._ray_cluster(cluster)
        self.containers = [OnNode(doc.node, c) for doc in docs for c in doc.containers]
        self.processes = [OnNode(doc.node, p) for doc in docs for p in doc.processes]
        # vLLM Ray workers of every node, for engines on the Ray executor (explain/ray.py).
        self.ray_workers = RayWorkers(docs)
        self.unknowns += footprint_unknowns(self.ray_workers, docs)

    def _read(self, doc: LedgerDocument) -> None:
        for gpu in doc.gpus:
            self.gpus[gpu.uuid] = Device(gpu, gpu, doc.node)
            for mig in gpu.mig_devices:
                self.gpus[mig.uuid] = Device(mig, gpu, doc.node)
        for pod in doc.pods:
            self._workload(pod.namespace, pod.workload).pods.setdefault(
                pod.uid, dataclasses.replace(pod, node=pod.node or doc.node)
            )
        for pending in doc.pending:
            self._workload(pending.namespace, pending.workload).pending.append(pending)
        for engine in doc.engines:
            if engine.workload:
                self._workload(engine.namespace, engine.workload).engines.append(
                    OnNode(doc.node, engine)
                )
        for d in doc.discrepancies:
            if d.workload:
                self._workload(d.namespace, d.workload).discrepancies.append(d)
        for n in doc.ray.nodes:
            if n.workload:
                self._workload(n.namespace, n.workload).ray_nodes.append(n)
        for a in doc.ray.actors:
            if a.workload:
                self._workload(a.namespace, a.workload).ray_actors.append(a)
        for dep in doc.serve.deployments:
            if dep.workload:
                self._workload(dep.namespace, dep.workload).serve.append(OnNode(doc.node, dep))
        for pool in doc.gateway.pools:
            self.pools[(pool.namespace, pool.name)] = pool
            for name in sorted({m.workload for m in pool.members if m.workload}):
                self._workload(pool.namespace, name).pools.append(pool)

    def _ray_cluster(self, cluster: RayClusterDoc) -> None:
        """The Ray cluster's workload, with the Ray work Ray cannot place as its pending
        placement. A cluster-mode exporter that does not know the RayCluster's namespace
        stands for every namespace with a workload of that name, as the recording rule
        namespace_workload:gpuledger_workloads:group does."""
        name = cluster.workload
        targets = [(cluster.namespace, name)]
        if not cluster.namespace:
            targets = [k for k in self.workloads if k[1] == name and k[0]] or targets
        gpus = dict(sorted(cluster.pending_gpus.items()))
        reason = ray_pending_reason(cluster.placement_groups)
        for namespace, _ in targets:
            w = self._workload(namespace, name)
            w.pending.extend(
                PendingDoc(
                    namespace=namespace,
                    name=f"(Ray {kind.replace('_', ' ')}s)",
                    uid="-",
                    workload=name,
                    reason=reason,
                    gpus=count,  # Ray counts GPUs in fractions
                )
                for kind, count in gpus.items()
                if count
            )

    def _workload(self, namespace: str, name: str) -> Workload:
        key = (namespace, name)
        if key not in self.workloads:
            self.workloads[key] = Workload(namespace, name)
        return self.workloads[key]

    def workload_of_pod(self, namespace: str, name: str) -> Workload | None:
        for w in self.workloads.values():
            if any(p.namespace == namespace and p.name == name for p in w.pods.values()):
                return w
            if any(p.namespace == namespace and p.name == name for p in w.pending):
                return w
        return None

    def find_gpu(self, text: str) -> Device:
        if text in self.gpus:
            return self.gpus[text]
        matches = sorted(
            (u for u in self.gpus if u.startswith(text)),
            key=lambda u: (self.gpus[u].node, self.gpus[u].gpu.index, u),
        )
        if len(matches) == 1:
            return self.gpus[matches[0]]
        if not matches:
            raise ExplainError(EXIT_NOT_FOUND, f"no GPU matching {text!r} in the ledger")
        # An ambiguous prefix: the candidates, so the next try can be exact.
        listed = [
            f"  {u}  index {self.gpus[u].gpu.index} on {self.gpus[u].node}"
            for u in matches[:MAX_CANDIDATES]
        ]
        more = len(matches) - len(listed)
        raise ExplainError(
            EXIT_NOT_FOUND,
            printable(f"{len(matches)} GPUs match {text!r}; give more of the UUID:")
            + "".join(f"\n{printable(line)}" for line in listed)
            + (f"\n  … and {more} more" if more > 0 else ""),
        )

    def pod_names(self) -> list[str]:
        """NAMESPACE/NAME of every pod the documents name, placed or not."""
        placed = {
            f"{p.namespace}/{p.name}" for w in self.workloads.values() for p in w.pods.values()
        }
        pending = {f"{p.namespace}/{p.name}" for w in self.workloads.values() for p in w.pending}
        return sorted(placed | pending)


def _bytes(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def _gpu_label(fleet: Fleet, uuid: str) -> str:
    d = fleet.gpus.get(uuid)
    if d is None:
        return uuid
    return f"{_device_name(d)} (index {d.gpu.index} on {d.node}, {d.gpu.model})"


def _device_uuids(fleet: Fleet, gpu: Device) -> set[str]:
    """A GPU and its MIG devices (who holds one of them holds a part of the GPU)."""
    found = {gpu.uuid}
    found.update(u for u, d in fleet.gpus.items() if d.parent_uuid == gpu.uuid)
    return found


def _engine_issues(engines: Iterable[EngineEntry]) -> list[str]:
    issues = []
    for e in engines:
        configured, in_use = e.gpus_configured, e.gpus_in_use
        holders = "its processes hold"
        if e.ray_footprint is not None:  # the Ray executor: its workers, on every node
            in_use, holders = e.ray_footprint.gpus_in_use, "its Ray workers hold"
        if e.up and configured is not None and in_use is not None and configured != in_use:
            issues.append(
                f"parallelism mismatch: {engine_name(e)} engine {e.engine} is "
                f"configured for {configured} GPU(s) (TP x PP) but {holders} {in_use}"
            )
    return issues


def _ray_issues(w: Workload) -> list[str]:
    issues = []
    for n in w.ray_nodes:
        total, allocated = n.gpus_total, n.gpus_allocated
        if allocated is not None and total > allocated:
            issues.append(
                f"Ray over-commit: Ray node {n.ray_node_id[:12]} (pod {n.namespace}/"
                f"{n.pod}) advertises {total:g} GPUs, Kubernetes allocated {allocated}"
            )
    for a in w.ray_actors:
        if a.without_gpu_memory:
            issues.append(
                f"Ray actors holding no GPU memory: {a.without_gpu_memory} ALIVE "
                f"{a.class_name} actor(s) on pod {a.namespace}/{a.pod}"
            )
    return issues


def engine_name(e: EngineDoc) -> str:
    """`namespace/pod`, or for an engine in no pod its workload and target."""
    return f"{e.namespace}/{e.pod}" if e.pod_uid else f"{e.workload} at {e.target or e.url}"


def _engine_entry(fleet: Fleet, e: OnNode) -> EngineEntry:
    doc: EngineDoc = e.row
    indices = {u: d.gpu.index for u, d in fleet.gpus.items()}
    fp = footprint(fleet.ray_workers, doc, indices)
    mine = sorted({indices[g.gpu_uuid] for g in doc.gpus if g.gpu_uuid in indices})
    return EngineEntry(**vars(doc), node=e.node, ray_footprint=fp, gpu_indices=tuple(mine))


def _container_entry(fleet: Fleet, c: OnNode) -> ContainerEntry:
    doc: ContainerDoc = c.row
    devices = tuple(
        DeviceEntry(
            **vars(d),
            gpu_index=fleet.gpus[d.gpu_uuid].gpu.index if d.gpu_uuid in fleet.gpus else None,
            # `MIG-… (GPU-… instance 3, 1g.10gb)` for a MIG device.
            device=_device_name(fleet.gpus[d.gpu_uuid]) if d.gpu_uuid in fleet.gpus else d.gpu_uuid,
        )
        for d in doc.devices
    )
    return ContainerEntry(**{**vars(doc), "devices": devices}, node=c.node)


def _pod_entry(fleet: Fleet, pod: PodDoc, engines: Sequence[EngineEntry]) -> PodEntry:
    uid = pod.uid
    procs = tuple(
        ProcessEntry(**vars(p.row), node=p.node)
        for p in fleet.processes
        if p.row.container is not None and p.row.container.pod_uid == uid
    )
    return PodEntry(
        pod=pod,
        engines=tuple(e for e in engines if e.pod_uid == uid),
        processes=procs,
        containers=tuple(
            _container_entry(fleet, c) for c in fleet.containers if c.row.pod_uid == uid
        ),
    )


def explain_workload(fleet: Fleet, w: Workload, t: Thresholds) -> WorkloadResult:
    verdict = w.verdict(t)
    engines = [_engine_entry(fleet, e) for e in w.engines]
    pods = tuple(
        _pod_entry(fleet, pod, engines) for pod in sorted(w.pods.values(), key=lambda p: p.name)
    )
    issues = (
        [
            f"{d.kind.replace('_', ' ')}: {d.namespace}/{d.pod} container "
            f"{d.container} and GPU {_gpu_label(fleet, d.gpu_uuid)}"
            for d in w.discrepancies
        ]
        + _engine_issues(engines)
        + _ray_issues(w)
    )
    return WorkloadResult(
        namespace=w.namespace,
        workload=w.name,
        pods=pods,
        pending=tuple(w.pending),
        serve=tuple(ServeEntry(**vars(d.row), node=d.node) for d in w.serve),
        verdict=decode(VerdictShown, verdict.to_json()),
        discrepancies=tuple(issues),
        host_engines=tuple(e for e in engines if not e.pod_uid),
        pools=tuple(w.pools),
    )


MAX_CANDIDATES = 10


def candidates(text: str, names: Iterable[str]) -> list[str]:
    """NAMESPACE/NAMEs a query that matched nothing may have meant: the same name in any
    namespace (a query without its namespace), names that start with it, close spellings."""
    by_name: dict[str, list[str]] = {}
    for full in sorted(set(names)):
        by_name.setdefault(full.rpartition("/")[2], []).append(full)
    bare = text.rpartition("/")[2]
    same = by_name.get(bare, [])
    started = [
        f
        for n, fs in by_name.items()
        for f in fs
        if f.startswith(text) or (bare and n.startswith(bare))
    ]
    spelled = difflib.get_close_matches(bare, list(by_name), n=3, cutoff=0.75)
    close = [f for n in spelled for f in by_name[n]]
    return list(dict.fromkeys(same + started + close))[:MAX_CANDIDATES]


def did_you_mean(text: str, names: Iterable[str]) -> str:
    found = [printable(n) for n in candidates(text, names)]
    if not found:
        return ""
    listed = found[0] if len(found) == 1 else ", ".join(found[:-1]) + " or " + found[-1]
    return f"; did you mean {listed}?"


def select(
    fleet: Fleet,
    *,
    pod: str | None = None,
    gpu: str | None = None,
    workload: str | None = None,
    engine: str | None = None,
    pool: str | None = None,
) -> list[Workload]:
    if pool is not None:
        return _pool_workloads(fleet, find_pool(fleet, pool))
    if pod is not None:
        ns, _, name = pod.partition("/")
        found = fleet.workload_of_pod(ns, name) if name else None
        if found is None:
            raise ExplainError(
                EXIT_NOT_FOUND,
                f"pod {pod!r} is in no ledger read (expected NAMESPACE/NAME of a GPU pod)"
                + did_you_mean(pod, fleet.pod_names()),
            )
        return [found]
    if workload is not None:
        # NAME alone (or /NAME): a workload in no namespace, an engine's on a bare host.
        ns, _, name = workload.rpartition("/") if "/" in workload else ("", "", workload)
        if (ns, name) not in fleet.workloads:
            raise ExplainError(
                EXIT_NOT_FOUND,
                f"workload {workload!r} is in no ledger read (expected NAMESPACE/NAME)"
                + did_you_mean(workload, [f"{k[0]}/{k[1]}" for k in fleet.workloads]),
            )
        return [fleet.workloads[(ns, name)]]
    if gpu is not None:
        found_gpu = fleet.find_gpu(gpu)
        uuids = _device_uuids(fleet, found_gpu)
        holders = {
            (c.row.namespace, c.row.workload)
            for c in fleet.containers
            if any(x.gpu_uuid in uuids for x in (*c.row.allocations, *c.row.usage))
        }
        # Engines whose processes hold it: on a bare host, no container does.
        holders |= {
            (w.namespace, w.name)
            for w in fleet.workloads.values()
            for e in w.engine_docs()
            if any(g.gpu_uuid in uuids for g in e.gpus)
        }
        return [fleet.workloads[k] for k in sorted(holders) if k in fleet.workloads]
    if engine is not None:
        matched = [
            w for w in fleet.workloads.values() for e in w.engine_docs() if engine in engine_keys(e)
        ]
        if not matched:
            raise ExplainError(
                EXIT_NOT_FOUND,
                f"no engine matches {engine!r} (expected NAMESPACE/POD[:RANK], a model name "
                "with or without its organisation, a target HOST:PORT, or a bare host's "
                "WORKLOAD[:RANK])",
            )
        unique: dict[tuple[str, str], Workload] = {(w.namespace, w.name): w for w in matched}
        return list(unique.values())
    raise ExplainError(
        EXIT_USAGE, "say what to explain: --pod, --gpu, --workload, --engine or --pool"
    )


def find_pool(fleet: Fleet, text: str) -> PoolDoc:
    """An InferencePool by NAMESPACE/NAME, as the cluster view read it."""
    ns, _, name = text.partition("/")
    found = fleet.pools.get((ns, name))
    if found is None:
        known = [f"{k[0]}/{k[1]}" for k in sorted(fleet.pools)]
        where = "" if known else " (the cluster view reads them: --from its URL too)"
        raise ExplainError(
            EXIT_NOT_FOUND,
            f"InferencePool {text!r} is in no ledger read{where}" + did_you_mean(text, known),
        )
    return found


def _pool_workloads(fleet: Fleet, pool: PoolDoc) -> list[Workload]:
    """The workloads of a pool's member pods: the chain of each shows the pool's path."""
    names = sorted({m.workload for m in pool.members if m.workload})
    return [
        fleet.workloads[(pool.namespace, n)]
        for n in names
        if (pool.namespace, n) in fleet.workloads
    ]


def engine_keys(e: EngineDoc) -> set[str]:
    """What `--engine` finds an engine by: its model name, with or without the part
    before the slash (`meta-llama/Llama-3.1-8B-Instruct`, `Llama-3.1-8B-Instruct`), its
    target, and its pod (NAMESPACE/POD[:RANK]), or in no pod its workload[:RANK]."""
    keys = {e.model_name, e.model_name.rpartition("/")[2], e.target}
    where = f"{e.namespace}/{e.pod}" if e.pod_uid else e.workload
    keys |= {where, f"{where}:{e.engine}"}
    return keys - {""}


def explain(
    docs: Sequence[LedgerDocument], t: Thresholds | None = None, **query: str | None
) -> dict[str, Any]:
    """The JSON of `explain --json` (explain/result.py), which render_text reads."""
    fleet = Fleet(docs)
    chosen = select(fleet, **query)
    result: dict[str, Any] = to_json(
        ExplainResult(
            query={k: v for k, v in query.items() if v is not None},
            workloads=tuple(explain_workload(fleet, w, t or Thresholds()) for w in chosen),
            unknowns=tuple(fleet.unknowns),
            not_configured={n: tuple(s) for n, s in fleet.not_configured.items() if s},
            simulated=tuple(fleet.simulated),
        )
    )
    if query.get("gpu"):
        gpu = fleet.find_gpu(str(query["gpu"]))
        result["gpu"] = {
            **gpu.shown(),
            "node": gpu.node,
            "device": _device_name(gpu),
            "host_processes": [
                to_json(p)
                for uuid in sorted(_device_uuids(fleet, gpu))
                for p in host_processes(fleet, uuid, gpu.node)
            ],
        }
    if query.get("pool"):
        result["pool"] = to_json(find_pool(fleet, str(query["pool"])))
    return result


def host_processes(fleet: Fleet, uuid: str, node: str) -> list[HostProcess]:
    """Processes in no pod (a host daemon, a user's job) that hold memory on this GPU."""
    procs: list[ProcessDoc] = [p.row for p in fleet.processes if p.node == node]
    return [
        HostProcess(
            pid=p.pid,
            title=p.title,
            cuda_devices=p.cuda_devices,
            used_bytes=g.used_bytes,
            gpu_uuid=uuid,
        )
        for p in procs
        if p.container is None
        for g in p.gpu_memory
        if g.gpu_uuid == uuid
    ]


def verdicts(
    docs: Sequence[LedgerDocument], t: Thresholds | None = None
) -> dict[tuple[str, str], Verdict]:
    """The verdict of every workload the documents name, by (namespace, workload): what
    `explain` prints for each and what the /ledger page shows."""
    fleet = Fleet(docs)
    return {key: w.verdict(t or Thresholds()) for key, w in sorted(fleet.workloads.items())}


# How the text output names each stage: stages.json, the file the mixin renders from.
STAGE_TEXT = {s.stage: s.text for s in STAGES}


_UNPRINTABLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}


def printable(text: str) -> str:
    """Values from pods, engines and process titles, made safe for a terminal: a control
    character (an escape sequence, a newline forging a verdict line) is shown escaped."""
    return text.translate(_UNPRINTABLE)


def render_text(result: Mapping[str, Any]) -> str:
    """The text of explain's result (its JSON, read back typed)."""
    read = decode(ExplainResult, result)
    lines: list[str] = []
    if read.simulated:
        lines.append(
            f"SIMULATED: {', '.join(read.simulated)} served by gpuledger demo or simulate,"
            " not real hardware"
        )
    if result.get("gpu"):
        lines.extend(_gpu_lines(decode(GpuShown, result["gpu"]), bool(read.workloads)))
    if result.get("pool") and not read.workloads:
        # A pool selecting no pod of a known workload: its path stops at the picker.
        pool = decode(PoolDoc, result["pool"])
        lines.extend(gateway_lines([pool], []))
        if not pool.members_error:
            lines.append(
                "  it selects no pod" if not pool.members else "  its pods name no workload"
            )
    for w in read.workloads:
        lines.extend(_workload_lines(w))
    for unknown in read.unknowns:
        lines.append(f"unknown: {unknown}")
    for node, sources in read.not_configured.items():
        lines.append(f"not configured on {node} (not a failure): {', '.join(sources)}")
    return "\n".join(printable(line) for line in lines) + "\n"


def _gpu_lines(gpu: GpuShown, held: bool) -> list[str]:
    kind = "MIG device" if gpu.parent_uuid else "GPU"
    lines = [
        f"{kind} {gpu.device or gpu.uuid}  index {gpu.index} on node "
        f"{gpu.node}  {gpu.model}  "
        f"{_bytes(gpu.memory_used_bytes)} / {_bytes(gpu.memory_total_bytes)} used"
        + ("" if gpu.up else f"  DOWN ({gpu.error_reason})")
    ]
    lines.extend(_host_process_lines(gpu))
    if not held and not gpu.host_processes:
        lines.append("  no pod holds or uses this GPU")
    return lines


def workload_text(namespace: str, workload: str) -> str:
    """`namespace/workload`, or the workload alone in no namespace (a bare host's)."""
    return f"{namespace}/{workload}" if namespace else workload


def _workload_lines(w: WorkloadResult) -> list[str]:
    lines = [f"workload {workload_text(w.namespace, w.workload)}"]
    for p in w.pending:
        lines.append(
            f"  pod {p.namespace}/{p.name}  uid {p.uid}  NOT PLACED: "
            f"{p.reason}  ({p.gpus} GPU(s) requested)"
        )
        lines.extend(_claim_lines(p))
    lines.extend(gateway_lines(w.pools, w.pods))
    for entry in w.pods:
        lines.extend(_pod_lines(entry))
        note = ordinal_note(entry)
        # A difference is noted where it occurs; the general note once per output.
        if note is not None and (note[1] or ORDINAL_NOTE not in lines):
            lines.append(note[0])
    for e in w.host_engines:
        lines.extend(_host_engine_lines(e))
    lines.extend(_serve_lines(w.serve))
    v = w.verdict
    reason = f" — {v.reason}" if v.reason else ""
    lines.append(f"  verdict: {STAGE_TEXT.get(v.stage, v.stage)}{reason}")
    lines.extend(f"    evidence: {e}" for e in v.evidence)
    lines.append(f"    next step: {v.next_step}")
    if v.runbook_url:
        lines.append(f"    runbook: {runbook_text(v.runbook_url)}")
    if w.discrepancies:
        lines.extend(f"  ledger disagrees: {d}" for d in w.discrepancies)
    else:
        lines.append("  ledger: allocations, processes and engines agree")
    return lines


def runbook_text(url: str) -> str:
    """A verdict's runbook link as explain prints it. The document's link is relative to the
    agent (stages.json's runbookURLPattern): every agent serves the runbooks at /runbooks."""
    if "://" in url:
        return url
    return f"/{url.lstrip('/')} on any gpuledger agent (docs/runbooks.md)"


def _count(value: float | None) -> str:
    return "?" if value is None else f"{float(value):g}"


def _picker_text(pool: PoolDoc) -> str:
    """`picker Service pool-a-epp (FailOpen): 30 held by flow control, saturation 0.2, 3
    endpoint(s) ready`, or why it was not read."""
    where = f"picker Service {pool.picker_service} ({pool.failure_mode or '?'})"
    picker = pool.picker
    if pool.picker_service is None:
        return "no endpoint picker (no endpointPickerRef)"
    if picker is None:
        return f"{where}: not read"
    if not picker.up:
        return f"{where}: NOT READ at {picker.url} ({picker.error_reason})"
    held = (
        "flow control off (holds nothing)"
        if picker.queued_requests is None
        else f"{_count(picker.queued_requests)} held by flow control"
    )
    extra = f", saturation {picker.saturation:g}" if picker.saturation is not None else ""
    ready = _count(picker.ready_endpoints)
    return f"{where}: {held}{extra}, {ready} endpoint(s) ready"


def _endpoint_line(pool: PoolDoc, member: PoolMemberDoc, pods: Sequence[PodEntry]) -> str:
    """`endpoint 10.0.0.11:8000  pod llm/vllm-a-x  Ready  picker sees 1 queued  -> engine
    vllm llama DP 0 on node-1: 0 waiting, 4 running`."""
    ports = ",".join(str(p) for p in pool.target_ports) or "?"
    state = "Ready" if member.ready else "NOT READY"
    pod = f"{pool.namespace}/{member.name}"
    line = f"    endpoint {member.pod_ip or '?'}:{ports}  pod {pod}  {state}"
    queues = [
        q
        for name, q in (pool.picker.endpoint_queues if pool.picker else {}).items()
        if name.rsplit("-rank-", 1)[0] == member.name
    ]
    if queues:
        line += f"  picker sees {sum(queues):g} queued"
    entry = next((e for e in pods if e.pod.uid == member.uid), None)
    engines = entry.engines if entry is not None else ()
    if not engines:
        return line + "  -> no engine read on its node"
    return line + "".join(
        f"  -> engine {_kind(e)}{e.model_name or '?'} DP {e.engine or '?'} on {e.node}: "
        f"{e.requests_waiting or 0:g} waiting, {e.requests_running or 0:g} running"
        for e in engines
    )


def gateway_lines(pools: Sequence[PoolDoc], pods: Sequence[PodEntry]) -> list[str]:
    """The request path through the gateway: each pool of the workload, its picker, and
    its endpoints with the engine behind each (its workers and GPUs follow, under its pod)."""
    lines = []
    for pool in pools:
        lines.append(f"  gateway: InferencePool {pool.namespace}/{pool.name}  {_picker_text(pool)}")
        if pool.members_error:
            lines.append(f"    members unknown ({pool.members_error})")
        lines.extend(_endpoint_line(pool, m, pods) for m in pool.members)
    return lines


def _serve_lines(deployments: Iterable[ServeEntry]) -> list[str]:
    """`serve app/dep on node N  HEALTHY  router: 30 queued, 10 at replicas ...` and one
    line per replica there."""
    lines = []
    for d in deployments:
        lines.append(
            f"  serve {d.application}/{d.deployment} on {d.node}  {d.status}  "
            f"router: {_count(d.router_queued_requests)} queued, "
            f"{_count(d.router_requests_at_replicas)} at replicas  "
            f"max_ongoing_requests {d.max_ongoing_requests or '?'}"
        )
        for r in d.replicas:
            engines = ", ".join(f"{e.model_name or '?'} DP {e.engine}" for e in r.engines)
            lines.append(
                f"    replica {r.replica}  {r.state}  pod {r.namespace}/{r.pod or '-'}"
                f"  pid {r.pid or '?'} (host {r.host_pid or '?'})  "
                f"{_count(r.ongoing_requests)} ongoing" + (f"  engine {engines}" if engines else "")
            )
    return lines


def _kind(e: EngineEntry) -> str:
    """`sglang ` / `vllm `: the engine's kind before its model; none while unknown."""
    return f"{e.kind} " if e.kind else ""


def _engine_lines(e: EngineEntry) -> list[str]:
    c = e.config
    status = "up" if e.up else "NOT ANSWERING"
    lines = [
        f"    engine {_kind(e)}{e.model_name or '?'}  DP rank {e.engine or '?'}  {status}  "
        f"TP {c.get('tensor_parallel_size', '?')} x PP {c.get('pipeline_parallel_size', '?')}"
        f"  max_num_seqs {c.get('max_num_seqs') or '?'}  "
        f"KV blocks {c.get('num_gpu_blocks') or '?'} x {c.get('block_size') or '?'}"
    ]
    if e.process_binding in ("only_api_server", "ambiguous"):  # the old rule
        lines.append(f"      {_binding_text(e)}")
    if e.gpu_link is not None:
        pp = c.get("pipeline_parallel_size", "")
        what = f"TP {c.get('tensor_parallel_size', '?')}" + (
            f" x PP {pp}" if pp not in ("", "1") else ""
        )
        lines.append(f"      {link_text(what, e.gpu_indices, e.gpu_link)}")
    if e.up:
        lines.append(
            f"      queue: {e.requests_waiting or 0:g} waiting, {e.requests_running or 0:g} "
            f"running, KV cache {(e.kv_cache_usage_ratio or 0) * 100:.0f}%"
        )
    lines.extend(footprint_lines(e, e.ray_footprint))
    return lines


def _host_engine_lines(e: EngineEntry) -> list[str]:
    """An engine in no pod: where it runs, the engine, and its processes' GPUs."""
    server = f"API server pid {e.api_server_pid}" if e.api_server_pid else "API server unknown"
    lines = [f"  host {e.node}  target {e.target or e.url}  {server} (in no pod)"]
    lines.extend(_engine_lines(e))
    for g in e.gpus:
        lines.append(f"      {g.role.replace('_', ' ')} rank {g.rank} holds {g.gpu_uuid}")
    return lines


def _pod_lines(entry: PodEntry) -> list[str]:
    pod = entry.pod
    state = "Ready" if pod.ready else "not Ready"
    lines = [
        f"  pod {pod.namespace}/{pod.name}  uid {pod.uid}  node {pod.node}  "
        f"{pod.phase}, {state}  requests {pod.gpu_requests} GPU(s)"
    ]
    for e in entry.engines:
        lines.extend(_engine_lines(e))
    for c in entry.containers:
        lines.append(f"    container {c.container}  id {c.container_id[:12] or '?'}")
        for d in c.devices:
            lines.append(
                f"      ordinal {d.local_index} -> {d.device or d.gpu_uuid}  "
                "host index "
                f"{'?' if d.gpu_index is None else d.gpu_index} on {c.node}  "
                f"({d.source})"
            )
        for a in c.allocations:
            if a.claim is not None:
                k = a.claim
                lines.append(
                    f"      claim {k.namespace}/{k.name}: DRA device {k.driver}/"
                    f"{k.pool}/{k.device} -> {a.gpu_uuid}"
                )
        if not c.allocations and not c.devices:
            lines.append("      no GPU allocation known for this container")
    for p in entry.processes:
        held = ", ".join(
            f"{_cuda_name(p.cuda_devices, g.gpu_uuid)}{g.gpu_uuid} {_bytes(g.used_bytes)}"
            for g in p.gpu_memory
        )
        lines.append(f"    process {p.pid} {p.title or '?'}" + (f"  holds {held}" if held else ""))
    return lines


# What each claim reason says about the pod's claims (docs/explain.md).
_CLAIM_TEXT = {
    "claim_unallocatable": "no device of class {classes} fits on {nodes}",
    "device_class_missing": "device class {classes} does not exist",
    "claim_deleting": "the claim is being deleted",
    "claim_in_use": "reserved for {reserved} pod(s) already",
    "claim_allocating": "being allocated by the scheduler",
}


def _claim_lines(p: PendingDoc) -> list[str]:
    """One line per GPU claim of a pending pod, saying why it waits when a claim does."""
    text = _CLAIM_TEXT.get(p.reason or "")
    lines = []
    for c in p.claims:
        why = (text or "{gpus} GPU(s) of class {classes}").format(
            classes=", ".join(c.device_classes),
            nodes=f"{p.nodes} nodes" if p.nodes is not None else "any node",
            reserved=c.reserved_for,
            gpus=c.gpus,
        )
        lines.append(f"    claim {c.name}: {why}")
    return lines


_SOCKETS_UNKNOWN = {
    "unreadable": "their sockets could not be read (the agent needs SYS_PTRACE)",
    "timeout": "reading their sockets ran out of time",
    "not_read": "their sockets were not read",
}


def _binding_text(e: EngineDoc) -> str:
    """How an engine's processes were found when its sockets did not say (docs/explain.md,
    `process_binding`)."""
    own = f"processes {', '.join(str(p) for p in e.pids)}" if e.pids else "no processes"
    why = _SOCKETS_UNKNOWN.get(e.sockets or "", "none listens on its port")
    if e.process_binding == "only_api_server":
        return f"{own}: the only API server here ({why})"
    return (
        f"processes unknown: several API servers here and {why}, so its GPUs, flags "
        "and parallelism are not joined"
    )


def _cuda_name(devices: Sequence[str] | None, uuid: str) -> str:
    devices = devices or ()
    return f"cuda:{devices.index(uuid)} = " if uuid in devices else ""


def _host_process_lines(gpu: GpuShown) -> list[str]:
    lines = []
    for p in gpu.host_processes:
        uuid = p.gpu_uuid or gpu.uuid  # on the GPU, or on one of its MIG devices
        lines.append(
            f"  host process {p.pid} {p.title or '?'} (in no pod)  holds "
            f"{_cuda_name(p.cuda_devices, uuid)}{uuid} {_bytes(p.used_bytes)}"
        )
    unread = gpu.unattributed_memory_bytes
    if not lines and unread:
        # NVML counts it outside every pod, but procfs could not name the process.
        lines.append(f"  processes in no pod hold {_bytes(unread)} (not identified)")
    return lines


ORDINAL_NOTE = (
    "    note: ordinal N is the container's numbering of its GPUs, cuda:N a process's own "
    "after its CUDA_VISIBLE_DEVICES; the two can differ, the UUID names the GPU"
)


def ordinal_note(entry: PodEntry) -> tuple[str, bool] | None:
    """Where a pod shows both numberings, one line on how they relate (identity rule 4):
    naming a process whose cuda:N is not its container's ordinal N (True), else the general
    note (False); None where only one numbering appears."""
    ordinals = {
        (c.container, d.gpu_uuid): d.local_index for c in entry.containers for d in c.devices
    }
    both = False
    for p in entry.processes:
        container = p.container.container if p.container is not None else None
        for g in p.gpu_memory:
            ordinal = ordinals.get((container or "", g.gpu_uuid))
            devices = p.cuda_devices or ()
            if ordinal is None or g.gpu_uuid not in devices:
                continue
            both = True
            cuda = devices.index(g.gpu_uuid)
            if cuda != ordinal:
                return (
                    f"    note: process {p.pid} calls its container's ordinal {ordinal} "
                    f"cuda:{cuda}: its CUDA_VISIBLE_DEVICES renumbers the container's GPUs; "
                    "the UUID names the GPU",
                    True,
                )
    return (ORDINAL_NOTE, False) if both else None
