"""A Ray-executor engine's workers attributed to its driver, against a real Ray 2.60 head.

The head is started as tests/integration/test_ray_real.py starts it (ray_head.py), with
`--num-gpus 4` (Ray's logical GPUs: no hardware). A Python driver does what vLLM's
EngineCore does with `--distributed-executor-backend ray`
(tests/fixtures/ray/vllm-0.32-ray/): it takes the title `VLLM::EngineCore` (setproctitle,
as vLLM does) before it connects, so it is the driver of a job whose entrypoint is that
title; it makes a placement group of one `{"GPU": 1}` bundle per rank, and one actor per
bundle, named `vllm_Worker_<id>_TP<r>` of class `RayWorkerProc` (RayExecutorV2), or
unnamed `RayWorkerWrapper` (the legacy executor). The exporter runs against the real /proc
and that dashboard, with a simulated vLLM /metrics and the fake NVML listing the actors'
real PIDs on its GPUs.

One cluster for the module; the drivers run one after the other, and each one's exit
(actors DEAD, job SUCCEEDED) must leave no series behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuledger.explain.ray import RayWorkers, footprint, footprint_lines
from gpuledger.export.document import ledger_document
from gpuledger.pipeline import Pipeline, PipelineConfig
from gpuledger.sim.fake_nvml import (
    STATE_ENV,
    FakeGpu,
    FakeNvmlState,
    FakeProcess,
    build_fake_nvml,
    write_state,
)
from gpuledger.sim.fake_vllm import FakeEngine, FakeVllmServer
from gpuledger.web.server import Exporter
from tests.conftest import Sample, pick, samples, value
from tests.integration.ray_head import RayHead, end, ray_head, read_line

pytestmark = pytest.mark.slow

START_TIMEOUT_SECONDS = 60.0
TP = 4
GIB = 2**30
UUIDS = [f"GPU-7e000000-0000-4000-8000-00000000000{i}" for i in range(TP)]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# The EngineCore's parent, as `vllm serve --tensor-parallel-size N` is: the API server whose
# whitelisted flags the exporter reads (its engine's configuration, identity rule 6).
API_SERVER = (
    "import subprocess, sys; sys.exit(subprocess.call(sys.argv[sys.argv.index('--') + 1 :]))"
)
DRIVER = r"""
import json, os, sys, time
import ray
from ray._raylet import setproctitle

address, title, executor, tp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
setproctitle(title)  # vLLM's EngineCore renames itself before it connects to Ray
ray.init(address=address, configure_logging=False, log_to_driver=False)
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


def pid(self):
    return os.getpid()


name = "RayWorkerProc" if executor == "ray" else "RayWorkerWrapper"
Worker = ray.remote(num_gpus=1, num_cpus=0)(type(name, (), {"pid": pid}))
group = placement_group([{"GPU": 1}] * tp, strategy="PACK")
ray.get(group.ready())
instance = str(time.time_ns())
workers = []
for rank in range(tp):
    options = {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=rank
        )
    }
    if executor == "ray":
        options["name"] = f"vllm_Worker_{instance}_TP{rank}"
    workers.append(Worker.options(**options).remote())
print(json.dumps({
    "pids": ray.get([w.pid.remote() for w in workers]),
    "driver_pid": os.getpid(),
    "job_id": ray.get_runtime_context().get_job_id(),
    "node_id": ray.get_runtime_context().get_node_id(),
}), flush=True)
sys.stdin.read()  # until the test closes stdin: the engine exits
ray.shutdown()
"""


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    with ray_head("glrayeng-", num_gpus=TP) as started:
        yield started


class Driver:
    """An EngineCore stand-in: a Ray driver with TP worker actors in a placement group."""

    def __init__(self, head: RayHead, executor: str) -> None:
        self.head = head
        with (head.tmp / f"driver-{executor}.log").open("wb") as log:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-c", API_SERVER, "--tensor-parallel-size", str(TP), "--"),
                    *(sys.executable, "-c", DRIVER, head.gcs, "VLLM::EngineCore", executor),
                    str(TP),
                ],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env=head.env, text=True, start_new_session=True,
            )  # fmt: skip
        line = read_line(self.process, time.monotonic() + START_TIMEOUT_SECONDS)
        if not line:
            self.stop()
            pytest.fail(f"the driver did not make its workers\n{head.logs()}")
        self.info: dict[str, Any] = json.loads(line)

    def stop(self) -> None:
        """The engine exits: its workers' owner is gone."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=20)
        end(self.process, grace_seconds=2)


