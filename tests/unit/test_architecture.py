"""The layer matrix of docs/design.md ("Layers"), checked on the source tree itself.

Imports are read from the code (ast), at module level and inside functions alike (a lazy
import still runs), but not under `if TYPE_CHECKING:` (those never run). The checks follow
imports transitively, so a leak through a helper module counts as much as a direct one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

import pytest

EXPORTER = Path(__file__).resolve().parents[2] / "exporter"
PACKAGE = EXPORTER / "gpuledger"

# Which layers each layer may import (besides itself and the package root's __version__).
# A layer is a subpackage of gpuledger, or a module at its root.
MAY_IMPORT: Mapping[str, frozenset[str]] = {
    name: frozenset(allowed)
    for name, allowed in {
        "model": (),
        "identity": ("model",),
        "engines": ("model", "identity"),
        "ledger": ("model", "identity", "engines"),
        "protocols": (),
        "net": ("identity",),
        "logs": (),
        "sources": ("model", "identity", "engines", "net", "protocols"),
        "document": ("model", "engines"),
        "export": ("model", "identity", "engines", "ledger", "document"),
        "explain": ("model", "identity", "engines", "document", "net"),
        "web": ("model", "identity", "engines", "document", "export", "explain", "net"),
        "pipeline": ("model", "identity", "engines", "ledger", "export", "sources"),
        "sim": (
            *("model", "identity", "engines", "protocols", "net", "document", "export"),
            "pipeline",
        ),
        "cli": (
            *("model", "identity", "engines", "ledger", "document", "export", "explain"),
            *("web", "net"),
            *("pipeline", "logs", "sim"),
        ),
    }.items()
}
# The pure layers: the join, the model and the identity rules reach none of these, even
# through another module.
PURE = ("model", "identity", "engines", "ledger", "document")
IO_LIBRARIES = frozenset(
    {
        *("socket", "ssl", "http", "urllib.request", "selectors", "subprocess", "ctypes"),
        *("requests", "urllib3", "grpc", "pynvml", "kubernetes", "prometheus_client"),
    }
)
IO_LAYERS = frozenset({"net", "sources", "protocols", "web", "sim", "cli", "pipeline"})


def module_name(path: Path) -> str:
    parts = path.relative_to(EXPORTER).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Mapping[str, Path] = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[str]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            yield from (m for n in node.orelse for m in _imports(n))
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            # `from gpuledger.x import y` may name a module y.
            yield from (f"{node.module}.{a.name}" for a in node.names)
        yield from _imports(node)


# Module -> source text used instead of the file's (the leak tests put a leak back).
_patched_source: dict[str, str] = {}


@cache
def imports_of(module: str) -> frozenset[str]:
    """What `module` imports when it runs: gpuledger modules by full name, others as named."""
    found: set[str] = set()
    source = _patched_source.get(module) or MODULES[module].read_text()
    for name in _imports(ast.parse(source)):
        if not name.startswith("gpuledger"):
            found.add(name)
            continue
        # The named module and every package above it run on import (but not the
        # packages above `module` itself: they are already running).
        parts = name.split(".")
        found.update(
            above
            for i in range(2, len(parts) + 1)
            if (above := ".".join(parts[:i])) in MODULES and not module.startswith(f"{above}.")
        )
    found.discard(module)
    return frozenset(found)


def reach(module: str) -> frozenset[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for name in imports_of(todo.pop()):
            if name not in seen:
                seen.add(name)
                if name in MODULES:
                    todo.append(name)
    return frozenset(seen)


def layer_of(module: str) -> str | None:
    """`gpuledger.ledger.node` -> "ledger"; the package root itself has no layer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _is_io(name: str) -> bool:
    return any(name == lib or name.startswith(f"{lib}.") for lib in IO_LIBRARIES)


def test_every_layer_is_declared() -> None:
    layers = {layer_of(m) for m in MODULES} - {None, "__main__"}
    assert layers <= MAY_IMPORT.keys(), sorted(layers - MAY_IMPORT.keys())


def matrix_violations() -> dict[str, list[str]]:
    offenders = {
        module: sorted(
            name
            for name in imports_of(module)
            if name in MODULES
            and layer_of(name) not in (None, layer_of(module))
            and layer_of(name) not in MAY_IMPORT.get(layer_of(module) or "", frozenset())
        )
        for module in MODULES
        if layer_of(module) not in (None, "__main__")
    }
    return {m: v for m, v in offenders.items() if v}


