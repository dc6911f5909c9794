"""Recording rules and alerts: promtool, naming, labels, annotations, runbooks, coverage."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from tests.mixin.helpers import (
    CONTRACT_METRICS,
    LAYERS,
    PROMQL_FUNCTIONS,
    REPO,
    RULES,
    RUNBOOKS,
    SEVERITIES,
    TESTS_DIR,
    alerts,
    config,
    github_anchor,
    promql_names,
    recording_names,
    recordings,
    rule_groups,
    run,
    tool,
)


def _test_files() -> list[Path]:
    files = sorted(TESTS_DIR.glob("*.yaml"))
    assert files, "no promtool tests in alerts/tests"
    return files


def test_promtool_check_rules() -> None:
    result = run([tool("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    result = run([tool("promtool"), "test", "rules", *map(str, _test_files())])
    assert result.returncode == 0, result.stdout + result.stderr


def test_recording_rule_names() -> None:
    names = recording_names()
    assert names
    for name in names:
        assert re.fullmatch(r"gpuledger:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*", name), name


def test_workload_recording_rules_required_by_the_issue() -> None:
    required = {
        "gpuledger:workload_pods_pending_placement:sum",
        "gpuledger:workload_ray_gpus_pending:sum",
        "gpuledger:workload_engines_up:sum",
        "gpuledger:workload_engines_expected:count",
        "gpuledger:workload_requests_waiting:sum",
        "gpuledger:workload_requests_running:sum",
        "gpuledger:workload_kv_cache_usage:max",
        "gpuledger:workload_preemptions:rate5m",
        "gpuledger:workload_stage:onehot",
        "gpuledger:workload_stage_reason:group",
        "gpuledger:workload_routing_imbalance:count",
    }
    assert required <= recording_names()


def test_stage_series_cover_every_stage_once() -> None:
    stages = [
        r["labels"]["stage"]
        for r in recordings()
        if r["record"] == "gpuledger:workload_stage:onehot"
    ]
    assert stages == [
        "pending_placement",
        "starting",
        "routing",
        "engine_queueing",
        "serving",
        "idle",
        "no_engine",
    ]


def test_recording_rules_are_documented_in_metrics_md() -> None:
    text = (REPO / "docs" / "metrics.md").read_text()
    assert "\n## Recording rules\n" in text
    section = text.split("\n## Recording rules\n", 1)[1]
    missing = [
        n
        for n in recording_names()
        if n not in section and n.replace("_running", "") not in section
    ]
    # `…_running:sum` shares a row with `…_waiting:sum`.
    missing = [n for n in missing if n != "gpuledger:workload_requests_running:sum"]
    assert not missing, f"recording rules missing from docs/metrics.md: {missing}"


def _all_expressions() -> list[tuple[str, str]]:
    return [(r.get("alert") or r["record"], r["expr"]) for g in rule_groups() for r in g["rules"]]


@pytest.mark.parametrize(
    ("name", "expr"), _all_expressions(), ids=[name for name, _ in _all_expressions()]
)
def test_rule_expressions_name_only_known_metrics(name: str, expr: str) -> None:
    metrics, functions = promql_names(expr)
    assert metrics, f"{name}: no metric found in {expr!r}"
    unknown = metrics - CONTRACT_METRICS - recording_names()
    assert not unknown, (
        f"{name} uses metrics outside the contract and the recording rules: {unknown}"
    )
    assert functions <= PROMQL_FUNCTIONS, (
        f"{name}: unknown functions {functions - PROMQL_FUNCTIONS}"
    )


def test_raw_series_use_the_configured_selector() -> None:
    selector = config()["gpuledgerSelector"]
    for name, expr in _all_expressions():
        for metric in re.findall(r"\b(gpuledger_[a-z0-9_]+|up)\{([^}]*)\}", expr):
            assert selector in metric[1], f"{name}: {metric[0]} without {selector}"
        bare = re.findall(r"\b(gpuledger_[a-z0-9_]+|up)\b(?!\{)", expr)
        assert not bare, f"{name}: raw series without a selector: {bare}"


def test_alert_names_labels_and_annotations() -> None:
    found = alerts()
    assert len(found) >= 14
    names = [a["alert"] for a in found]
    assert len(names) == len(set(names)), "duplicate alert names"
    for alert in found:
        name = alert["alert"]
        assert re.fullmatch(r"GpuLedger(?:[A-Z][a-z0-9]*)+", name), (
            f"{name}: not CamelCase with prefix GpuLedger"
        )
        assert alert["labels"].get("severity") in SEVERITIES, name
        assert alert["labels"].get("layer") in LAYERS, name
        annotations = alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        assert "{{" not in annotations["summary"], f"{name}: summary must be static"
        assert annotations["summary"].endswith("."), name
        assert "{{" in annotations["description"], f"{name}: description must be templated"
        assert alert.get("for"), f"{name}: no for"


def test_every_layer_and_severity_is_used() -> None:
    assert {a["labels"]["layer"] for a in alerts()} == set(LAYERS)
    assert {a["labels"]["severity"] for a in alerts()} == set(SEVERITIES)


def test_alert_for_comes_from_the_config() -> None:
    cfg = config()
    durations = {v for k, v in cfg.items() if k.endswith("For")}
    for alert in alerts():
        assert alert["for"] in durations, (
            f"{alert['alert']}: for {alert['for']} is not a config *For value"
        )
    for_keys = [k for k in cfg if k.endswith("For")]
    assert len(for_keys) == len(alerts()), "one config *For per alert"


def test_runbook_urls_point_at_existing_anchors() -> None:
    pattern = config()["runbookURLPattern"]
    headings = re.findall(r"^## (.+)$", RUNBOOKS.read_text(), re.M)
    anchors = {github_anchor(h) for h in headings}
    for alert in alerts():
        name = alert["alert"]
        url = alert["annotations"]["runbook_url"]
        assert url == pattern % name.lower(), f"{name}: runbook_url {url}"
        assert "/docs/runbooks.md#" in url, url
        anchor = url.rsplit("#", 1)[1]
        assert anchor in anchors, f"{name}: no heading with anchor #{anchor} in docs/runbooks.md"


def test_every_runbook_says_what_why_who_and_what_not() -> None:
    text = RUNBOOKS.read_text()
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    by_name = {a["alert"]: a for a in alerts()}
    assert set(sections) == set(by_name), "one runbook section per alert, and no other"
    for name, body in sections.items():
        for part in ("**Meaning.**", "**Layer and team.**", "**Check first.**", "**Do not.**"):
            assert part in body, f"runbook {name}: missing {part}"
        layer = by_name[name]["labels"]["layer"]
        team = body.split("**Layer and team.**", 1)[1]
        assert team.lstrip().startswith(f"`{layer}`"), (
            f"runbook {name}: layer should read `{layer}`"
        )


def _minutes(duration: str) -> int:
    match = re.fullmatch(r"(\d+)([mh])", duration)
    assert match, duration
    return int(match.group(1)) * (60 if match.group(2) == "h" else 1)


def test_every_alert_is_tested_on_both_sides_of_its_for() -> None:
    """Some scenario expects the alert silent one minute before `for` ends and firing at it."""
    silent: dict[str, set[int]] = defaultdict(set)
    firing: dict[str, set[int]] = defaultdict(set)
    scenarios_per_alert: dict[str, int] = defaultdict(int)
    for path in _test_files():
        doc = yaml.safe_load(path.read_text())
        for group in doc["tests"]:
            fired = set()
            for case in group.get("alert_rule_test", []):
                minute = _minutes(case["eval_time"])
                target = firing if case.get("exp_alerts") else silent
                target[case["alertname"]].add(minute)
                if case.get("exp_alerts"):
                    fired.add(case["alertname"])
            for name in fired:
                scenarios_per_alert[name] += 1
    for alert in alerts():
        name = alert["alert"]
        boundary = _minutes(alert["for"])
        assert boundary in firing[name], f"{name}: no test expects it firing at {alert['for']}"
        assert boundary - 1 in silent[name], f"{name}: no test expects it silent at {boundary - 1}m"


def test_every_scenario_checks_every_alert() -> None:
    names = {a["alert"] for a in alerts()}
    for path in _test_files():
        doc = yaml.safe_load(path.read_text())
        for group in doc["tests"]:
            times = defaultdict(set)
            for case in group.get("alert_rule_test", []):
                times[case["eval_time"]].add(case["alertname"])
            assert times, f"{path.name}: {group['name']}: no alert checks"
            for when, checked in times.items():
                assert checked == names, (
                    f"{path.name}: {group['name']} at {when}: unchecked {names - checked}"
                )


def test_placement_and_engine_alerts_are_tested_as_pairs() -> None:
    """paired.yaml: engine-side alerts fire alone, and a placement/startup twin silences them."""
    doc = yaml.safe_load((TESTS_DIR / "paired.yaml").read_text())
    layer = {a["alert"]: a["labels"]["layer"] for a in alerts()}
    fired_layers = []
    for group in doc["tests"]:
        fired = {c["alertname"] for c in group["alert_rule_test"] if c.get("exp_alerts")}
        assert len(fired) == 1, group["name"]
        fired_layers.append(layer[fired.pop()])
    assert {"engine", "routing"} <= set(fired_layers)
    assert {"placement", "startup"} <= set(fired_layers)


def test_rule_files_reference_the_rendered_rules() -> None:
    for path in _test_files():
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../gpuledger.rules.yaml"], path
        assert doc["group_eval_order"] == [g["name"] for g in rule_groups()], path
