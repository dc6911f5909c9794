"""The demo's /ledger.json as the typed document writes it: the same JSON as the untyped
code wrote (tests/fixtures/ledger_documents/v1-3566608.json) but for what changes each run,
and valid against docs/ledger.schema.json."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

import jsonschema

from gpuledger.export.document import document_bytes
from gpuledger.sim.harness import settled_document
from gpuledger.sim.scenario import load_scenario
from tests.conftest import REPO

DEMO = REPO / "exporter/gpuledger/sim/scenarios/demo.yaml"
BEFORE = REPO / "tests/fixtures/ledger_documents/v1-3566608.json"


@cache
def demo_json() -> str:
    return document_bytes(settled_document(load_scenario(DEMO))).decode()


def _steady(text: str) -> str:
    """Without what differs from run to run: times and the simulated engine's port."""
    text = re.sub(r'"(taken_at|duration_seconds)": [0-9.e-]+', r'"\1": 0', text)
    return re.sub(r"127\.77\.0\.1:\d+", "127.77.0.1:PORT", text)


def test_the_demo_document_is_the_json_it_was() -> None:
    now: dict[str, Any] = json.loads(demo_json())
    for engine in now["engines"]:
        assert (engine.pop("error_reason"), engine.pop("kind")) == (None, "vllm")
        # Added since: the demo's TP-2 engine sits on two GPUs of one NVSwitch fabric.
        assert engine.pop("gpu_link") == "nvlink"
    assert now["ray"].pop("engine_links") == []
    # Changed since (issue 24): the demo's engine sends request spans, so the receiver is
    # a source and the spans are in the document; its engine is at --max-num-seqs 48 with
    # KV headroom (62%) instead of KV-bound (93% of a 256-slot batch).
    assert now.pop("spans")["receiving"] is True
    assert now.pop("gateway") == {"pools": []}  # added since (issue 23): a node has none
    now["sources"] = [s for s in now["sources"] if s["source"] != "otlp"]
    (engine,) = now["engines"]
    assert (engine["kv_cache_usage_ratio"], engine["config"]["max_num_seqs"]) == (0.62, "48")
    engine["kv_cache_usage_ratio"], engine["config"]["max_num_seqs"] = 0.93, "256"
    assert _steady(json.dumps(now, indent=1) + "\n") == _steady(BEFORE.read_text())


def test_the_demo_document_holds_to_the_published_schema() -> None:
    schema = json.loads((REPO / "docs/ledger.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(json.loads(demo_json()))