class Agent:
    """The node agent of this host: the real pipeline on /proc, the fake NVML listing the
    workers' PIDs (GPU i held by the worker of rank i, unless told otherwise), the engine's
    simulated /metrics."""

    def __init__(self, head: RayHead, tmp: Path) -> None:
        self.state = tmp / "nvml.state"
        os.environ[STATE_ENV] = str(self.state)
        self.hold([])
        self.vllm = FakeVllmServer([FakeEngine(model_name=MODEL, running=3)]).start()
        self.pipeline = Pipeline(
            PipelineConfig(
                node="ray-host",
                proc_root="/proc",
                nvml_library=str(build_fake_nvml()),
                engine_targets=(self.vllm.url,),
                ray_address=head.url,
            )
        )
        self.exporter = Exporter(self.pipeline.cycle, 1.0)

    def hold(self, pids: list[int], gpus: list[int] | None = None) -> None:
        devices = tuple(
            FakeGpu(
                i, u, "NVIDIA H100 80GB HBM3", f"00000000:{0x18 + i:02X}:00.0", 80 * GIB, 0, 0, 0
            )
            for i, u in enumerate(UUIDS)
        )
        on = gpus if gpus is not None else list(range(len(pids)))
        held = tuple(FakeProcess(g, pid, (10 + g) * GIB) for pid, g in zip(pids, on, strict=True))
        write_state(self.state, FakeNvmlState(gpus=devices, processes=held))

    def scrape(self) -> tuple[list[Sample], dict[str, Any]]:
        published = self.exporter.run_once()
        body, _ = self.exporter.render(None)
        return samples(body.decode()), ledger_document(published)

    def close(self) -> None:
        self.pipeline.close()
        self.vllm.stop()


@pytest.fixture
def agent(head: RayHead, tmp_path: Path) -> Iterator[Agent]:
    made = Agent(head, tmp_path)
    yield made
    made.close()


def _settled(agent: Agent, done: Any, seconds: float = 30.0) -> tuple[list[Sample], Any]:
    """Scrape until `done(samples)`: Ray's tables settle a moment after the driver says so."""
    deadline = time.monotonic() + seconds
    while True:
        s, doc = agent.scrape()
        if done(s) or time.monotonic() > deadline:
            return s, doc
        time.sleep(0.5)


def test_workers_are_attributed_to_their_driver_and_leave_with_it(
    head: RayHead, agent: Agent
) -> None:
    driver = Driver(head, "ray")
    try:
        pids, job = driver.info["pids"], driver.info["job_id"]
        agent.hold(pids)
        s, doc = _settled(agent, lambda s: len(pick(s, "gpuledger_ray_worker_info")) == TP)
        identity = {"ray_job_id": job, "ray_driver_node_id": driver.info["node_id"]}
        assert value(s, "gpuledger_source_up", source="ray") == 1
        # Every worker, under the engine's identity, with its rank and its process's GPU.
        workers = pick(s, "gpuledger_ray_worker_info", **identity)
        assert sorted(w[1]["tp_rank"] for w in workers) == ["0", "1", "2", "3"]
        assert {w[1]["class_name"] for w in workers} == {"RayWorkerProc"}
        assert sorted(w[1]["bundle_index"] for w in workers) == ["0", "1", "2", "3"]
        memory = pick(s, "gpuledger_ray_worker_gpu_memory_used_bytes", **identity)
        assert {m[1]["tp_rank"]: m[1]["gpu_uuid"] for m in memory} == {
            str(r): UUIDS[r] for r in range(TP)
        }
        # The engine on this host is linked to the driver's job: TP from its placement group.
        engine = {"model_name": MODEL, "engine": "0"}
        assert value(s, "gpuledger_engine_ray_job_info", **engine, **identity) == 1
        assert value(s, "gpuledger_engine_ray_workers", **engine, state="ALIVE") == TP
        assert value(s, "gpuledger_engine_gpus", **engine, state="configured") == TP
        (e,) = doc.engines
        assert e.ray is not None and e.ray.driver_pid == driver.info["driver_pid"]  # its own
        assert {w.host_pid for w in doc.ray.workers} == set(pids)
        # What explain prints under the engine (a host without Kubernetes has no workload to
        # explain by name: the chain itself).
        lines = "\n".join(footprint_lines(e, footprint(RayWorkers([doc]), e)))
        assert f"Ray job {job}: driver EngineCore pid {driver.info['driver_pid']}" in lines
        assert f"GPUs in use by its workers: {TP} on 1 node(s) (ray-host), configured {TP}" in lines
        # Two workers on one GPU: the engine holds 3.
        agent.hold(pids, gpus=[0, 1, 2, 2])
        _, doc = agent.scrape()
        fp = footprint(RayWorkers([doc]), doc.engines[0])
        assert fp is not None and fp.gpus_in_use == 3
    finally:
        driver.stop()
    s, doc = _settled(agent, lambda s: not pick(s, "gpuledger_ray_worker_info"))
    for family in (
        "gpuledger_ray_worker_info",
        "gpuledger_ray_worker_gpu_memory_used_bytes",
        "gpuledger_engine_ray_job_info",
        "gpuledger_engine_ray_workers",
    ):
        assert not pick(s, family), family
    assert doc.engines[0].ray is None


def test_legacy_executor_workers(head: RayHead, agent: Agent) -> None:
    driver = Driver(head, "legacy")
    try:
        agent.hold(driver.info["pids"])
        s, _ = _settled(agent, lambda s: len(pick(s, "gpuledger_ray_worker_info")) == TP)
        workers = pick(s, "gpuledger_ray_worker_info", ray_job_id=driver.info["job_id"])
        assert {(w[1]["class_name"], w[1]["tp_rank"]) for w in workers} == {
            ("RayWorkerWrapper", "")
        }
        assert sorted(w[1]["bundle_index"] for w in workers) == ["0", "1", "2", "3"]
        assert value(s, "gpuledger_engine_ray_workers", model_name=MODEL, state="ALIVE") == TP
    finally:
        driver.stop()
