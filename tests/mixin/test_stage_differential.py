"""One truth for stages: `gpuledger explain` on the ledger and the mixin's recording rules on
the exposition give every workload the same stage and reason.

Every scenario under tests/fixtures/scenarios/ and the `gpuledger demo` scenario, at each of
its phases, plus the node and cluster views of one cluster together, run through both paths
from the same snapshot (tests/mixin/stage_differential.py). Both sides read
exporter/gpuledger/stages.json; the tests at the end change a threshold or a precedence on
one side only and require the check to report it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli.simulate import demo_scenario_path
from gpuledger.explain.verdict import STAGES, Thresholds
from gpuledger.sim.scenario import load_scenario
from tests.mixin.helpers import REPO, config, recordings, render_module, rule_groups
from tests.mixin.stage_differential import (
    Snapshot,
    python_judgements,
    rule_mismatches,
    take_snapshot,
)

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
DEMO = demo_scenario_path()

# (scenario, phase); None is the scenario before its first phase.
Part = tuple[Path, str | None]


def _phases(path: Path) -> list[Part]:
    scenario = load_scenario(path)
    return [(path, None), *((path, p.name) for p in scenario.phases)]


# One exporter each, then the node agent and the cluster view of one cluster together.
CASES: dict[str, list[Part]] = {
    f"{path.stem}@{phase or 'start'}": [(path, phase)]
    for path in [*sorted(SCENARIOS.glob("*.yaml")), DEMO]
    for path, phase in _phases(path)
}
CASES["explain-node+explain-cluster"] = [
    (SCENARIOS / "explain-node.yaml", None),
    (SCENARIOS / "explain-cluster.yaml", None),
]
CASES["e2e-node+e2e-cluster"] = [
    (SCENARIOS / "e2e-node.yaml", None),
    (SCENARIOS / "e2e-cluster.yaml", None),
]
CASES["gateway-node+gateway-cluster"] = [
    (SCENARIOS / "gateway-node.yaml", None),
    (SCENARIOS / "gateway-cluster.yaml", None),
]
# Issue 23's second half: the picker passes through, the engines fill to max_num_seqs.
CASES["gateway-node@engines-full+gateway-cluster@passing-through"] = [
    (SCENARIOS / "gateway-node.yaml", "engines-full"),
    (SCENARIOS / "gateway-cluster.yaml", "passing-through"),
]


@functools.cache
def snapshot(path: Path, phase: str | None) -> Snapshot:
    scenario = load_scenario(path)
    job = "gpuledger-cluster" if scenario.mode == "cluster" else "gpuledger"
    return take_snapshot(scenario, phase, job)


def _recording_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [g for g in groups if all("record" in r for r in g["rules"])]


@pytest.mark.parametrize("parts", CASES.values(), ids=CASES.keys())
def test_explain_and_the_recording_rules_agree(parts: list[Part]) -> None:
    snapshots = [snapshot(*part) for part in parts]
    assert python_judgements(snapshots), "the scenario names no workload: nothing compared"
    assert rule_mismatches(snapshots, _recording_groups(rule_groups())) == []


def test_the_demo_workloads_without_an_engine_are_no_engine_on_both_sides() -> None:
    """The bug this test file exists for: the rules put the demo's notebook, embed, rerank
    and finetune in `idle`, explain in `no_engine`."""
    judged = python_judgements([snapshot(DEMO, None)])
    for key in [
        ("research", "notebook-alice"),
        ("search", "embed"),
        ("search", "rerank"),
        ("train", "finetune"),
    ]:
        assert judged[key] == ("no_engine", None), key
    assert judged[("llm", "llama-8b")] == ("engine_queueing", "max_num_seqs")


@pytest.mark.parametrize(
    ("case", "want"),
    [
        ("gateway-node+gateway-cluster", ("routing", "gateway_queue")),
        (
            "gateway-node@engines-full+gateway-cluster@passing-through",
            ("engine_queueing", "max_num_seqs"),
        ),
    ],
)
def test_a_pool_of_three_engines_is_the_gateways_while_its_picker_queues_then_the_engines(
    case: str, want: tuple[str, str]
) -> None:
    """Issue 23's "Done when", on both sides: picker queue 30 with every engine below
    max_num_seqs is routing (gateway_queue); the picker passing through to engines at
    max_num_seqs is engine queueing (max_num_seqs)."""
    snapshots = [snapshot(*part) for part in CASES[case]]
    assert python_judgements(snapshots)[("llm", "vllm-a")] == want
    assert rule_mismatches(snapshots, _recording_groups(rule_groups())) == []


# ---------------------------------------------------------------------------- one side only


def _rules(overrides: str) -> list[dict[str, Any]]:
    """The recording rules rendered with `overrides` added to the mixin."""
    render_module()  # asserts the jsonnet binding is there
    import _jsonnet

    snippet = f"((import 'mixin.libsonnet') + {overrides}).prometheusRules.groups"
    return json.loads(_jsonnet.evaluate_snippet("variant", snippet, jpathdir=[str(REPO / "mixin")]))  # type: ignore[no-any-return]


def _mismatches_on(part: Part, overrides: str, t: Thresholds | None = None) -> list[str]:
    return rule_mismatches([snapshot(*part)], _rules(overrides), t)


DEMO_START: Part = (DEMO, None)
DEMO_QUEUE: Part = (DEMO, "queue-builds")
ROUTING: Part = (SCENARIOS / "explain-node.yaml", None)


def test_unchanged_rules_agree_with_explain() -> None:
    """The control for the tests below: rendered here with no override, the rules agree."""
    assert _mismatches_on(DEMO_START, "{}") == []


@pytest.mark.parametrize(
    ("setting", "value", "part", "workload"),
    [
        # llama-8b's engine: 12 waiting, 48 running of --max-num-seqs 48, KV cache 62%:
        # with KV headroom only below 50%, its reason is no longer max_num_seqs.
        ("kvCacheHeadroomRatio", 0.5, DEMO_START, "llm/llama-8b"),
        # Later (queue-builds) its KV cache is 99%: at 0.995 it is no longer KV pressure.
        ("kvCachePressureRatio", 0.995, DEMO_QUEUE, "llm/llama-8b"),
        ("queueingMinWaitingRequests", 20, DEMO_START, "llm/llama-8b"),
        # chat-1, chat's idle sibling, has 10% of its KV cache in use.
        ("kvCacheHeadroomRatio", 0.05, ROUTING, "serve/chat"),
    ],
)
def test_a_threshold_changed_in_the_mixin_only_is_reported(
    setting: str, value: float, part: Part, workload: str
) -> None:
    found = _mismatches_on(part, f"{{ _config+:: {{ {setting}: {value} }} }}")
    assert [m for m in found if m.startswith(workload + ":")], found


def test_a_threshold_changed_in_python_only_is_reported() -> None:
    found = _mismatches_on(DEMO_START, "{}", Thresholds(kv_headroom=0.5))
    assert [m for m in found if m.startswith("llm/llama-8b:")], found


def test_a_reason_precedence_changed_in_the_mixin_only_is_reported() -> None:
    """A KV-bound engine also meets `other`: with the reasons reversed the rules say other."""
    reversed_reasons = """{ _stages+:: { stages: [
      s + (if s.stage == 'engine_queueing' then { reasons: std.reverse(s.reasons) } else {})
      for s in super.stages
    ] } }"""
    found = _mismatches_on(DEMO_START, reversed_reasons)
    assert [m for m in found if m.startswith("llm/llama-8b:")], found


def test_a_stage_precedence_changed_in_the_mixin_only_is_reported() -> None:
    """chat queues on one replica while the other has headroom: routing outranks queueing.
    With the two stages swapped in the mixin only, the rules say engine_queueing."""
    swapped = """{ _stages+:: {
      local old = super.stages,
      local named(stage) = [s for s in old if s.stage == stage][0],
      local other = { routing: 'engine_queueing', engine_queueing: 'routing' },
      stages: [
        if std.objectHas(other, s.stage) then named(other[s.stage]) { code: s.code } else s
        for s in old
      ],
    } }"""
    found = _mismatches_on(ROUTING, swapped)
    assert [m for m in found if m.startswith("serve/chat:")], found


def test_stage_codes_out_of_precedence_order_do_not_render() -> None:
    """The rules pick the first stage that holds, in stages.json order; a code must say the
    same, or the state timeline and the onehot series would name another stage."""
    swapped_codes = """{ _stages+:: { stages: [
      s + (if s.stage == 'routing' then { code: 3 } else {})
      + (if s.stage == 'engine_queueing' then { code: 4 } else {})
      for s in super.stages
    ] } }"""
    with pytest.raises(RuntimeError, match="codes"):
        _rules(swapped_codes)


# ---------------------------------------------------------------------------- one definition


def test_python_and_the_rendered_rules_name_the_same_stages_and_reasons() -> None:
    onehot = [
        r
        for r in recordings()
        if r["record"] == "namespace_workload_stage:gpuledger_stage_code:onehot"
    ]
    assert [r["labels"]["stage"] for r in onehot] == [s.stage for s in STAGES]
    assert [r["expr"].strip() for r in onehot] == [
        f"namespace_workload:gpuledger_stage_code:max == bool {s.code}" for s in STAGES
    ]
    pairs = [
        (r["labels"]["stage"], r["labels"].get("reason"))
        for r in recordings()
        if r["record"] == "namespace_workload_stage_reason:gpuledger_stage_reason_code:group"
    ]
    assert pairs == [(s.stage, r) for s in STAGES for r in (s.reasons or [None])]


def test_stage_codes_are_strictly_ordered_and_the_last_stage_always_holds() -> None:
    codes = [s.code for s in STAGES]
    assert codes == sorted(codes, reverse=True) and len(set(codes)) == len(codes)
    assert STAGES[-1].code == 0 and STAGES[-1].reasons == ()


def test_python_thresholds_are_the_mixin_defaults() -> None:
    c, t = config(), Thresholds()
    assert (
        c["queueingMinWaitingRequests"],
        c["kvCachePressureRatio"],
        c["kvCacheHeadroomRatio"],
    ) == (t.queueing_min_waiting, t.kv_pressure, t.kv_headroom)


@pytest.mark.parametrize("doc", ["explain.md", "metrics.md"])
def test_the_docs_list_every_stage_with_its_reasons_in_order(doc: str) -> None:
    text = (REPO / "docs" / doc).read_text()
    rows = {
        line.split("|")[1].strip(" `"): line
        for line in text.splitlines()
        if line.startswith("| `") and line.split("|")[1].strip(" `") in {s.stage for s in STAGES}
    }
    assert list(rows) == [s.stage for s in STAGES], f"docs/{doc}: stage table out of order"
    for s in STAGES:
        places = [rows[s.stage].find(f"`{r}`") for r in s.reasons]
        assert -1 not in places and places == sorted(places), (doc, s.stage, s.reasons)
