"""The rules on what the real exporter emits: `gpuledger simulate --once` expositions of
scenarios, scraped into promtool as constant series, must fire exactly the expected alerts.

Scenarios: tests/fixtures/scenarios/explain-node.yaml (a node with sticky routing, a TP=4
engine on 2 GPUs with a full KV cache, GPUs allocated and unused, a model loading, a
notebook using a GPU it was not given) and explain-cluster.yaml (the cluster-mode exporter:
a replica of the same workload pending for GPUs, a gated pod with hostile label values).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.mixin.helpers import REPO, RULES, rule_groups, run, tool

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
HORIZON = "45m"  # after every `for` of the mixin
# The Helm chart's jobs, as config.libsonnet's gpuledgerNodeSelector/ClusterSelector expect.
CLUSTER_UP = 'up{job="gpuledger-cluster",instance="10.0.0.5:9402"}'


@functools.cache
def _exposition(scenario: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    result = run([sys.executable, "-m", "gpuledger", "simulate", str(scenario), "--once"], env=env)
    assert result.returncode == 0, (
        f"gpuledger simulate {scenario.name} failed:\n{result.stderr[-3000:]}"
    )
    return result.stdout


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series(exposition: str, job: str, instance: str) -> list[dict[str, str]]:
    """Input series as Prometheus would store a scrape of this exposition, held constant."""
    out = [{"series": f'up{{job="{job}",instance="{instance}"}}', "values": "1+0x60"}]
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = {**sample.labels, "job": job, "instance": instance}
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            out.append({"series": f"{sample.name}{{{body}}}", "values": f"{sample.value:g}+0x60"})
    return out


def _stage_series(namespace: str, workload: str, stage: str) -> str:
    labels = f'namespace="{_escape(namespace)}",stage="{stage}",workload="{_escape(workload)}"'
    return f"namespace_workload_stage:gpuledger_stage_code:onehot{{{labels}}}"


def _check(
    tmp_path: Path, series: list[dict[str, str]], firing: dict[str, int], stages: dict
) -> None:
    cases = [
        {
            "expr": 'count by (alertname) (ALERTS{alertstate="firing"})',
            "eval_time": HORIZON,
            "exp_samples": [
                {"labels": f'{{alertname="{name}"}}', "value": count}
                for name, count in sorted(firing.items())
            ],
        },
        {
            "expr": "namespace_workload_stage:gpuledger_stage_code:onehot == 1",
            "eval_time": HORIZON,
            "exp_samples": [
                {"labels": _stage_series(ns, wl, stage), "value": 1}
                for (ns, wl), stage in sorted(stages.items())
            ],
        },
    ]
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "group_eval_order": [g["name"] for g in rule_groups()],
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}],
    }
    path = tmp_path / "real.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1_000_000))
    result = run([tool("promtool"), "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr


# notebook-bob requests no GPU but uses one: a GPU workload with no engine.
NODE_STAGES = {
    ("research", "notebook-bob"): "no_engine",
    ("serve", "chat"): "routing",
    ("serve", "llama"): "engine_queueing",
    ("serve", "qwen"): "starting",
}


def test_node_exporter_output_fires_exactly_the_expected_alerts(tmp_path: Path) -> None:
    series = _series(
        _exposition(SCENARIOS / "explain-node.yaml"), "gpuledger-node", "10.0.0.7:9402"
    )
    # The cluster view is scraped too (what it serves is the next test's): with no target of
    # it at all, GpuLedgerExporterDown would fire.
    series.append({"series": CLUSTER_UP, "values": "1+0x60"})
    _check(
        tmp_path,
        series,
        firing={
            # chat-0 queues at max_num_seqs while chat-1 idles: routing, not the engine.
            "GpuLedgerRoutingImbalance": 1,
            # llama-0: KV cache 98% full, and TP=4 on 2 GPUs, 2 of its 4 GPUs unused.
            "GpuLedgerEngineQueueingKvCachePressure": 1,
            "GpuLedgerEngineParallelismMismatch": 1,
            "GpuLedgerGpuAllocatedUnused": 2,
            # qwen-0 is loading: startup (its unused GPU is not a ledger alert yet).
            "GpuLedgerWorkloadStartingTooLong": 1,
            "GpuLedgerGpuUnallocatedUse": 1,
        },
        stages=NODE_STAGES,
    )


def test_a_pending_replica_silences_the_routing_alert(tmp_path: Path) -> None:
    """The cluster exporter sees a chat replica pending for GPUs: chat's stage is pending
    placement, the placement alert fires and the routing alert does not."""
    series = _series(
        _exposition(SCENARIOS / "explain-node.yaml"), "gpuledger-node", "10.0.0.7:9402"
    )
    series += _series(
        _exposition(SCENARIOS / "explain-cluster.yaml"), "gpuledger-cluster", "10.0.0.5:9402"
    )
    _check(
        tmp_path,
        series,
        firing={
            "GpuLedgerPodsPendingPlacement": 2,  # serve/chat, and the gated hostile pod
            "GpuLedgerEngineQueueingKvCachePressure": 1,
            "GpuLedgerEngineParallelismMismatch": 1,
            "GpuLedgerGpuAllocatedUnused": 2,
            "GpuLedgerWorkloadStartingTooLong": 1,
            "GpuLedgerGpuUnallocatedUse": 1,
        },
        stages={
            **NODE_STAGES,
            ("serve", "chat"): "pending_placement",
            ("<script>alert(1)</script>", 'evil"pod'): "pending_placement",
        },
    )
