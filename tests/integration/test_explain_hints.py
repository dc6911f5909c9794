"""`gpuledger explain` says what to do next and answers a near miss with candidates
(issue 16, items 3 and 4): next steps, host processes, ambiguous GPUs, "did you mean",
and the CUDA ordinal against the container ordinal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache

import pytest

from gpuledger.cli.simulate import demo_scenario_path
from gpuledger.document.v1 import LedgerDocument
from gpuledger.explain.chain import (
    EXIT_NOT_FOUND,
    ORDINAL_NOTE,
    ExplainError,
    candidates,
    explain,
    render_text,
)
from gpuledger.sim.harness import settled_document
from gpuledger.sim.scenario import load_scenario
from tests.conftest import REPO

NODE = REPO / "tests" / "fixtures" / "scenarios" / "explain-node.yaml"
HOST_ONLY_GPU = "GPU-e3bed46b-78f4-b8dc-ef6f-847b54d1fe44"  # demo: index 7, a host python3
# Relative to the agent that serves the document: every agent serves /runbooks.
# The demo's engine is at max_num_seqs with KV headroom (its slots are the bound).
SLOTS_RUNBOOK = "runbooks#gpuledgerenginequeueingatmaxnumseqs"


@cache
def demo() -> LedgerDocument:
    return settled_document(load_scenario(demo_scenario_path()))


@cache
def node() -> LedgerDocument:
    return settled_document(load_scenario(NODE))


def _not_found(**query: str) -> str:
    with pytest.raises(ExplainError) as err:
        explain([demo()], **query)
    assert err.value.code == EXIT_NOT_FOUND
    return str(err.value)


# ---------------------------------------------------------------------------- next steps


def test_every_verdict_says_what_to_do_next_with_the_alerts_runbook() -> None:
    result = explain([demo()], workload="llm/llama-8b")
    v = result["workloads"][0]["verdict"]
    assert v["next_step"].startswith("Raise the batch-slot bound (vLLM --max-num-seqs")
    assert v["runbook_url"] == SLOTS_RUNBOOK
    lines = render_text(result).splitlines()
    at = lines.index(f"    next step: {v['next_step']}")
    assert lines[at + 1] == (
        f"    runbook: /{SLOTS_RUNBOOK} on any gpuledger agent (docs/runbooks.md)"
    )
    assert lines[at - 1].startswith("    evidence: ")


def test_a_verdict_no_alert_pages_for_has_a_next_step_and_no_runbook_line() -> None:
    result = explain([demo()], workload="train/finetune")
    v = result["workloads"][0]["verdict"]
    assert v["stage"] == "no_engine" and v["runbook_url"] is None
    text = render_text(result)
    assert f"    next step: {v['next_step']}" in text and "runbook:" not in text


def test_json_output_carries_the_next_step() -> None:
    result = json.loads(json.dumps(explain([node()], workload="serve/chat"), default=str))
    v = result["workloads"][0]["verdict"]
    assert (v["stage"], v["reason"]) == ("routing", "imbalance")
    assert v["runbook_url"].endswith("#gpuledgerroutingimbalance")
    assert "scaling out will not help" in v["next_step"]


# ---------------------------------------------------------------------------- candidates


def test_a_gpu_held_only_by_a_host_process_names_the_process() -> None:
    result = explain([demo()], gpu=HOST_ONLY_GPU[:12])
    assert result["workloads"] == []
    [proc] = result["gpu"]["host_processes"]
    assert (proc["pid"], proc["title"], proc["used_bytes"]) == (47000, "python3", 4 * 2**30)
    text = render_text(result)
    assert (
        f"  host process 47000 python3 (in no pod)  holds cuda:0 = {HOST_ONLY_GPU} 4.0 GiB" in text
    )
    assert "no pod holds or uses this GPU" not in text


def test_a_gpu_nobody_holds_says_so() -> None:
    free = next(g.uuid for g in demo().gpus if g.index == 6)
    result = explain([demo()], gpu=free)
    assert result["gpu"]["host_processes"] == [] and result["workloads"] == []
    assert "  no pod holds or uses this GPU" in render_text(result)


def test_an_ambiguous_gpu_prefix_lists_the_matching_gpus() -> None:
    message = _not_found(gpu="GPU-7")
    first, *listed = message.splitlines()
    assert first == "3 GPUs match 'GPU-7'; give more of the UUID:"
    by_uuid = {g.uuid: g.index for g in demo().gpus}
    assert [line.split()[0] for line in listed] == [
        u for u in sorted(by_uuid, key=by_uuid.__getitem__) if u.startswith("GPU-7")
    ]
    for line in listed:
        uuid = line.split()[0]
        assert line == f"  {uuid}  index {by_uuid[uuid]} on demo-gpu-node-1"


@pytest.mark.parametrize(
    ("query", "meant"),
    [
        ({"workload": "llama-8b"}, "llm/llama-8b"),  # without its namespace
        ({"workload": "llm/lama-8b"}, "llm/llama-8b"),  # misspelt
        ({"pod": "llama-8b"}, "llm/llama-8b-5f7c9d8b6-q7x2k"),  # the workload's name
        ({"pod": "notebook-alice"}, "research/notebook-alice"),
    ],
)
def test_a_name_matching_nothing_answers_with_candidates(query: dict[str, str], meant: str) -> None:
    assert _not_found(**query).endswith(f"; did you mean {meant}?")


def test_a_name_like_nothing_has_no_candidates() -> None:
    assert "did you mean" not in _not_found(workload="zzz-unrelated")


def test_candidates_order_same_name_then_prefix_then_spelling() -> None:
    names = ["a/chat", "b/chat", "a/chat-large", "c/chta", "d/other"]
    assert candidates("chat", names) == ["a/chat", "b/chat", "a/chat-large", "c/chta"]
    assert candidates("a/", names) == ["a/chat", "a/chat-large"]


def test_cli_did_you_mean_exits_1_with_one_line() -> None:
    scenario = str(demo_scenario_path())
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuledger",
            "explain",
            "--scenario",
            scenario,
            "--workload",
            "llama-8b",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
    )
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "gpuledger: workload 'llama-8b' is in no ledger read (expected NAMESPACE/NAME); "
        "did you mean llm/llama-8b?"
    ]


# ---------------------------------------------------------------------------- ordinals


def test_a_process_renumbering_its_gpus_is_explained_where_it_happens() -> None:
    text = render_text(explain([demo()], workload="train/finetune"))
    lines = text.splitlines()
    # The container gives ordinal 0 to the GPU its process calls cuda:1 (CUDA_VISIBLE_DEVICES=1,0).
    assert (
        any(line.startswith("      ordinal 0 -> GPU-cba58627") for line in lines)
        and "cuda:1 = GPU-cba58627" in text
    )
    note = next(line for line in lines if line.startswith("    note: "))
    assert note == (
        "    note: process 45000 calls its container's ordinal 0 cuda:1: its "
        "CUDA_VISIBLE_DEVICES renumbers the container's GPUs; the UUID names the GPU"
    )


def test_matching_numberings_get_the_general_note_once() -> None:
    text = render_text(explain([node()], workload="serve/chat"))  # two pods, cuda:0 = ordinal 0
    assert text.count("ordinal 0 ->") == 2
    assert text.splitlines().count(ORDINAL_NOTE) == 1


def test_no_note_where_only_one_numbering_appears() -> None:
    text = render_text(explain([demo()], gpu=HOST_ONLY_GPU))
    assert "note:" not in text
