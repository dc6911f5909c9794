"""Engines on a bare host in Prometheus: the recording rules and the engine alerts on
the exposition of tests/fixtures/scenarios/bare-host-engines.yaml (two vLLM systemd
units, no Kubernetes; A at --max-num-seqs 4 with 40 waiting, B idle), in promtool. The
same snapshot through explain: tests/integration/test_bare_host_engines.py; every phase
through both: tests/mixin/test_stage_differential.py."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import yaml

from gpuledger.sim.scenario import load_scenario
from tests.mixin.helpers import REPO, config, rule_groups, run, tool
from tests.mixin.stage_differential import (
    Snapshot,
    input_series,
    python_judgements,
    rule_mismatches,
    take_snapshot,
)

SCENARIO = REPO / "tests" / "fixtures" / "scenarios" / "bare-host-engines.yaml"
A = ("", "vllm-a.service")
B = ("", "vllm-b.service")


@functools.cache
def snapshot() -> Snapshot:
    return take_snapshot(load_scenario(SCENARIO), None, "gpuledger")


def _minutes(duration: str) -> int:
    assert duration.endswith("m"), duration
    return int(duration[:-1])


def _held(snap: Snapshot, samples: int) -> list[dict[str, str]]:
    """The scrape held constant for `samples` more minutes."""
    return [
        {**s, "values": s["values"].replace("+0x3", f"+0x{samples}")} for s in input_series(snap)
    ]


def test_a_queues_at_max_num_seqs_and_b_is_idle_in_the_recording_rules() -> None:
    judged = python_judgements([snapshot()])
    assert judged[A] == ("engine_queueing", "max_num_seqs")
    assert judged[B] == ("idle", None)
    groups = [g for g in rule_groups() if all("record" in r for r in g["rules"])]
    assert rule_mismatches([snapshot()], groups) == []


def test_the_max_num_seqs_alert_fires_for_a_only() -> None:
    wait = _minutes(config()["engineMaxNumSeqsFor"]) + 2
    # Every alert of a layer a workload is in (the exporter's own pages about the
    # absent gpuledger-node and gpuledger-cluster jobs of a cluster install).
    firing = 'ALERTS{alertstate="firing", layer!="exporter"}'
    expr = f"count by (alertname, namespace, workload, max_num_seqs) ({firing})"
    test: dict[str, Any] = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _held(snapshot(), wait + 2),
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": f"{wait}m",
                        "exp_samples": [
                            {
                                "labels": '{alertname="GpuLedgerEngineQueueingAtMaxNumSeqs",'
                                'max_num_seqs="4",workload="vllm-a.service"}',
                                "value": 1,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    with tempfile.TemporaryDirectory(prefix="bare-host-alerts-") as tmp:
        (Path(tmp) / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
        (Path(tmp) / "test.yaml").write_text(yaml.safe_dump(test, width=1_000_000))
        result = run([tool("promtool"), "test", "rules", str(Path(tmp) / "test.yaml")])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
