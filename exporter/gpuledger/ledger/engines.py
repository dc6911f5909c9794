"""Engines joined to their pods, processes and GPUs (identity rule 6). Pure.

An engine is known from two sides: its `/metrics` (model, DP rank, queues, KV cache) and
its process tree (API server -> the processes its kind retitles: an engine core per DP
rank, and its workers; gpuledger.engines). The two meet on the API server that listens
on the target's port (ledger/binding.py), else on the Pod UID (empty for a process on a
host without Kubernetes), and then on the DP rank.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuledger.engines import BY_NAME, EngineProcess, is_engine_title, parse_engine_title
from gpuledger.engines.kinds import ENGINE_CORE, PIPELINE_PARALLEL_SIZE, TENSOR_PARALLEL_SIZE
from gpuledger.identity.hostworkload import host_engine_workload
from gpuledger.identity.processes import ancestors
from gpuledger.identity.urls import safe_url
from gpuledger.ledger import caps
from gpuledger.ledger.binding import Binding, SocketsRead, TargetBinding, bind_target
from gpuledger.ledger.rayengines import EngineRay
from gpuledger.model import frozen_map
from gpuledger.model.engines import (
    NOT_AN_ENGINE,
    EngineMetrics,
    EngineScrape,
    EnginesSnapshot,
    EngineTarget,
)
from gpuledger.model.procfs import ProcessInfo, ProcessSockets
from gpuledger.model.serverinfo import ServerInfo


@dataclass(frozen=True)
class EngineGpu:
    gpu_uuid: str
    role: str
    rank: str  # worker rank in the engine (pp * tp_size + tp); "0" for EngineCore


@dataclass(frozen=True)
class Engine:
    """One (model_name, DP rank) served by one scrape target."""

    url: str  # without userinfo or query
    # The target's endpoint (host:port[/path], EngineTarget.endpoint): with model_name
    # and engine, what makes an engine's series unique on this node, pod known or not.
    target: str
    origin: str
    namespace: str
    pod: str
    pod_uid: str
    workload: str
    model_name: str
    engine: str
    up: bool
    metrics: EngineMetrics | None
    config: Mapping[str, str] = field(default_factory=frozen_map)
    gpus: tuple[EngineGpu, ...] = ()
    # tensor_parallel_size * pipeline_parallel_size, when the API server's flags are known.
    gpus_configured: int | None = None
    # Distinct GPUs the engine's processes hold, when its processes were found.
    gpus_in_use: int | None = None
    # Why the last scrape failed (refused, timeout, http_500, ...), when it did.
    error_reason: str | None = None
    error_message: str | None = None
    # How the target was tied to its API server (ledger/binding.py), that server's PID,
    # and how the candidates' sockets were read.
    process_binding: Binding = "none"
    api_server_pid: int | None = None
    sockets: SocketsRead | None = None
    # The engine's own processes: its API server, and the EngineCore and Workers of its
    # DP rank under that server.
    pids: tuple[int, ...] = ()
    # The Ray job its EngineCore drives (Ray executor), when linked (ledger/rayengines.py).
    ray: EngineRay | None = None
    # Its engine kind (gpuledger.engines): the scrape's, else the previous cycle's.
    kind: str = ""
    # The weakest link among its GPUs on this node (model.nvml.LINK_LEVELS,
    # ledger/topology.py); None with fewer than two.
    gpu_link: str | None = None


@dataclass(frozen=True)
class _Server:
    """One API server and the engine processes under it."""

    pid: int
    flags: Mapping[str, str]  # whitelisted, with its kind's defaults
    by_rank: Mapping[int, tuple[EngineProcess, ...]]


@dataclass(frozen=True)
class _ProcessGroup:
    api_servers: frozenset[int]
    # Of the only API server; empty with several.
    flags: Mapping[str, str]
    # DP rank -> every engine process of the pod (or host)
    by_rank: Mapping[int, tuple[EngineProcess, ...]]
    servers: Mapping[int, _Server] = field(default_factory=frozen_map)


def _api_server_of(pid: int, procs: Mapping[int, ProcessInfo]) -> int | None:
    """The nearest ancestor that is not an engine-retitled process: the API server."""
    info = procs.get(pid)
    if info is None:
        return None
    if not is_engine_title(info.title):
        return info.pid
    for parent in ancestors(info, procs):
        if not is_engine_title(parent.title):
            return parent.pid
    return None


def _engine_rank(proc: EngineProcess, pid: int, procs: Mapping[int, ProcessInfo]) -> int:
    """DP rank of a process: its own title, else its EngineCore ancestor's, else 0."""
    if proc.dp_rank is not None:
        return proc.dp_rank
    info = procs.get(pid)
    for parent in ancestors(info, procs) if info is not None else ():
        found = parse_engine_title(parent.title)
        if found is not None and found.dp_rank is not None:
            return found.dp_rank
    return 0


