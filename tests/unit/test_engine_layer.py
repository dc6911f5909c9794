"""The generic engine layer (issue 26, item 3): what is vLLM's lives in its kind module.

The grep check reads code, not prose: identifiers, imported names and string literals
that are not sentences (docstrings, comments, help and log text may say what vLLM does).
Outside the vLLM modules, vLLM's fake and the allow-list below, no code names vLLM.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpuledger.engines import KINDS, is_engine_title, parse_engine_title
from gpuledger.engines.kinds import EngineProcess
from gpuledger.engines.vllm import VLLM
from gpuledger.sim.scenario import ScenarioError, parse_scenario
from gpuledger.sources.engines.discovery import discover_targets
from gpuledger.sources.engines.exposition import looks_like
from tests.unit.ledger_inputs import pod

PACKAGE = Path(__file__).resolve().parents[2] / "exporter" / "gpuledger"
# What may name vLLM: its kind, and the simulator's vLLM fake.
VLLM_MODULES = {"engines/vllm.py", "sim/fake_vllm.py"}
# User-facing strings, and the few places that pick the vLLM module by name.
# (module, exact string or identifier) -> why it stays.
ALLOWED: dict[tuple[str, str], str] = {
    ("engines/__init__.py", "gpuledger.engines.vllm"): "the registry of kinds imports each kind",
    ("engines/__init__.py", "VLLM"): "the registry of kinds",
    ("model/engines.py", "vllm"): "the `source` label value users see, kept",
    ("model/engines.py", "not_vllm"): "an error reason users may query, kept",
    ("ledger/node.py", "vllm"): "the source's name, keying its 'unknown' sentence",
    ("sim/scenario.py", "vllm"): "the scenario key's alias for older files",
    ("sim/harness.py", "gpuledger.sim.fake_vllm"): "the harness starts the vLLM fake",
    ("sim/harness.py", "FakeVllmServer"): "the harness starts the vLLM fake",
    ("sim/harness.py", "fake_vllm"): "the harness's renderer of each kind's fake",
    ("sim/scenario.py", "fake_vllm"): "the style check reads each kind's fake's styles",
    ("sim/fake_sglang.py", "gpuledger.sim.fake_vllm"): "the fakes share one HTTP server",
    ("sim/fake_sglang.py", "FakeVllmServer"): "the fakes share one HTTP server",
    ("sim/fake_picker.py", "gpuledger.sim.fake_vllm"): "the picker's fake shares that server",
    ("sim/fake_picker.py", "FakeVllmServer"): "the picker's fake shares that server",
    ("cli/flags.py", "--vllm-target"): "a CLI flag users type",
    ("cli/flags.py", "--vllm-discovery"): "a CLI flag users type",
    ("cli/flags.py", "VLLM_TARGETS"): "an environment variable users set",
    ("cli/flags.py", "VLLM_DISCOVERY"): "an environment variable users set",
    ("cli/serve.py", "VLLM_TARGETS"): "an environment variable users set",
    ("cli/serve.py", "vllm_target"): "argparse's name for --vllm-target",
    ("cli/serve.py", "vllm_discovery"): "argparse's name for --vllm-discovery",
    ("export/families.py", "`vllm:num_preemptions_total`."): "docs/metrics.md text",
}
_NAMES_VLLM = re.compile("vllm", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(id(value))
    return found


def _code_words(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every identifier, imported name and string literal but docstrings."""
    skip = _docstrings(tree)
    words: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if " " not in node.value.strip():  # a sentence is text for people
                words.append((line, node.value))
        elif isinstance(node, ast.Name):
            words.append((line, node.id))
        elif isinstance(node, ast.Attribute):
            words.append((line, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.append((line, node.name))
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            words.append((line, node.arg))
        elif isinstance(node, ast.ImportFrom) and node.module:
            words.append((line, node.module))
            words.extend((line, a.asname or a.name) for a in node.names)
        elif isinstance(node, ast.alias):
            words.append((line, node.name))
    return words


def vllm_mentions(path: Path, source: str | None = None) -> list[str]:
    relative = path.relative_to(PACKAGE).as_posix()
    tree = ast.parse(source if source is not None else path.read_text(), filename=relative)
    return sorted(
        {
            f"{relative}:{line}: {text!r}"
            for line, text in _code_words(tree)
            if _NAMES_VLLM.search(text) and (relative, text) not in ALLOWED
        }
    )


def test_no_code_outside_the_vllm_modules_names_vllm() -> None:
    found = [
        mention
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).as_posix() not in VLLM_MODULES
        for mention in vllm_mentions(path)
    ]
    assert found == []


def test_the_check_catches_a_vllm_title_put_back_in_the_join() -> None:
    path = PACKAGE / "ledger" / "engines.py"
    assert vllm_mentions(path) == []
    source = path.read_text() + '\n_TITLE = "VLLM::EngineCore"\n'
    assert vllm_mentions(path, source) == [
        "ledger/engines.py:" + _last_line(source) + ": 'VLLM::EngineCore'"
    ]


def _last_line(source: str) -> str:
    return str(len(source.rstrip("\n").split("\n")))


def test_every_allowance_is_still_needed() -> None:
    used = {
        (path.relative_to(PACKAGE).as_posix(), text)
        for path in PACKAGE.rglob("*.py")
        for _, text in _code_words(ast.parse(path.read_text()))
    }
    assert set(ALLOWED) - used == set()


def test_the_kinds_package_is_pure() -> None:
    # The join and the sources import it: it may import only the standard library, the
    # model, the identity rules and itself (the layer matrix, test_architecture.py).
    for path in (PACKAGE / "engines").glob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {
            n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        } | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        outside = {
            m
            for m in modules
            if m.startswith("gpuledger")
            and not m.startswith(("gpuledger.engines", "gpuledger.model", "gpuledger.identity"))
        }
        assert outside == set(), path.name
        assert not {m for m in modules if m.split(".")[0] in ("socket", "http", "urllib", "ssl")}


def test_vllm_titles_through_the_kind() -> None:
    assert parse_engine_title("VLLM::Worker_DP1_PP0_TP3", 7) == EngineProcess(
        7, "worker", 1, 0, 3, "vllm"
    )
    assert parse_engine_title("VLLM::EngineCore_DP2") == EngineProcess(
        0, "engine_core", 2, None, None, "vllm"
    )
    assert parse_engine_title("VLLM::APIServer_0") is None  # retitled, but no role we join
    assert is_engine_title("VLLM::APIServer_0") and not is_engine_title("python3")


def test_discovery_names_the_kind_its_annotation_belongs_to() -> None:
    annotated, candidate = discover_targets(
        [
            pod(1, ip="10.0.0.1", annotations={VLLM.port_annotation: "8000"}),
            pod(2, ip="10.0.0.2", annotations={"prometheus.io/port": "9000"}),
        ],
        (),
    )
    static = discover_targets([], ["http://10.9.9.9:8000/metrics"])[0]
    assert (annotated.kind, candidate.kind, static.kind) == ("vllm", "", "")


def test_a_body_is_recognised_by_its_kinds_markers() -> None:
    assert [
        k.name for k in KINDS if looks_like("x 1\n vllm:num_requests_running 1\n", k.markers)
    ] == ["vllm"]
    assert not any(looks_like("# HELP vllm:x a comment only\nup 1\n", k.markers) for k in KINDS)


ENGINE = {"pod": "ns/p", "engines": [{"model_name": "m"}]}


def _scenario(extra: dict[str, object]) -> dict[str, object]:
    pods = {"pods": [{"namespace": "ns", "name": "p"}]}
    return {"node": "n", "gpus": [], "processes": [], "kubernetes": pods, **extra}


def test_the_older_vllm_key_reads_as_engines_of_kind_vllm() -> None:
    old = parse_scenario(
        _scenario(
            {"vllm": [ENGINE], "phases": [{"name": "later", "vllm": {"ns/p": {"fault": "hang"}}}]}
        ),
        "old.yaml",
    )
    new = parse_scenario(
        _scenario(
            {
                "engines": [{"kind": "vllm", **ENGINE}],
                "phases": [{"name": "later", "engines": {"ns/p": {"fault": "hang"}}}],
            }
        ),
        "new.yaml",
    )
    assert [(e.kind, e.key) for e in old.engines] == [("vllm", "ns/p")]
    assert [e.fault for e in old.at_phase("later").engines] == ["hang"]
    assert [(e.kind, e.key, e.engines) for e in new.engines] == [
        (e.kind, e.key, e.engines) for e in old.engines
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"engines": [ENGINE]}, "kind"),
        ({"engines": [{"kind": "tgi", **ENGINE}]}, "one of vllm"),
        (
            {"engines": [{"kind": "vllm", **ENGINE}], "vllm": [ENGINE]},
            "only one of vllm and engines",
        ),
    ],
)
def test_engine_entries_name_a_known_kind(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(_scenario(extra), "bad.yaml")
