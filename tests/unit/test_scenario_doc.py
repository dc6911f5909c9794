"""docs/scenarios.md documents exactly the keys the scenario parser accepts.

The parser declares each object's keys (`scenario.OBJECT_KEYS`); these tests hold that
table to what the parser enforces, and the document's reference tables to the table, so a
key added to the parser without a line in the document (or the other way round) fails.
"""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

import pytest
import yaml

from gpuledger.sim import scenario
from gpuledger.sim.scenario import OBJECT_KEYS, ScenarioError, parse_scenario
from tests.conftest import REPO

DOC = REPO / "docs" / "scenarios.md"
GPU = "GPU-00000000-0000-4000-8000-000000000000"
GPU_MIG = "GPU-00000000-0000-4000-8000-000000000001"
MIG = "MIG-00000000-0000-5000-8000-000000000000"
UNKNOWN = "zz_not_a_key"
_HEADING = re.compile(r"^#{2,4} (.*)$")
_OBJECT = re.compile(r"^`([^`]+)`$")
_ROW = re.compile(r"^\| `(\w+)` \|")


def documented_keys() -> dict[str, set[str]]:
    """Reference table keys by object: rows `| \\`key\\` | …` under a heading `` `path` ``."""
    tables: dict[str, set[str]] = {}
    current: str | None = None
    in_code = False
    for line in DOC.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (heading := _HEADING.match(line)):
            path = _OBJECT.match(heading.group(1).strip())
            current = path.group(1) if path else None
        elif not in_code and current and (row := _ROW.match(line)):
            tables.setdefault(current, set()).add(row.group(1))
    return tables


def skeleton() -> dict[str, Any]:
    """A valid scenario with one of every object OBJECT_KEYS names."""
    return {
        "node": "n1",
        "nvml": {},
        # The first GPU is the one `gpus[]` locates: it has the MIG device `gpus[].mig[]`.
        "gpus": [{"uuid": GPU_MIG, "mig": [{"uuid": MIG, "profile": "1g.10gb"}]}, {"uuid": GPU}],
        "processes": [{"pid": 100}],
        "kubernetes": {
            "pods": [
                {
                    "name": "p",
                    "containers": [{"name": "main"}],
                    "owner": {"kind": "Job", "name": "j"},
                    "pending": {},
                }
            ]
        },
        "podresources": {
            "allocations": [{"pod": "p"}],
            "dynamic": [{"pod": "p", "claim": "c", "device": "gpu-0"}],
        },
        "dra": {
            "slices": [{"devices": [{"name": "gpu-0", "gpu": GPU}]}],
            "claims": [{"name": "c"}],
        },
        "engines": [
            {"kind": "sglang", "pod": "default/p", "engines": [{}], "server_info": {}},
            {"kind": "vllm", "name": "v", "engines": [{}], "requests": [{"id": "r-1"}]},
        ],
        "ray": {
            "nodes": [{"name": "head"}],
            "actors": [{}],
            "placement_groups": [{}],
            "jobs": [
                {"driver": {"node": "head", "pid": 2}, "workers": [{"node": "head", "pid": 3}]}
            ],
            "serve": {
                "applications": [
                    {
                        "deployments": [
                            {"replicas": [{"node": "head"}], "routers": [{"node": "head"}]}
                        ]
                    }
                ]
            },
        },
        "gateway": {"pools": [{"name": "pool", "selector": {"app": "x"}, "picker": {}}]},
        "phases": [
            {
                "name": "later",
                "gpus": {GPU: {}},
                "processes": {100: {}},
                "pods": {"default/p": {}},
                "engines": {"default/p": {}},
                "gateway": {"default/pool": {}},
            }
        ],
    }


