"""Stands up a scenario's simulated sources for the real exporter pipeline.

NVML: the fake libnvidia-ml.so.1 (compiled at run time) reading a state file.
procfs: a synthetic proc root with the files the procfs source reads.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from gpuledger.pipeline import PipelineConfig
from gpuledger.sim.fake_nvml import (
    STATE_ENV,
    FakeGpu,
    FakeNvmlState,
    FakeProcess,
    build_fake_nvml,
    write_state,
)
from gpuledger.sim.scenario import Scenario, SimProcess

_COMM_LIMIT = 15  # the kernel cuts comm to 15 bytes; titles live in cmdline


def nvml_state(scenario: Scenario) -> FakeNvmlState:
    by_uuid = {g.uuid: g for g in scenario.gpus}
    used = {g.uuid: g.memory_reserved for g in scenario.gpus}
    processes = []
    for proc in scenario.processes:
        for uuid, size in proc.gpu_memory.items():
            used[uuid] += size
            processes.append(FakeProcess(by_uuid[uuid].index, proc.pid, size))
    gpus = tuple(
        FakeGpu(
            index=g.index,
            uuid=g.uuid,
            name=g.name,
            pci_bus_id=g.pci_bus_id,
            memory_total=g.memory_total,
            memory_used=min(used[g.uuid], g.memory_total),
            util_gpu=round(g.utilization * 100),
            util_memory=0,
            mig_mode=g.mig_mode,
            lost=g.lost,
        )
        for g in sorted(scenario.gpus, key=lambda g: g.index)
    )
    return FakeNvmlState(
        gpus=gpus,
        processes=tuple(processes),
        driver_version=scenario.nvml.driver_version,
        init_error=scenario.nvml.init_error,
    )


def _status(proc: SimProcess) -> str:
    comm = Path(proc.cmdline[0]).name[:_COMM_LIMIT]
    nspid = "\t".join(str(p) for p in (proc.nspid or (proc.pid,)))
    return (
        f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{proc.pid}\n"
        f"Ngid:\t0\nPid:\t{proc.pid}\nPPid:\t{proc.ppid}\nTracerPid:\t0\n"
        f"NStgid:\t{nspid}\nNSpid:\t{nspid}\n"
    )


def write_proc_root(root: Path, processes: tuple[SimProcess, ...]) -> None:
    """Rewrite the synthetic proc root to hold exactly `processes`."""
    root.mkdir(parents=True, exist_ok=True)
    wanted = {str(p.pid) for p in processes}
    for entry in root.iterdir():
        if entry.name.isdigit() and entry.name not in wanted:
            shutil.rmtree(entry, ignore_errors=True)
    for proc in processes:
        base = root / str(proc.pid)
        base.mkdir(exist_ok=True)
        (base / "status").write_text(_status(proc))
        (base / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in proc.cmdline))
        (base / "comm").write_text(Path(proc.cmdline[0]).name[:_COMM_LIMIT] + "\n")
        (base / "cgroup").write_text(proc.cgroup.rstrip("\n") + "\n")
        (base / "environ").write_bytes(
            b"".join(f"{k}={v}".encode() + b"\0" for k, v in proc.environ.items())
        )


class SimulatedNode:
    """A scenario's simulated sources, living in a work directory until closed."""

    def __init__(self, scenario: Scenario, workdir: Path | None = None) -> None:
        self.scenario = scenario
        self._own_dir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuledger-sim-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc_root = self.workdir / "proc"
        self.state_file = self.workdir / "nvml.state"
        if scenario.nvml.library == "missing":
            self.library_path = str(self.workdir / "absent" / "libnvidia-ml.so.1")
        else:
            self.library_path = str(build_fake_nvml(frozenset(scenario.nvml.variants)))
        # The fake library reads this at every (re)load; one simulated node per process.
        os.environ[STATE_ENV] = str(self.state_file)
        self.apply(scenario)

    def apply(self, state: Scenario) -> None:
        """Make the simulated node look like `state` (a scenario, possibly at a phase)."""
        write_state(self.state_file, nvml_state(state))
        write_proc_root(self.proc_root, state.processes)

    def pipeline_config(self, deadline_seconds: float = 5.0) -> PipelineConfig:
        return PipelineConfig(
            node=self.scenario.node,
            proc_root=str(self.proc_root),
            nvml_library=self.library_path,
            source_deadline_seconds=deadline_seconds,
        )

    def close(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SimulatedNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PhaseClock:
    """Advances a simulated node through its scenario's phases in real time."""

    def __init__(self, node: SimulatedNode, scenario: Scenario) -> None:
        self.node, self.scenario = node, scenario
        self.started = time.monotonic()
        self.current: str | None = None

    def tick(self) -> None:
        elapsed = time.monotonic() - self.started
        due = [p.name for p in self.scenario.phases if p.after_seconds <= elapsed]
        if due and due[-1] != self.current:
            self.current = due[-1]
            logging.getLogger(__name__).info("scenario phase %s", self.current)
            self.node.apply(self.scenario.at_phase(self.current))
