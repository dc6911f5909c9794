"""The gateway through the real exporter pipeline, against the simulator's API server and
endpoint pickers (tests/fixtures/scenarios/gateway-cluster.yaml, its shapes those of
tests/fixtures/gateway/: GIE v1.6.0's InferencePool, llm-d-router v0.10.0's picker): the
families a cluster view exports, and hostile pickers that cost only their own series."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import yaml

from gpuledger.sim.scenario import load_scenario, parse_scenario
from tests.conftest import REPO, Run, pick, value

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"


def test_the_cluster_view_exports_its_pools_members_and_pickers(tmp_path: Path) -> None:
    sim = Run(load_scenario(SCENARIOS / "gateway-cluster.yaml"), tmp_path)
    try:
        found = sim.settle()
    finally:
        sim.close()
    assert value(found, "gpuledger_source_up", source="inferencepools") == 1
    assert value(found, "gpuledger_source_up", source="picker") == 1
    pools = {s[1]["pool"]: s[1] for s in pick(found, "gpuledger_inference_pool_info")}
    assert set(pools) == {"pool-a", "pool-empty", "pool-down"}
    assert (pools["pool-a"]["picker_service"], pools["pool-a"]["failure_mode"]) == (
        "pool-a-epp",
        "FailOpen",
    )
    members = pick(found, "gpuledger_inference_pool_member", pool="pool-a")
    assert sorted((s[1]["pod"], s[1]["workload"], s[2]) for s in members) == [
        ("vllm-a-5d8c7b9f4-2xk9p", "vllm-a", 1.0),
        ("vllm-a-5d8c7b9f4-7hq2m", "vllm-a", 1.0),
        ("vllm-a-5d8c7b9f4-wn4tz", "vllm-a", 1.0),
    ]
    assert [s[2] for s in pick(found, "gpuledger_inference_pool_member", pool="pool-down")] == [0]
    assert not pick(found, "gpuledger_inference_pool_member", pool="pool-empty")
    assert value(found, "gpuledger_gateway_queued_requests", pool="pool-a") == 30
    assert value(found, "gpuledger_gateway_picker_ready_endpoints", pool="pool-a") == 3
    assert value(found, "gpuledger_gateway_pool_saturation", pool="pool-a") == 0.2
    assert {s[1]["pool"]: s[2] for s in pick(found, "gpuledger_gateway_picker_up")} == {
        "pool-a": 1,
        "pool-empty": 1,
        "pool-down": 1,
    }


def _hostile(faults: dict[str, str]) -> str:
    """A cluster view of one pool per picker fault, each selecting nothing."""
    pools = "\n".join(
        f"  - {{namespace: llm, name: {name}, selector: {{app: {name}}}, picker: {{fault: {f}}}}}"
        for name, f in faults.items()
    )
    return (
        "node: gpuledger-cluster\nmode: cluster\nkubernetes:\n  pods: []\n"
        f"gateway:\n  pools:\n{pools}\n"
    )


def test_hostile_pickers_cost_only_their_own_series_and_the_cycle_keeps_its_deadline(
    tmp_path: Path,
) -> None:
    faults = {"good": "ok", "huge": "huge", "hang": "hang", "slow": "slow", "junk": "garbage"}
    scenario = parse_scenario(yaml.safe_load(_hostile(faults)), "hostile.yaml")
    sim = Run(scenario, tmp_path)
    try:
        sim.settle()
        started = time.monotonic()
        found = sim.scrape()
        took = time.monotonic() - started
    finally:
        sim.close()
    # The picker source's deadline is the engines' (3 s here): hung and trickling pickers
    # end with it, and the cycle with them; a 50 MB answer stops at the byte cap.
    assert took < 3.0 + 2.0, took
    up = {s[1]["pool"]: s[2] for s in pick(found, "gpuledger_gateway_picker_up")}
    assert up == {"good": 1, "huge": 0, "hang": 0, "slow": 0, "junk": 0}
    assert value(found, "gpuledger_source_up", source="picker") == 1
    assert value(found, "gpuledger_source_up", source="inferencepools") == 1
    errors = {
        s[1]["reason"]: s[2] for s in pick(found, "gpuledger_source_errors_total", source="picker")
    }
    assert set(errors) == {"too_large", "timeout", "garbage"}


def test_a_cluster_without_the_inference_extension_reports_it_not_configured(
    tmp_path: Path,
) -> None:
    scenario = load_scenario(SCENARIOS / "gateway-cluster.yaml")
    assert scenario.gateway is not None
    sim = Run(replace(scenario, gateway=replace(scenario.gateway, fault="not_served")), tmp_path)
    try:
        found = sim.settle()
    finally:
        sim.close()
    states = {
        s[1]["state"]: s[2] for s in pick(found, "gpuledger_source_state", source="inferencepools")
    }
    assert states["not_configured"] == 1
    assert not pick(found, "gpuledger_inference_pool_info")
    assert not pick(found, "gpuledger_source_errors_total", source="inferencepools")
