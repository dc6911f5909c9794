"""Recording rules and alerts: promtool, naming, labels, annotations, runbooks, coverage."""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from tests.mixin.helpers import (
    ALIAS_GROUP,
    CONTRACT_METRICS,
    LAYERS,
    PROMQL_FUNCTIONS,
    REPO,
    RULES,
    RUNBOOKS,
    SEVERITIES,
    TESTS_DIR,
    alerts,
    alias_rules,
    config,
    evaluate_jsonnet,
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
    assert files, "no promtool tests in mixin/tests"
    return files


def test_promtool_check_rules() -> None:
    result = run([tool("promtool"), "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    result = run([tool("promtool"), "test", "rules", *map(str, _test_files())])
    assert result.returncode == 0, result.stdout + result.stderr


# `level:metric:operations` (docs/mixin.md, "Recording rule names"): the labels kept, a
# gpuledger_* metric, the aggregation.
_LEVELS = (
    "namespace_workload",
    "namespace_workload_reason",
    "namespace_workload_kind",
    "namespace_workload_scheduling_state",
    "namespace_workload_stage",
    "namespace_workload_stage_reason",
    "namespace_workload_application_deployment",
    "node_namespace_workload_pod_target_engine",
    "node_namespace_pod",
)
_OPERATIONS = ("sum", "max", "count", "group", "rate5m", "onehot")


def _by_record(name: str) -> list[dict]:
    return [r for r in recordings() if r["record"] == name]


def _output_labels(expr: str, labels: dict[str, str]) -> set[str]:
    """The labels an expression's result keeps: those of its outermost `by (...)`, or of
    the recording rule it reads; plus the rule's own labels."""
    match = re.match(r"\s*[a-z]+ by \(([^)]*)\)", expr)
    if match:
        kept = {label.strip() for label in match.group(1).split(",")}
    else:
        source = re.match(r"[\s(]*(?:floor\()?([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)", expr)
        assert source, expr
        first = _by_record(source.group(1))[0]
        kept = _output_labels(first["expr"], first.get("labels", {}))
    return kept | set(labels)


def test_recording_rule_names() -> None:
    names = recording_names()
    assert names
    for name in names:
        assert re.fullmatch(r"[a-z][a-z_]*:gpuledger_[a-z0-9_]+:[a-z0-9_]+", name), name
        level, _metric, operation = name.split(":")
        assert level in _LEVELS, name
        assert operation in _OPERATIONS, name


def test_recording_rule_levels_name_the_labels_they_keep() -> None:
    """The level lists the labels the result keeps, `cluster` left implicit, and the
    engine's and pod's `pod_uid` and `model_name` riding along. An engine is a scrape
    `target` and a data-parallel rank `engine` in it (docs/design.md, identity rule 6)."""
    hierarchy = ("node", "namespace", "workload", "pod", "target", "engine")
    riding = {config()["clusterLabel"], "pod_uid", "model_name"}
    for name in recording_names():
        level = name.split(":")[0]
        # Every rule recording the name (one per stage, say): the labels of any of them.
        kept = set().union(
            *(_output_labels(r["expr"], r.get("labels", {})) for r in _by_record(name))
        )
        kept -= riding
        prefix = "_".join(w for w in hierarchy if w in kept)
        extras = sorted(kept - set(hierarchy))
        assert any(
            level == "_".join([prefix, *order]) for order in itertools.permutations(extras)
        ), f"{name}: keeps {sorted(kept)}"


def test_workload_recording_rules_required_by_the_issue() -> None:
    required = {
        "namespace_workload_reason:gpuledger_pod_pending_placement:sum",
        "namespace_workload_kind:gpuledger_ray_pending_gpus:sum",
        "namespace_workload:gpuledger_engine_up:sum",
        "namespace_workload:gpuledger_engine_up:count",
        "namespace_workload:gpuledger_engine_requests_waiting:sum",
        "namespace_workload:gpuledger_engine_requests_running:sum",
        "namespace_workload:gpuledger_engine_kv_cache_usage_ratio:max",
        "namespace_workload:gpuledger_engine_preemptions:rate5m",
        "namespace_workload_stage:gpuledger_stage_code:onehot",
        "namespace_workload_stage_reason:gpuledger_stage_reason_code:group",
        "namespace_workload:gpuledger_routing_imbalance:sum",
    }
    assert required <= recording_names()


def test_stage_series_cover_every_stage_once() -> None:
    stages = [
        r["labels"]["stage"]
        for r in recordings()
        if r["record"] == "namespace_workload_stage:gpuledger_stage_code:onehot"
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


def _renamed_table() -> list[tuple[str, str]]:
    """docs/mixin.md's table of the names before this release: [(old, new)]."""
    text = (REPO / "docs" / "mixin.md").read_text()
    section = text.split("\n## Recording rule names\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(gpuledger:[^`]+)` \| `([^`]+)` \|$", section, re.M)


def _added_since() -> set[str]:
    """Recording rules docs/mixin.md lists as added after the rename (no old name)."""
    text = (REPO / "docs" / "mixin.md").read_text()
    section = text.split("\nRules added since have no old name", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`([a-z_]+:gpuledger_[a-z0-9_]+:[a-z0-9_]+)`", section))


def test_deprecated_aliases_record_every_old_name_from_its_new_one() -> None:
    """One alias per recording rule that had an old name, each the bare new name, as
    docs/mixin.md's table says; the rules added since are listed there too."""
    aliases = alias_rules()
    pairs = [(r["record"], r["expr"].strip()) for r in aliases]
    assert pairs == _renamed_table()
    assert all(set(r) == {"record", "expr"} for r in aliases), "an alias adds no labels"
    assert {new for _, new in pairs} | _added_since() == recording_names()
    assert not {new for _, new in pairs} & _added_since()
    olds = [old for old, _ in pairs]
    assert len(set(olds)) == len(olds)
    assert not set(olds) & recording_names()
    for old in olds:
        assert re.fullmatch(r"gpuledger:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*", old), old
    # Nothing of the mixin reads an old name.
    for group in rule_groups():
        for rule in group["rules"]:
            assert not promql_names(rule["expr"])[0] & set(olds), (
                rule.get("alert") or rule["record"]
            )


def test_deprecated_aliases_are_a_setting() -> None:
    import _jsonnet

    def groups(value: str) -> list[str]:
        snippet = (
            "local m = (import 'mixin.libsonnet')"
            f" + {{ _config+:: {{ deprecatedRecordingRuleAliases: {value} }} }};"
            " [g.name for g in m.prometheusRules.groups]"
        )
        return json.loads(
            _jsonnet.evaluate_snippet("aliases", snippet, jpathdir=[str(REPO / "mixin")])
        )

    assert config()["deprecatedRecordingRuleAliases"] is True
    assert groups("true")[-1] == ALIAS_GROUP
    assert ALIAS_GROUP not in groups("false")
    assert groups("false") == groups("true")[:-1]


def test_deprecated_aliases_equal_the_new_series(tmp_path: Path) -> None:
    """promtool, on the synthetic cluster of the dashboard tests: every old name has exactly
    the series of its new name, labels and values, and has some."""
    series = evaluate_jsonnet(REPO / "tests" / "mixin" / "dashboard_data.jsonnet")
    cases = []
    # The names docs/mixin.md pairs (not the aliases' own expressions): an alias recording
    # the wrong series fails here.
    table = _renamed_table()
    assert {old for old, _ in table} == {r["record"] for r in alias_rules()}
    for old, new in table:
        cases += [
            {
                "expr": f"({old} != {new}) or ({old} unless {new}) or ({new} unless {old})",
                "eval_time": "30m",
                "exp_samples": [],
            },
            {
                "expr": f"group({old})",
                "eval_time": "30m",
                "exp_samples": [{"labels": "{}", "value": 1}],
            },
        ]
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "group_eval_order": [g["name"] for g in rule_groups()],
        "tests": [
            {
                "name": "deprecated aliases",
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": cases,
            }
        ],
    }
    path = tmp_path / "aliases.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1_000_000))
    result = run([tool("promtool"), "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr


def test_recording_rules_are_documented_in_metrics_md() -> None:
    text = (REPO / "docs" / "metrics.md").read_text()
    assert "\n## Recording rules\n" in text
    section = text.split("\n## Recording rules\n", 1)[1]
    missing = [n for n in recording_names() if f"`{n}`" not in section]
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
    cfg = config()
    selector = cfg["gpuledgerSelector"]
    # `up` of one agent's targets (GpuLedgerExporterDown's absent() and node count).
    agents = {cfg["gpuledgerNodeSelector"], cfg["gpuledgerClusterSelector"]} - {""}
    for name, expr in _all_expressions():
        for metric in re.findall(r"(?<![\w:])(gpuledger_[a-z0-9_]+|up)\{([^}]*)\}", expr):
            if metric[0] == "up" and metric[1] in agents:
                continue
            assert selector in metric[1], f"{name}: {metric[0]} without {selector}"
        for labels in re.findall(r"\bkube_[a-z_]+\{([^}]*)\}", expr):
            assert cfg["kubeStateMetricsSelector"] in labels, f"{name}: kube-state-metrics"
        # (a recording rule's name has a gpuledger_* metric between colons)
        bare = re.findall(r"(?<![\w:])(gpuledger_[a-z0-9_]+|up)\b(?![{:])", expr)
        assert not bare, f"{name}: raw series without a selector: {bare}"


def test_agent_selectors_fall_under_the_gpuledger_selector() -> None:
    """The node and cluster agents' jobs are among the jobs every gpuledger series is read
    from; their default is the Helm chart's <jobName>-node and <jobName>-cluster."""
    cfg = config()
    assert cfg["gpuledgerNodeSelector"] == 'job="gpuledger-node"'
    assert cfg["gpuledgerClusterSelector"] == 'job="gpuledger-cluster"'
    job_regex = re.fullmatch(r'job=~"(.*)"', cfg["gpuledgerSelector"])
    assert job_regex, cfg["gpuledgerSelector"]
    for key in ("gpuledgerNodeSelector", "gpuledgerClusterSelector"):
        job = re.fullmatch(r'job="(.*)"', cfg[key])
        assert job and re.fullmatch(job_regex.group(1), job.group(1)), key


def test_exporter_down_without_the_optional_parts() -> None:
    """With no cluster-mode agent expected and kube-state-metrics turned off, the alert is
    the failing-target and node-agent-absent conditions only, and promtool accepts it."""
    import _jsonnet

    snippet = (
        "local m = (import 'mixin.libsonnet') + { _config+:: {"
        " gpuledgerClusterSelector: '', kubeStateMetricsSelector: '' } };"
        " [r.expr for g in m.prometheusAlerts.groups for r in g.rules"
        " if r.alert == 'GpuLedgerExporterDown'][0]"
    )
    expr = json.loads(_jsonnet.evaluate_snippet("down", snippet, jpathdir=[str(REPO / "mixin")]))
    assert expr == 'up{job=~"gpuledger.*"} == 0\nor\nabsent(up{job="gpuledger-node"})\n'


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
        # By default the runbooks every agent serves, through docs/install.md's port-forward.
        assert url.startswith("http://localhost:9402/runbooks#"), url
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
        assert doc["rule_files"] == ["../rendered/gpuledger.rules.yaml"], path
        assert doc["group_eval_order"] == [g["name"] for g in rule_groups()], path
