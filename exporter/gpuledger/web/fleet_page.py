"""The cluster page read from Prometheus (`--prometheus-url`): a fleet of 1,000+ nodes.

Reading every node agent's /ledger.json does not fit a page's deadline past a few hundred
agents; Prometheus already holds every workload's stage as a recording rule. So the
overview is a handful of instant queries over the recorded series (explain/recorded.py),
no agent read, and `/ledger?workload=NS/NAME` asks Prometheus which agents hold that
workload's series (their `instance`, the address it scrapes) and reads only those, for the
chain (cluster_page.render_workload, the same page as without Prometheus). Everything
within the cluster page's deadline; a Prometheus that hangs, floods or answers garbage is
named on the page and costs nothing else. The cluster view's own sources (pods not placed,
Ray's placement groups) come from its own document, as without Prometheus.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from http import HTTPStatus
from urllib.parse import parse_qs

from gpuledger.document.v1 import LedgerDocument
from gpuledger.explain.agents import (
    Agent,
    AgentAccess,
    AgentAccessError,
    FetchResult,
    fetch_documents,
)
from gpuledger.explain.prometheus import PrometheusAccess, PrometheusError
from gpuledger.explain.recorded import (
    FleetOverview,
    WorkloadRow,
    holder_agents,
    read_holders,
    read_overview,
)
from gpuledger.explain.verdict import STAGE, next_step_for
from gpuledger.identity.urls import safe_url
from gpuledger.web.cluster_page import (
    CACHE_SECONDS,
    CONCURRENCY,
    AgentRead,
    Reading,
    RecordedQueues,
    _e,
    _lines,
    _next_step,
    _page,
    _source,
    _table,
    _when,
    _workload_link,
    gateway_table,
    not_placed_tables,
    render_workload,
)

# (agents, seconds left) -> their documents: the reads share the page's one deadline.
Fetch = Callable[[Sequence[Agent], float], FetchResult]
MAX_KEPT = 64  # workloads whose agents' documents are kept for reuse


class FleetPage:
    """/ledger of a cluster view with `--prometheus-url`. The overview, and each workload's
    agents' documents, are reused for `ttl_seconds`: a burst of page loads queries
    Prometheus, and reads a workload's agents, once."""

    def __init__(
        self,
        prometheus: PrometheusAccess,
        *,
        deadline_seconds: float,
        access: AgentAccess | None = None,
        ttl_seconds: float = CACHE_SECONDS,
        fetch: Fetch | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prometheus = prometheus
        self.deadline_seconds = deadline_seconds
        self.ttl_seconds = ttl_seconds
        self.access = access or AgentAccess()
        self._clock = clock
        self._fetch: Fetch = fetch or (
            lambda agents, seconds: fetch_documents(
                agents,
                deadline_seconds=seconds,
                concurrency=CONCURRENCY,
                access=self.access,
            )
        )
        self._overview: tuple[float, FleetOverview | str] | None = None
        self._readings: OrderedDict[tuple[str, str], tuple[float, Reading]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, own: LedgerDocument, query: str) -> tuple[int, str]:
        asked = parse_qs(query).get("workload", [""])[0]
        if not asked:
            return HTTPStatus.OK, render_fleet(own, self.overview(), self.where())
        namespace, _, name = asked.partition("/")
        return render_workload(
            own, self.workload_reading(namespace, name), (namespace, name), self.ttl_seconds
        )

    def where(self) -> str:
        return safe_url(self.prometheus.url)

    def overview(self) -> FleetOverview | str:
        """The overview, or one line saying why Prometheus could not give it."""
        with self._lock:
            now = self._clock()
            if self._overview is None or now - self._overview[0] >= self.ttl_seconds:
                self._overview = (now, self._read_overview())
            return self._overview[1]

    def _read_overview(self) -> FleetOverview | str:
        try:
            client = self.prometheus.client(self.deadline_seconds)
            return read_overview(client, self.deadline_seconds, self.prometheus.selector)
        except (PrometheusError, AgentAccessError) as exc:
            return _why(exc)

    def workload_reading(self, namespace: str, name: str) -> Reading:
        """The documents of the agents holding the workload's series, reused for
        `ttl_seconds` (a reload costs the agents nothing), at most MAX_KEPT workloads."""
        key = (namespace, name)
        with self._lock:
            kept = self._readings.get(key)
            if kept is not None and self._clock() - kept[0] < self.ttl_seconds:
                return kept[1]
        reading = self._read_workload(namespace, name)
        with self._lock:
            self._readings[key] = (self._clock(), reading)
            self._readings.move_to_end(key)
            while len(self._readings) > MAX_KEPT:
                self._readings.popitem(last=False)
        return reading

    def _read_workload(self, namespace: str, name: str) -> Reading:
        """Within the deadline, the question to Prometheus included."""
        end = self._clock() + self.deadline_seconds
        try:
            client = self.prometheus.client(self.deadline_seconds)
            holders = read_holders(
                client, namespace, name, self.deadline_seconds, selector=self.prometheus.selector
            )
        except (PrometheusError, AgentAccessError) as exc:
            return Reading([], [f"Prometheus {self.where()} not read: {_why(exc)}"])
        agents = holder_agents(holders, self.access.scheme)
        if not agents or end - self._clock() <= 0:
            return Reading([], [] if agents else [_no_holder(self.where(), namespace, name)])
        result = self._fetch(agents, end - self._clock())
        wall = time.time()
        return Reading(
            [
                AgentRead(
                    node=a.node,
                    pod="",
                    url=a.url,
                    document=result.documents.get(a.key),
                    error=None if a.key in result.documents else result.failures.get(a.key),
                    read_at=wall,
                )
                for a in agents
            ]
        )


def _why(exc: PrometheusError | AgentAccessError) -> str:
    if isinstance(exc, PrometheusError):
        return f"{exc.message} ({exc.reason})"
    return str(exc)


def _no_holder(where: str, namespace: str, name: str) -> str:
    return (
        f"Prometheus {where} has no node agent series of {namespace}/{name}: "
        "only the cluster view's document is read"
    )


def _engines(row: WorkloadRow) -> str:
    # In front of the engines: what its InferencePools' pickers hold back.
    gateway = f"<br>gateway holds {row.gateway_queued:g}" if row.gateway_queued is not None else ""
    if not row.engines:
        return "<span class=muted>none</span>" + gateway
    kv = f"<br>max KV {row.kv_max * 100:.0f}%" if row.kv_max is not None else ""
    return (
        f"{row.engines_up}/{row.engines} up<br>{row.waiting:g} waiting, {row.running:g} running"
        f"{kv}{gateway}"
    )


MAX_NODES_SHOWN = 8


def _nodes(row: WorkloadRow) -> str:
    if not row.nodes:
        return "<span class=muted>not placed</span>" if row.pending else ""
    names = [n for n, _ in row.nodes]
    more = len(names) - MAX_NODES_SHOWN
    shown = _lines(names[:MAX_NODES_SHOWN])
    return shown + (f"<br><span class=muted>and {more} more</span>" if more > 0 else "")


def _pending(row: WorkloadRow) -> str:
    if not row.pending:
        return ""
    parts = [f"{n} {reason}" for reason, n in row.pending]
    return f"<span class=bad>{_lines(parts)}</span><br>{row.pending_gpus:g} GPU(s)"


def _stage(row: WorkloadRow) -> tuple[str, str]:
    """(stage cell, next-step cell)."""
    if row.stage is None or row.stage not in STAGE:
        return "<span class=muted>not judged yet</span>", ""
    step = next_step_for(row.stage, row.reason)
    reason = f" ({_e(row.reason)})" if row.reason else ""
    return f"{_e(row.stage)}{reason}", _next_step(step.text, step.runbook_url)


def _row(row: WorkloadRow) -> str:
    stage, step = _stage(row)
    pods = sum(n for _, n in row.nodes)
    return (
        "<tr>"
        f"<td>{_workload_link(row.namespace, row.name)}</td>"
        f"<td class=node>{_nodes(row)}</td>"
        f"<td>{pods}</td>"
        f"<td class=stage>{stage}</td>"
        f"<td class=eng>{_engines(row)}</td>"
        f"<td>{_pending(row)}</td>"
        f"<td class=next>{step}</td>"
        "</tr>"
    )


def _fleet_header(own: LedgerDocument, overview: FleetOverview | str, where: str) -> str:
    sources = " ".join(_source(s) for s in own.sources)
    if isinstance(overview, str):
        read = (
            f'<p class=bad id="prometheus-error">Prometheus {_e(where)} not read: '
            f"{_e(overview)}</p>"
        )
    else:
        problems = "".join(f"<p class=bad>{_e(p)}</p>" for p in overview.problems)
        read = (
            f'<p id="prometheus">Read from Prometheus <code>{_e(where)}</code>: '
            f"{len(overview.rows)} workloads in {overview.queries} queries "
            f"({overview.seconds:.2f} s), from the mixin's recording rules. Node agents are "
            "read only for the workload you open.</p>" + problems
        )
    return (
        f"<p class=muted>cluster view {_e(own.node)}, snapshot "
        f"{_e(_when(own.taken_at))}, gpuledger {_e(own.version)}. "
        f'Sources: {sources}. <a href="ledger.json">ledger.json</a> · '
        f'<a href="metrics">metrics</a></p>{read}'
    )


def _recorded_queues(overview: FleetOverview | str) -> RecordedQueues:
    """Each workload's engines and their queue, as the rules count them."""
    if isinstance(overview, str):
        return {}
    return {
        (r.namespace, r.name): (r.engines, r.waiting, r.running) for r in overview.rows if r.engines
    }


def render_fleet(own: LedgerDocument, overview: FleetOverview | str, where: str) -> str:
    rows = [] if isinstance(overview, str) else [_row(r) for r in overview.rows]
    docs = [own]
    body = (
        "<h1>GPU ledger of the cluster</h1>"
        + _fleet_header(own, overview, where)
        + "<h2>Workloads</h2>"
        + _table(
            "workloads",
            [
                "workload",
                "nodes",
                "GPU pods",
                "where requests wait",
                "engines",
                "pods not placed",
                "what to do next",
            ],
            rows,
            "no workloads in Prometheus" if not isinstance(overview, str) else "not read",
        )
        + gateway_table(docs, _recorded_queues(overview))
        + not_placed_tables(docs)
    )
    return _page("gpuledger ledger: the cluster", body, docs)
