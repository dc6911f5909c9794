"""The rendered mixin is up to date and the jsonnet is formatted."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from tests.mixin.helpers import DASHBOARDS_DIR, REPO, TESTS_DIR, rendered, run, tool

JSONNET_ROOTS = ["mixin", "tests/mixin"]


def _jsonnet_files() -> list[Path]:
    files: list[Path] = []
    for root in JSONNET_ROOTS:
        path = REPO / root
        if path.is_file():
            files.append(path)
        else:
            files += sorted(p for p in path.rglob("*") if p.suffix in {".jsonnet", ".libsonnet"})
    return files


def test_rendered_files_are_up_to_date() -> None:
    problems = []
    for path, text in rendered().items():
        target = REPO / path
        if not target.exists():
            problems.append(f"{path}: missing")
        elif target.read_text() != text:
            diff = difflib.unified_diff(
                target.read_text().splitlines(),
                text.splitlines(),
                "committed",
                "rendered",
                lineterm="",
                n=1,
            )
            problems.append(f"{path}: out of date\n" + "\n".join(list(diff)[:40]))
    assert not problems, "run scripts/render-mixin:\n" + "\n\n".join(problems)


def test_no_rendered_file_without_a_source() -> None:
    committed = {
        p.relative_to(REPO) for p in [*DASHBOARDS_DIR.glob("*.json"), *TESTS_DIR.glob("*.yaml")]
    }
    leftovers = committed - set(rendered())
    assert not leftovers, (
        f"rendered files whose source is gone (delete them): {sorted(map(str, leftovers))}"
    )


def test_render_script_check_mode() -> None:
    result = run([sys.executable, "scripts/render-mixin", "--check"])
    assert result.returncode == 0, result.stderr


def test_rendered_outputs_exist() -> None:
    names = {str(p) for p in rendered()}
    assert "mixin/rendered/gpuledger.rules.yaml" in names
    assert sum(n.startswith("mixin/rendered/dashboards/") for n in names) >= 4
    assert sum(n.startswith("mixin/tests/") for n in names) >= 5
    assert "mixin/lib/stages.json" in names


def test_jsonnet_is_formatted() -> None:
    jsonnetfmt = tool("jsonnetfmt")
    files = _jsonnet_files()
    assert len(files) >= 10, files
    unformatted = [
        str(f.relative_to(REPO))
        for f in files
        if run([jsonnetfmt, "--test", str(f)]).returncode != 0
    ]
    assert not unformatted, f"not jsonnetfmt-formatted (jsonnetfmt -i FILE): {unformatted}"
