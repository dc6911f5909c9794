"""The typed ledger document: older agents' documents still read, the codec is strict on
types and keeps /ledger.json's bytes, the published JSON Schema is current and holds."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuledger.document.codec import DocumentError, from_json, to_json
from gpuledger.document.schema import rendered
from gpuledger.explain.chain import explain, render_text, verdicts
from gpuledger.web.node_page import render_page
from tests.conftest import REPO

FIXTURES = REPO / "tests/fixtures/ledger_documents"
STORED = sorted(FIXTURES.glob("v1-*.json"))
SCHEMA_FILE = REPO / "docs/ledger.schema.json"


def stored(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def test_a_document_of_each_released_shape_is_stored() -> None:
    assert [p.name for p in STORED] == [
        *("v1-3566608.json", "v1-4a16c02.json", "v1-8b2f5d9.json", "v1-b3d7eee.json")
    ]


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_an_older_agents_document_reads_and_explains(path: Path) -> None:
    doc = from_json(stored(path))
    assert doc.node == "demo-gpu-node-1" and len(doc.gpus) == 8
    verdict = verdicts([doc])[("llm", "llama-8b")]
    assert (verdict.stage, verdict.reason) == ("engine_queueing", "kv_cache")
    text = render_text(explain([doc], workload="llm/llama-8b"))
    assert "verdict: ENGINE QUEUEING" in text and "KV cache 93% (>= 90%)" in text
    assert "ordinal 1 -> GPU-76cb54a7-2b2e-ba14-5bc3-62625ee10c5a  host index 1" in text
    text = render_text(explain([doc], gpu="GPU-f75c9cdb"))
    assert text.count("workload llm/llama-8b") == 1
    assert 'id="node">demo-gpu-node-1<' in render_page(doc)


def test_a_document_older_than_source_state_reads_a_disabled_source_as_not_configured() -> None:
    raw = stored(FIXTURES / "v1-8b2f5d9.json")
    assert all("state" not in s for s in raw["sources"])
    raw["sources"][0] = {**raw["sources"][0], "up": False, "reason": "disabled"}
    result = explain([from_json(raw)], workload="llm/llama-8b")
    assert result["not_configured"] == {"demo-gpu-node-1": [raw["sources"][0]["source"]]}


def test_the_codec_keeps_the_bytes_of_ledger_json() -> None:
    """What the untyped code served, read and written again, is byte for byte the same
    (the fields added since aside: the engines' three, Ray's engine links, the spans,
    the gateway)."""
    path = FIXTURES / "v1-3566608.json"
    again = to_json(from_json(stored(path)))
    for engine in again["engines"]:
        assert (engine.pop("error_reason"), engine.pop("kind")) == (None, "vllm")
        assert engine.pop("gpu_link") is None
    assert again["ray"].pop("engine_links") == []
    assert again.pop("spans")["receiving"] is False
    assert again.pop("gateway") == {"pools": []}
    assert json.dumps(again, indent=1) + "\n" == path.read_text()


def _with_gpu(**changes: object) -> dict[str, Any]:
    raw = stored(FIXTURES / "v1-b3d7eee.json")
    raw["gpus"][0] = {**raw["gpus"][0], **changes}
    return raw


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"index": "0"}, "gpus[0].index: expected int, got str"),
        ({"index": True}, "gpus[0].index: expected int, got bool"),
        ({"up": 1}, "gpus[0].up: expected bool, got int"),
        ({"mig_devices": {}}, "gpus[0].mig_devices: expected array, got dict"),
        ({"uuid": None}, "gpus[0].uuid: expected str, got NoneType"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_with_its_path(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(DocumentError, match=re.escape(message)):
        from_json(_with_gpu(**changes))


def test_unknown_keys_are_ignored_and_a_missing_required_one_is_named() -> None:
    assert from_json(_with_gpu(from_a_newer_agent={"x": 1})).gpus[0].index == 0
    raw = _with_gpu()
    del raw["gpus"][0]["uuid"]
    with pytest.raises(DocumentError, match=r"gpus\[0\]\.uuid: missing"):
        from_json(raw)
    with pytest.raises(DocumentError, match=re.escape("not a gpuledger.io/ledger/v1 document")):
        from_json({**raw, "schema": "gpuledger.io/ledger/v2"})


def test_a_down_engine_says_why_it_does_not_answer() -> None:
    doc = from_json(stored(FIXTURES / "v1-b3d7eee.json"))
    down = dataclasses.replace(doc.engines[0], up=False, error_reason="timeout")
    verdict = verdicts([dataclasses.replace(doc, engines=(down,))])[("llm", "llama-8b")]
    assert verdict.stage == "starting"
    assert f"not answering at {down.url} (timeout)" in "\n".join(verdict.evidence)


def test_the_published_schema_is_current() -> None:
    assert SCHEMA_FILE.read_text() == rendered(), (
        "docs/ledger.schema.json is stale: run scripts/render-ledger-schema"
    )


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_every_stored_document_holds_to_the_schema(path: Path) -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(stored(path))


def test_the_schema_refuses_what_the_codec_refuses() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_with_gpu(index="0"), schema)


def _imports(module: str) -> set[str]:
    """Modules `module` imports, gpuledger's own followed transitively."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        path = REPO / "exporter" / Path(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if name in seen or not path.exists():
            seen.add(name)
            continue
        seen.add(name)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo.append(node.module)
            elif isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names)
    return seen


def test_the_document_types_reach_no_io_and_no_source() -> None:
    found = _imports("gpuledger.document.codec") | _imports("gpuledger.document.schema")
    io = {"socket", "ssl", "http", "urllib", "subprocess", "threading", "grpc", "kubernetes"}
    layers = ("gpuledger.sources", "gpuledger.net", "gpuledger.ledger", "gpuledger.export")
    assert not {m for m in found if m.split(".")[0] in io}
    assert not {m for m in found if m.startswith(layers)}
    assert "gpuledger.document.v1" in found  # the walk follows the package's own imports
