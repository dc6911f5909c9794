"""End to end with a real Prometheus: the mixin's rules and dashboards on what the real
exporter serves.

A real Prometheus (Debian package `prometheus`) scrapes, every second:
- `gpuledger simulate` of tests/fixtures/scenarios/e2e-node.yaml and e2e-phases.yaml (node
  mode, two targets of the job `gpuledger-node`, as a DaemonSet on two nodes),
- `gpuledger simulate` of tests/fixtures/scenarios/e2e-cluster.yaml (cluster mode, job
  `gpuledger-cluster`),
- a static endpoint in this process standing in for dcgm-exporter and kube-state-metrics
  (whose node capacity says both nodes have GPUs: GpuLedgerExporterDown counts them),
and evaluates, every second, the mixin's recording rules and alerts rendered with every
`for` at 0s (the `for` boundaries are promtool's job: mixin/tests). Every target carries
the config's `clusterLabel` and a job the config's `gpuledgerSelector` matches; the node and
cluster agents' jobs are the Helm chart's, which `gpuledgerNodeSelector` and
`gpuledgerClusterSelector` expect.

The scenarios put each situation in its own namespace, so the test can say, per namespace,
which alerts fire: exactly the one of that situation, and nothing else anywhere. The
namespace `e2e-evolving` (e2e-phases.yaml) moves through phases while served (loading ->
serving -> KV pressure -> recovered) and the test reads the alert and the stage appearing
and clearing back from Prometheus. It is a node of its own because the harness rewrites the
whole synthetic /proc at each phase change, and a procfs read that meets a half-written
file briefly sees a process in no pod (an allocated GPU "unused" for one cycle): with every
`for` at 0s that would fire a ledger alert in the steady namespaces.

Then every query of every dashboard panel, and every query of docs/promql.md, must return
data.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuledger.sim.scenario import load_scenario
from tests.conftest import REPO
from tests.e2e.prom_harness import (
    Prometheus,
    Simulated,
    StaticTargets,
    dcgm_exposition,
    free_port,
    grafana_regex_escape,
    ksm_exposition,
    load_yaml,
    mixin_config,
    prometheus_binary,
    substitute,
    variables_used,
    zero_for_rules,
)
from tests.e2e.test_gateway_prometheus import GATEWAY_PANELS
from tests.mixin.test_ray_engine_footprint import WAITING, ray_executor_panels

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
NODE_SCENARIO = SCENARIOS / "e2e-node.yaml"
CLUSTER_SCENARIO = SCENARIOS / "e2e-cluster.yaml"
PHASES_SCENARIO = SCENARIOS / "e2e-phases.yaml"
DASHBOARDS = REPO / "mixin" / "rendered" / "dashboards"
# The stage of every workload, one series per stage (mixin/rules/rules.libsonnet).
STAGE_SERIES = "namespace_workload_stage:gpuledger_stage_code:onehot"
# The node-mode DaemonSet's job, as the Helm chart names it.
NODE_JOB = "gpuledger-node"
PROMQL_GUIDE = REPO / "docs" / "promql.md"
STAGES_JSON = REPO / "exporter" / "gpuledger" / "stages.json"
CLUSTER_NAME = "e2e"
EVOLVING = "e2e-evolving"

# Per namespace of the scenarios: the one alert its situation must fire, with the layer it
# is routed on and labels that identify the right object. Nothing else may fire.
EXPECTED: dict[str, tuple[str, str, dict[str, str]] | None] = {
    # pending for GPU capacity (cluster mode)
    "e2e-capacity": (
        "GpuLedgerPodsPendingPlacement",
        "placement",
        {"workload": "big", "reason": "insufficient_gpu"},
    ),
    # pending on node selector (cluster mode)
    "e2e-selector": (
        "GpuLedgerPodsPendingPlacement",
        "placement",
        {"workload": "pinned", "reason": "node_selector"},
    ),
    # Ray placement group that never fits (cluster mode)
    "e2e-infeasible": (
        "GpuLedgerRayPlacementGroupsInfeasible",
        "placement",
        {"workload": "raycluster-inf", "scheduling_state": "INFEASIBLE"},
    ),
    # model loading: placed, not Ready, engine not answering (its unused GPU is not a
    # ledger alert while the pod starts)
    "e2e-loading": ("GpuLedgerWorkloadStartingTooLong", "startup", {"workload": "loading"}),
    # KV-cache pressure on a lone engine
    "e2e-kv": ("GpuLedgerEngineQueueingKvCachePressure", "engine", {"pod": "kv-0"}),
    # bound by --max-num-seqs with KV headroom
    "e2e-seqs": (
        "GpuLedgerEngineQueueingAtMaxNumSeqs",
        "engine",
        {"pod": "seqs-0", "max_num_seqs": "16"},
    ),
    # sticky routing: one replica queues at max_num_seqs, its sibling idles
    "e2e-routing": ("GpuLedgerRoutingImbalance", "routing", {"workload": "routing"}),
    # a Job holding 2 GPUs and opening one
    "e2e-unused": (
        "GpuLedgerGpuAllocatedUnused",
        "ledger",
        {"pod": "trainer-0", "gpu_uuid": "GPU-e2e00006-0000-4000-8000-000000000006"},
    ),
    # double booking: `ray start --num-gpus 4` in a pod given 2 GPUs
    "e2e-ray": (
        "GpuLedgerRayGpusExceedAllocation",
        "ledger",
        {"pod": "raycluster-dbl-gpu-worker-0"},
    ),
    # a MIG device (mixed strategy) allocated and never opened, its sibling in use
    "e2e-mig": (
        "GpuLedgerGpuAllocatedUnused",
        "ledger",
        {
            "pod": "tiny-b",
            "gpu_uuid": "MIG-e2e0c001-0000-5000-8000-00000000c001",
            "parent_gpu_uuid": "GPU-e2e00020-0000-4000-8000-000000000020",
        },
    ),
    # a Ray Serve router holding requests its full replicas cannot take, no engine queueing
    "e2e-serve": (
        "GpuLedgerServeRouterQueueing",
        "routing",
        {"workload": "rayserve", "application": "chat", "deployment": "LLMServer"},
    ),
    # a healthy engine serving, nothing waiting
    "e2e-serving": None,
    # two notebooks time-slicing one GPU: both allocated, both using it: nothing
    "e2e-shared": None,
    # alerts without a namespace (exporter, sources): nothing
    "": None,
}

STAGES = {
    ("e2e-capacity", "big"): "pending_placement",
    ("e2e-selector", "pinned"): "pending_placement",
    ("e2e-infeasible", "raycluster-inf"): "pending_placement",
    ("e2e-loading", "loading"): "starting",
    ("e2e-kv", "kv"): "engine_queueing",
    ("e2e-seqs", "seqs"): "engine_queueing",
    ("e2e-routing", "routing"): "routing",
    ("e2e-serving", "healthy"): "serving",
    ("e2e-unused", "trainer"): "no_engine",
    ("e2e-ray", "raycluster-dbl"): "no_engine",
    ("e2e-shared", "notebook-a"): "no_engine",
    ("e2e-shared", "notebook-b"): "no_engine",
    ("e2e-mig", "tiny"): "no_engine",
    ("e2e-serve", "rayserve"): "routing",
}

# e2e-phases.yaml's phases for e2e-evolving, in order: the stage and the alerts of each.
EVOLUTION = [
    ("starting", {"GpuLedgerWorkloadStartingTooLong"}),
    ("serving", set()),
    ("engine_queueing", {"GpuLedgerEngineQueueingKvCachePressure"}),
    ("serving", set()),
]


@dataclass
class Stack:
    prom: Prometheus
    started_wall: float  # when the phased node started (its phase clock), Unix time
    selector: str


def _scrape_config(
    job: str, targets: list[str], cluster_label: str, path: str = "/metrics"
) -> dict[str, Any]:
    return {
        "job_name": job,
        "metrics_path": path,
        "static_configs": [{"targets": targets, "labels": {cluster_label: CLUSTER_NAME}}],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus_binary()  # fail early, with the install hint, when it is missing
    config = mixin_config()
    selector = config["gpuledgerSelector"]
    # The jobs below are named for the default selectors; a changed default needs them too.
    assert selector == 'job=~"gpuledger.*"', selector
    assert config["gpuledgerNodeSelector"] == f'job="{NODE_JOB}"'
    assert config["gpuledgerClusterSelector"] == 'job="gpuledger-cluster"'
    assert config["kubeStateMetricsSelector"] == 'job="kube-state-metrics"'
    cluster_label = config["clusterLabel"]
    rules = zero_for_rules()

    docs = [load_yaml(p) for p in (NODE_SCENARIO, PHASES_SCENARIO, CLUSTER_SCENARIO)]
    static = StaticTargets(
        {
            "dcgm": "".join(dcgm_exposition(d) for d in docs),
            "ksm": ksm_exposition(docs),
        }
    )
    started: list[Any] = [static]
    try:
        # Prometheus first: it is ready before the exporters are, so it sees the phased
        # node from its first phase on.
        ports = {name: free_port() for name in ("node", "phases", "cluster")}
        prom = Prometheus(
            tmp_path_factory.mktemp("prometheus"),
            [
                # One job for the node-mode DaemonSet (two nodes), one for cluster mode.
                _scrape_config(
                    NODE_JOB,
                    [f"127.0.0.1:{ports['node']}", f"127.0.0.1:{ports['phases']}"],
                    cluster_label,
                ),
                _scrape_config(
                    "gpuledger-cluster", [f"127.0.0.1:{ports['cluster']}"], cluster_label
                ),
                _scrape_config("dcgm-exporter", [static.target], cluster_label, "/dcgm"),
                _scrape_config("kube-state-metrics", [static.target], cluster_label, "/ksm"),
            ],
            rules,
        )
        started.append(prom)
        prom.wait_ready()
        # The phased node first: its phase clock starts with its process.
        started_wall = time.time()
        exporters = []
        for name, scenario in (
            ("phases", PHASES_SCENARIO),
            ("node", NODE_SCENARIO),
            ("cluster", CLUSTER_SCENARIO),
        ):
            exporters.append(Simulated(scenario, ports[name]))
            started.append(exporters[-1])
        for exporter in exporters:
            exporter.wait_ready()
        prom.wait_for(
            "every target scraped",
            lambda: (h := prom.target_health()) and len(h) == 5 and set(h.values()) == {"up"},
            timeout=60,
        )
        # The rules have run on complete data: every workload of the scenarios has a stage.
        prom.wait_for(
            "a stage for every workload",
            lambda: len(prom.query(f"{STAGE_SERIES} == 1")) >= len(STAGES),
            timeout=60,
        )
        yield Stack(prom, started_wall, selector)
    finally:
        for thing in reversed(started):
            thing.close()


# ---------------------------------------------------------------------------- alerts


def _firing_by_namespace(prom: Prometheus) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for alert in prom.alerts("firing"):
        labels = alert["labels"]
        out.setdefault(labels.get("namespace", ""), []).append(labels)
    return out


def _mismatches(firing: dict[str, list[dict[str, str]]]) -> list[str]:
    problems = []
    for namespace in sorted(set(EXPECTED) | set(firing)):
        if namespace == EVOLVING:
            continue
        got = firing.get(namespace, [])
        names = sorted(a["alertname"] for a in got)
        if namespace not in EXPECTED:
            problems.append(f"namespace {namespace!r} of no scenario fires {names}")
            continue
        expected = EXPECTED[namespace]
        if expected is None:
            if got:
                problems.append(f"{namespace or '(no namespace)'}: expected nothing, got {got}")
            continue
        name, layer, labels = expected
        wanted = {"alertname": name, "layer": layer, **labels}
        if len(got) != 1 or any(got[0].get(k) != v for k, v in wanted.items()):
            problems.append(f"{namespace}: expected exactly one {wanted}, got {got}")
    return problems


def test_targets_are_the_selected_jobs_with_the_cluster_label(stack: Stack) -> None:
    ups = stack.prom.query(f"up{{{stack.selector}}}")
    jobs = sorted(s["metric"]["job"] for s in ups)
    assert jobs == ["gpuledger-cluster", NODE_JOB, NODE_JOB]
    assert all(s["value"][1] == "1" for s in ups)
    built = stack.prom.query("gpuledger_build_info")
    assert {s["metric"].get("cluster") for s in built} == {CLUSTER_NAME}
    # Every source the scenarios configure is up: nothing below is a degraded view. The
    # others are not configured (the state set says so), and only they read source_up 0.
    down = stack.prom.query(f'gpuledger_source_state{{{stack.selector}, state="down"}} == 1')
    assert not down, down

    def sources(expr: str) -> set[tuple[str, str]]:
        return {(s["metric"]["instance"], s["metric"]["source"]) for s in stack.prom.query(expr)}

    not_configured = sources(
        f'gpuledger_source_state{{{stack.selector}, state="not_configured"}} == 1'
    )
    assert not_configured, "the scenarios leave some source not configured"
    assert sources(f"gpuledger_source_up{{{stack.selector}}} == 0") == not_configured
    # A state set: exactly one state of every source is 1.
    assert not stack.prom.query(
        f"sum by (instance, source) (gpuledger_source_state{{{stack.selector}}}) != 1"
    )


def test_each_situation_fires_exactly_its_alert(stack: Stack) -> None:
    prom = stack.prom
    last: list[str] = []

    def settled() -> bool:
        last[:] = _mismatches(_firing_by_namespace(prom))
        return not last

    try:
        prom.wait_for("the expected alerts", settled, timeout=60)
    except AssertionError:
        raise AssertionError("\n".join(last)) from None
    # And it stays so over several more evaluations of every rule (a scrape each second).
    for _ in range(4):
        prom.wait_next_evaluation()
        assert _mismatches(_firing_by_namespace(prom)) == []
    # No alert is even pending (with `for: 0s` nothing should linger there).
    pending = [a["labels"] for a in prom.alerts("pending")]
    assert [a for a in pending if a.get("namespace") != EVOLVING] == []


def test_stage_alerts_end_with_the_next_step_of_their_verdict(stack: Stack) -> None:
    """As Prometheus renders them: each firing stage alert's description ends with the next
    step stages.json gives the workload's stage and reason (what `gpuledger explain` and the
    /ledger page print), the startup alert's read by its template from the rules."""
    stack.prom.wait_for(
        "the expected alerts",
        lambda: not _mismatches(_firing_by_namespace(stack.prom)),
        timeout=60,
    )
    stages = {s["stage"]: s for s in json.loads(STAGES_JSON.read_text())["stages"]}
    verdicts = {
        (m.get("namespace", ""), m["workload"]): (m["stage"], m.get("reason"))
        for m in (
            s["metric"]
            for s in stack.prom.query(
                "namespace_workload_stage_reason:gpuledger_stage_reason_code:group"
            )
        )
    }
    checked = set()
    for alert in stack.prom.alerts("firing"):
        labels = alert["labels"]
        if labels.get("namespace") == EVOLVING or "Next step: " not in alert["annotations"].get(
            "description", ""
        ):
            continue
        stage, reason = verdicts[(labels.get("namespace", ""), labels["workload"])]
        entry = stages[stage].get("by_reason", {}).get(reason, stages[stage])
        assert entry["runbook_alert"] == labels["alertname"], (labels, stage, reason)
        description = alert["annotations"]["description"]
        assert description.endswith(" Next step: " + entry["next_step"]), description
        checked.add(labels["alertname"])
    assert checked >= {
        "GpuLedgerPodsPendingPlacement",
        "GpuLedgerRayPlacementGroupsInfeasible",
        "GpuLedgerWorkloadStartingTooLong",
        "GpuLedgerEngineQueueingKvCachePressure",
        "GpuLedgerEngineQueueingAtMaxNumSeqs",
        "GpuLedgerRoutingImbalance",
    }


