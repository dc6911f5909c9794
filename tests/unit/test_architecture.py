"""The layering docs/design.md describes, checked on the source tree itself.

Sources do I/O and produce model snapshots; the join (ledger/), the collector and every
other surface read only the model. So the only module outside sources/ that may import
a source is the pipeline, which is where the list of sources lives.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "exporter" / "gpuledger"
COMPOSITION_ROOT = PACKAGE / "pipeline.py"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def modules_outside(folder: str) -> list[Path]:
    inside = PACKAGE / folder
    return [p for p in PACKAGE.rglob("*.py") if inside not in p.parents]


# kubeapi is the kubernetes client's configuration loader, not a source: explain's own
# discovery of the agents (agents.py) loads the user's kubeconfig with it.
# (`from gpuledger.sources import kubeapi` names the package too; its other names are checked.)
CLIENT_LOADER = {"gpuledger.sources", "gpuledger.net.kubeapi"}
CLIENT_LOADER_USERS = {PACKAGE / "agents.py"}


def test_only_the_pipeline_imports_sources() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            m
            for m in imported_modules(path)
            if m.startswith("gpuledger.sources")
            and not (path in CLIENT_LOADER_USERS and m in CLIENT_LOADER)
        )
        for path in modules_outside("sources")
        if path != COMPOSITION_ROOT
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_join_and_the_model_do_no_io() -> None:
    io_modules = ("requests", "urllib3", "socket", "grpc", "pynvml", "http.client", "kubernetes")
    for folder in ("ledger", "model", "identity"):
        for path in (PACKAGE / folder).rglob("*.py"):
            used = {m for m in imported_modules(path) if m.split(".")[0] in io_modules}
            assert not used, f"{path.relative_to(PACKAGE)} imports {sorted(used)}"


def test_the_checks_see_the_tree() -> None:
    # Guards the two tests above against passing on an empty or moved package.
    assert "gpuledger.sources.nvml" in imported_modules(COMPOSITION_ROOT)
    assert len(modules_outside("sources")) > 20
