"""The fleet as the mixin's recording rules have it, read from Prometheus.

With `--prometheus-url`, the cluster page's overview and `gpuledger explain --workload`
do not read every node agent: a handful of instant queries over the recorded series
(mixin/rules/rules.libsonnet, rendered into mixin/rendered/gpuledger.rules.yaml) give every
workload's stage and reason, its engines with their queue, its pending pods and its nodes.
Opening one workload asks which agents (`instance`) hold its series, and only those are
read for its chain. The names below are the rules' `record:` names; a test reads the
rendered rules file, so renaming a rule fails it rather than this page, silently.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from gpuledger.explain.agents import Agent
from gpuledger.explain.prometheus import Prometheus, PrometheusError, Sample, promql_string
from gpuledger.explain.verdict import STAGE

__all__ = [
    "ENGINE_SERIES",
    "HOLDER_SERIES",
    "PENDING_SERIES",
    "POD_SERIES",
    "STAGE_SERIES",
    "FleetOverview",
    "Holder",
    "WorkloadRow",
    "holder_agents",
    "read_holders",
    "read_overview",
]

# The stage and reason of every workload, one series each (`stage`, `reason` labels).
STAGE_SERIES = "namespace_workload_stage_reason:gpuledger_stage_reason_code:group"
ENGINES_UP = "namespace_workload:gpuledger_engine_up:sum"
ENGINES = "namespace_workload:gpuledger_engine_up:count"
WAITING = "namespace_workload:gpuledger_engine_requests_waiting:sum"
RUNNING = "namespace_workload:gpuledger_engine_requests_running:sum"
KV_MAX = "namespace_workload:gpuledger_engine_kv_cache_usage_ratio:max"
# Requests the endpoint pickers of the workload's InferencePools hold (the cluster view's).
GATEWAY_QUEUED = "namespace_workload:gpuledger_gateway_queued_requests:sum"
ENGINE_SERIES = (ENGINES_UP, ENGINES, WAITING, RUNNING, KV_MAX, GATEWAY_QUEUED)
PENDING_PODS = "namespace_workload_reason:gpuledger_pod_pending_placement:sum"
PENDING_GPUS = "namespace_workload:gpuledger_pod_pending_gpus:sum"
PENDING_SERIES = (PENDING_PODS, PENDING_GPUS)
# Raw series of the node agents (export/families.py): one per GPU pod on a node, and the
# ones that name a workload's pods, engines and GPU users on the node whose agent holds them.
POD_SERIES = "gpuledger_pod_starting"
HOLDER_SERIES = (
    "gpuledger_pod_starting",
    "gpuledger_engine_up",
    "gpuledger_container_gpu_memory_used_bytes",
)
# A Ray-executor engine's job, and its workers on every node, by the engine's identity.
RAY_ENGINE_SERIES = "gpuledger_engine_ray_job_info"
RAY_WORKER_SERIES = "gpuledger_ray_worker_info"
RAY_JOB_KEY = "cluster, ray_job_id, ray_driver_node_id"
# The cluster view's: pods not placed (explain reads its document for them).
CLUSTER_VIEW_SERIES = "gpuledger_pod_pending_placement"
WORKLOAD_KEY = "namespace, workload"
MAX_HOLDERS = 2000  # agents read for one workload at most (the cluster page's bound)

Key = tuple[str, str]  # (namespace, workload)


@dataclass(frozen=True)
class WorkloadRow:
    """One workload of the overview, as the recorded series say."""

    namespace: str
    name: str
    stage: str | None  # None: no stage series (the rules have not judged it yet)
    reason: str | None
    engines_up: int = 0
    engines: int = 0
    waiting: float = 0.0
    running: float = 0.0
    kv_max: float | None = None
    gateway_queued: float | None = None  # None: no InferencePool's picker reports for it
    pending: tuple[tuple[str, int], ...] = ()  # (reason, pods not placed)
    pending_gpus: float = 0.0
    nodes: tuple[tuple[str, int], ...] = ()  # (node, GPU pods on it)

    @property
    def pending_pods(self) -> int:
        return sum(n for _, n in self.pending)


@dataclass(frozen=True)
class FleetOverview:
    """Every workload Prometheus judges, strongest stage first, and what was not read."""

    rows: tuple[WorkloadRow, ...]
    queries: int  # instant queries it took
    problems: tuple[str, ...]  # queries that failed: their part of each row is missing
    seconds: float  # wall time of the queries


@dataclass(frozen=True)
class Holder:
    """An agent whose series name the workload: its node label and its scrape address."""

    node: str
    instance: str


def _names(names: Iterable[str], extra: str = "") -> str:
    return "{__name__=~" + promql_string("|".join(names)) + extra + "}"


def overview_queries(selector: str = "") -> dict[str, str]:
    """The overview's queries; `selector` (label matchers, e.g. `cluster="prod"`) narrows
    every one to one cluster of a Prometheus that holds several (Thanos, Mimir)."""
    extra = f", {selector}" if selector else ""
    return {
        "stage": f"{STAGE_SERIES}{{{selector}}}" if selector else STAGE_SERIES,
        "engines": _names(ENGINE_SERIES, extra),
        "pending": _names(PENDING_SERIES, extra),
        "nodes": f'count by ({WORKLOAD_KEY}, node) ({POD_SERIES}{{workload!=""{extra}}})',
    }


OVERVIEW_QUERIES: Mapping[str, str] = overview_queries()


def read_overview(
    prometheus: Prometheus, deadline_seconds: float, selector: str = ""
) -> FleetOverview:
    """The overview from the queries of `overview_queries(selector)`, run at once, all
    within one deadline. PrometheusError when the stage query fails (nothing to list without it);
    another failing leaves its columns empty and is a problem."""
    started = time.monotonic()
    end = started + deadline_seconds

    def run(expr: str) -> tuple[Sample, ...] | PrometheusError:
        try:
            return prometheus.query(expr, deadline_seconds=end - time.monotonic())
        except PrometheusError as exc:
            return exc

    queries = overview_queries(selector)
    with ThreadPoolExecutor(len(queries), "prometheus-query") as pool:
        answers = dict(zip(queries, pool.map(run, queries.values()), strict=True))
    stage = answers["stage"]
    if isinstance(stage, PrometheusError):
        raise stage
    problems = tuple(
        f"{part} not read: {answer.message} ({answer.reason})"
        for part, answer in answers.items()
        if isinstance(answer, PrometheusError)
    )

    def ok(part: str) -> tuple[Sample, ...]:
        answer = answers[part]
        return () if isinstance(answer, PrometheusError) else answer

    rows = _rows(stage, ok("engines"), ok("pending"), ok("nodes"))
    return FleetOverview(rows, len(queries), problems, time.monotonic() - started)


def _key(s: Sample) -> Key:
    return (s.get("namespace"), s.get("workload"))


def _rows(
    stages: Sequence[Sample],
    engines: Sequence[Sample],
    pending: Sequence[Sample],
    nodes: Sequence[Sample],
) -> tuple[WorkloadRow, ...]:
    rows: dict[Key, WorkloadRow] = {}

    def update(s: Sample, **changes: Any) -> None:
        key = _key(s)
        rows[key] = replace(rows.get(key) or WorkloadRow(key[0], key[1], None, None), **changes)

    for s in stages:
        update(s, stage=s.get("stage"), reason=s.get("reason") or None)
    for s in engines:
        name = _ENGINE_FIELDS.get(s.get("__name__"))
        if name is not None:
            update(s, **{name: int(s.value) if name in _COUNTS else s.value})
    by_reason: defaultdict[Key, list[tuple[str, int]]] = defaultdict(list)
    for s in pending:
        if s.get("__name__") == PENDING_PODS and s.value > 0:
            by_reason[_key(s)].append((s.get("reason") or "other", int(s.value)))
        elif s.get("__name__") == PENDING_GPUS:
            update(s, pending_gpus=s.value)
    on_nodes: defaultdict[Key, list[tuple[str, int]]] = defaultdict(list)
    for s in nodes:
        on_nodes[_key(s)].append((s.get("node"), int(s.value)))
    for key, reasons in by_reason.items():
        rows[key] = replace(
            rows.get(key) or WorkloadRow(*key, None, None), pending=tuple(sorted(reasons))
        )
    for key, held in on_nodes.items():
        rows[key] = replace(
            rows.get(key) or WorkloadRow(*key, None, None), nodes=tuple(sorted(held))
        )
    listed = [row for key, row in rows.items() if key[1]]
    return tuple(sorted(listed, key=_strongest_first))


_ENGINE_FIELDS = {
    ENGINES_UP: "engines_up",
    ENGINES: "engines",
    WAITING: "waiting",
    RUNNING: "running",
    KV_MAX: "kv_max",
    GATEWAY_QUEUED: "gateway_queued",
}
_COUNTS = ("engines_up", "engines")


_ORDER = {s: i for i, s in enumerate(STAGE)}


def _strongest_first(row: WorkloadRow) -> tuple[int, str, str]:
    return (_ORDER.get(row.stage or "", len(_ORDER)), row.namespace, row.name)


def holders_query(
    namespace: str, workload: str, series: Iterable[str] = HOLDER_SERIES, selector: str = ""
) -> str:
    """One query: the agents of the workload's own series, or of the Ray workers (on any
    node, of any pod) of its Ray-executor engines, joined on the engine's identity
    (docs/design.md, identity rule 9)."""
    matchers = f"namespace={promql_string(namespace)}, workload={promql_string(workload)}"
    matchers += f", {selector}" if selector else ""
    own = f"{{__name__=~{promql_string('|'.join(series))}, {matchers}}}"
    workers = f"{RAY_WORKER_SERIES} and on ({RAY_JOB_KEY}) {RAY_ENGINE_SERIES}{{{matchers}}}"
    return f"group by (node, instance) ({own} or {workers})"


def read_holders(
    prometheus: Prometheus,
    namespace: str,
    workload: str,
    deadline_seconds: float,
    *,
    cluster_view: bool = False,
    selector: str = "",
) -> tuple[Holder, ...]:
    """The agents (node, instance) whose series name the workload's pods, engines or GPU
    users, or hold its Ray-executor engines' workers: the ones to read for its chain;
    with `cluster_view`, the cluster view too when it reports pods of it not placed.
    PrometheusError when it cannot be asked."""
    series = (*HOLDER_SERIES, CLUSTER_VIEW_SERIES) if cluster_view else HOLDER_SERIES
    query = holders_query(namespace, workload, series, selector)
    answer = prometheus.query(query, deadline_seconds)
    found = {Holder(s.get("node"), s.get("instance")) for s in answer if s.get("instance")}
    return tuple(sorted(found, key=lambda h: (h.node, h.instance)))


def holder_agents(holders: Sequence[Holder], scheme: str) -> list[Agent]:
    """The agents to read for a workload, one per node (its first address, when a rollout
    leaves two: documents are keyed by node), read at `scheme`://instance, at most
    MAX_HOLDERS."""
    agents: dict[str, Agent] = {}
    for h in sorted(holders, key=lambda h: (h.node, h.instance)):
        key = h.node or h.instance
        agents.setdefault(
            key, Agent(node=key, namespace="", pod="", url=f"{scheme}://{h.instance}", role="node")
        )
    return [agents[k] for k in sorted(agents)][:MAX_HOLDERS]
