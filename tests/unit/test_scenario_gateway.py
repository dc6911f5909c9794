"""The scenario format's `gateway` section (docs/scenarios.md): InferencePools, their
pickers, and phases that change a picker, checked when the file is read."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuledger.sim.scenario import ScenarioError, parse_scenario


def doc(**gateway: Any) -> dict[str, Any]:
    return {
        "mode": "cluster",
        "kubernetes": {
            "pods": [
                {"namespace": "llm", "name": "a-1", "labels": {"app": "a", "tier": "x"}},
                {"namespace": "llm", "name": "a-2", "labels": {"app": "a"}},
                {"namespace": "other", "name": "a-3", "labels": {"app": "a"}},
            ]
        },
        "gateway": {
            "pools": [
                {"namespace": "llm", "name": "pool-a", "selector": {"app": "a"}, "picker": {}}
            ],
            **gateway,
        },
    }


def test_defaults() -> None:
    scenario = parse_scenario(doc(), "t.yaml")
    assert scenario.gateway is not None and scenario.gateway.fault == "ok"
    [pool] = scenario.gateway.pools
    assert (pool.key, dict(pool.selector), pool.target_ports) == (
        "llm/pool-a",
        {"app": "a"},
        (8000,),
    )
    assert pool.failure_mode == "FailClose"
    picker = pool.picker
    assert picker is not None
    assert (picker.service, picker.names, picker.flow_control, picker.fault) == (
        "pool-a-epp",
        "both",
        True,
        "ok",
    )
    assert (picker.queued, picker.queued_bytes, picker.saturation) == (0, 0, 0.0)
    assert picker.ready_endpoints is None and picker.token is None
    members = [p.name for p in scenario.pods or () if pool.selects(p)]
    assert members == ["a-1", "a-2"]  # its namespace only


def test_a_pool_without_a_picker_and_every_key_given() -> None:
    d = doc()
    d["gateway"]["pools"] = [
        {"namespace": "llm", "name": "bare", "selector": {"app": "a"}},
        {
            "namespace": "llm",
            "name": "full",
            "selector": {"app": "a", "tier": "x"},
            "target_ports": [8000, 8001],
            "failure_mode": "FailOpen",
            "picker": {
                "service": "full-svc",
                "names": "legacy",
                "flow_control": False,
                "queued": 3,
                "queued_bytes": "60KiB",
                "saturation": 1.5,
                "ready_endpoints": 7,
                "token": "t0k",
                "fault": "slow",
            },
        },
    ]
    bare, full = parse_scenario(d, "t.yaml").gateway.pools  # type: ignore[union-attr]
    assert bare.picker is None
    assert full.target_ports == (8000, 8001) and full.failure_mode == "FailOpen"
    assert full.picker is not None
    assert full.picker.queued_bytes == 60 * 1024 and full.picker.saturation == 1.5
    assert (full.picker.ready_endpoints, full.picker.token) == (7, "t0k")


def test_queued_bytes_follow_queued_unless_given() -> None:
    d = doc()
    d["gateway"]["pools"][0]["picker"] = {"queued": 30}
    d["phases"] = [{"name": "drain", "gateway": {"llm/pool-a": {"queued": 2, "saturation": 0.9}}}]
    scenario = parse_scenario(d, "t.yaml")
    picker = scenario.gateway.pools[0].picker  # type: ignore[union-attr]
    assert picker is not None and picker.queued_bytes == 30 * 2048
    later = scenario.at_phase("drain").gateway.pools[0].picker  # type: ignore[union-attr]
    assert later is not None
    assert (later.queued, later.queued_bytes, later.saturation) == (2, 4096, 0.9)
    assert later.service == "pool-a-epp"  # the rest kept


def _with(path: str, value: Any) -> dict[str, Any]:
    d = doc()
    target: Any = d["gateway"]
    *parts, last = path.split(".")
    for part in parts:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value
    return d


@pytest.mark.parametrize(
    ("d", "message"),
    [
        (_with("fault", "gone"), "gateway.fault: expected one of ok, not_served"),
        (
            _with("pool", []),
            "gateway.pool: expected one of the keys fault, pools (did you mean pools?)",
        ),
        (_with("pools.0.selector", {}), "gateway.pools[0].selector: expected 1 to 64 labels"),
        (
            _with("pools.0.selector", None),
            "gateway.pools[0].selector: expected a mapping of labels",
        ),
        (_with("pools.0.name", None), "gateway.pools[0].name: expected an InferencePool name"),
        (
            _with("pools.0.target_ports", [0]),
            "gateway.pools[0].target_ports[0]: expected an integer >= 1",
        ),
        (_with("pools.0.target_ports", [70000]), "target_ports[0]: expected a port number"),
        (_with("pools.0.target_ports", [80, 80]), "target_ports: expected unique port numbers"),
        (_with("pools.0.target_ports", []), "target_ports: expected 1 to 8 ports"),
        (
            _with("pools.0.failure_mode", "FailOpn"),
            "failure_mode: expected one of FailClose, FailOpen",
        ),
        (
            _with("pools.0.picker", {"names": "new"}),
            "picker.names: expected one of both, llm_d_epp, legacy",
        ),
        (
            _with("pools.0.picker", {"fault": "truncated"}),
            "picker.fault: expected one of ok, refuse",
        ),
        (_with("pools.0.picker", {"queud": 1}), "picker.queud: expected one of the keys"),
        (_with("pools.0.picker", {"queued": -1}), "picker.queued: expected an integer >= 0"),
        (_with("pools.0.picker", {"saturation": "high"}), "picker.saturation: expected a number"),
        (
            _with("pools.0.picker", {"flow_control": "yes"}),
            "picker.flow_control: expected true or false",
        ),
        (
            _with("pools", [{"name": "p", "selector": {"a": "b"}}] * 2),
            "gateway.pools: expected unique namespace/name pairs",
        ),
        (
            _with(
                "pools",
                [
                    {"name": "p", "selector": {"a": "b"}, "picker": {"service": "s"}},
                    {"name": "q", "selector": {"a": "b"}, "picker": {"service": "s"}},
                ],
            ),
            "gateway.pools: expected unique picker Services per namespace",
        ),
    ],
)
def test_errors_name_the_path(d: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(d, "t.yaml")
    assert message in str(err.value)


def test_did_you_mean_in_a_picker() -> None:
    with pytest.raises(ScenarioError, match=r"picker\.queud: .*\(did you mean queued\?\)"):
        parse_scenario(_with("pools.0.picker", {"queud": 1}), "t.yaml")


def test_a_gateway_needs_kubernetes() -> None:
    d = doc()
    del d["kubernetes"]
    with pytest.raises(
        ScenarioError, match=r"t.yaml: gateway: expected a scenario with kubernetes"
    ):
        parse_scenario(d, "t.yaml")


@pytest.mark.parametrize(
    ("patches", "message"),
    [
        ({"llm/pool-b": {}}, "phases[0].gateway.llm/pool-b: expected namespace/name of a pool"),
        ({"llm/pool-a": {"queue": 1}}, "(did you mean queued?)"),
        (
            {"llm/pool-a": {"names": "legacy"}},
            "phases[0].gateway.llm/pool-a.names: expected one of",
        ),
        (
            {"llm/pool-a": {"saturation": -1}},
            "phases[0].gateway.llm/pool-a.saturation: expected a number",
        ),
        ({"llm/pool-a": {"fault": "melt"}}, "phases[0].gateway.llm/pool-a.fault: expected one of"),
        ({"llm/pool-a": 3}, "phases[0].gateway.llm/pool-a: expected a mapping"),
    ],
)
def test_phase_patches_are_checked_when_the_file_is_read(
    patches: dict[str, Any], message: str
) -> None:
    d = doc()
    d["phases"] = [{"name": "p", "gateway": patches}]
    with pytest.raises(ScenarioError) as err:
        parse_scenario(d, "t.yaml")
    assert message in str(err.value)


def test_a_phase_cannot_patch_a_pool_without_a_picker() -> None:
    d = doc()
    del d["gateway"]["pools"][0]["picker"]
    d["phases"] = [{"name": "p", "gateway": {"llm/pool-a": {"queued": 1}}}]
    with pytest.raises(ScenarioError, match=r"a pool under gateway\.pools with a picker"):
        parse_scenario(d, "t.yaml")


def test_a_phase_without_gateway_keeps_it() -> None:
    d = copy.deepcopy(doc())
    d["phases"] = [{"name": "p", "pods": {"llm/a-2": {"ready": False}}}]
    scenario = parse_scenario(d, "t.yaml")
    assert scenario.at_phase("p").gateway == scenario.gateway
