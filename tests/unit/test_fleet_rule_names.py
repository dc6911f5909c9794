"""The fleet page queries the recording rules by name: the names it uses must be the ones
mixin/rendered/gpuledger.rules.yaml records (renaming a rule fails here, not on the page),
with the labels the page reads, and the raw series it asks for must be declared families
that carry the workload's labels."""

from __future__ import annotations

from typing import Any

import yaml

from gpuledger.explain import recorded
from gpuledger.export.families import BY_NAME
from tests.conftest import REPO

RULES = REPO / "mixin" / "rendered" / "gpuledger.rules.yaml"


def _records() -> dict[str, list[dict[str, Any]]]:
    rules = yaml.safe_load(RULES.read_text())
    found: dict[str, list[dict[str, Any]]] = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                found.setdefault(rule["record"], []).append(rule)
    return found


def test_every_recorded_name_the_page_queries_is_a_rule() -> None:
    records = _records()
    names = [recorded.STAGE_SERIES, *recorded.ENGINE_SERIES, *recorded.PENDING_SERIES]
    missing = [n for n in names if n not in records]
    assert not missing, f"the fleet page queries series no rule records: {missing}"
    # Every workload-level name keeps the labels the page keys its rows by.
    for name in names:
        assert name.split(":", 1)[0].startswith("namespace_workload"), name


def test_the_stage_series_carries_the_stage_and_reason_labels_the_page_reads() -> None:
    rules = _records()[recorded.STAGE_SERIES]
    assert all("stage" in r["labels"] for r in rules)
    assert any("reason" in r["labels"] for r in rules)
    assert "by (cluster, namespace, workload)" in rules[0]["expr"]


def test_pending_pods_are_counted_by_reason() -> None:
    (rule,) = _records()[recorded.PENDING_PODS]
    assert "namespace, workload, reason" in rule["expr"]


def test_the_raw_series_it_asks_for_are_families_with_the_workload_labels() -> None:
    for name in (
        *recorded.HOLDER_SERIES,
        recorded.POD_SERIES,
        recorded.CLUSTER_VIEW_SERIES,
        recorded.RAY_ENGINE_SERIES,
    ):
        assert name in BY_NAME, name
        assert {"namespace", "workload"} <= set(BY_NAME[name].labels), name
    # The Ray join's labels are on both sides, and are the rules' own key for it.
    job = {k.strip() for k in recorded.RAY_JOB_KEY.split(",")} - {"cluster"}
    for name in (recorded.RAY_ENGINE_SERIES, recorded.RAY_WORKER_SERIES):
        assert job <= set(BY_NAME[name].labels), name
    assert f"count by ({recorded.RAY_JOB_KEY})" in RULES.read_text()


def test_one_agent_is_read_per_node_at_the_address_prometheus_scrapes() -> None:
    holders = [
        recorded.Holder("n2", "10.0.0.2:9402"),
        recorded.Holder("n1", "10.0.0.9:9402"),  # a rollout: two addresses for one node
        recorded.Holder("n1", "10.0.0.1:9402"),
    ]
    agents = recorded.holder_agents(holders, "https")
    assert [(a.key, a.url) for a in agents] == [
        ("n1", "https://10.0.0.1:9402"),
        ("n2", "https://10.0.0.2:9402"),
    ]


def test_label_values_are_quoted_as_promql_strings() -> None:
    query = recorded.holders_query('we"ird', "a\\b", selector='cluster="x"')
    assert 'namespace="we\\"ird"' in query and 'workload="a\\\\b"' in query
    assert query.count('cluster="x"') == 2  # the workload's series and its Ray engines'
