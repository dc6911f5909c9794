"""The stage differential check: the same snapshot judged by `gpuledger explain` (on the
ledger document) and by the mixin's recording rules (on the exposition, in promtool).

A snapshot is one collection cycle of the real pipeline against a simulated node: its
`/ledger.json` document and its `/metrics` exposition come from the same `Published`
state. Python's verdicts become the expected
`namespace_workload_stage_reason:gpuledger_stage_reason_code:group` series; promtool
evaluates the rules on the exposition and compares. Any workload whose stage or reason
differs, or that only one side knows, is a mismatch.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.document.v1 import LedgerDocument
from gpuledger.explain.chain import verdicts
from gpuledger.explain.verdict import Thresholds
from gpuledger.export.document import ledger_document
from gpuledger.sim.scenario import Scenario
from tests.conftest import Run
from tests.mixin.helpers import run, tool

REASON_SERIES = "namespace_workload_stage_reason:gpuledger_stage_reason_code:group"
EVAL = "2m"  # one evaluation after the first: every rule of the group has seen its inputs

Key = tuple[str, str]  # (namespace, workload)
Judgement = tuple[str, str | None]  # (stage, reason)


@dataclass(frozen=True)
class Snapshot:
    """What one exporter served for one collection cycle."""

    job: str
    instance: str
    exposition: str
    document: LedgerDocument


def take_snapshot(scenario: Scenario, phase: str | None, job: str) -> Snapshot:
    """Run `scenario` at `phase` until its configured sources answer, then take one more
    cycle: the exposition and the document of that cycle."""
    with tempfile.TemporaryDirectory(prefix="stage-diff-node-") as workdir:
        sim = Run(scenario, Path(workdir))
        try:
            sim.settle(phase)
            published = sim.exporter.run_once()
            body, _ = sim.exporter.render(None)
        finally:
            sim.close()
    return Snapshot(job, f"{scenario.node}:9402", body.decode(), ledger_document(published))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Mapping[str, str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if v != "")


def input_series(snapshot: Snapshot) -> list[dict[str, str]]:
    """The exposition as Prometheus stores a scrape of it, held constant."""
    out = []
    for family in text_string_to_metric_families(snapshot.exposition):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = {**sample.labels, "job": snapshot.job, "instance": snapshot.instance}
            out.append(
                {"series": f"{sample.name}{{{_labels(labels)}}}", "values": f"{sample.value!r}+0x3"}
            )
    return out


def python_judgements(
    snapshots: Sequence[Snapshot], t: Thresholds | None = None
) -> dict[Key, Judgement]:
    """What `gpuledger explain` (and the /ledger page) says of every workload."""
    return {k: (v.stage, v.reason) for k, v in verdicts([s.document for s in snapshots], t).items()}


def _sample(key: Key, judgement: Judgement) -> dict[str, Any]:
    stage, reason = judgement
    labels = {"namespace": key[0], "workload": key[1], "stage": stage, "reason": reason or ""}
    return {"labels": f"{REASON_SERIES}{{{_labels(labels)}}}", "value": 1}


_ENTRY = re.compile(r'\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _parse_samples(line: str) -> dict[Key, Judgement]:
    """promtool's `exp:`/`got:` line -> {(namespace, workload): (stage, reason)}."""
    out: dict[Key, Judgement] = {}
    for entry in _ENTRY.finditer(line):
        raw = dict(_LABEL.findall(entry.group(1)))
        labels = {k: re.sub(r"\\(.)", r"\1", v) for k, v in raw.items()}
        key = (labels.get("namespace", ""), labels.get("workload", ""))
        out[key] = (labels.get("stage", ""), labels.get("reason"))
    return out


def _differences(promtool_output: str) -> list[str]:
    found = {
        m.group(1): m.group(2) for m in re.finditer(r"^\s*(exp|got):(.*)$", promtool_output, re.M)
    }
    if "got" not in found:
        return [f"promtool failed without a comparison:\n{promtool_output[-3000:]}"]
    python, rules = _parse_samples(found.get("exp", "")), _parse_samples(found["got"])
    return [
        f"{key[0]}/{key[1]}: explain says {python.get(key)}, the recording rules {rules.get(key)}"
        for key in sorted(set(python) | set(rules))
        if python.get(key) != rules.get(key)
    ]


def rule_mismatches(
    snapshots: Sequence[Snapshot],
    rule_groups: Sequence[Mapping[str, Any]],
    t: Thresholds | None = None,
) -> list[str]:
    """Every workload whose (stage, reason) differs between explain on the documents and the
    recording rules `rule_groups` on the expositions; [] when they agree."""
    expected = python_judgements(snapshots, t)
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "group_eval_order": [g["name"] for g in rule_groups],
        "tests": [
            {
                "interval": "1m",
                "input_series": [s for snap in snapshots for s in input_series(snap)],
                "promql_expr_test": [
                    {
                        "expr": REASON_SERIES,
                        "eval_time": EVAL,
                        "exp_samples": [_sample(k, v) for k, v in sorted(expected.items())],
                    }
                ],
            }
        ],
    }
    with tempfile.TemporaryDirectory(prefix="stage-diff-") as tmp:
        (Path(tmp) / "rules.yaml").write_text(yaml.safe_dump({"groups": list(rule_groups)}))
        (Path(tmp) / "test.yaml").write_text(yaml.safe_dump(test, width=1_000_000))
        result = run([tool("promtool"), "test", "rules", str(Path(tmp) / "test.yaml")])
    if result.returncode == 0:
        return []
    return _differences(result.stdout + result.stderr) or [result.stdout[-3000:]]
