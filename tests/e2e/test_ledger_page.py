"""The /ledger page in a real headless Chromium: rows a user must see, hostile values inert."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.prom_harness import Simulated
from tests.e2e.servers import serve_without_hardware

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
    assert by_index["7"][7] == "host process 47000 python3 (4.0 GiB)"
    workloads = {row[0]: row for row in page.tables["workloads"][1:]}
    assert workloads["llm/llama-8b"][2] == "engine_queueing (max_num_seqs)"
    assert "KV cache 62%" in workloads["llm/llama-8b"][7]


def test_demo_page_says_simulated_what_to_do_next_and_how_gpus_are_numbered(
    demo: Simulated,
) -> None:
    dom = _browse(f"http://{demo.target}/ledger")
    page = Table()
    page.feed(dom)
    # A banner above everything: the node is the simulator's.
    banner = re.search(r'<p id="simulated"[^>]*>(.*?)</p>', dom, re.S)
    assert banner and banner.group(1).startswith("SIMULATED DATA: node demo-gpu-node-1")
    assert dom.index('id="simulated"') < dom.index("<h1>")
    # Every workload says what to do next; the slot-bound one links its alert's runbook.
    workloads = {row[0]: row for row in page.tables["workloads"][1:]}
    assert all(row[8] for row in workloads.values())
    assert workloads["llm/llama-8b"][8].startswith(
        "Raise the batch-slot bound (vLLM --max-num-seqs"
    )
    assert workloads["llm/llama-8b"][8].endswith("runbook")
    assert 'href="runbooks#gpuledgerenginequeueingatmaxnumseqs"' in dom
    # The link lands: the agent serves the runbooks, with the alert's section at the anchor.
    with urllib.request.urlopen(f"http://{demo.target}/runbooks", timeout=10) as answer:
        runbooks = answer.read().decode()
    assert '<h2 id="gpuledgerenginequeueingatmaxnumseqs">' in runbooks
    assert workloads["train/finetune"][8].startswith("No vLLM queue to judge")
    # The container ordinal and the process's cuda:N side by side, and what they mean:
    # the trainer's CUDA_VISIBLE_DEVICES=1,0 calls its ordinal 0 cuda:1.
    by_index = {row[0]: row for row in page.tables["gpus"][1:]}
    assert by_index["4"][6] == "train/finetune-x7k2p ordinal 0"
    assert by_index["4"][7] == "train/finetune-x7k2p as cuda:1 (60.0 GiB)"
    assert "cuda:1 can be ordinal 0" in dom and 'id="numbering"' in dom
    # A source the demo does not configure is grey, not red.
    assert re.search(r'<span class="muted" data-source="ray" data-state="not_configured"', dom)
    assert not re.search(r'<span class="bad" data-source=', dom)


def test_serve_page_greys_sources_not_configured_and_reds_a_down_one() -> None:
    served = serve_without_hardware()
    try:
        ARTIFACTS.mkdir(exist_ok=True)
        dom = _browse(served.base + "/ledger", ARTIFACTS / "ledger-serve-no-gpu.png")
    finally:
        served.close()
    spans = re.findall(r'<span class="(\w+)" data-source="(\w+)" data-state="(\w+)"', dom)
    states = {source: (css, state) for css, source, state in spans}
    assert states["nvml"] == ("bad", "down")
    assert states["procfs"] == ("ok", "up")
    for source in ("podresources", "kubernetes", "vllm", "ray"):
        assert states[source] == ("muted", "not_configured"), source
    assert "nvml (down: library_not_found)" in dom
    assert 'id="simulated"' not in dom


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
