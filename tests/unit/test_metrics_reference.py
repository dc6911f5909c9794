"""docs/metrics.md's family tables and docs/scaling.md's budget tables are rendered from the
declarations (scripts/render-metrics-docs) and match them."""

from __future__ import annotations

import subprocess
import sys

from gpuledger.export import families as F
from gpuledger.export.reference import budget_rows, family_rows, metrics_md, scaling_md
from tests.conftest import REPO

METRICS = REPO / "docs" / "metrics.md"
SCALING = REPO / "docs" / "scaling.md"


def test_the_tables_are_up_to_date() -> None:
    text = METRICS.read_text()
    assert metrics_md(text) == text, "docs/metrics.md is stale: run scripts/render-metrics-docs"
    text = SCALING.read_text()
    assert scaling_md(text) == text, "docs/scaling.md is stale: run scripts/render-metrics-docs"


def test_every_family_is_in_a_table_of_metrics_md() -> None:
    text = METRICS.read_text()
    for spec in F.FAMILIES:
        assert f"| `{spec.name}` | {spec.kind} |" in text, spec.name
    sections = {spec.section for spec in F.FAMILIES}
    for section in sections:
        assert f"<!-- families:{section} -->" in text, section


def test_a_stale_table_is_rewritten_and_the_prose_kept() -> None:
    stale = "intro\n<!-- families:engines -->\n| old |\n<!-- /families -->\nmid\n"
    stale += "<!-- budget:cluster -->\n<!-- /budget -->\nend\n"
    fresh = scaling_md(metrics_md(stale))
    assert "| old |" not in fresh
    assert f"| `{F.ENGINE_UP.name}` | gauge | engine labels |" in fresh
    assert "| `gpuledger_pod_pending_gpus` | 10,000 |" in fresh
    assert fresh.startswith("intro\n") and fresh.endswith("end\n") and "\nmid\n" in fresh


def test_the_budget_total_is_the_sum_and_the_dropped_row_counts_the_droppable() -> None:
    rows = budget_rows("node")
    worst = [b.worst for spec in F.FAMILIES for b in spec.budget if b.mode == "node"]
    assert rows[-1] == f"| **total** | | | **{sum(worst):,}** |"
    droppable = [s for s in F.FAMILIES if s.dropped and "node" in s.modes]
    assert f"| {len(droppable)} |" in next(r for r in rows if F.SERIES_DROPPED.name in r)


def test_the_mig_table_lists_every_family_keyed_by_device() -> None:
    rows = "\n".join(family_rows(F.MIG))
    for spec in F.FAMILIES:
        if spec.device:
            assert f"`{spec.name}`" in rows, spec.name


def test_the_script_checks() -> None:
    script = REPO / "scripts" / "render-metrics-docs"
    env = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    found = subprocess.run([script, "--check"], env=env, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
