"""A Ray-executor vLLM engine as the real captures show it (identity rule 9), through the
whole pipeline: the fake Ray dashboard serving the captured state API rows
(tests/fixtures/ray/vllm-0.32-ray/), a proc root written from the captured process
table, the fake NVML listing the captured worker PIDs, and the captured vLLM /metrics.

The capture ran on a GPU-less machine: Ray's GPUs were logical, so the GPUs the workers
hold here are the test's (one per worker, by the captured PIDs).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuledger.document.codec import from_json
from gpuledger.explain.chain import explain, render_text
from gpuledger.export.document import document_json, ledger_document
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sim.fake_nvml import (
    STATE_ENV,
    FakeGpu,
    FakeNvmlState,
    FakeProcess,
    build_fake_nvml,
    write_state,
)
from gpuledger.sim.fake_ray import FakeRayDashboard
from gpuledger.sim.harness import write_proc_root
from gpuledger.sim.scenario import SimProcess
from gpuledger.web.server import Exporter
from tests.conftest import REPO, Sample, pick, samples, value

CAPTURE = REPO / "tests" / "fixtures" / "ray" / "vllm-0.32-ray"
NODE_ID = "a0afe47a7634b9b3d02f9a08580f26517851fce2db57019755280500"
GIB = 2**30
UUIDS = [f"GPU-7a000000-0000-4000-8000-00000000000{i}" for i in range(2)]
GPUS = tuple(
    FakeGpu(i, u, "NVIDIA H100 80GB HBM3", f"00000000:{0x18 + i:02X}:00.0", 80 * GIB, 0, 0, 0)
    for i, u in enumerate(UUIDS)
)


def _load(name: str) -> Any:
    return json.loads((CAPTURE / name).read_text())


def _rows(name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _load(name)["data"]["result"]["result"]
    return rows


def _processes(name: str) -> tuple[SimProcess, ...]:
    """The captured process table as a proc root's processes (cmdline NULs were written
    as the two characters `\\0`; NSpid as the status line)."""
    found = []
    for p in _load(name):
        args = p["cmdline"].split("\\0")
        nspid = tuple(int(x) for x in p["status_NSpid_line"].split(":", 1)[1].split())
        found.append(
            SimProcess(
                pid=p["pid"],
                ppid=p["ppid"],
                cmdline=tuple(args[:-1] if args[-1] == "" else args),
                nspid=nspid,
                environ=p["env_values"],
            )
        )
    return tuple(found)


class MetricsServer:
    """Serves the captured vLLM /metrics (or refuses, when the engine is gone)."""

    def __init__(self, body: bytes) -> None:
        outer = self
        self.body: bytes | None = body

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if outer.body is None:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class Captured:
    dashboard: FakeRayDashboard
    metrics: MetricsServer
    exporter: Exporter
    pipeline: Pipeline
    proc_root: Path
    state: Path

    def show(self, actors: str, jobs: str, groups: str, processes: str, pids: list[int]) -> None:
        self.dashboard.set_nodes(_rows("ray_nodes_detail.json"))
        self.dashboard.set_actors(_rows(actors))
        self.dashboard.set_jobs(_load(jobs))
        self.dashboard.set_placement_groups(_rows(groups))
        write_proc_root(self.proc_root, _processes(processes))
        held = tuple(FakeProcess(i, pid, (20 + i) * GIB) for i, pid in enumerate(pids))
        write_state(self.state, FakeNvmlState(gpus=GPUS, processes=held))

    def scrape(self) -> tuple[list[Sample], dict[str, Any]]:
        published = self.exporter.run_once()
        body, _ = self.exporter.render(None)
        return samples(body.decode()), document_json(ledger_document(published))


@pytest.fixture
def captured(tmp_path: Path) -> Iterator[Captured]:
    state = tmp_path / "nvml.state"
    os.environ[STATE_ENV] = str(state)
    metrics = MetricsServer((CAPTURE / "vllm_metrics_under_load_1.txt").read_bytes())
    with FakeRayDashboard() as dashboard:
        proc_root = tmp_path / "proc"
        made = Captured(dashboard, metrics, None, None, proc_root, state)  # type: ignore[arg-type]
        made.show(
            "ray_actors.json",
            "ray_api_jobs.json",
            "ray_placement_groups.json",
            "processes.json",
            [7438, 7437],
        )
        pipeline = Pipeline(
            PipelineConfig(
                node="capture-host",
                proc_root=str(proc_root),
                nvml_library=str(build_fake_nvml()),
                engine_targets=(metrics.url,),
                ray_address=dashboard.url,
            )
        )
        made.pipeline = pipeline
        made.exporter = Exporter(pipeline.cycle, 1.0)
        try:
            yield made
        finally:
            pipeline.close()
            metrics.close()


def test_ray_executor_v2_engine_joined_to_its_workers(captured: Captured) -> None:
    s, doc = captured.scrape()
    assert value(s, "gpuledger_source_up", source="ray") == 1
    engine = {"model_name": "tiny", "engine": "0"}
    assert (
        value(
            s,
            "gpuledger_engine_ray_job_info",
            **engine,
            ray_job_id="01000000",
            ray_driver_node_id=NODE_ID,
        )
        == 1
    )
    assert value(s, "gpuledger_engine_ray_workers", **engine, state="ALIVE") == 2
    # The API server (6913) holds no GPU and no GPU process descends from it (the
    # workers are the raylet's children), yet its flags are read: procfs reads every
    # engine-retitled process (the EngineCore 7137) and its ancestors while engines are
    # scraped. TP x PP is the flags', as the placement group's bundles say too.
    (config,) = pick(s, "gpuledger_engine_config_info", **engine)
    assert config[1]["tensor_parallel_size"] == "2"
    assert config[1]["pipeline_parallel_size"] == "1"
    assert value(s, "gpuledger_engine_gpus", **engine, state="configured") == 2
    # The capture's server ran without --max-num-seqs (README.md there): none reported.
    assert not pick(s, "gpuledger_engine_max_num_seqs", **engine)
    # Its GPUs are its workers', reported per node: none counted from local processes.
    assert not pick(s, "gpuledger_engine_gpus", **engine, state="in_use")
    job = {"ray_job_id": "01000000", "ray_driver_node_id": NODE_ID}
    for pid, rank, uuid, gib in ((7438, "0", UUIDS[0], 20), (7437, "1", UUIDS[1], 21)):
        labels = {**job, "tp_rank": rank, "pp_rank": "0", "bundle_index": rank}
        assert value(s, "gpuledger_ray_worker_info", **labels, class_name="RayWorkerProc") == 1
        memory = value(s, "gpuledger_ray_worker_gpu_memory_used_bytes", **labels, gpu_uuid=uuid)
        assert memory == gib * GIB, pid
    (e,) = doc["engines"]
    assert (e["api_server_pid"], e["pids"]) == (6913, [6913, 7137])
    assert e["config"]["distributed_executor_backend"] == "ray"
    assert e["ray"]["driver_pid"] == 7137  # the EngineCore
    assert e["ray"]["worker_class"] == "RayWorkerProc"
    assert e["ray"]["worker_nodes"] == [{"ray_node_id": NODE_ID, "node_ip": "<ip>", "workers": 2}]
    workers = sorted(doc["ray"]["workers"], key=lambda w: w["tp_rank"])
    assert [(w["name"], w["pid"], w["host_pid"]) for w in workers] == [
        ("vllm_Worker_1796132130615376518_TP0", 7438, 7438),
        ("vllm_Worker_1796132130615376518_TP1", 7437, 7437),
    ]


def test_max_num_seqs_verdict_reached_on_the_ray_executor(captured: Captured) -> None:
    """The captured engine as a systemd unit started with `--max-num-seqs 6`, under the
    captured load (6 running) with 40 waiting. Changed here, not captured: the flag
    appended to the server's command line, its tree's cgroup, and the waiting sample."""
    unit = "0::/system.slice/vllm-tiny.service"
    tree = {6913, 7136, 7137}  # the API server, its resource tracker, the EngineCore
    procs = tuple(
        replace(
            p,
            cmdline=(*p.cmdline, "--max-num-seqs", "6") if p.pid == 6913 else p.cmdline,
            cgroup=unit if p.pid in tree else p.cgroup,
        )
        for p in _processes("processes.json")
    )
    write_proc_root(captured.proc_root, procs)
    body = (CAPTURE / "vllm_metrics_under_load_1.txt").read_bytes()
    waiting = b'vllm:num_requests_waiting{engine="0",model_name="tiny"} '
    assert waiting + b"0.0\n" in body
    captured.metrics.body = body.replace(waiting + b"0.0\n", waiting + b"40.0\n")
    s, doc = captured.scrape()
    engine = {"namespace": "", "workload": "vllm-tiny.service", "model_name": "tiny"}
    assert value(s, "gpuledger_engine_max_num_seqs", **engine) == 6
    assert value(s, "gpuledger_engine_gpus", **engine, state="configured") == 2
    result = explain([from_json(doc)], engine="tiny")
    (workload,) = result["workloads"]
    assert (workload["namespace"], workload["workload"]) == ("", "vllm-tiny.service")
    assert (workload["verdict"]["stage"], workload["verdict"]["reason"]) == (
        "engine_queueing",
        "max_num_seqs",
    )
    text = render_text(result)
    assert "TP 2 x PP 1  max_num_seqs 6" in text
    assert "running = --max-num-seqs 6 with KV headroom" in text


def test_after_engine_exit_no_ray_series_remain(captured: Captured) -> None:
    first, _ = captured.scrape()
    assert pick(first, "gpuledger_ray_worker_info")
    # ~10 s after SIGTERM to the API server: actors DEAD, job SUCCEEDED, group REMOVED,
    # the processes gone.
    captured.metrics.body = None
    alive = [
        p
        for p in _processes("processes.json")
        if p.pid not in (6913, 7136, 7137, 7437, 7438, 7986, 7885)
    ]
    captured.dashboard.set_actors(_rows("ray_actors_after_engine_exit.json"))
    captured.dashboard.set_jobs(_load("ray_api_jobs_after_engine_exit.json"))
    captured.dashboard.set_placement_groups(_rows("ray_placement_groups_after_engine_exit.json"))
    write_proc_root(captured.proc_root, tuple(alive))
    write_state(captured.state, FakeNvmlState(gpus=GPUS))
    s, doc = captured.scrape()
    assert value(s, "gpuledger_source_up", source="ray") == 1
    for family in (
        "gpuledger_ray_worker_info",
        "gpuledger_ray_worker_gpu_memory_used_bytes",
        "gpuledger_engine_ray_job_info",
        "gpuledger_engine_ray_workers",
    ):
        assert not pick(s, family), family
    assert doc["ray"]["workers"] == []
    assert all(e["ray"] is None for e in doc["engines"])


def test_legacy_executor_workers(captured: Captured) -> None:
    """RayDistributedExecutor: unnamed RayWorkerWrapper actors of job 03000000, next to
    the DEAD actors of the two jobs before it (which must not count)."""
    captured.show(
        "legacy-executor_ray_actors.json",
        "legacy-executor_ray_api_jobs.json",
        "legacy-executor_ray_placement_groups.json",
        "legacy-executor_processes.json",
        [18012, 18015],
    )
    s, doc = captured.scrape()
    job = {"ray_job_id": "03000000", "ray_driver_node_id": NODE_ID}
    info = pick(s, "gpuledger_ray_worker_info")
    assert {(x[1]["ray_job_id"], x[1]["bundle_index"]) for x in info} == {
        ("03000000", "0"),
        ("03000000", "1"),
    }
    for _, labels, _v in info:
        # The legacy executor ranks workers by sorting their IPs: Ray does not show it.
        assert (labels["class_name"], labels["tp_rank"], labels["pp_rank"]) == (
            "RayWorkerWrapper",
            "",
            "",
        )
    assert len(pick(s, "gpuledger_ray_worker_gpu_memory_used_bytes", **job)) == 2
    # The same /metrics (the executor does not change it) stands for the legacy engine.
    assert value(s, "gpuledger_engine_ray_job_info", model_name="tiny", **job) == 1
    assert value(s, "gpuledger_engine_ray_workers", model_name="tiny", state="ALIVE") == 2
    assert value(s, "gpuledger_engine_gpus", model_name="tiny", state="configured") == 2
    (e,) = doc["engines"]
    assert (e["ray"]["driver_pid"], e["ray"]["worker_class"]) == (17845, "RayWorkerWrapper")


def test_ray_down_leaves_the_rest(captured: Captured) -> None:
    captured.dashboard.set_fault("http_500")
    s, doc = captured.scrape()
    assert value(s, "gpuledger_source_up", source="ray") == 0
    assert value(s, "gpuledger_source_up", source="nvml") == 1
    assert value(s, "gpuledger_engine_up", model_name="tiny") == 1
    assert not pick(s, "gpuledger_ray_worker_info")
    assert not pick(s, "gpuledger_engine_ray_job_info")
    # The workers' memory is still the host's, by NVML and procfs.
    assert value(s, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=UUIDS[0]) == 20 * GIB
    assert any("Ray" in u for u in doc["unknowns"])


def test_job_list_unreadable_says_so_and_links_nothing(captured: Captured) -> None:
    captured.dashboard.set_fault("result_false", path="/api/v0/jobs")
    s, doc = captured.scrape()
    # The rest of Ray's view stands: the source is up, its actors counted.
    assert value(s, "gpuledger_source_up", source="ray") == 1
    assert value(s, "gpuledger_ray_actor_gpus", class_name="RayWorkerProc", state="ALIVE") == 2
    assert not pick(s, "gpuledger_engine_ray_job_info")
    assert not pick(s, "gpuledger_ray_worker_info")
    (unknown,) = [u for u in doc["unknowns"] if "Ray job list" in u]
    assert "Failed to query the data source" in unknown
    captured.dashboard.set_fault("ok", path="/api/v0/jobs")
    captured.dashboard.set_fault("result_false", path="/api/v0/placement_groups")
    s, doc = captured.scrape()
    # One engine's job unreadable: linked, but Ray's count of its workers is unknown
    # (none rather than 0: the footprint rule then says nothing); TP x PP is still the
    # API server's flags'.
    assert value(s, "gpuledger_engine_ray_job_info", model_name="tiny") == 1
    assert not pick(s, "gpuledger_engine_ray_workers")
    assert value(s, "gpuledger_engine_gpus", model_name="tiny", state="configured") == 2
    assert any(u.startswith("Ray job 01000000:") for u in doc["unknowns"])
    assert len(pick(s, "gpuledger_ray_worker_info")) == 2
