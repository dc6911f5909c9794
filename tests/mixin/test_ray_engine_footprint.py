"""A Ray-executor engine's footprint across nodes, in promtool on the real exporter's output.

Two node agents (`gpuledger simulate --once` of tests/fixtures/scenarios/ray-engine-node-a
and -b: one Ray cluster, a TP 4 engine whose EngineCore and workers TP0, TP1 run on node a
and workers TP2, TP3 on node b) scraped as constant series: the recording rule
node_namespace_workload_pod_target_engine:gpuledger_ray_worker_gpus:count gives the engine 4 GPUs
on 2 nodes against TP 4, GpuLedgerEngineParallelismMismatch fires when two workers share a
GPU (3 GPUs), not when a node agent is missing (the count is then unknown), and the
`promql ray-executor` queries of docs/promql.md answer as documented.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.mixin.helpers import REPO, RULES, rule_groups, run, tool

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
HORIZON = "45m"  # after every `for` of the mixin
RULE = "node_namespace_workload_pod_target_engine:gpuledger_ray_worker_gpus:count"
ENGINE = (
    'engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct",namespace="ray",'
    'node="gpu-node-a",pod="llama-head",pod_uid="ae000001-0000-4000-8000-000000000001",'
    'workload="llama"'
)
CLUSTER_UP = 'up{job="gpuledger-cluster",instance="10.0.0.5:9402"}'


@functools.cache
def engine() -> str:
    """The engine's labels as the rule keeps them: ENGINE and its scrape `target` (an engine
    is one target, model and data-parallel rank), whose port the simulator picks."""
    for family in text_string_to_metric_families(exposition("a")):
        for sample in family.samples:
            if sample.name == "gpuledger_engine_ray_job_info":
                return f'{ENGINE},target="{sample.labels["target"]}"'
    raise AssertionError("node a reports no gpuledger_engine_ray_job_info")


@functools.cache
def exposition(node: str, phase: str | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    args = [sys.executable, "-m", "gpuledger", "simulate"]
    args += [str(SCENARIOS / f"ray-engine-node-{node}.yaml"), "--once"]
    args += ["--phase", phase] if phase else []
    result = run(args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def series(text: str, instance: str) -> list[dict[str, str]]:
    """A scrape of `text` by the node agents' job, held constant."""
    job = "gpuledger-node"
    out = [{"series": f'up{{job="{job}",instance="{instance}"}}', "values": "1+0x60"}]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, "job": job, "instance": instance}
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            out.append({"series": f"{sample.name}{{{body}}}", "values": f"{sample.value!r}+0x60"})
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def promtool(tmp_path: Path, inputs: list[dict[str, str]], cases: list[dict[str, Any]]) -> None:
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "group_eval_order": [g["name"] for g in rule_groups()],
        "tests": [
            {
                "interval": "1m",
                "input_series": [*inputs, {"series": CLUSTER_UP, "values": "1+0x60"}],
                "promql_expr_test": cases,
            }
        ],
    }
    path = tmp_path / "ray-footprint.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1_000_000))
    result = run([tool("promtool"), "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr


def firing(alerts: dict[str, int]) -> dict[str, Any]:
    return {
        "expr": 'count by (alertname) (ALERTS{alertstate="firing"})',
        "eval_time": HORIZON,
        "exp_samples": [
            {"labels": f'{{alertname="{name}"}}', "value": n} for name, n in sorted(alerts.items())
        ],
    }


def footprint(value: int | None) -> dict[str, Any]:
    return {
        "expr": RULE,
        "eval_time": HORIZON,
        "exp_samples": []
        if value is None
        else [{"labels": f"{RULE}{{{engine()}}}", "value": value}],
    }


def guide_queries() -> list[str]:
    text = (REPO / "docs" / "promql.md").read_text()
    return [q.strip() for q in re.findall(r"^```promql ray-executor\n(.*?)^```", text, re.S | re.M)]


def test_engine_holds_4_gpus_on_2_nodes_against_tp_4(tmp_path: Path) -> None:
    inputs = series(exposition("a"), "10.0.0.1:9402") + series(exposition("b"), "10.0.0.2:9402")
    ratio, where, memory = guide_queries()
    model = 'model_name="meta-llama/Llama-3.1-70B-Instruct"'
    pods = [("gpu-node-a", "llama-head"), ("gpu-node-b", "llama-worker-0")]
    ranks = [("0", "a", "ae0"), ("1", "a", "ae1"), ("2", "b", "be0"), ("3", "b", "be1")]
    promtool(
        tmp_path,
        inputs,
        [
            footprint(4),
            firing({}),
            {
                "expr": ratio,
                "eval_time": HORIZON,
                "exp_samples": [{"labels": f"{{{engine()}}}", "value": 1}],
            },
            {
                "expr": where,
                "eval_time": HORIZON,
                "exp_samples": [
                    {"labels": f'{{{model},node="{n}",pod="{p}"}}', "value": 2} for n, p in pods
                ],
            },
            {
                "expr": memory,
                "eval_time": HORIZON,
                "exp_samples": [
                    {
                        "labels": f'{{gpu_uuid="{_uuid(g)}",node="gpu-node-{n}",pp_rank="0",'
                        f'tp_rank="{r}"}}',
                        "value": 70 * 2**30,
                    }
                    for r, n, g in ranks
                ],
            },
        ],
    )


def _uuid(short: str) -> str:
    return {
        "ae0": "GPU-ae000000-0000-4000-8000-000000000000",
        "ae1": "GPU-ae100000-0000-4000-8000-000000000001",
        "be0": "GPU-be000000-0000-4000-8000-000000000000",
        "be1": "GPU-be100000-0000-4000-8000-000000000001",
    }[short]


def test_workers_sharing_a_gpu_fire_the_parallelism_mismatch(tmp_path: Path) -> None:
    inputs = series(exposition("a"), "10.0.0.1:9402")
    inputs += series(exposition("b", "shared-gpu"), "10.0.0.2:9402")
    promtool(
        tmp_path,
        inputs,
        [
            footprint(3),
            # TP3 left its GPU: the worker pod's second GPU is allocated and unused, too.
            firing({"GpuLedgerEngineParallelismMismatch": 1, "GpuLedgerGpuAllocatedUnused": 1}),
        ],
    )


def test_a_missing_node_agent_leaves_the_footprint_unknown(tmp_path: Path) -> None:
    """Node b's agent is not scraped: 2 of the 4 ALIVE workers are not reported, so the
    rule says nothing rather than 2, and no mismatch fires (GpuLedgerExporterDown is for
    the missing agent, which Prometheus here does not know of)."""
    promtool(tmp_path, series(exposition("a"), "10.0.0.1:9402"), [footprint(None), firing({})])


RAY_EXECUTOR_ROW = "Engines on the Ray executor: footprint across nodes"
WAITING = REPO / "mixin" / "rendered" / "dashboards" / "gpuledger-where-waiting.json"


def ray_executor_panels() -> dict[str, list[str]]:
    """The queries of the Where-waiting dashboard's Ray-executor row, by panel title. The
    e2e Prometheus stack has no Ray-executor engine: these are checked here instead."""
    import json

    panels: dict[str, list[str]] = {}
    in_row = False
    for panel in json.loads(WAITING.read_text())["panels"]:
        if panel["type"] == "row":
            in_row = panel["title"] == RAY_EXECUTOR_ROW
        elif in_row:
            panels[panel["title"]] = [t["expr"] for t in panel["targets"]]
    return panels


def _all_values(expr: str) -> str:
    """The dashboard's variables at All, as Grafana sends them to `=~` matchers."""
    return re.sub(r"\$\w+", ".*", expr)


def test_the_dashboard_shows_the_footprint_and_every_rank(tmp_path: Path) -> None:
    inputs = series(exposition("a"), "10.0.0.1:9402") + series(exposition("b"), "10.0.0.2:9402")
    panels = ray_executor_panels()
    assert set(panels) == {
        "GPUs in use across nodes vs configured",
        "Ray workers: rank, pod, node and GPU memory",
    }
    in_use, configured = panels["GPUs in use across nodes vs configured"]
    (memory,) = panels["Ray workers: rank, pod, node and GPU memory"]
    key = engine().replace(',pod_uid="ae000001-0000-4000-8000-000000000001"', "")
    ranks = [("0", "a", "ae0", "llama-head"), ("1", "a", "ae1", "llama-head")]
    ranks += [("2", "b", "be0", "llama-worker-0"), ("3", "b", "be1", "llama-worker-0")]
    job = job_labels()
    promtool(
        tmp_path,
        inputs,
        [
            {
                "expr": _all_values(in_use),
                "eval_time": HORIZON,
                "exp_samples": [{"labels": f"{{{key}}}", "value": 4}],
            },
            {
                "expr": _all_values(configured),
                "eval_time": HORIZON,
                "exp_samples": [{"labels": f"{{{key}}}", "value": 4}],
            },
            {
                "expr": _all_values(memory),
                "eval_time": HORIZON,
                "exp_samples": [
                    {
                        "labels": f'{{gpu_uuid="{_uuid(g)}",namespace="ray",node="gpu-node-{n}",'
                        f'pod="{p}",pp_rank="0",{job},tp_rank="{r}"}}',
                        "value": 70 * 2**30,
                    }
                    for r, n, g, p in ranks
                ],
            },
        ],
    )


def job_labels() -> str:
    """`ray_driver_node_id` and `ray_job_id` of the engine, as node a reports them."""
    for family in text_string_to_metric_families(exposition("a")):
        for sample in family.samples:
            if sample.name == "gpuledger_engine_ray_job_info":
                return (
                    f'ray_driver_node_id="{sample.labels["ray_driver_node_id"]}",'
                    f'ray_job_id="{sample.labels["ray_job_id"]}"'
                )
    raise AssertionError("node a reports no gpuledger_engine_ray_job_info")