def _ranked(items: Sequence[tuple[EngineProcess, int]]) -> Mapping[int, tuple[EngineProcess, ...]]:
    by_rank: dict[int, list[EngineProcess]] = defaultdict(list)
    for proc, rank in items:
        by_rank[rank].append(proc)
    return frozen_map({r: tuple(sorted(p, key=lambda x: x.pid)) for r, p in by_rank.items()})


def _server_flags(
    info: ProcessInfo, mine: Sequence[tuple[EngineProcess, int]]
) -> Mapping[str, str]:
    """The API server's whitelisted flags over the defaults of its processes' kind; of
    the flags every kind whitelists, only its kind's (an SGLang server's --port is not
    read for vLLM)."""
    kind = BY_NAME.get(mine[0][0].kind) if mine else None
    if kind is None:
        return frozen_map(info.flags)
    own = set(kind.flags.values())
    return frozen_map({**kind.flag_defaults, **{k: v for k, v in info.flags.items() if k in own}})


def group_engine_processes(procs: Mapping[int, ProcessInfo]) -> dict[str, _ProcessGroup]:
    """Engine process trees by Pod UID ("" = host processes), and by API server in each."""
    members: dict[str, list[tuple[EngineProcess, int]]] = defaultdict(list)
    under: dict[str, dict[int, list[tuple[EngineProcess, int]]]] = defaultdict(dict)
    for pid, info in procs.items():
        parsed = parse_engine_title(info.title, pid)
        if parsed is None:
            continue
        pod_uid = info.cgroup.pod_uid or ""
        item = (parsed, _engine_rank(parsed, pid, procs))
        members[pod_uid].append(item)
        server = _api_server_of(pid, procs)
        if server is not None:
            under[pod_uid].setdefault(server, []).append(item)
    groups: dict[str, _ProcessGroup] = {}
    for pod_uid, items in members.items():
        servers = {
            pid: _Server(pid, _server_flags(procs[pid], mine), _ranked(mine))
            for pid, mine in under[pod_uid].items()
        }
        only = next(iter(servers.values())) if len(servers) == 1 else None
        groups[pod_uid] = _ProcessGroup(
            api_servers=frozenset(servers),
            flags=only.flags if only is not None else frozen_map(),
            by_rank=_ranked(items),
            servers=frozen_map(servers),
        )
    return groups


def _worker_rank(proc: EngineProcess, tp_size: int) -> str:
    if proc.role == ENGINE_CORE:
        return "0"
    return str((proc.pp_rank or 0) * tp_size + (proc.tp_rank or 0))


def _engine_gpus(
    server: _Server | None, rank: int, gpu_by_pid: Mapping[int, Sequence[str]]
) -> tuple[EngineGpu, ...]:
    # No server: two API servers in one pod (or on one host) that their sockets did not
    # tell apart. Better no join than a wrong one.
    if server is None:
        return ()
    try:
        tp_size = int(server.flags.get(TENSOR_PARALLEL_SIZE, "1") or 1)
    except ValueError:
        tp_size = 1
    found = {
        EngineGpu(uuid, proc.role, _worker_rank(proc, tp_size))
        for proc in server.by_rank.get(rank, ())
        for uuid in gpu_by_pid.get(proc.pid, ())
    }
    return tuple(sorted(found, key=lambda g: (g.role, int(g.rank), g.gpu_uuid)))


