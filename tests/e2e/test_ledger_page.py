"""The /ledger page in a real headless Chromium: rows a user must see, hostile values inert."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.prom_harness import Simulated

ARTIFACTS = REPO / "test-artifacts"
DEMO = REPO / "exporter" / "gpuledger" / "sim" / "scenarios" / "demo.yaml"
HOSTILE = REPO / "tests" / "fixtures" / "scenarios" / "hostile.yaml"


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "headless Chromium is required (Debian package chromium; .ci/run installs it)"
    return found


def served(scenario: Path) -> Simulated:
    """`gpuledger simulate` serving `scenario`, once its ledger is complete."""
    sim = Simulated(scenario)
    sim.wait_ready()
    return sim


def _browse(url: str, screenshot: Path | None = None) -> str:
    with tempfile.TemporaryDirectory() as profile:
        flags = [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
        ]
        if screenshot is not None:
            subprocess.run(
                [*flags, f"--screenshot={screenshot}", url],
                capture_output=True,
                timeout=90,
                check=True,
            )
        dom = subprocess.run(
            [*flags, "--dump-dom", url], capture_output=True, text=True, timeout=90, check=True
        )
    return dom.stdout


class Table(HTMLParser):
    """Rows of the tables by id, as text, plus every element name seen."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.elements: list[str] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(tag)
        if tag == "table":
            self._table = dict(attrs).get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._table is not None and self._row is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def demo() -> object:
    sim = served(DEMO)
    yield sim
    sim.close()


def test_demo_page_shows_every_gpu_and_workload(demo: Simulated) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "ledger-demo.png"
    dom = _browse(f"http://{demo.target}/ledger", shot)
    assert shot.stat().st_size > 10_000  # a real rendering, kept as a test artifact
    page = Table()
    page.feed(dom)
    gpus = page.tables["gpus"][1:]
    assert len(gpus) == 8
    by_index = {row[0]: row for row in gpus}
    assert "llm/llama-8b-5f7c9d8b6-q7x2k" in by_index["0"][6]  # allocated to
    assert "search/embed-0" in by_index["2"][7] and "search/rerank-0" in by_index["2"][7]
    assert "allocated unused: research/notebook-alice" in by_index["3"][8]
    assert "host processes: 4.0 GiB" in by_index["7"][7]
    workloads = {row[0]: row for row in page.tables["workloads"][1:]}
    assert workloads["llm/llama-8b"][2] == "engine_queueing (kv_cache)"
    assert "KV cache 93%" in workloads["llm/llama-8b"][7]


def test_hostile_values_are_text_not_markup() -> None:
    sim = served(HOSTILE)
    try:
        dom = _browse(f"http://{sim.target}/ledger")
        json_doc = urllib.request.urlopen(f"http://{sim.target}/ledger.json", timeout=5).read()
    finally:
        sim.close()
    page = Table()
    page.feed(dom)
    # No element the values tried to inject exists in the rendered DOM.
    for tag in ("script", "img", "svg", "b", "i"):
        assert tag not in page.elements, tag
    cells = " ".join(c for rows in page.tables.values() for row in rows for c in row)
    assert "<img src=x onerror=alert(1)>/pod\"quoted'" in cells
    assert "H100 <svg onload=alert(2)>" in cells
    assert "<script>alert(3)</script>" in cells  # the workload label, shown as text
    assert "sk-<script>leak</script>" not in dom
    assert b"sk-<script>leak</script>" not in json_doc