def test_each_workload_is_in_its_stage(stack: Stack) -> None:
    found = {
        (s["metric"]["namespace"], s["metric"]["workload"]): s["metric"]["stage"]
        for s in stack.prom.query(f"{STAGE_SERIES} == 1")
        if s["metric"]["namespace"] != EVOLVING
    }
    assert found == STAGES
    # Exactly one stage per workload, one series per stage (exporter/gpuledger/stages.json).
    counts = stack.prom.query(
        f"count by (namespace, workload) ({STAGE_SERIES}) != 7"
        f" or sum by (namespace, workload) ({STAGE_SERIES}) != 1"
    )
    assert counts == []


# ---------------------------------------------------------------------------- dashboards


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _queries() -> list[tuple[str, str, str]]:
    # The stack runs no engine on the Ray executor (it takes two nodes sharing one Ray
    # cluster): those panels are checked, with exact answers, on two simulated nodes in
    # tests/mixin/test_ray_engine_footprint.py.
    elsewhere = set(ray_executor_panels())
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in _panels(dashboard):
            if panel.get("title", "") in elsewhere and path.name == WAITING.name:
                continue
            for target in panel.get("targets", []):
                out.append((path.name, panel.get("title", ""), target["expr"]))
    return out


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+),\s*([A-Za-z_]\w*)\s*\)\s*$", re.S)
# A fallback some stat panels add so they show 0 instead of "No data"; checked without it.
_OR_ZERO = re.compile(r"\s*or\s+vector\(0\)\s*$")


