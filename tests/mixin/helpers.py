"""Shared helpers of the mixin tests: tools, the render script, rendered files, PromQL names."""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
MIXIN = REPO / "mixin"
RULES = MIXIN / "rendered" / "gpuledger.rules.yaml"
TESTS_DIR = MIXIN / "tests"
DASHBOARDS_DIR = MIXIN / "rendered" / "dashboards"
RUNBOOKS = REPO / "docs" / "runbooks.md"
ALERTMANAGER_EXAMPLE = REPO / "docs" / "alertmanager-example.yaml"

# The metric contract (docs/metrics.md; docs/design.md "Metric contract (v1)"), plus the one
# Prometheus series the alerts use and the one kube-state-metrics series they may use.
# Anything else a rule or panel names must be a recording rule of the mixin.
CONTRACT_METRICS = frozenset(
    {
        # GPUs
        "gpuledger_gpu_info",
        "gpuledger_gpu_up",
        "gpuledger_gpu_memory_total_bytes",
        "gpuledger_gpu_memory_used_bytes",
        "gpuledger_gpu_utilization_ratio",
        "gpuledger_mig_device_info",
        # Kubernetes allocation and containers
        "gpuledger_gpu_allocation_info",
        "gpuledger_dra_allocation_info",
        "gpuledger_dra_node_gpu_devices",
        "gpuledger_container_device_info",
        "gpuledger_container_gpu_memory_used_bytes",
        "gpuledger_container_gpu_processes",
        "gpuledger_unattributed_gpu_memory_used_bytes",
        "gpuledger_gpu_allocated_unused",
        "gpuledger_gpu_unallocated_use",
        # Ray
        "gpuledger_ray_node_gpus",
        "gpuledger_ray_actor_gpus",
        "gpuledger_ray_actor_gpu_memory_used_bytes",
        "gpuledger_ray_actors_without_gpu_memory",
        "gpuledger_ray_placement_groups",
        "gpuledger_ray_pending_gpus",
        "gpuledger_ray_worker_info",
        "gpuledger_ray_engine_gpu_link_weakest",
        "gpuledger_ray_worker_gpu_memory_used_bytes",
        # Ray Serve
        "gpuledger_serve_deployment_info",
        "gpuledger_serve_router_queued_requests",
        # The gateway (cluster view): InferencePools and their endpoint pickers
        "gpuledger_inference_pool_info",
        "gpuledger_inference_pool_member",
        "gpuledger_gateway_picker_up",
        "gpuledger_gateway_queued_requests",
        "gpuledger_gateway_picker_ready_endpoints",
        "gpuledger_gateway_pool_saturation",
        "gpuledger_serve_router_requests_at_replicas",
        "gpuledger_serve_replica_info",
        "gpuledger_serve_replica_ongoing_requests",
        # vLLM
        "gpuledger_engine_up",
        "gpuledger_engine_requests",
        "gpuledger_engine_requests_waiting_by_reason",
        "gpuledger_engine_kv_cache_usage_ratio",
        "gpuledger_engine_preemptions_total",
        "gpuledger_engine_config_info",
        "gpuledger_engine_gpu_info",
        "gpuledger_engine_gpu_link_weakest",
        "gpuledger_engine_gpus",
        "gpuledger_engine_max_num_seqs",
        # from the engines' request spans (docs/spans.md), histogram buckets
        "gpuledger_engine_request_queue_seconds_bucket",
        "gpuledger_engine_request_ttft_seconds_bucket",
        "gpuledger_engine_ray_job_info",
        "gpuledger_engine_ray_workers",
        # Pending and starting pods
        "gpuledger_pod_pending_placement",
        "gpuledger_pod_pending_gpus",
        "gpuledger_pod_pending_since_timestamp_seconds",
        "gpuledger_pod_starting",
        # Self-monitoring
        "gpuledger_source_up",
        "gpuledger_source_state",
        "gpuledger_source_duration_seconds",
        "gpuledger_source_cpu_seconds_total",
        "gpuledger_source_errors_total",
        "gpuledger_source_last_success_timestamp_seconds",
        "gpuledger_snapshot_age_seconds",
        "gpuledger_build_info",
        # Prometheus itself
        "up",
        # kube-state-metrics, optional: GpuLedgerExporterDown counts the nodes with GPUs
        "kube_node_status_capacity",
    }
)

LAYERS = ("placement", "startup", "engine", "routing", "ledger", "exporter")
SEVERITIES = ("warning", "critical")

# Debian package that provides each tool (scripts/setup-env --test installs them).
_TOOL_PACKAGES = {
    "promtool": "prometheus",
    "amtool": "prometheus-alertmanager",
    "jsonnetfmt": "jsonnet",
}


