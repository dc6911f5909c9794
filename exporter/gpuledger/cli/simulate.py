"""`gpuledger demo` and `gpuledger simulate`: the exporter against the simulator.

The simulator (and PyYAML, and the fake NVML's C build) is imported only inside these
commands: `gpuledger serve` never loads gpuledger.sim (tests/e2e/test_serve_imports.py).
The exporter image leaves the simulator out (.dockerignore); there these commands say so.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from gpuledger.cli.flags import EXIT_USAGE
from gpuledger.cli.serve import run_exporter
from gpuledger.pipeline import Pipeline
from gpuledger.web.server import Exporter

if TYPE_CHECKING:
    from gpuledger.sim.scenario import Scenario

log = logging.getLogger("gpuledger")


def run_simulation(scenario: Scenario, args: argparse.Namespace, banner: str | None) -> int:
    from gpuledger.sim.fake_nvml import FakeNvmlBuildError  # noqa: PLC0415 (see top)
    from gpuledger.sim.harness import (  # noqa: PLC0415
        PhaseClock,
        SimulatedNode,
        deliver_spans,
    )

    try:
        node = SimulatedNode(scenario)
    except FakeNvmlBuildError as exc:
        print(f"gpuledger: error: {exc}", file=sys.stderr)
        return 1
    with node:
        if args.once:
            state = scenario.at_phase(getattr(args, "phase", None))
            node.apply(state)
            pipeline = Pipeline(node.pipeline_config(args.source_deadline))
            exporter = Exporter(pipeline.cycle, args.interval)
            pipeline.warm_up(args.source_deadline)
            deliver_spans(node, state, pipeline)
            exporter.run_once()
            body, _ = exporter.render(None)
            pipeline.close()
            sys.stdout.write(body.decode())
            return 0
        return run_exporter(
            node.pipeline_config(args.source_deadline), args, banner, PhaseClock(node, scenario)
        )


DEMO_BANNER = """\
gpuledger demo: a SIMULATED node, not your hardware.
  Node "{node}": 8 simulated H100-class GPUs (fake NVML at the C ABI + a synthetic /proc).
  Pods: two time-sliced on one GPU, one that holds a GPU it never opens, plus a host process.
  Also simulated: the kubelet's PodResources, the Kubernetes API and a queueing vLLM engine.
Look at:
  {{url}}/ledger    the node's GPU ledger, readable (open it in a browser)
  {{url}}/metrics   the exposition (try: curl -s {{url}}/metrics | grep allocated_unused)
  gpuledger explain --from {{url}} --workload llm/llama-8b
                        where that workload's requests wait, and why
  gpuledger explain --from {{url}} --request req-102
                        one slow request walked to its GPUs (its engine's spans arrive ~20 s in)
Stop with Ctrl-C."""


NO_SIMULATOR = (
    "the simulator is not installed here (the exporter image leaves it out): run it from a "
    "checkout (scripts/demo) or from `pip install gpuledger`"
)


def simulator_installed() -> bool:
    return importlib.util.find_spec("gpuledger.sim") is not None


def demo_scenario_path() -> Path:
    return Path(str(resources.files("gpuledger.sim") / "scenarios" / "demo.yaml"))


def run_scenario_command(args: argparse.Namespace) -> int:
    """`demo` and `simulate`: the commands that load the simulator."""
    if not simulator_installed():
        print(f"gpuledger: error: {NO_SIMULATOR}", file=sys.stderr)
        return EXIT_USAGE
    from gpuledger.sim.scenario import ScenarioError, load_scenario  # noqa: PLC0415 (see top)

    path = demo_scenario_path() if args.command == "demo" else Path(args.file)
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        print(f"gpuledger: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    banner = DEMO_BANNER.format(node=scenario.node) if args.command == "demo" else None
    return run_simulation(scenario, args, banner)
