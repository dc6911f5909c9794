"""The mixin renders valid rules and dashboards with non-default settings."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.mixin.helpers import (
    REPO,
    dashboards,
    panels,
    render_module,
    run,
    substitute_grafana_variables,
    tool,
)

VARIANT = """
local mixin = (import 'mixin.libsonnet') + {
  _config+:: {
    gpuledgerSelector: 'job="gpu-ledger", env="prod"',
    clusterLabel: 'k8s_cluster',
    showMultiCluster: true,
    kvCachePressureRatio: 0.95,
  },
};
{
  rules: mixin.prometheusRules.groups + mixin.prometheusAlerts.groups,
  dashboards: mixin.grafanaDashboards,
}
"""


def _variant() -> dict:
    render_module()  # asserts the jsonnet binding is there
    import _jsonnet

    return json.loads(_jsonnet.evaluate_snippet("variant", VARIANT, jpathdir=[str(REPO / "mixin")]))


def test_multi_cluster_variant_is_valid(tmp_path: Path) -> None:
    variant = _variant()
    # Every dashboard query becomes a recording rule, so promtool parses it too.
    queries = [
        substitute_grafana_variables(t["expr"])
        for d in variant["dashboards"].values()
        for p in panels(d)
        for t in p.get("targets", [])
    ]
    groups = [
        *variant["rules"],
        {
            "name": "dashboard-queries",
            "rules": [{"record": f"check:query_{i}", "expr": q} for i, q in enumerate(queries)],
        },
    ]
    path = tmp_path / "variant.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, width=1_000_000))
    result = run([tool("promtool"), "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr

    for group in variant["rules"]:
        for rule in group["rules"]:
            assert "k8s_cluster" in rule["expr"] or "by (" not in rule["expr"], rule
            assert 'job=~"gpuledger.*"' not in rule["expr"], rule
    for name, dashboard in variant["dashboards"].items():
        cluster = next(v for v in dashboard["templating"]["list"] if v["name"] == "cluster")
        assert cluster["hide"] == 0, name
        assert "k8s_cluster" in cluster["query"]["query"], name
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                assert 'k8s_cluster=~"$cluster"' in target["expr"], (name, panel["title"])


def test_default_dashboards_have_no_cluster_matcher() -> None:
    for name, dashboard in dashboards().items():
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                assert "$cluster" not in target["expr"], (name, panel["title"])