def _variable_values(prom: Prometheus, dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Values Grafana would offer for each query variable (others at All)."""
    values = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(query)
        assert match, f"{dashboard['uid']}: ${variable['name']}: not label_values(): {query}"
        selector, label = substitute(match.group(1), {}), match.group(2)
        series = prom.query(f"group by ({label}) ({selector})")
        values[variable["name"]] = sorted({s["metric"].get(label, "") for s in series} - {""})
    return values


def test_every_dashboard_variable_offers_values(stack: Stack) -> None:
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        values = _variable_values(stack.prom, dashboard)
        empty = [name for name, found in values.items() if not found]
        assert not empty, f"{path.name}: variables without values: {empty}"
        assert values["cluster"] == [CLUSTER_NAME], path.name


# Panels these scenarios have no data for yet (no multi-GPU engine with a placement, no DRA
# node): tests/mixin/test_dashboards.py answers them exactly on its synthetic series.
SYNTHETIC_ONLY = frozenset(
    {
        "Weakest link among an engine's GPUs",
        "Weakest link among a Ray-executor engine's ranks per node",
        "Allocated through DRA ResourceClaims",
        "Allocations: device plugin vs DRA",
        # The scenarios' engines send no request spans within the test's window.
        "Queue time, p99",
        "Time to first token, p99",
    }
    # The scenarios have no InferencePools: tests/e2e/test_gateway_prometheus.py checks the
    # gateway row against the gateway scenarios' series.
    | GATEWAY_PANELS
)


def test_every_dashboard_query_returns_data(stack: Stack) -> None:
    """Every panel query, with the variables at All, answers without error and with data
    (the `or vector(0)` fallback removed); and for each variable a query uses, some value
    the variable offers gives it data: its matchers fit the series' real labels."""
    prom = stack.prom
    queries = _queries()
    assert len(queries) >= 40
    variables = {
        path.name: _variable_values(prom, json.loads(path.read_text()))
        for path in sorted(DASHBOARDS.glob("*.json"))
    }
    problems = []
    for name, title, expr in queries:
        if title in SYNTHETIC_ONLY:
            continue
        where = f"{name}: {title}: {' '.join(expr.split())}"
        try:
            if not prom.query(substitute(expr, {})):
                problems.append(f"{where}: no data")
                continue
            core = _OR_ZERO.sub("", expr)
            if not prom.query(substitute(core, {})):
                problems.append(f"{where}: no data without `or vector(0)`")
                continue
            for variable in sorted(variables_used(core)):
                offered = variables[name].get(variable, [])
                if not any(
                    prom.query(substitute(core, {variable: grafana_regex_escape(v)}))
                    for v in offered
                ):
                    problems.append(f"{where}: no value of ${variable} ({offered}) gives data")
        except AssertionError as exc:
            problems.append(f"{where}: {exc}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------- docs/promql.md


def _guide_queries() -> list[str]:
    text = PROMQL_GUIDE.read_text()
    return [q.strip() for q in re.findall(r"^```promql\n(.*?)^```", text, re.S | re.M)]


def test_promql_guide_queries_return_data(stack: Stack) -> None:
    queries = _guide_queries()
    assert len(queries) >= 15, "docs/promql.md lost its ```promql blocks"
    joined = " ".join(queries)
    for needed in ("DCGM_FI_DEV_GPU_UTIL", "kube_pod_info", "kube_pod_status_phase", "UUID"):
        assert needed in joined, f"docs/promql.md has no query with {needed}"
    problems = []
    for query in queries:
        try:
            if not stack.prom.query(query):
                problems.append(f"no data: {query}")
        except AssertionError as exc:
            problems.append(str(exc))
    assert not problems, "\n\n".join(problems)


# ---------------------------------------------------------------------------- phases


def _compressed(sequence: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in sequence:
        if not out or out[-1] != item:
            out.append(item)
    return out


def test_alert_appears_and_clears_as_the_scenario_moves_through_phases(stack: Stack) -> None:
    """e2e-evolving: loading (startup alert) -> serving (nothing) -> KV pressure (engine
    alert) -> recovered (nothing), read back from Prometheus as it happened: the stage and
    the firing alerts of the namespace, every half second since the node started."""
    prom = stack.prom
    phases = load_scenario(PHASES_SCENARIO).phases
    assert len(phases) == len(EVOLUTION) - 1
    last_phase = max(p.after_seconds for p in phases)
    stage_expr = f'{STAGE_SERIES}{{namespace="{EVOLVING}"}} == 1'
    alerts_expr = f'ALERTS{{alertstate="firing", namespace="{EVOLVING}"}}'
    want_stages = [frozenset({stage}) for stage, _ in EVOLUTION]
    want_alerts = [frozenset(names) for _, names in EVOLUTION]
    step = 0.5

    def timeline(expr: str, label: str, start: float, end: float) -> list[frozenset[str]]:
        data = prom.query_range(expr, start, end, step)
        at: dict[float, set[str]] = {}
        for k in range(int((end - start) / step) + 1):
            at[round(start + k * step, 3)] = set()
        for series in data["result"]:
            for ts, _ in series["values"]:
                at.setdefault(round(float(ts), 3), set()).add(series["metric"][label])
        return [frozenset(at[t]) for t in sorted(at)]

    seen: dict[str, Any] = {}

    def observed() -> bool:
        start, end = stack.started_wall, time.time()
        stage_line = timeline(stage_expr, "stage", start, end)
        alert_line = timeline(alerts_expr, "alertname", start, end)
        known = [i for i, s in enumerate(stage_line) if s]
        stages = _compressed([stage_line[i] for i in known])
        # Alerts are evaluated in their own groups, up to an interval after the rules:
        # leading empty samples are that lag, not a phase.
        alerts = _compressed(alert_line[known[0] :] if known else [])
        while alerts and not alerts[0]:
            alerts.pop(0)
        seen.update(stages=stages, alerts=alerts)
        assert stages == want_stages[: len(stages)], f"stages went {stages}"
        assert alerts == want_alerts[: len(alerts)], f"alerts went {alerts}"
        return stages == want_stages and alerts == want_alerts

    try:
        prom.wait_for("e2e-evolving through its phases", observed, timeout=last_phase + 45)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; observed {seen}") from None
    # And it stays recovered over two more evaluations of every rule.
    prom.wait_next_evaluation()
    prom.wait_next_evaluation()
    assert observed(), seen
