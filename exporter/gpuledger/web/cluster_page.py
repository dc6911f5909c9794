"""The cluster view's /ledger page: every workload's stage across the cluster.

The cluster view knows only what is not placed (pending pods, Ray's placement groups); where
a placed workload waits is in the node agents' documents. So the page reads every node
agent's /ledger.json (through `explain/agents.py`: concurrency-limited, each read under the
HttpClient's one deadline), keeps each read for a few seconds, and joins them with its own
document through explain's `Fleet` and `verdicts`: the same function, on the same
documents, that `gpuledger explain --from …` uses. `/ledger?workload=NS/NAME` shows that
workload's chain across its nodes.

An agent that cannot be read is named on the page, never a reason to fail it; every value
is escaped (pod, label, model and node names are anyone's to choose). Agents behind
`--web-config-file` are read as `--agent-tls`, `--agent-ca-file`, `--agent-server-name`
and `--agent-auth-file` say (agents.AgentAccess), the files re-read on each refresh.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from gpuledger.document.v1 import EngineDoc, LedgerDocument, PoolDoc, ProcessDoc, SourceDoc
from gpuledger.explain import agents
from gpuledger.explain.agents import (
    SERVICE_ACCOUNT_DIR,
    Agent,
    AgentAccess,
    ClusterError,
    FetchResult,
    fetch_documents,
    find_agents,
)
from gpuledger.explain.chain import (
    STAGE_TEXT,
    Fleet,
    Workload,
    explain_workload,
    gateway_lines,
    source_state,
    verdicts,
)
from gpuledger.explain.result import ContainerEntry, WorkloadResult
from gpuledger.explain.verdict import STAGE, Thresholds, Verdict
from gpuledger.web.node_page import STYLE, simulated_banner

log = logging.getLogger(__name__)

# A read is reused this long: a page reloaded, or a workload opened from the list, costs
# the agents nothing, and what the page shows is at most this much older than a read.
CACHE_SECONDS = 10.0
CONCURRENCY = 16  # agents read at once, per page load
MAX_AGENTS = 2000  # agents read (and documents held) at most: the cache's bound

# The cluster page's additions to the node page's style.
CLUSTER_STYLE = """
a{color:#175cd3} .chain td{font-size:13px} ul{margin:.2em 0 .6em}
.node{white-space:nowrap} .eng{min-width:9em}
"""


@dataclass(frozen=True)
class AgentRead:
    """One node agent as the page last read it: its document, or why it could not be."""

    node: str | None  # the node it runs on, when known before reading it
    pod: str  # NAMESPACE/NAME of a discovered agent; "" for an --agent-url
    url: str  # where it is read (scheme, host, port: no credentials)
    document: LedgerDocument | None
    error: str | None  # one safe line; None when `document` is set
    read_at: float  # wall clock of the read (a reused read is older than the page)

    @property
    def name(self) -> str:
        if self.document is not None:
            return self.document.node or self.node or self.url
        return self.node or self.url


@dataclass(frozen=True)
class Reading:
    """What one page load knows of the agents, and what kept it from knowing more."""

    reads: Sequence[AgentRead]
    problems: Sequence[str] = ()


Fetch = Callable[[Sequence[Agent]], FetchResult]
Find = Callable[[], tuple[list[Agent], list[str]]]


def static_agents(urls: Iterable[str]) -> list[Agent]:
    """Agents given by address (--agent-url): base URLs, or their /ledger.json. Their node
    is known once read; until then the URL stands for it (and is the cache key)."""
    bases = [u.strip().rstrip("/").removesuffix("/ledger.json") for u in urls]
    return [Agent(node=b, namespace="", pod="", url=b, role="node") for b in dict.fromkeys(bases)]


class AgentReader:
    """The node agents' documents for the page: found, read `concurrency` at a time within
    one deadline (agents.fetch_documents), each read, document or failure, reused for
    `ttl_seconds`. One refresh at a time: a burst of page loads reads each agent once, and
    a load never waits longer than one refresh (the deadline, plus finding the agents)."""

    def __init__(
        self,
        find: Find,
        *,
        deadline_seconds: float,
        ttl_seconds: float = CACHE_SECONDS,
        concurrency: int = CONCURRENCY,
        max_agents: int = MAX_AGENTS,
        fetch: Fetch | None = None,
        clock: Callable[[], float] = time.monotonic,
        access: AgentAccess | None = None,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self._find = find
        self._max_agents = max_agents
        self._clock = clock
        self._fetch: Fetch = fetch or (
            lambda agents: fetch_documents(
                agents,
                deadline_seconds=deadline_seconds,
                concurrency=concurrency,
                access=access or AgentAccess(),
            )
        )
        self._found: tuple[float, list[Agent], list[str]] | None = None
        self._cache: OrderedDict[str, tuple[float, AgentRead]] = OrderedDict()
        self._lock = threading.Lock()

    def read(self) -> Reading:
        with self._lock:
            agents, problems = self._agents()
            now = self._clock()
            stale = [
                a
                for a in agents
                if now - self._cache.get(a.key, (-1e18, None))[0] >= self.ttl_seconds
            ]
            if stale:
                self._store(stale, self._fetch(stale), now)
            wanted = {a.key for a in agents}
            for key in [k for k in self._cache if k not in wanted]:
                del self._cache[key]  # gone from the cluster: bound by the agents found
            return Reading([self._cache[a.key][1] for a in agents], problems)

    def _agents(self) -> tuple[list[Agent], list[str]]:
        now = self._clock()
        if self._found is None or now - self._found[0] >= self.ttl_seconds:
            agents, problems = self._find()
            if len(agents) > self._max_agents:
                problems = [
                    *problems,
                    f"{len(agents)} node agents found; the page reads the first "
                    f"{self._max_agents} by node name",
                ]
                agents = sorted(agents, key=lambda a: a.key)[: self._max_agents]
            self._found = (now, agents, problems)
        return self._found[1], self._found[2]

    def _store(self, agents: Sequence[Agent], result: FetchResult, now: float) -> None:
        wall = time.time()
        for a in agents:
            error = result.failures.get(a.key)
            if a.key not in result.documents and error is None:
                error = "not read"  # fetch_documents answers for every agent; never shown
            elif error is not None:
                # fetch_documents starts each line with the pod; the page has a column for it.
                error = error.removeprefix(f"{a.namespace}/{a.pod}: ")
            read = AgentRead(
                node=None if not a.pod else a.node,
                pod=f"{a.namespace}/{a.pod}" if a.pod else "",
                url=a.url,
                document=result.documents.get(a.key),
                error=error,
                read_at=wall,
            )
            self._cache[a.key] = (now, read)
            self._cache.move_to_end(a.key)


class Discovery:
    """The agents the page reads: the --agent-url ones, and, with the Kubernetes API, the
    node agents listed by the chart's labels (agents.find_agents) and read by pod IP. When
    the API cannot be reached, the agents it listed last are read, and the page says so.
    `scheme` is what the listed agents serve; the --agent-url ones keep their own."""

    def __init__(
        self,
        urls: Sequence[str],
        connect: Callable[[], Any] | None = None,
        namespace: str | None = None,
        scheme: str = "http",
    ) -> None:
        self._static = static_agents(urls)
        self._connect = connect
        self._namespace = namespace
        self._scheme = scheme
        self._lister: Any = None
        self._listed: list[Agent] = []

    def __call__(self) -> tuple[list[Agent], list[str]]:
        if self._connect is None:
            return list(self._static), []
        problems = []
        try:
            if self._lister is None:
                self._lister = self._connect()
            found = find_agents(
                self._lister,
                namespace=self._namespace,
                nodes=None,
                via="direct",
                scheme=self._scheme,
            )
            self._listed = [a for a in found if a.role == "node"]
        except ClusterError as exc:
            log.warning("cluster page: cannot list the node agents: %s", exc)
            problems.append(f"node agents not listed: {exc}")
        return [*self._static, *self._listed], problems


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _when(ts: object) -> str:
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _lines(values: Iterable[object]) -> str:
    return "<br>".join(_e(v) for v in values)


def _workload_link(namespace: str, name: str) -> str:
    target = "ledger?workload=" + quote(f"{namespace}/{name}", safe="")
    return f'<a href="{_e(target)}">{_e(namespace)}/{_e(name)}</a>'


def _next_step(text: str, runbook_url: str | None) -> str:
    link = f' <a class=runbook href="{_e(runbook_url)}">runbook</a>' if runbook_url else ""
    return f"{_e(text)}{link}"


def _stage(v: Verdict) -> str:
    reason = f" ({_e(v.reason)})" if v.reason else ""
    return f"{_e(v.stage)}{reason}"


def documents(own: LedgerDocument, reads: Sequence[AgentRead]) -> list[LedgerDocument]:
    """The cluster view's document, then each node's once (an agent reached by two
    addresses would count its engines twice)."""
    docs, seen = [own], {own.node}
    for read in reads:
        if read.document is not None and read.document.node not in seen:
            seen.add(read.document.node)
            docs.append(read.document)
    return docs


def _engines_summary(engines: Sequence[EngineDoc]) -> str:
    """Engines up, the requests they hold, the fullest KV cache: one cell, so the table
    keeps to the width of a screen."""
    if not engines:
        return "<span class=muted>none</span>"
    up = [e for e in engines if e.up]
    waiting = sum(e.requests_waiting or 0 for e in up)
    running = sum(e.requests_running or 0 for e in up)
    kv = [e.kv_cache_usage_ratio for e in up if e.kv_cache_usage_ratio is not None]
    fullest = f"<br>max KV {max(kv) * 100:.0f}%" if kv else ""
    return f"{len(up)}/{len(engines)} up<br>{waiting:g} waiting, {running:g} running{fullest}"


def _workload_row(w: Workload, v: Verdict) -> str:
    nodes = sorted({p.node or "?" for p in w.pods.values()})
    pods = sorted(p.name for p in w.pods.values()) + [p.name for p in w.pending]
    return (
        "<tr>"
        f"<td>{_workload_link(w.namespace, w.name)}</td>"
        f"<td class=node>{_lines(nodes) or '<span class=muted>not placed</span>'}</td>"
        f"<td>{_lines(pods)}</td>"
        f"<td class=stage>{_stage(v)}</td>"
        f"<td class=eng>{_engines_summary(w.engine_docs())}</td>"
        f"<td>{_lines(v.evidence)}</td>"
        f"<td class=next>{_next_step(v.next_step.text, v.next_step.runbook_url)}</td>"
        "</tr>"
    )


def _workload_rows(fleet: Fleet, judged: Mapping[tuple[str, str], Verdict]) -> list[str]:
    # Strongest stage first: what waits longest for someone to act is at the top.
    order = {s: i for i, s in enumerate(STAGE)}
    keys = sorted(judged, key=lambda k: (order.get(judged[k].stage, len(order)), k))
    return [_workload_row(fleet.workloads[k], judged[k]) for k in keys]


def _pending_rows(docs: Sequence[LedgerDocument]) -> list[str]:
    rows = []
    for doc in docs:
        for p in doc.pending:
            rows.append(
                "<tr>"
                f"<td>{_e(p.namespace)}/{_e(p.name)}</td>"
                f"<td>{_workload_link(p.namespace, p.workload)}</td>"
                f"<td class=bad>{_e(p.reason or 'other')}</td>"
                f"<td>{_e(p.gpus)}</td><td>{_when(p.since)}</td>"
                "</tr>"
            )
    return rows


def _ray_rows(docs: Sequence[LedgerDocument]) -> list[str]:
    rows = []
    for doc in docs:
        cluster = doc.ray.cluster
        if cluster is None:
            continue
        groups = [
            f"{g.count} {g.state}" + (f" ({g.scheduling_state})" if g.scheduling_state else "")
            for g in cluster.placement_groups
        ]
        waiting = [
            f"{kind.replace('_', ' ')}s: {count:g}"
            for kind, count in sorted(cluster.pending_gpus.items())
        ]
        rows.append(
            "<tr>"
            f"<td>{_workload_link(cluster.namespace, cluster.workload)}</td>"
            f"<td>{_e(doc.node)}</td>"
            f"<td>{_lines(groups) or '<span class=muted>none</span>'}</td>"
            f"<td>{_lines(waiting)}</td>"
            "</tr>"
        )
    return rows


def _agent_row(read: AgentRead, now: float) -> str:
    doc = read.document
    if doc is None:
        state = f'<span class="bad">not read: {_e(read.error)}</span>'
        snapshot = gpus = pods = ""
    else:
        state = '<span class="ok">read</span>'
        snapshot = _when(doc.taken_at)
        gpus, pods = str(len(doc.gpus)), str(len(doc.pods))
    return (
        "<tr>"
        f"<td>{_e(read.name)}</td><td>{_e(read.pod)}</td><td><code>{_e(read.url)}</code></td>"
        f"<td>{state}</td>"
        f"<td>{snapshot}</td><td>{gpus}</td><td>{pods}</td>"
        f"<td>{max(0.0, now - read.read_at):.0f} s ago</td>"
        "</tr>"
    )


def _unread_note(reading: Reading) -> str:
    unread = [r for r in reading.reads if r.document is None]
    problems = "".join(f"<p class=bad>{_e(p)}</p>" for p in reading.problems)
    if not unread:
        return problems
    items = "".join(
        f"<li>{_e(r.name)}{'' if r.name == r.url else f' ({_e(r.url)})'}: {_e(r.error)}</li>"
        for r in unread
    )
    return (
        f"{problems}<p class=bad>Node agents not read: workloads with pods on these nodes "
        f'may be missing or judged without them.</p><ul id="unread">{items}</ul>'
    )


def _source(status: SourceDoc) -> str:
    # As on the node page: up green, down red with its reason, not configured grey.
    state = source_state(status)
    name = _e(status.source)
    if state == "up":
        return f'<span class="ok">{name}</span>'
    if state == "not_configured":
        return f'<span class="muted">{name} (not configured)</span>'
    return f'<span class="bad">{name} (down: {_e(status.reason)})</span>'


def _header(own: LedgerDocument, reading: Reading, ttl: float) -> str:
    reads = reading.reads
    sources = " ".join(_source(s) for s in own.sources)
    read = sum(r.document is not None for r in reads)
    agents = (
        f"Node agents: {read} of {len(reads)} read (each read is reused for {ttl:g} s)."
        if reads
        else "<span class=bad>No node agents found</span>: give --agent-url, or run in the "
        "cluster with the chart so the agents are found by their labels."
    )
    return (
        f"<p class=muted>cluster view {_e(own.node)}, snapshot "
        f"{_e(_when(own.taken_at))}, gpuledger {_e(own.version)}. "
        f'Sources: {sources}. <a href="ledger.json">ledger.json</a> · '
        f'<a href="metrics">metrics</a></p><p>{agents}</p>{_unread_note(reading)}'
    )


def _page(title: str, body: str, docs: Sequence[LedgerDocument]) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>{STYLE}{CLUSTER_STYLE}</style></head><body>
{simulated_banner(d.node for d in docs if d.simulated)}
{body}
</body></html>
"""


def not_placed_tables(docs: Sequence[LedgerDocument]) -> str:
    """The pods and the Ray work not placed, as every cluster page shows them (from the
    cluster view's own document, Prometheus or not)."""
    return (
        "<h2>Pods not placed</h2>"
        + _table(
            "pending",
            ["pod", "workload", "reason", "GPUs", "waiting since"],
            _pending_rows(docs),
            "every GPU pod is placed",
        )
        + "<h2>Ray work not placed</h2>"
        + _table(
            "ray",
            ["workload", "seen by", "placement groups", "GPUs waiting"],
            _ray_rows(docs),
            "no Ray cluster configured",
        )
    )


# A workload's engines as the recording rules count them: (engines, waiting, running).
RecordedQueues = Mapping[tuple[str, str], tuple[int, float, float]]


def _pool_row(
    pool: PoolDoc, engines: Mapping[str, list[EngineDoc]], recorded: RecordedQueues
) -> str:
    """One InferencePool: its picker's queue beside its engines' queues (the engines of
    its member pods that the documents read hold, by Pod UID; without them, as the
    recording rules count its workloads' engines)."""
    picker = pool.picker
    if pool.picker_service is None:
        held = "<span class=muted>no picker</span>"
    elif picker is None or not picker.up:
        reason = picker.error_reason if picker is not None else "not read"
        held = f'<span class="bad">picker not read ({_e(reason)})</span>'
    elif picker.queued_requests is None:
        held = "<span class=muted>flow control off</span>"
    else:
        sat = "" if picker.saturation is None else f", saturation {picker.saturation:g}"
        held = f"{picker.queued_requests:g}{_e(sat)}"
    ready = sum(1 for m in pool.members if m.ready)
    members = f"{ready} of {len(pool.members)} Ready"
    if ready == 0:
        members = f'<span class="bad">{members}: no ready endpoint</span>'
    mine = [e for m in pool.members for e in engines.get(m.uid, [])]
    workloads = sorted({m.workload for m in pool.members if m.workload})
    counted = [recorded[(pool.namespace, w)] for w in workloads if (pool.namespace, w) in recorded]
    if mine:
        queues = (
            f"{len(mine)} engine(s): {sum(e.requests_waiting or 0 for e in mine):g} waiting, "
            f"{sum(e.requests_running or 0 for e in mine):g} running"
        )
    elif counted:
        queues = (
            f"{sum(c[0] for c in counted)} engine(s) of its workloads: "
            f"{sum(c[1] for c in counted):g} waiting, {sum(c[2] for c in counted):g} running"
        )
    else:
        queues = "<span class=muted>no engine read</span>"
    links = "<br>".join(_workload_link(pool.namespace, w) for w in workloads)
    return (
        f"<tr><td>{_e(pool.namespace)}/{_e(pool.name)}</td>"
        f"<td>{_e(pool.picker_service or '-')}</td><td>{held}</td>"
        f"<td>{members}</td><td>{queues}</td><td>{links}</td></tr>"
    )


def gateway_table(docs: Sequence[LedgerDocument], recorded: RecordedQueues | None = None) -> str:
    """InferencePools (the cluster view's), each with its picker's queue and its engines'
    (from the node agents' documents, else `recorded`: the fleet page's, from Prometheus)."""
    pools = [p for d in docs for p in d.gateway.pools]
    if not pools:
        return ""
    engines: dict[str, list[EngineDoc]] = {}
    for d in docs:
        for e in d.engines:
            if e.pod_uid:
                engines.setdefault(e.pod_uid, []).append(e)
    return "<h2>Gateway: InferencePools</h2>" + _table(
        "pools",
        ["pool", "picker", "held by the picker", "members", "engines' queues", "workloads"],
        [_pool_row(p, engines, recorded or {}) for p in pools],
        "no InferencePools",
    )


def _table(table_id: str, headings: Sequence[str], rows: Sequence[str], empty: str) -> str:
    head = "".join(f"<th>{h}</th>" for h in headings)
    body = "".join(rows) or f"<tr><td colspan={len(headings)} class=muted>{empty}</td></tr>"
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def render_overview(own: LedgerDocument, reading: Reading, ttl: float, now: float) -> str:
    reads = reading.reads
    docs = documents(own, reads)
    fleet = Fleet(docs)
    judged = verdicts(docs)
    unknowns = "".join(f"<li>{_e(u)}</li>" for u in fleet.unknowns)
    body = (
        "<h1>GPU ledger of the cluster</h1>"
        + _header(own, reading, ttl)
        + (f"<p class=bad>Not known this cycle:</p><ul>{unknowns}</ul>" if unknowns else "")
        + "<h2>Workloads</h2>"
        + _table(
            "workloads",
            [
                "workload",
                "nodes",
                "pods",
                "where requests wait",
                "engines",
                "evidence",
                "what to do next",
            ],
            _workload_rows(fleet, judged),
            "no GPU workloads",
        )
        + gateway_table(docs)
        + not_placed_tables(docs)
        + "<h2>Node agents</h2>"
        + _table(
            "agents",
            ["node", "agent pod", "URL", "state", "snapshot", "GPUs", "GPU pods", "read"],
            [_agent_row(r, now) for r in sorted(reads, key=lambda r: r.name)],
            "none",
        )
    )
    return _page("gpuledger ledger: the cluster", body, docs)


def _engine_text(e: EngineDoc) -> str:
    c = e.config
    status = "up" if e.up else '<span class="bad">not answering</span>'
    tp, pp = c.get("tensor_parallel_size", "?"), c.get("pipeline_parallel_size", "?")
    head = (
        f"{_e(e.model_name or '?')} DP rank {_e(e.engine or '?')} {status}, "
        f"TP {_e(tp)} x PP {_e(pp)}, max_num_seqs {_e(c.get('max_num_seqs') or '?')}"
    )
    if not e.up:
        return head
    kv = e.kv_cache_usage_ratio
    return (
        f"{head}<br>queue: {e.requests_waiting or 0:g} waiting, "
        f"{e.requests_running or 0:g} running, KV cache "
        f"{'?' if kv is None else f'{kv * 100:.0f}%'}"
    )


def _gpus_text(containers: Sequence[ContainerEntry]) -> str:
    lines = []
    for c in containers:
        lines.append(f"container {_e(c.container)}")
        for d in c.devices:
            index = "?" if d.gpu_index is None else d.gpu_index
            lines.append(
                f"ordinal {_e(d.local_index)} → <code>{_e(d.gpu_uuid)}</code> "
                f"(host index {_e(index)}, {_e(d.source)})"
            )
        if not c.devices and not c.allocations:
            lines.append("<span class=muted>no GPU allocation known</span>")
    return "<br>".join(lines)


def _process_text(p: ProcessDoc) -> str:
    devices = p.cuda_devices or ()
    held = ", ".join(
        (f"cuda:{devices.index(g.gpu_uuid)} = " if g.gpu_uuid in devices else "")
        + f"{g.gpu_uuid} {(g.used_bytes or 0) / 2**30:.1f} GiB"
        for g in p.gpu_memory
    )
    return f"{_e(p.pid)} {_e(p.title or '?')}" + (f" holds {_e(held)}" if held else "")


def _chain_rows(result: WorkloadResult) -> list[str]:
    rows = [
        "<tr>"
        f"<td>{_e(p.namespace)}/{_e(p.name)}</td><td class=muted>not placed</td>"
        f"<td class=bad>{_e(p.reason or 'other')} ({_e(p.gpus)} GPU(s) "
        "requested)</td><td></td><td></td><td></td></tr>"
        for p in result.pending
    ]
    for entry in result.pods:
        pod = entry.pod
        ready = (
            '<span class="ok">Ready</span>' if pod.ready else '<span class="bad">not Ready</span>'
        )
        rows.append(
            "<tr>"
            f"<td>{_e(pod.namespace)}/{_e(pod.name)}<br>"
            f"<code>{_e(pod.uid)}</code></td>"
            f"<td class=node>{_e(pod.node)}</td>"
            f"<td>{_e(pod.phase)}, {ready}<br>requests {_e(pod.gpu_requests)} "
            "GPU(s)</td>"
            f"<td>{'<br>'.join(_engine_text(e) for e in entry.engines)}</td>"
            f"<td>{_gpus_text(entry.containers)}</td>"
            f"<td>{'<br>'.join(_process_text(p) for p in entry.processes)}</td>"
            "</tr>"
        )
    return rows


def _gateway_path(result: WorkloadResult) -> str:
    """The request path pool -> picker -> endpoint -> engine, as explain prints it."""
    if not result.pools:
        return ""
    lines = gateway_lines(result.pools, result.pods)
    text = "\n".join(_e(line.strip()) if i == 0 else _e(line) for i, line in enumerate(lines))
    return f'<h2>Request path through the gateway</h2><pre id="gateway">{text}</pre>'


def render_workload(
    own: LedgerDocument, reading: Reading, key: tuple[str, str], ttl: float
) -> tuple[int, str]:
    docs = documents(own, reading.reads)
    fleet = Fleet(docs)
    name = f"{key[0]}/{key[1]}"
    back = '<p><a href="ledger">all workloads</a></p>'
    w = fleet.workloads.get(key)
    if w is None:
        body = (
            f"<h1>Workload {_e(name)}</h1>{back}{_header(own, reading, ttl)}"
            f"<p class=bad>Workload {_e(name)} is in no ledger read.</p>"
        )
        return HTTPStatus.NOT_FOUND, _page(f"gpuledger: {name}", body, docs)
    result = explain_workload(fleet, w, Thresholds())
    v = result.verdict
    issues = "".join(f"<li>{_e(d)}</li>" for d in result.discrepancies)
    evidence = "".join(f"<li>{_e(x)}</li>" for x in v.evidence)
    reason = f" — {_e(v.reason)}" if v.reason else ""
    body = (
        f'<h1>Workload <span id="workload">{_e(name)}</span></h1>{back}'
        + _header(own, reading, ttl)
        + "<h2>Where requests wait</h2>"
        + f'<p id="verdict" class=stage>{_e(STAGE_TEXT.get(v.stage, v.stage))}{reason}</p>'
        + f"<ul>{evidence}</ul>"
        + f'<p id="next">Next: {_next_step(v.next_step, v.runbook_url)}</p>'
        + _gateway_path(result)
        + "<h2>Chain</h2>"
        + _table(
            "chain",
            ["pod", "node", "state", "engines", "container → GPUs", "processes"],
            _chain_rows(result),
            "no pods",
        ).replace("<table ", '<table class="chain" ', 1)
        + "<h2>Ledger</h2>"
        + (
            f'<p class=bad>Disagreements:</p><ul id="disagreements">{issues}</ul>'
            if issues
            else "<p class=ok>allocations, processes and engines agree</p>"
        )
    )
    return HTTPStatus.OK, _page(f"gpuledger: {name}", body, docs)


def render(
    own: LedgerDocument, reading: Reading, query: str, ttl: float, now: float | None = None
) -> tuple[int, str]:
    """(status, HTML) of /ledger: the overview, or `?workload=NS/NAME`'s chain."""
    asked = parse_qs(query).get("workload", [""])[0]
    if not asked:
        wall = time.time() if now is None else now
        return HTTPStatus.OK, render_overview(own, reading, ttl, wall)
    namespace, _, name = asked.partition("/")
    return render_workload(own, reading, (namespace, name), ttl)


class ClusterLedgerPage:
    """/ledger of the cluster view: reads the agents (or reuses a recent read), renders."""

    def __init__(self, reader: AgentReader) -> None:
        self.reader = reader

    def __call__(self, own: LedgerDocument, query: str) -> tuple[int, str]:
        return render(own, self.reader.read(), query, self.reader.ttl_seconds)


def _own_namespace(service_account_dir: str = SERVICE_ACCOUNT_DIR) -> str | None:
    """In the cluster, the agents are the cluster view's release's: its own namespace.
    Outside (a kubeconfig), every namespace."""
    try:
        return Path(service_account_dir, "namespace").read_text().strip() or None
    except OSError:
        return None


def for_cluster_view(
    urls: Sequence[str],
    *,
    kubernetes: bool,
    kubeconfig: str | None,
    deadline_seconds: float,
    access: AgentAccess | None = None,
) -> ClusterLedgerPage:
    """The page `serve --mode cluster` serves: agents from `urls`, and from the Kubernetes
    API when it is on (the cluster view's own credentials; in the cluster its ClusterRole
    already lists pods everywhere), read as `access` says: every read with its basic auth,
    https:// ones verified with its CA and server name, the listed agents at https:// when
    `access.tls`."""
    access = access or AgentAccess()
    connect = None
    if kubernetes:

        def connect() -> Any:
            return agents.connect(
                kubeconfig=kubeconfig, context=None, deadline_seconds=deadline_seconds
            )

    find = Discovery(urls, connect, _own_namespace() if kubernetes else None, access.scheme)
    return ClusterLedgerPage(AgentReader(find, deadline_seconds=deadline_seconds, access=access))