def impure_modules() -> dict[str, list[str]]:
    offenders = {
        module: sorted(
            name for name in reach(module) if _is_io(name) or layer_of(name) in IO_LAYERS
        )
        for module in MODULES
        if layer_of(module) in PURE
    }
    return {m: v for m, v in offenders.items() if v}


def sources_reaching_the_join() -> dict[str, list[str]]:
    offenders = {
        module: sorted(n for n in reach(module) if layer_of(n) in ("ledger", "export", "web"))
        for module in MODULES
        if layer_of(module) == "sources"
    }
    return {m: v for m, v in offenders.items() if v}


def document_reaching_the_collector() -> dict[str, list[str]]:
    # The exposition and the ledger document are two renderings of one published ledger.
    found = "gpuledger.export.collector" in reach("gpuledger.export.document")
    return {"gpuledger.export.document": ["gpuledger.export.collector"]} if found else {}


def _cycle(graph: Mapping[str, frozenset[str]]) -> list[str] | None:
    """A cycle of `graph`, as the path around it, or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, frozenset())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def module_cycle() -> dict[str, list[str]]:
    graph = {m: frozenset(n for n in imports_of(m) if n in MODULES) for m in MODULES}
    cycle = _cycle(graph)
    return {"modules": cycle} if cycle else {}


def package_cycle() -> dict[str, list[str]]:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        own = layer_of(module)
        if own is None:
            continue
        graph.setdefault(own, set()).update(
            layer for n in imports_of(module) if (layer := layer_of(n)) not in (None, own)
        )
    cycle = _cycle({k: frozenset(v) for k, v in graph.items()})
    return {"packages": cycle} if cycle else {}


CHECKS = {
    "the layer matrix": matrix_violations,
    "pure layers reach no I/O, even indirectly": impure_modules,
    "sources never reach the join": sources_reaching_the_join,
    "the document is built without the collector": document_reaching_the_collector,
    "no module import cycles": module_cycle,
    "no package cycles": package_cycle,
}


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_layers(check: str) -> None:
    assert CHECKS[check]() == {}


def test_the_checks_see_the_tree() -> None:
    # Guards the checks against passing on an empty or moved package.
    assert "gpuledger.sources.nvml" in imports_of("gpuledger.pipeline")
    assert "socket" in reach("gpuledger.net.httpclient")
    assert len([m for m in MODULES if layer_of(m) == "ledger"]) >= 5


LEAKS = {
    # The leaks this test was written against (issue 26): each, put back, fails a check.
    "gpuledger.ledger.engines": "from gpuledger.net.httpclient import HttpClient",
    "gpuledger.sources.procfs.sockets": "from gpuledger.ledger.node import Ledger",
    "gpuledger.model.procfs": "from gpuledger.identity.cgroup import parse_cgroup_file",
    "gpuledger.ledger.rayengines": "from gpuledger.ledger.engines import build_engines",
    "gpuledger.export.document": "from gpuledger.export.collector import LedgerCollector",
    "gpuledger.identity.devices": "import socket",
}


@pytest.mark.parametrize("module", sorted(LEAKS))
def test_a_leak_put_back_is_caught(module: str) -> None:
    imports_of.cache_clear()
    _patched_source[module] = f"{LEAKS[module]}\n{MODULES[module].read_text()}"
    try:
        failing = [name for name, check in CHECKS.items() if check()]
    finally:
        _patched_source.clear()
        imports_of.cache_clear()
    assert failing, f"{LEAKS[module]!r} in {module} passes every check"


DESIGN = EXPORTER.parent / "docs" / "design.md"


def documented_matrix() -> dict[str, frozenset[str]]:
    """The "Layers" table of docs/design.md: layer -> what it may import."""
    section = DESIGN.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    matrix: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) != 4 or not cells[1].strip().startswith("`"):
            continue
        layers = re.findall(r"`([a-z_]+)`", cells[1])
        allowed = cells[2].strip()
        names = frozenset(MAY_IMPORT) - set(layers) if allowed == "everything" else None
        for layer in layers:
            matrix[layer] = (
                names
                if names is not None
                else frozenset(re.findall(r"`([a-z_]+)`", re.sub(r"\(.*?\)", "", allowed)))
            )
    return matrix


def test_the_documented_matrix_is_the_tested_one() -> None:
    assert documented_matrix() == dict(MAY_IMPORT)