def _configured_gpus(config: Mapping[str, str]) -> int | None:
    try:
        tp = int(config.get(TENSOR_PARALLEL_SIZE, "1"))
        pp = int(config.get(PIPELINE_PARALLEL_SIZE, "1"))
    except ValueError:
        return None  # a flag we cannot read as a number: unknown, not a guess
    return tp * pp


def _config(
    server: _Server | None, metrics: EngineMetrics | None, info: ServerInfo | None
) -> Mapping[str, str]:
    """The API server's flags, then what the engine says it resolved them to (its
    server info: the bound its schedulers really use wins over the flag that asked for
    it), then its cache config series."""
    config: dict[str, str] = {}
    if server is not None:
        config.update(server.flags)
    if info is not None:
        config.update(info.config)
        if info.effective_max_num_seqs is not None:
            config["max_num_seqs"] = info.effective_max_num_seqs
    if metrics is not None:
        config.update(metrics.cache_config)
    return frozen_map(config)


def known_engine_ids(engines: Sequence[Engine]) -> Mapping[str, Sequence[tuple[str, str]]]:
    """Target URL -> the (model_name, engine) pairs it served, from a previous ledger.
    A target that never answered has none: it stays one engine with empty names."""
    known: dict[str, list[tuple[str, str]]] = {}
    for engine in engines:
        if engine.model_name or engine.engine:
            known.setdefault(engine.url, []).append((engine.model_name, engine.engine))
    return known


def known_kinds(engines: Sequence[Engine]) -> Mapping[str, str]:
    """Target URL -> its engine kind, from a previous ledger, where it was known."""
    return {e.url: e.kind for e in engines if e.kind}


def known_workloads(engines: Sequence[Engine]) -> Mapping[str, str]:
    """Target URL -> the workload of its engine in no pod, from a previous ledger."""
    return {e.url: e.workload for e in engines if not e.pod_uid and e.workload}


@dataclass(frozen=True)
class Known:
    """What the previous ledger knew of each target URL (known_engine_ids, known_kinds,
    known_workloads), and this node's name (a loopback target's workload names it)."""

    ids: Mapping[str, Sequence[tuple[str, str]]] = field(default_factory=frozen_map)
    kinds: Mapping[str, str] = field(default_factory=frozen_map)
    workloads: Mapping[str, str] = field(default_factory=frozen_map)
    node: str = ""


def build_engines(
    snapshot: EnginesSnapshot | None,
    procs: Mapping[int, ProcessInfo],
    gpu_by_pid: Mapping[int, Sequence[str]],
    known: Mapping[str, Sequence[tuple[str, str]]],
    sockets: Mapping[int, ProcessSockets] | None = None,
    *,
    known_kinds: Mapping[str, str] | None = None,
    known_workloads: Mapping[str, str] | None = None,
    node: str = "",
) -> tuple[Engine, ...]:
    """Engines from this cycle's scrapes.

    `known` maps a target URL to the (model_name, engine) pairs it served before, so a
    target that stops answering keeps its series with up=0 instead of vanishing.
    `sockets` are the API servers' listening sockets (ProcSnapshot.sockets);
    `known_kinds` each target URL's engine kind before (known_kinds()), and
    `known_workloads` the workload of each engine in no pod before (known_workloads()).
    `node` names a loopback target's workload (identity/hostworkload.py).
    """
    if snapshot is None:
        return ()
    groups = group_engine_processes(procs)
    before = Known(known, known_kinds or {}, known_workloads or {}, node)
    engines: list[Engine] = []
    for scrape in snapshot.scrapes:
        if not scrape.up and scrape.error_reason == NOT_AN_ENGINE:
            continue  # only a candidate (prometheus.io annotation), not an engine
        kind = scrape.kind or before.kinds.get(safe_url(scrape.target.url), "")
        engines.extend(
            _engines_of(
                scrape, groups, gpu_by_pid, before, procs=procs, sockets=sockets or {}, kind=kind
            )
        )
    return tuple(engines)


