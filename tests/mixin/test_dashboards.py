"""Dashboards: valid Grafana JSON, conventions, and queries that parse and return data."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.mixin.helpers import (
    CONTRACT_METRICS,
    DASHBOARDS_DIR,
    PROMQL_FUNCTIONS,
    REPO,
    RULES,
    config,
    dashboard_queries,
    dashboards,
    evaluate_jsonnet,
    label_values_query,
    panels,
    promql_names,
    recording_names,
    rule_groups,
    run,
    substitute_grafana_variables,
    tool,
    variable_queries,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE_FUNCTIONS = ("rate", "irate", "increase", "delta", "idelta", "deriv")


def test_four_dashboards_with_stable_unique_uids() -> None:
    found = dashboards()
    assert set(found) == {
        "gpuledger-where-waiting.json",
        "gpuledger-gpu-ledger.json",
        "gpuledger-engines.json",
        "gpuledger-ray.json",
    }
    uids = [d["uid"] for d in found.values()]
    assert sorted(uids) == sorted(config()["dashboardUids"].values())
    assert len({d["title"] for d in found.values()}) == len(found)


@pytest.mark.parametrize("path", sorted(DASHBOARDS_DIR.glob("*.json")), ids=lambda p: p.name)
def test_dashboard_is_valid_json_with_unique_panel_ids(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    for key in ("title", "uid", "panels", "templating", "schemaVersion", "time"):
        assert key in dashboard, f"{path.name}: no {key}"
    ids = [p["id"] for p in panels(dashboard)]
    assert all(isinstance(i, int) for i in ids)
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]


def _positions_overlap(a: dict, b: dict) -> bool:
    return not (
        a["x"] + a["w"] <= b["x"]
        or b["x"] + b["w"] <= a["x"]
        or a["y"] + a["h"] <= b["y"]
        or b["y"] + b["h"] <= a["y"]
    )


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS_DIR.glob("*.json")))
def test_panels_do_not_overlap(name: str) -> None:
    grid = [p["gridPos"] for p in panels(dashboards()[name])]
    for i, a in enumerate(grid):
        for b in grid[i + 1 :]:
            assert not _positions_overlap(a, b), f"{name}: {a} overlaps {b}"


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS_DIR.glob("*.json")))
def test_panel_conventions(name: str) -> None:
    for panel in panels(dashboards()[name]):
        if panel["type"] == "row":
            continue
        title = panel["title"]
        assert panel.get("description"), f"{name}: {title}: no description"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{name}: {title}: no unit"
        assert panel["datasource"] == DATASOURCE, f"{name}: {title}"
        targets = panel.get("targets", [])
        assert targets, f"{name}: {title}: no query"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), f"{name}: {title}"
        for target in targets:
            assert target["datasource"] == DATASOURCE, f"{name}: {title}"
            for fn in RATE_FUNCTIONS:
                for window in re.findall(rf"\b{fn}\s*\([^\[]*\[([^\]]+)\]", target["expr"]):
                    assert window == "$__rate_interval", f"{name}: {title}: {fn}() over [{window}]"


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS_DIR.glob("*.json")))
def test_templating_variables(name: str) -> None:
    dashboard = dashboards()[name]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    cluster = variables["cluster"]
    assert config()["clusterLabel"] in cluster["query"]["query"]
    assert cluster["hide"] == (0 if config()["showMultiCluster"] else 2)
    assert "namespace" in variables
    if name != "gpuledger-gpu-ledger.json":
        assert "workload" in variables
    else:
        assert {"node", "gpu"} <= set(variables)
    for variable in variables.values():
        if variable["type"] == "query" and variable["name"] != "cluster":
            assert variable["multi"] and variable["includeAll"], f"{name}: {variable['name']}"
            assert variable["allValue"] == ".*", f"{name}: {variable['name']}"
            assert variable["datasource"] == DATASOURCE


@pytest.mark.parametrize(
    ("name", "title", "expr"),
    dashboard_queries(),
    ids=[f"{name.removesuffix('.json')}:{title}" for name, title, _ in dashboard_queries()],
)
def test_panel_queries_name_only_known_metrics(name: str, title: str, expr: str) -> None:
    metrics, functions = promql_names(expr)
    assert metrics, f"{name}: {title}: no metric in {expr!r}"
    unknown = metrics - CONTRACT_METRICS - recording_names()
    assert not unknown, (
        f"{name}: {title}: metrics outside the contract and the recording rules: {unknown}"
    )
    assert functions <= PROMQL_FUNCTIONS, (
        f"{name}: {title}: unknown functions {functions - PROMQL_FUNCTIONS}"
    )


def test_variable_queries_name_only_known_metrics() -> None:
    for name, variable, query in variable_queries():
        selector, _ = label_values_query(query)
        metrics, _ = promql_names(selector)
        assert metrics and metrics <= CONTRACT_METRICS | recording_names(), (
            f"{name}: ${variable}: {query}"
        )


def _promtool_test(tmp_path: Path, cases: list[dict]) -> str:
    """Run promql_expr_test cases against the rendered rules and the synthetic cluster."""
    series = evaluate_jsonnet(REPO / "tests" / "mixin" / "dashboard_data.jsonnet")
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "group_eval_order": [g["name"] for g in rule_groups()],
        "tests": [
            {
                "name": "dashboard queries",
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": cases,
            }
        ],
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1_000_000))
    result = run([tool("promtool"), "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr
    return result.stdout


def test_every_panel_query_returns_data(tmp_path: Path) -> None:
    """Each query, with every variable at All, returns at least one series (group() == 1);
    but the simulated-data banner, which shows nothing on real hardware (its own tests)."""
    banners = {_banner_query(d) for d in dashboards().values()}
    cases = [
        {
            "expr": f"group({substitute_grafana_variables(expr)})",
            "eval_time": "30m",
            "exp_samples": [{"labels": "{}", "value": 1}],
        }
        for _, _, expr in dashboard_queries()
        if expr not in banners
    ]
    assert len(cases) >= 40
    _promtool_test(tmp_path, cases)


def test_every_variable_query_returns_values(tmp_path: Path) -> None:
    cases = []
    for _, variable, query in variable_queries():
        selector, label = label_values_query(query)
        selector = substitute_grafana_variables(selector)
        if (
            variable != "cluster"
        ):  # single-cluster: the label does not exist, the variable is hidden
            selector = (
                selector[:-1] + f', {label}!=""}}'
                if selector.endswith("}")
                else f'{selector}{{{label}!=""}}'
            )
        cases.append(
            {
                "expr": f"group({selector})",
                "eval_time": "30m",
                "exp_samples": [{"labels": "{}", "value": 1}],
            }
        )
    _promtool_test(tmp_path, cases)


def _panel(dashboard: str, title: str) -> dict:
    found = [p for p in panels(dashboards()[dashboard]) if p.get("title") == title]
    assert len(found) == 1, f"{dashboard}: {len(found)} panels titled {title!r}"
    return found[0]


def test_source_state_shows_not_configured_apart_from_down(tmp_path: Path) -> None:
    """GPU ledger dashboard, "Source state": the state set gpuledger_source_state as one value
    per source, mapped to up (green), down (red) and not configured (grey); an exporter
    without the state set shows gpuledger_source_up as up or down."""
    panel = _panel("gpuledger-gpu-ledger.json", "Source state")
    options = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
    value = {o["text"]: float(v) for v, o in options.items()}
    color = {o["text"]: o["color"] for o in options.values()}
    assert set(value) == {"up", "down", "not configured"}
    assert color["up"] == "green" and color["down"] == "red"
    assert color["not configured"] not in {"red", "green", "orange", "yellow"}, color
    assert len(set(value.values())) == 3
    for title, state in (("Sources down", "down"), ("Sources not configured", "not_configured")):
        (target,) = _panel("gpuledger-gpu-ledger.json", title)["targets"]
        assert f'state="{state}"' in target["expr"], title

    (target,) = panel["targets"]
    node = {"job": "gpuledger-node", "instance": "10.0.0.11:9402", "node": "gpu-node-1"}
    old = {"job": "gpuledger-node", "instance": "10.0.0.12:9402", "node": "gpu-node-2"}
    states = {"nvml": "up", "vllm": "down", "ray": "not_configured"}

    def series(name: str, labels: dict[str, str], v: int) -> dict[str, str]:
        body = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
        return {"series": f"{name}{{{body}}}", "values": f"{v}+0x40"}

    inputs = [
        series("gpuledger_source_up", {**node, "source": s}, int(state == "up"))
        for s, state in states.items()
    ] + [
        series("gpuledger_source_state", {**node, "source": s, "state": x}, int(x == state))
        for s, state in states.items()
        for x in ("up", "down", "not_configured")
    ]
    # An exporter from before gpuledger_source_state: source_up only.
    inputs += [
        series("gpuledger_source_up", {**old, "source": "nvml"}, 1),
        series("gpuledger_source_up", {**old, "source": "ray"}, 0),
    ]

    def sample(labels: dict[str, str], source: str, text: str) -> dict:
        body = f'job="{labels["job"]}",node="{labels["node"]}",source="{source}"'
        return {"labels": f"{{{body}}}", "value": value[text]}

    expected = [sample(node, s, state.replace("_", " ")) for s, state in states.items()] + [
        sample(old, "nvml", "up"),
        sample(old, "ray", "down"),
    ]
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "source state",
                "interval": "1m",
                "input_series": inputs,
                "promql_expr_test": [
                    {
                        "expr": substitute_grafana_variables(target["expr"]),
                        "eval_time": "10m",
                        "exp_samples": expected,
                    }
                ],
            }
        ],
    }
    path = tmp_path / "source-state.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1_000_000))
    result = run([tool("promtool"), "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr


def test_allocation_panels_show_device_plugin_and_dra_allocations_apart(tmp_path: Path) -> None:
    """GPU ledger dashboard: the device-plugin table lists exactly the device-plugin
    allocations of the synthetic cluster, the DRA table exactly the claim's (with its claim
    and device), and the per-node counts tell the two apart."""
    ledger = "gpuledger-gpu-ledger.json"
    (plugin,) = _panel(ledger, "Allocated through a device plugin")["targets"]
    (dra,) = _panel(ledger, "Allocated through DRA ResourceClaims")["targets"]
    counts = _panel(ledger, "Allocations: device plugin vs DRA")["targets"]

    def row(pod: str, gpu: str, **labels: str) -> str:
        namespace, container = ("ray", "ray-worker") if pod.startswith("ray") else ("ml", "vllm")
        base = {"node": "gpu-node-1", "gpu_uuid": gpu, "namespace": namespace, "pod": pod}
        base |= {"container": container, **labels}
        return "{" + ",".join(f'{k}="{base[k]}"' for k in sorted(base)) + "}"

    nvidia = {"resource": "nvidia.com/gpu"}
    claim = {
        "container": "main",
        "dra_claim_namespace": "ml",
        "dra_claim_name": "gpu-claim",
        "dra_driver_name": "gpu.nvidia.com",
        "dra_pool_name": "gpu-node-1",
        "dra_device_name": "gpu-4",
        "dra_share_id": "",
    }
    # promtool drops empty labels from expected series as Prometheus does.
    claim_row = row("trainer", "GPU-d", **claim).replace(',dra_share_id=""', "")
    cases = [
        (
            plugin,
            [
                row("chat-a", "GPU-a", **nvidia),
                row("chat-a", "GPU-x", **nvidia),
                row("chat-b", "GPU-b", **nvidia),
                row("ray-llm-worker-a", "GPU-w1", **nvidia),
            ],
        ),
        (dra, [claim_row]),
    ]
    promql = [
        {
            "expr": substitute_grafana_variables(target["expr"]),
            "eval_time": "30m",
            "exp_samples": [{"labels": labels, "value": 1} for labels in expected],
        }
        for target, expected in cases
    ] + [
        {
            "expr": substitute_grafana_variables(target["expr"]),
            "eval_time": "30m",
            "exp_samples": [{"labels": '{node="gpu-node-1"}', "value": value}],
        }
        for target, value in zip(counts, (4, 1), strict=True)
    ]
    assert [t["legendFormat"] for t in counts] == ["{{node}} device plugin", "{{node}} DRA"]
    _promtool_test(tmp_path, promql)


# ---------------------------------------------------------------------------- simulated data

SIMULATED_TEXT = "SIMULATED DATA"


def _banner(dashboard: dict) -> dict:
    """The panel on top of the dashboard, alone on its line and full width."""
    top = [p for p in panels(dashboard) if p["gridPos"]["y"] == 0]
    assert len(top) == 1, f"{dashboard['title']}: {len(top)} panels on the first line"
    return top[0]


def _banner_query(dashboard: dict) -> str:
    (target,) = _banner(dashboard)["targets"]
    return str(target["expr"])


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS_DIR.glob("*.json")))
def test_dashboard_has_the_simulated_data_banner(name: str) -> None:
    """On top of every dashboard: SIMULATED DATA in red while an exporter in view is
    simulated (gpuledger_build_info{simulated="true"}), nothing otherwise."""
    dashboard = dashboards()[name]
    banner = _banner(dashboard)
    assert banner["type"] == "stat"
    assert banner["gridPos"]["x"] == 0 and banner["gridPos"]["w"] == 24
    assert _banner_query(dashboard) == (
        f'max(gpuledger_build_info{{{config()["gpuledgerSelector"]}, simulated="true"}})'
    )
    defaults = banner["fieldConfig"]["defaults"]
    (mapping,) = defaults["mappings"]
    assert mapping["type"] == "value"
    assert set(mapping["options"]) == {"1"}
    shown = mapping["options"]["1"]
    assert shown["text"].startswith(SIMULATED_TEXT) and shown["color"] == "red"
    # Real hardware: no title, no background, a blank instead of "No data".
    assert banner["title"] == ""
    assert banner["transparent"] is True
    assert defaults["noValue"].strip() == ""
    assert [s["color"] for s in defaults["thresholds"]["steps"]] == ["transparent"]
    assert banner["options"]["colorMode"] == "background"
    # Its id comes after the others': adding it moved no panel's id.
    assert banner["id"] == max(p["id"] for p in panels(dashboard))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _demo_series() -> list[dict[str, str]]:
    """`gpuledger demo --once`, as Prometheus would store a scrape of it (node agent job)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    result = run([sys.executable, "-m", "gpuledger", "demo", "--once"], env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    out = []
    for family in text_string_to_metric_families(result.stdout):
        for sample in family.samples:
            labels = {**sample.labels, "job": "gpuledger-node", "instance": "10.0.0.11:9402"}
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            out.append({"series": f"{sample.name}{{{body}}}", "values": f"{sample.value:g}+0x40"})
    return out


def test_simulated_data_banner_shows_on_the_demo_only(tmp_path: Path) -> None:
    """Every dashboard's banner query returns data on `gpuledger demo`'s exposition, and
    none on an exporter of real hardware (simulated="false") or one from before the label."""
    queries = sorted(
        {substitute_grafana_variables(_banner_query(d)) for d in dashboards().values()}
    )
    demo = _demo_series()
    assert any('simulated="true"' in s["series"] for s in demo if "build_info" in s["series"])
    real = [
        {
            "series": 'gpuledger_build_info{instance="10.0.0.12:9402",job="gpuledger-node",'
            'node="gpu-node-2",simulated="false",version="0.1.0"}',
            "values": "1+0x40",
        },
        {
            "series": 'gpuledger_build_info{instance="10.0.0.13:9402",job="gpuledger-node",'
            'node="gpu-node-3",version="0.0.9"}',
            "values": "1+0x40",
        },
    ]

    def group(name: str, series: list[dict[str, str]], shown: bool) -> dict:
        return {
            "name": name,
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {
                    "expr": query,
                    "eval_time": "10m",
                    "exp_samples": [{"labels": "{}", "value": 1}] if shown else [],
                }
                for query in queries
            ],
        }

    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            group("gpuledger demo", demo, True),
            group("real hardware", real, False),
            group("real hardware next to a simulated node", real + demo, True),
        ],
    }
    path = tmp_path / "simulated-banner.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1_000_000))
    result = run([tool("promtool"), "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr
