"""Memory and CPU of a real `gpuledger serve` node agent on the dense simulated node.

The agent runs as the DaemonSet runs it: node mode, all six sources, the pod informer
on in-cluster configuration (HTTPS, service-account token and CA). As root, the
process gets a private mount namespace in which the simulated service account sits at
the real path (/var/run/secrets/kubernetes.io/serviceaccount); otherwise it falls back
to a kubeconfig, which also loads the client's kubeconfig authenticators (~9 MB more),
and says so.

CPU is the process's own (utime + stime from /proc/<pid>/stat: every thread, the HTTP
server, the informer's watch), over the run after its first `--warm` seconds, at the
DaemonSet's default 10 s interval unless `--interval` says otherwise; nothing scrapes it
meanwhile and nothing reads its /ledger.json until the end.

    .venv/bin/python benchmarks/rss_serve.py [--scale 1 16] [--seconds 25] [--interval 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "exporter"), str(ROOT)]

from benchmarks.dense_node import dense_node
from gpuledger.sim.fake_nvml import STATE_ENV
from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import Scenario, parse_scenario

PORT = 19402
# Inside the namespace: a fresh /run (so nothing is written to the host), the account.
IN_NAMESPACE = (
    "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io && "
    'cp -r "$GL_SA" /run/secrets/kubernetes.io/serviceaccount && exec "$@"'
)


def can_use_namespace() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    return probe.returncode == 0


def memory(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process, all threads (fields 14 and 15 of /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_memory(
    scenario: Scenario,
    seconds: float,
    port: int = PORT,
    *,
    interval: float = 5.0,
    warm: float = 0.0,
) -> tuple[str, dict[str, Any], dict[str, float]]:
    """A real `gpuledger serve` on the simulated node for `seconds`, then scraped: the
    configuration it ran with (in-cluster where the machine allows a private mount
    namespace, else a kubeconfig), its /ledger.json, its memory in MB."""
    in_cluster = can_use_namespace()
    with SimulatedNode(scenario, in_cluster=in_cluster) as node:
        config = node.pipeline_config(5.0)
        serve = [
            sys.executable, "-m", "gpuledger", "serve",
            "--listen", f"127.0.0.1:{port}", "--interval", f"{interval:g}",
            "--proc-root", config.proc_root, "--nvml-library", str(config.nvml_library),
            "--node-name", config.node, "--kubernetes", "on",
            "--podresources-socket", str(config.podresources_socket), "--log-level", "warning",
        ]  # fmt: skip
        if config.ray_address:
            serve += ["--ray-address", config.ray_address]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter"), STATE_ENV: str(node.state_file)}
        if in_cluster:
            env |= {**node.service_env, "GL_SA": str(node.service_account_dir)}
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
            command += [IN_NAMESPACE, "sh", *serve]
        else:
            command = [*serve, "--kubeconfig", str(node.kubeconfig)]
        process = subprocess.Popen(command, env=env)
        try:
            time.sleep(warm)
            cpu0, wall0 = cpu_seconds(process.pid), time.monotonic()
            time.sleep(max(0.0, seconds - warm))
            cpu = (cpu_seconds(process.pid) - cpu0) / (time.monotonic() - wall0)
            for _ in range(5):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    r.read()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ledger.json", timeout=5) as r:
                document = json.loads(r.read())
            result = {**memory(process.pid), "millicores": cpu * 1e3}
        finally:
            process.terminate()
            process.wait(30)
    return "in-cluster" if in_cluster else "kubeconfig", document, result


def run(scale: int, seconds: float, interval: float, warm: float) -> dict[str, Any]:
    configuration, document, result = serve_memory(
        parse_scenario(dense_node(scale), "dense.yaml"), seconds, interval=interval, warm=warm
    )
    return {
        "scale": scale,
        "config": configuration,
        "sources_up": sorted(s["source"] for s in document["sources"] if s["up"]),
        "sources": len(document["sources"]),
        "engines": len(document["engines"]),
        **result,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--warm", type=float, default=10.0, help="seconds before CPU counts")
    args = parser.parse_args()
    for scale in args.scale:
        r = run(scale, args.seconds, args.interval, args.warm)
        print(json.dumps(r))
        print(
            f"scale {r['scale']:>2} ({r['config']}): RSS {r['VmRSS']:.0f} MB, peak "
            f"{r['VmHWM']:.0f} MB (anon {r['RssAnon']:.0f}, file {r['RssFile']:.0f}); "
            f"{len(r['sources_up'])}/{r['sources']} sources up, {r['engines']} engines; "
            f"{r['millicores']:.1f} millicores at a {args.interval:g} s interval",
            flush=True,
        )


if __name__ == "__main__":
    main()
