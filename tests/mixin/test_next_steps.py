"""The stage alerts end with the next step that `gpuledger explain` and the /ledger page print
for the same verdict: one string, defined once in exporter/gpuledger/stages.json.

A verdict is a (stage, reason); its next step is `by_reason.<reason>.next_step`, else the
stage's `next_step`, and the alert it pages with is `runbook_alert` (verdict.py's
next_step_for). Each alert's rendered description must end with " Next step: " and that
text, verbatim: the step itself where the alert stands for one verdict, else a template
switch on the reason with one branch per verdict and the stage's step for any other reason.
The text is generated from stages.json (mixin/alerts/alerts.libsonnet), so these tests compare the
committed rules with the file: a step changed in one place only fails here (or, for
stages.json without re-rendering, in test_render too).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.mixin.helpers import REPO, alerts

STAGES: list[dict[str, Any]] = json.loads(
    (REPO / "exporter" / "gpuledger" / "stages.json").read_text()
)["stages"]
NEXT = " Next step: "
# {{ if eq <subject> "<reason>" }}<step>{{ else if eq <subject> "<reason>" }}<step>...
_BRANCH = re.compile(r'\{\{ (?:else )?if eq \$\w+(?:\.\w+)? "([^"]+)" \}\}(.*?)(?=\{\{)')
_DEFAULT = re.compile(r"\{\{ else \}\}([^{]*)\{\{ end \}\}$")


def _step(stage: dict[str, Any], reason: str) -> dict[str, Any]:
    entry: dict[str, Any] = stage.get("by_reason", {}).get(reason, stage)
    return entry


def _verdicts() -> dict[str, list[tuple[dict[str, Any], str, str]]]:
    """alert -> [(stage, reason, next step)] of the verdicts whose runbook_alert it is."""
    out: dict[str, list[tuple[dict[str, Any], str, str]]] = {}
    for stage in STAGES:
        for reason in stage["reasons"]:
            entry = _step(stage, reason)
            if entry["runbook_alert"] is not None:
                out.setdefault(entry["runbook_alert"], []).append(
                    (stage, reason, entry["next_step"])
                )
    return out


def _description(name: str) -> str:
    (alert,) = [a for a in alerts() if a["alert"] == name]
    return str(alert["annotations"]["description"])


def test_every_runbook_alert_of_stages_json_is_an_alert() -> None:
    names = {a["alert"] for a in alerts()}
    named = set(_verdicts()) | ({s["runbook_alert"] for s in STAGES} - {None})
    assert named <= names, f"stages.json names alerts the mixin lacks: {named - names}"
    # The stage alerts: placement, startup, engine and routing.
    assert len(_verdicts()) >= 7


def test_next_steps_are_one_sentence_each() -> None:
    """Plain text a template can carry verbatim: no template delimiters, ends with a full stop."""
    for stage in STAGES:
        for entry in [stage, *stage.get("by_reason", {}).values()]:
            step = entry["next_step"]
            assert step.endswith(".") and "{{" not in step and "}}" not in step, step
            assert "\n" not in step, step


@pytest.mark.parametrize("name", sorted(a["alert"] for a in alerts()))
def test_description_ends_with_the_next_step_of_stages_json(name: str) -> None:
    description = _description(name)
    verdicts = _verdicts().get(name, [])
    if not verdicts:
        assert NEXT not in description, f"{name} has no verdict in stages.json"
        return
    assert description.count(NEXT) == 1, description
    tail = description.split(NEXT, 1)[1]
    steps = {step for _, _, step in verdicts}
    if "{{" not in tail:
        # One verdict (or several with one step): the step, verbatim, at the very end.
        assert steps == {tail}, f"{name}: the alert says {tail!r}, stages.json {steps}"
        return
    # Several: one branch per reason, in stages.json's order, with its step verbatim, and the
    # stage's own step for any other reason (as explain falls back to it).
    branches = _BRANCH.findall(tail)
    assert branches == [(reason, step) for _, reason, step in verdicts], f"{name}: {tail}"
    stages = {stage["stage"] for stage, _, _ in verdicts}
    assert len(stages) == 1, name
    default = _DEFAULT.search(tail)
    assert default, f"{name}: no fallback in {tail!r}"
    assert default.group(1) == verdicts[0][0]["next_step"], name


def test_starting_alert_reads_its_reason_from_the_rules() -> None:
    """The startup alert's reason is no label (it may change while the workload starts): the
    template reads it from the stage-reason rule, and switches on it."""
    description = _description("GpuLedgerWorkloadStartingTooLong")
    head, tail = description.split(NEXT, 1)
    assert "namespace_workload_stage_reason:gpuledger_stage_reason_code:group" in head
    assert '{stage="starting",' in head
    assert re.search(r'\$reason = \. \| first \| label "reason"', head), head
    assert {r for r, _ in _BRANCH.findall(tail)} == {"pod_not_ready", "engine_not_up"}
