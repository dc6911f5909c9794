"""Scenario files: valid ones load, invalid ones say file, path and expectation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.sim.scenario import ScenarioError, load_scenario, parse_scenario

GPU = "GPU-11111111-1111-4111-8111-111111111111"


def test_demo_scenario_loads() -> None:
    from gpuledger.cli.simulate import demo_scenario_path

    scenario = load_scenario(demo_scenario_path())
    assert len(scenario.gpus) == 8
    assert scenario.at_phase("gpu-lost").gpus[6].lost


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"gpus": [{"uuid": "nvidia0"}]}, "t.yaml: gpus[0].uuid: expected a GPU UUID starting"),
        ({"gpus": [{"uuid": GPU, "utilization": 3}]}, "gpus[0].utilization: expected a ratio"),
        ({"gpus": [{"uuid": GPU}, {"uuid": GPU}]}, "gpus: expected unique GPU UUIDs"),
        (
            {"gpus": [{"uuid": GPU}], "processes": [{"pid": 5, "gpu_memory": {"GPU-x": 1}}]},
            "processes[0].gpu_memory.GPU-x: expected the UUID or index of a GPU",
        ),
        ({"processes": [{"pid": 1}]}, "processes[0].pid: expected an integer >= 2"),
        ({"gpu": []}, "t.yaml: gpu: expected one of the keys"),
        ({"nvml": {"variants": ["v9"]}}, "nvml.variants[0]: expected one of no_v3"),
        ({"phases": [{"name": "p", "after": "soon"}]}, "phases[0].after: expected a duration"),
        ([1, 2], "t.yaml: (top level): expected a YAML mapping"),
    ],
)
def test_errors_name_the_path(doc: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(doc, "t.yaml")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_phase_lists_known_ones() -> None:
    scenario = parse_scenario({"phases": [{"name": "a"}]}, "t.yaml")
    with pytest.raises(ScenarioError, match=r"no phase named 'b' \(have: a\)"):
        scenario.at_phase("b")


def test_phases_apply_in_order() -> None:
    doc = {
        "gpus": [{"uuid": GPU}],
        "processes": [{"pid": 10, "gpu_memory": {GPU: "1GiB"}}],
        "phases": [
            {"name": "grow", "processes": {10: {"gpu_memory": {GPU: "2GiB"}}}},
            {"name": "add", "add_processes": [{"pid": 11}]},
            {"name": "exit", "processes": {10: None}},
        ],
    }
    s = parse_scenario(doc, "t.yaml")
    assert s.at_phase("grow").processes[0].gpu_memory[GPU] == 2 * 1024**3
    assert [p.pid for p in s.at_phase("add").processes] == [10, 11]
    assert [p.pid for p in s.at_phase("exit").processes] == [11]


def test_unreadable_and_non_yaml_files(tmp_path: Any) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [\n")
    with pytest.raises(ScenarioError, match=r"bad.yaml: line \d+: not valid YAML"):
        load_scenario(bad)


yaml_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "node",
                    "gpus",
                    "processes",
                    "phases",
                    "nvml",
                    "uuid",
                    "pid",
                    "gpu_memory",
                    "name",
                    "memory_total",
                    "cmdline",
                    "environ",
                    "lost",
                    "after",
                    "library",
                    "x",
                ]
            )
            | st.text(max_size=5),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@given(yaml_values)
def test_any_document_is_accepted_or_rejected_with_scenario_error(doc: Any) -> None:
    try:
        parse_scenario(doc, "fuzz.yaml")
    except ScenarioError as exc:
        assert str(exc).startswith("fuzz.yaml: ")