def locate(doc: dict[str, Any], path: str) -> dict[str, Any]:
    """The object at an OBJECT_KEYS path: `a.b[]` is a list's first item (the first that has
    the path's next key: one engine entry cannot be of two kinds), `<x>` a map's."""
    node: Any = doc
    if path == "(top level)":
        return node  # type: ignore[no-any-return]
    parts = path.split(".")
    for i, part in enumerate(parts):
        name = part.removesuffix("[]")
        node = next(iter(node.values())) if name.startswith("<") else node[name]
        if part.endswith("[]"):
            after = parts[i + 1].removesuffix("[]") if i + 1 < len(parts) else None
            node = next((n for n in node if after is None or after in n), node[0])
    return node  # type: ignore[no-any-return]


def test_the_skeleton_is_a_valid_scenario() -> None:
    parsed = parse_scenario(skeleton(), "t.yaml")
    assert parsed.at_phase("later").pods is not None


@pytest.mark.parametrize("path", sorted(OBJECT_KEYS))
def test_the_key_table_is_what_the_parser_enforces(path: str) -> None:
    """An unknown key at `path` is refused with exactly that object's declared keys."""
    doc = skeleton()
    locate(doc, path)[UNKNOWN] = 1
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(doc, "t.yaml")
    message = str(caught.value)
    assert f"{UNKNOWN}: expected one of the keys" in message, message
    listed = re.search(r"one of the keys ([\w, ]+?)(?: \(did you mean [^)]*\))?, got", message)
    assert listed, message
    assert set(listed.group(1).split(", ")) == OBJECT_KEYS[path]


# The functions that check keys, and which argument holds the allowed set.
_KEY_ARGUMENT = {"_check_keys": 1, "_patch": 2}


def test_every_key_check_uses_a_declared_table() -> None:
    """No object's keys are written inline, out of OBJECT_KEYS' (and the document's) sight."""
    tree = ast.parse(inspect.getsource(scenario))
    tables = {id(keys) for keys in OBJECT_KEYS.values()}
    checked = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef) or function.name in _KEY_ARGUMENT:
            continue  # the checkers themselves pass their parameter on
        for call in ast.walk(function):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                position = _KEY_ARGUMENT.get(call.func.id)
                if position is None:
                    continue
                keys = call.args[position]
                where = f"{function.name}, line {call.lineno}"
                assert isinstance(keys, ast.Name), f"{where}: an inline key set"
                assert id(getattr(scenario, keys.id)) in tables, (
                    f"{where}: {keys.id} not in OBJECT_KEYS"
                )
                checked.append(keys.id)
    assert set(checked) >= {"TOP_KEYS", "GPU_KEYS", "PHASE_KEYS", "POD_PATCH_KEYS"}, checked


def test_every_key_the_parser_accepts_is_documented() -> None:
    documented = documented_keys()
    missing = {
        path: sorted(keys - documented.get(path, set()))
        for path, keys in OBJECT_KEYS.items()
        if keys - documented.get(path, set())
    }
    assert not missing, f"docs/scenarios.md lacks these keys (by object): {missing}"


def test_the_document_names_no_key_the_parser_refuses() -> None:
    documented = documented_keys()
    unknown_objects = sorted(set(documented) - set(OBJECT_KEYS))
    assert not unknown_objects, (
        f"docs/scenarios.md documents objects the parser lacks: {unknown_objects}"
    )
    extra = {
        path: sorted(keys - OBJECT_KEYS[path])
        for path, keys in documented.items()
        if keys - OBJECT_KEYS[path]
    }
    assert not extra, f"docs/scenarios.md documents keys the parser refuses: {extra}"


def test_the_documents_examples_make_a_valid_scenario() -> None:
    """The sections' examples, read in order into one file, parse, and every phase applies."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert len(blocks) >= 9, "docs/scenarios.md lost its examples"
    merged: dict[str, Any] = {}
    for block in blocks:
        merged.update(yaml.safe_load(block))
    parsed = parse_scenario(merged, "scenarios.md")
    assert set(merged) == scenario.TOP_KEYS  # every section has an example
    for phase in parsed.phases:
        parsed.at_phase(phase.name)
