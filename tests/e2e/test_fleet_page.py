"""The cluster page and `explain --workload` over 1,000 simulated nodes, read from a real
Prometheus (`--prometheus-url`).

The fleet's series are backfilled with promtool and the mixin's rendered recording rules
evaluated by Prometheus itself (benchmarks/fleet.py); one server answers /ledger.json as
every node agent, each at its own loopback address (the `instance` Prometheus has for it),
and counts the reads. The overview must list every workload with the stage the rules give
and read no agent; opening one workload must read its four agents and no other.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from benchmarks.fleet import CLUSTER_VIEW, AgentFarm, Fleet, FleetPrometheus

from gpuledger.explain.prometheus import PrometheusAccess
from gpuledger.web.fleet_page import FleetPage
from tests.conftest import REPO
from tests.e2e.prom_harness import _stop, free_port

NODES = 1000
DEADLINE = 5.0  # --source-deadline: the page's one deadline


class Rows(HTMLParser):
    """The text of each cell of each row of the table with the given id."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id = table_id
        self.inside = False
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.inside = dict(attrs).get("id") == self.table_id
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag == "td":
            self.cell = []
        elif tag == "br" and self.cell is not None:
            self.cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.inside = False
        elif tag == "td" and self.cell is not None:
            self.rows[-1].append(" ".join("".join(self.cell).split()))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def table(html: str, table_id: str) -> list[list[str]]:
    parser = Rows(table_id)
    parser.feed(html)
    return [r for r in parser.rows if r]


class FleetStack:
    def __init__(self, workdir: Path) -> None:
        self.farm = AgentFarm()
        self.fleet = Fleet(NODES, self.farm.port, self.farm.cluster_instance)
        self.farm.fleet = self.fleet
        self.prometheus = FleetPrometheus(self.fleet, workdir)
        self.prometheus.wait_judged(len(self.fleet.expected()))
        self.target = f"127.0.0.1:{free_port()}"
        self.view = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuledger",
                "serve",
                "--mode=cluster",
                "--kubernetes=off",
                f"--listen={self.target}",
                f"--source-deadline={DEADLINE:g}",
                "--log-level=warning",
                "--node-name=cluster-view",
                f"--prometheus-url={self.prometheus.url}",
            ],
            env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def get(self, path: str) -> tuple[int, str]:
        give_up = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.target}{path}", timeout=30) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()
            except OSError:
                if self.view.poll() is not None or time.monotonic() > give_up:
                    stderr = self.view.stderr.read() if self.view.stderr else ""
                    raise AssertionError(f"the cluster view does not answer:\n{stderr}") from None
                time.sleep(0.2)

    def close(self) -> None:
        _stop(self.view)
        if self.view.stderr is not None:
            self.view.stderr.close()
        self.prometheus.close()
        self.farm.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetStack]:
    made = FleetStack(tmp_path_factory.mktemp("fleet"))
    try:
        yield made
    finally:
        made.close()


def _stage_cell(stage: str, reason: str | None) -> str:
    return f"{stage} ({reason})" if reason else stage


def test_the_overview_lists_every_workload_with_its_stage_and_reads_no_agent(
    stack: FleetStack,
) -> None:
    stack.farm.reads.clear()
    status, html = stack.get("/ledger")
    assert status == 200
    assert 'id="prometheus-error"' not in html, html[:3000]
    rows = table(html, "workloads")
    listed = {row[0]: row for row in rows}
    expected = stack.fleet.expected()
    assert len(rows) == len(expected) == 550
    for (namespace, name), (stage, reason) in expected.items():
        row = listed[f"{namespace}/{name}"]
        assert row[3] == _stage_cell(stage, reason), row
    # Engines and their queue, nodes, pending pods: from the recorded series too.
    queueing = listed["team-01/llm-0001"]
    assert queueing[2] == "4"  # GPU pods
    assert queueing[4].startswith("4/4 up 80 waiting, 128 running max KV 95%"), queueing
    assert "gpu-node-0002" in queueing[1]
    assert listed["batch/pending-007"][5].startswith("2 insufficient_gpu"), listed[
        "batch/pending-007"
    ]
    assert "1 queries" not in html and "4 queries" in html
    assert stack.farm.reads == {}, "the overview read node agents"


def test_opening_a_workload_reads_only_its_agents(stack: FleetStack) -> None:
    stack.farm.reads.clear()
    status, html = stack.get("/ledger?workload=team-04%2Fllm-0004")
    assert status == 200, html[:2000]
    wanted = stack.fleet.nodes_of("team-04", "llm-0004")
    assert set(stack.farm.reads) == wanted and len(wanted) == 4
    assert all(n == 1 for n in stack.farm.reads.values())
    chain = table(html, "chain")
    assert sorted(r[0].split()[0] for r in chain) == [f"team-04/llm-0004-{r}" for r in range(4)]
    verdict = html.split('id="verdict"', 1)[1].split("</p>", 1)[0]
    assert "imbalance" in verdict, verdict


def test_a_ray_executor_engine_reads_the_agents_of_its_workers_too(stack: FleetStack) -> None:
    stack.farm.reads.clear()
    status, _ = stack.get("/ledger?workload=team-00%2Fllm-0000")
    assert status == 200
    own = stack.fleet.nodes_of("team-00", "llm-0000")
    workers = set(stack.fleet.ray_worker_nodes())
    assert not own & workers
    assert set(stack.farm.reads) == own | workers


@pytest.mark.parametrize(("cluster", "listed"), [("sim", 550), ("elsewhere", 0)])
def test_a_selector_narrows_the_page_to_one_cluster(
    stack: FleetStack, cluster: str, listed: int
) -> None:
    access = PrometheusAccess(stack.prometheus.url, selector=f'cluster="{cluster}"')
    page = FleetPage(access, deadline_seconds=DEADLINE)
    own = stack.fleet.cluster_document()
    _, html = page(own, "")
    workloads = [r for r in table(html, "workloads") if "/" in r[0]]
    assert len(workloads) == listed
    assert ("no workloads in Prometheus" in html) == (listed == 0)
    stack.farm.reads.clear()
    page(own, "workload=team-03%2Fllm-0003")
    assert len(stack.farm.reads) == (4 if listed else 0)


def test_explain_workload_reads_its_agents_and_the_cluster_view(stack: FleetStack) -> None:
    stack.farm.reads.clear()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuledger",
            "explain",
            "--workload",
            "team-01/llm-0001",
            f"--prometheus-url={stack.prometheus.url}",
            "--timeout=10",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "ENGINE QUEUEING" in out.stdout.upper() and "kv_cache" in out.stdout, out.stdout
    assert set(stack.farm.reads) == stack.fleet.nodes_of("team-01", "llm-0001")

    stack.farm.reads.clear()
    pending = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuledger",
            "explain",
            "--workload",
            "batch/pending-003",
            f"--prometheus-url={stack.prometheus.url}",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert pending.returncode == 0, pending.stderr
    assert "insufficient_gpu" in pending.stdout
    assert set(stack.farm.reads) == {CLUSTER_VIEW}
