"""Every verdict's next step and runbook link come from stages.json, and every link lands on
a runbook section of an alert of the verdict's layer (issue 16, item 3)."""

from __future__ import annotations

import json

import pytest

from gpuledger.explain.verdict import RUNBOOK_URL_PATTERN, STAGE, STAGES, Verdict, next_step_for
from tests.conftest import REPO
from tests.mixin.helpers import RUNBOOKS, alerts, config, github_anchor

STAGES_JSON = json.loads((REPO / "exporter" / "gpuledger" / "stages.json").read_text())
PAIRS = [(s.stage, r) for s in STAGES for r in (s.reasons or (None,))]


def _runbook_anchors() -> set[str]:
    return {
        github_anchor(line.removeprefix("## "))
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("## ")
    }


@pytest.mark.parametrize(("stage", "reason"), PAIRS)
def test_every_stage_and_reason_has_a_one_line_next_step(stage: str, reason: str | None) -> None:
    raw = next(s for s in STAGES_JSON["stages"] if s["stage"] == stage)
    # Written in the file for the reason itself, not only inherited from the stage.
    own = raw["by_reason"][reason] if reason else raw
    text = own["next_step"]
    assert text.strip() == text and text.endswith("."), text
    assert "\n" not in text and 20 <= len(text) <= 160, text
    assert next_step_for(stage, reason).text == text


def test_reasons_and_their_next_steps_name_the_same_reasons() -> None:
    for raw in STAGES_JSON["stages"]:
        assert list(raw.get("by_reason", {})) == raw["reasons"], raw["stage"]


def test_every_runbook_alert_is_an_alert_of_the_stage_layer_with_a_runbook_section() -> None:
    layers = {a["alert"]: a["labels"]["layer"] for a in alerts()}
    anchors = _runbook_anchors()
    seen = set()
    for stage, reason in PAIRS:
        step = next_step_for(stage, reason)
        if step.runbook_alert is None:
            continue
        seen.add(step.runbook_alert)
        assert layers.get(step.runbook_alert) == STAGE[stage].layer, (stage, reason)
        assert step.runbook_alert.lower() in anchors, step.runbook_alert
        assert step.runbook_url == RUNBOOK_URL_PATTERN % step.runbook_alert.lower()
    # Each stage alert's runbook is reachable from some verdict.
    stage_layers = {s.layer for s in STAGES if s.layer}
    assert {a for a, layer in layers.items() if layer in stage_layers} <= seen | {
        "GpuLedgerEngineParallelismMismatch",  # an engine's config, not a stage's reason
        "GpuLedgerInferencePoolNoReadyEndpoints",  # a pool's, which may name no workload
    }


def test_stages_without_an_alert_say_so_with_no_link() -> None:
    for stage in ("serving", "idle", "no_engine"):
        assert next_step_for(stage, None).runbook_url is None
    # engine_queueing reasons no alert pages for: the next step, no link.
    assert next_step_for("engine_queueing", "deferred").runbook_url is None


def test_verdicts_link_the_runbooks_the_agent_serves() -> None:
    # Relative to the agent's page: /ledger links runbooks#<alert>, i.e. /runbooks#<alert>.
    assert STAGES_JSON["runbookURLPattern"] == RUNBOOK_URL_PATTERN == "runbooks#%s"
    # The mixin's alerts say the same anchor, on the agent's /runbooks page by default.
    assert config()["runbookURLPattern"].endswith("/runbooks#%s")
    for alert in alerts():
        url = alert["annotations"]["runbook_url"]
        assert url.endswith("/" + RUNBOOK_URL_PATTERN % alert["alert"].lower())


def test_a_verdict_document_carries_its_next_step_and_link() -> None:
    doc = Verdict("engine_queueing", "kv_cache", ("e",)).to_json()
    assert doc["next_step"].startswith("Give the engine more KV cache")
    assert doc["runbook_url"].endswith("#gpuledgerenginequeueingkvcachepressure")
    # A reason the file does not know falls back to its stage's next step.
    assert next_step_for("engine_queueing", "unheard_of") == next_step_for("engine_queueing", None)