def identity(engine: Engine) -> tuple[str, ...]:
    """The engine's label values (collector.ENGINE_LABELS order)."""
    return (
        engine.namespace,
        engine.pod,
        engine.pod_uid,
        engine.workload,
        engine.model_name,
        engine.engine,
        engine.target,
    )


def cap_engines(
    engines: Sequence[Engine],
) -> tuple[tuple[Engine, ...], tuple[Engine, ...], tuple[Engine, ...]]:
    """At most MAX_ENGINES engines with distinct label values, and at most MAX_GPU_ROWS
    GPU rows over all of them (ledger/caps.py). Also what was left out: repeated or
    surplus engines, and kept engines carrying only their surplus GPU rows."""
    seen: set[tuple[str, ...]] = set()
    unique: list[Engine] = []
    repeated: list[Engine] = []
    for e in engines:
        key = identity(e)
        (repeated if key in seen else unique).append(e)
        seen.add(key)
    kept, surplus = caps.split(unique, caps.MAX_ENGINES)
    trimmed: list[Engine] = []
    gpu_rows: list[Engine] = []
    budget = caps.MAX_GPU_ROWS
    for e in kept:
        if len(e.gpus) > budget:
            gpu_rows.append(replace(e, gpus=e.gpus[budget:]))
        trimmed.append(replace(e, gpus=e.gpus[:budget]) if len(e.gpus) > budget else e)
        budget -= len(trimmed[-1].gpus)
    return tuple(trimmed), (*repeated, *surplus), tuple(gpu_rows)


def _workload(
    target: EngineTarget,
    bound: TargetBinding,
    procs: Mapping[int, ProcessInfo],
    before: Known,
) -> str:
    """The pod's workload; for an engine in no pod, its API server's systemd unit, else
    the workload it had, else its target (identity rule 7, identity/hostworkload.py)."""
    if target.pod_uid:
        return target.workload
    info = procs.get(bound.api_server) if bound.api_server is not None else None
    return host_engine_workload(
        info.cgroup.unit if info is not None else None,
        before.workloads.get(safe_url(target.url)),
        target.endpoint,
        before.node,
        by_socket=bound.binding == "socket",
    )


def _engines_of(
    scrape: EngineScrape,
    groups: Mapping[str, _ProcessGroup],
    gpu_by_pid: Mapping[int, Sequence[str]],
    before: Known,
    *,
    procs: Mapping[int, ProcessInfo],
    sockets: Mapping[int, ProcessSockets],
    kind: str,
) -> list[Engine]:
    target = scrape.target
    url = safe_url(target.url)
    group = groups.get(target.pod_uid)
    bound = bind_target(target.endpoint, group.api_servers if group else (), sockets)
    server = group.servers.get(bound.api_server or 0) if group is not None else None
    workload = _workload(target, bound, procs, before)

    def engine(model: str, rank: str, metrics: EngineMetrics | None) -> Engine:
        rank_int = int(rank) if rank.isdigit() else 0
        joined = server is not None
        gpus = _engine_gpus(server, rank_int, gpu_by_pid)
        own = server.by_rank.get(rank_int, ()) if server is not None else ()
        config = _config(server, metrics, scrape.server_info)
        return Engine(
            url=url,
            target=target.endpoint,
            origin=target.origin,
            namespace=target.namespace,
            pod=target.pod,
            pod_uid=target.pod_uid,
            workload=workload,
            model_name=model,
            engine=rank,
            up=scrape.up,
            metrics=metrics,
            config=config,
            gpus=gpus,
            gpus_configured=_configured_gpus(config) if joined else None,
            gpus_in_use=len({g.gpu_uuid for g in gpus}) if joined else None,
            error_reason=scrape.error_reason,
            error_message=scrape.error_message,
            process_binding=bound.binding,
            api_server_pid=bound.api_server,
            sockets=bound.sockets,
            pids=(server.pid, *(p.pid for p in own)) if server is not None else (),
            kind=kind,
        )

    if scrape.up:
        return [engine(m.model_name, m.engine, m) for m in scrape.engines]
    previous = before.ids.get(url) or [("", "")]
    return [engine(model, rank, None) for model, rank in previous]
