"""The mixin is a package of its own (issue 26, item 6): mixin/ alone, vendored the way
jsonnet-bundler vendors it, renders exactly the committed rules and dashboards, and its copy
of the stage definitions is the exporter's file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.mixin.helpers import DASHBOARDS_DIR, REPO, RULES

MIXIN = REPO / "mixin"

# What a user writes next to `jb install`'s vendor/ (docs/mixin.md, "Using it").
IMPORTER = """
local mixin = import 'gpuledger-mixin/mixin.libsonnet';
{
  groups: mixin.prometheusRules.groups + mixin.prometheusAlerts.groups,
  dashboards: mixin.grafanaDashboards,
}
"""


def _vendored(tmp_path: Path) -> Path:
    """Only mixin/, under vendor/gpuledger-mixin/, with the importing file beside vendor/."""
    vendor = tmp_path / "vendor"
    shutil.copytree(MIXIN, vendor / "gpuledger-mixin")
    (tmp_path / "gpuledger.jsonnet").write_text(IMPORTER)
    return tmp_path


def _render(project: Path) -> Any:
    import _jsonnet

    text = _jsonnet.evaluate_file(
        str(project / "gpuledger.jsonnet"), jpathdir=[str(project / "vendor")]
    )
    return json.loads(text)


def test_the_mixin_folder_alone_renders_the_committed_output(tmp_path: Path) -> None:
    out = _render(_vendored(tmp_path))
    assert out["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    committed = {p.name: json.loads(p.read_text()) for p in DASHBOARDS_DIR.glob("*.json")}
    assert out["dashboards"] == committed


def test_the_jsonnet_command_renders_it_too(tmp_path: Path) -> None:
    # `jsonnet -J vendor`, as docs/mixin.md says (the Go or C++ jsonnet; optional here).
    jsonnet = shutil.which("jsonnet")
    assert jsonnet is not None, "no jsonnet command: scripts/setup-env --test installs it (apt)"
    project = _vendored(tmp_path)
    result = subprocess.run(
        [jsonnet, "-J", "vendor", "gpuledger.jsonnet"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == _render(project)


def test_the_mixin_reads_nothing_outside_its_folder(tmp_path: Path) -> None:
    # Without its stages copy the vendored mixin cannot render: it really reads the copy,
    # not the repository's exporter/ (absent from the vendored tree).
    project = _vendored(tmp_path)
    assert not (project / "exporter").exists()
    (project / "vendor" / "gpuledger-mixin" / "lib" / "stages.json").unlink()
    try:
        _render(project)
    except RuntimeError as exc:
        assert "stages.json" in str(exc)
    else:
        raise AssertionError("rendered without lib/stages.json")


def test_the_stages_copy_is_the_exporters_file() -> None:
    copy = MIXIN / "lib" / "stages.json"
    source = REPO / "exporter" / "gpuledger" / "stages.json"
    assert copy.read_bytes() == source.read_bytes(), "run scripts/render-mixin"


def test_the_package_has_what_jsonnet_bundler_needs() -> None:
    jsonnetfile = json.loads((MIXIN / "jsonnetfile.json").read_text())
    assert jsonnetfile["version"] == 1 and jsonnetfile["dependencies"] == []
    for part in ("mixin.libsonnet", "config.libsonnet", "lib", "rules", "alerts", "dashboards"):
        assert (MIXIN / part).exists(), part
    # Recording rules apart from alerts.
    assert sorted(p.name for p in (MIXIN / "rules").glob("*.libsonnet")) == [
        "aliases.libsonnet",
        "rules.libsonnet",
    ]
    assert not list((MIXIN / "alerts").glob("rules*"))
    # Nothing of the old layout is left at the repository root.
    for gone in ("mixin.libsonnet", "config.libsonnet", "jsonnetfile.json", "alerts", "dashboards"):
        assert not (REPO / gone).exists(), gone