def tool(name: str) -> str:
    """Path of a required command-line tool; fails (never skips) when it is missing."""
    path = shutil.which(name)
    assert path is not None, (
        f"{name} not found on PATH: install the Debian package {_TOOL_PACKAGES.get(name, name)} "
        "(scripts/setup-env --test does it)"
    )
    return path


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=300, **kwargs)


@functools.cache
def render_module() -> ModuleType:
    """scripts/render-mixin, imported as a module (it has no .py suffix)."""
    assert importlib.util.find_spec("_jsonnet") is not None, (
        "the PyPI package `jsonnet` (module _jsonnet) is missing: .venv/bin/pip install jsonnet "
        "(it belongs to the `test` extra)"
    )
    path = REPO / "scripts" / "render-mixin"
    loader = importlib.machinery.SourceFileLoader("render_mixin", str(path))
    spec = importlib.util.spec_from_loader("render_mixin", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@functools.cache
def rendered() -> dict[Path, str]:
    """Every rendered file (relative path -> text), rendered in memory from the jsonnet."""
    return render_module().render(REPO)  # type: ignore[no-any-return]


@functools.cache
def config() -> dict[str, Any]:
    import _jsonnet

    text = _jsonnet.evaluate_snippet(
        "config", "(import 'mixin.libsonnet')._config", jpathdir=[str(REPO / "mixin")]
    )
    return json.loads(text)  # type: ignore[no-any-return]


def evaluate_jsonnet(path: Path) -> Any:
    import _jsonnet

    return json.loads(_jsonnet.evaluate_file(str(path), jpathdir=[str(REPO / "mixin")]))


@functools.cache
def rule_groups() -> list[dict[str, Any]]:
    """Groups of the committed rendered rules file."""
    return yaml.safe_load(RULES.read_text())["groups"]  # type: ignore[no-any-return]


def alerts() -> list[dict[str, Any]]:
    return [r for g in rule_groups() for r in g["rules"] if "alert" in r]


# Old recording rule names kept for one release (mixin/rules/aliases.libsonnet).
ALIAS_GROUP = "gpuledger.deprecated_aliases"


def recordings() -> list[dict[str, Any]]:
    """The recording rules, without the deprecated aliases of their old names."""
    return [
        r for g in rule_groups() if g["name"] != ALIAS_GROUP for r in g["rules"] if "record" in r
    ]


def alias_rules() -> list[dict[str, Any]]:
    """The deprecated aliases: {record: old name, expr: new name}."""
    return [r for g in rule_groups() if g["name"] == ALIAS_GROUP for r in g["rules"]]


def recording_names() -> set[str]:
    return {r["record"] for r in recordings()}


def dashboards() -> dict[str, dict[str, Any]]:
    """The committed rendered dashboards by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS_DIR.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    out: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


# ---------------------------------------------------------------------------- PromQL

PROMQL_FUNCTIONS = frozenset(
    {
        # aggregation operators
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        # functions
        "abs",
        "absent",
        "absent_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_quantile",
        "holt_winters",
        "hour",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "ln",
        "log2",
        "log10",
        "minute",
        "month",
        "predict_linear",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sort",
        "sort_desc",
        "sqrt",
        "time",
        "timestamp",
        "vector",
        "year",
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "sum_over_time",
        "count_over_time",
        "quantile_over_time",
        "stddev_over_time",
        "stdvar_over_time",
        "last_over_time",
        "present_over_time",
    }
)
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
    }
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, function names) an expression uses."""
    text = _STRINGS.sub('""', expr)
    text = _BRACES.sub("", text)
    text = _BRACKETS.sub("", text)
    text = _LABEL_LISTS.sub("", text)
    metrics: set[str] = set()
    functions: set[str] = set()
    for match in _IDENT.finditer(text):
        name = match.group(0)
        start = match.start()
        if start > 0 and (text[start - 1].isdigit() or text[start - 1] in ".$"):
            continue  # the tail of a number (1e3) or a variable
        if name.lower() in _KEYWORDS:
            continue
        if text[match.end() :].lstrip().startswith("("):
            functions.add(name)
        else:
            metrics.add(name)
    return metrics, functions


def substitute_grafana_variables(expr: str) -> str:
    """A panel query as Prometheus would get it with every variable at `All`."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return "5m" if name.startswith("__") else ".*"

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def label_values_query(query: str) -> tuple[str, str]:
    """(series selector, label) of a Grafana `label_values(selector, label)` query."""
    match = _LABEL_VALUES.match(query)
    assert match is not None, f"not a label_values(selector, label) query: {query!r}"
    return match.group(1), match.group(2)


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) of every panel target."""
    return [
        (name, panel.get("title", ""), target["expr"])
        for name, dashboard in dashboards().items()
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def variable_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, variable name, label_values query) of every query variable."""
    out = []
    for name, dashboard in dashboards().items():
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                query = variable["query"]
                out.append(
                    (name, variable["name"], query["query"] if isinstance(query, dict) else query)
                )
    return out
