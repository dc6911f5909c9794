"""Memory and CPU of hostile answers, through the real pipeline and its source runners.

Each case serves one hostile body from a server in its own process, then a fresh
measuring process runs the real `Pipeline` (the production `SourceRunner`, thread pool
and garbage-collector defaults) with only that source for `--cycles` cycles, and reports
its RSS at the start, after every cycle (steady: the last; max over cycles) and at its
peak (`VmHWM`), and the CPU one cycle costs. Servers and measurer never share a process,
so the body the server holds is not counted.

    .venv/bin/python benchmarks/hostile_memory.py [--cycles 8] [--only ray-empty-objects ...]
    .venv/bin/python benchmarks/hostile_memory.py --combined 40   # a real serve, at once

Ray cases answer every state API path with the same body; vLLM cases answer all eight
engine targets (the scraper's workers) with it, so a figure is the worst one source meets.
Serve cases run the Serve source through its runner against one Ray node (the Ray
source's answer is given), the hostile part at its metrics port or its applications.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "exporter"), str(ROOT)]

MIB = 1024 * 1024
ENGINES = 8


def _ray(rows: bytes) -> bytes:
    return b'{"result": true, "msg": "", "data": {"result": {"result": [' + rows + b"]}}}"


def _fill(unit: bytes, size: int) -> bytes:
    return unit * (size // len(unit))


def _exposition_series(count: int) -> bytes:
    """The real vLLM 0.32 sample, then `count` series of another family."""
    sample = (ROOT / "tests" / "fixtures" / "vllm" / "vllm-0.32.txt").read_bytes()
    return sample + b"".join(b'other_metric{engine="0",i="%d"} 1\n' % i for i in range(count))


def _wanted_at_bound() -> bytes:
    """cache_config_info lines of distinct engines up to the 512 KiB of wanted lines."""
    line = b'vllm:cache_config_info{engine="%d",block_size="16",num_gpu_blocks="%d"} 1\n'
    return b"".join(line % (i, i) for i in range(6_500))


def _ray_cluster(actors: int) -> dict[str, bytes]:
    """A state API whose actor list has `actors` rows like the captured Ray 2.60 ones."""
    fixtures = ROOT / "tests" / "fixtures" / "ray" / "ray-2.60-local"
    envelope = json.loads((fixtures / "actors_detail.json").read_text())
    rows = envelope["data"]["result"]["result"]
    many = []
    for i in range(actors):
        row = dict(rows[i % len(rows)])
        row["actor_id"] = f"{i:032x}"
        many.append(row)
    envelope["data"]["result"].update(result=many, total=actors, num_after_truncation=actors)
    envelope["data"]["result"]["num_filtered"] = actors
    return {
        "/api/v0/actors": json.dumps(envelope).encode(),
        "/api/v0/nodes": (fixtures / "nodes_detail.json").read_bytes(),
        "/api/v0/placement_groups": (fixtures / "placement_groups_detail.json").read_bytes(),
        "/api/cluster_status": (fixtures / "cluster_status.json").read_bytes(),
    }


def _ray_at_budget(unit: bytes) -> bytes:
    """A list of `unit` values just inside the client's bounds for 10,000 rows
    (sources/ray/state.py: 4,096 + 96 a row; written out so that older code can be measured)."""
    per_unit = 1 + sum(map(unit.count, (b",", b":", b"{", b"[")))
    count = (4096 + 10_000 * 96 - 64) // per_unit
    return _ray(b",".join([unit] * count))


SERVE = ROOT / "tests" / "fixtures" / "ray" / "ray-2.60-serve"
SERVE_NODE = "7cc0021f8fcc6b248d693dcf14978f1d1aa83da30d5be155e6e4e1df"


def _serve(
    metrics: bytes, applications: bytes | None = None, node: bytes | None = None
) -> dict[str, bytes]:
    """A dashboard with Serve running on one Ray node whose metrics port is this server
    ($PORT), answering `metrics` there (and `applications` and the node's `detail`, else
    the captured ones)."""
    detail = json.loads((SERVE / "ray_dashboard_nodes_node_id.json").read_text())
    detail["data"]["detail"]["raylet"]["metricsExportPort"] = "$PORT"
    return {
        "/api/serve/applications/": applications
        or (SERVE / "serve_applications_under_load.json").read_bytes(),
        f"/nodes/{SERVE_NODE}": node or json.dumps(detail).encode(),
        "/metrics": metrics,
    }


def _serve_node_at_budget() -> dict[str, bytes]:
    """The node's detail: short strings up to the JSON bound of its 8 MiB cap (one value
    per 8 bytes, sources/ray/serve.py)."""
    count = 8 * MIB // 8 - 64
    return _serve(b"", node=b"[" + b",".join([b'"ab"'] * count) + b"]")


Body = bytes | dict[str, bytes]

# name -> (source, body factory, headers). Bodies are made in the server process only.
CASES: dict[str, tuple[str, Callable[[], Body], dict[str, str]]] = {
    "ray-oversized-streamed": ("ray", lambda: b" " * (33 * MIB), {"length": "none"}),
    "ray-oversized-declared": ("ray", lambda: b" " * (33 * MIB), {}),
    "ray-empty-objects": ("ray", lambda: _ray(_fill(b"{},", 31 * MIB) + b"{}"), {}),
    "ray-empty-lists": ("ray", lambda: _ray(_fill(b"[],", 31 * MIB) + b"[]"), {}),
    "ray-short-strings": ("ray", lambda: _ray(_fill(b'"ab",', 31 * MIB) + b'"ab"'), {}),
    "ray-deep-nesting": ("ray", lambda: b"[" * (31 * MIB), {}),
    "ray-gzip-bomb": ("ray", lambda: gzip.compress(b" " * (256 * MIB), 9), {"gzip": "1"}),
    "ray-strings-at-budget": ("ray", lambda: _ray_at_budget(b'"ab"'), {}),
    "ray-objects-at-budget": ("ray", lambda: _ray_at_budget(b'{"a":{}}'), {}),
    "ray-10k-actors": ("ray", lambda: _ray_cluster(10_000), {}),
    "vllm-garbage-50mb": ("vllm", lambda: os.urandom(50 * MIB), {"length": "none"}),
    "vllm-garbage-50mb-declared": ("vllm", lambda: os.urandom(50 * MIB), {}),
    "vllm-short-lines": ("vllm", lambda: _fill(b"ab\n", 8 * MIB - 3), {}),
    "vllm-empty-lines": ("vllm", lambda: b"\n" * (8 * MIB - 1), {}),
    "vllm-200k-series": ("vllm", lambda: _exposition_series(200_000), {}),
    "vllm-wanted-at-bound": ("vllm", _wanted_at_bound, {}),
    "vllm-gzip-bomb": ("vllm", lambda: gzip.compress(b"\n" * (256 * MIB), 9), {"gzip": "1"}),
    "serve-metrics-short-lines": ("serve", lambda: _serve(_fill(b"ab\n", 32 * MIB - 3)), {}),
    "serve-metrics-oversized": (
        "serve",
        lambda: _serve(_fill(b"other_metric 1\n", 40 * MIB)),
        {"length": "none"},
    ),
    "serve-node-detail-at-budget": ("serve", _serve_node_at_budget, {}),
    "serve-applications-empty-objects": (
        "serve",
        lambda: _serve(b"", b"[" + _fill(b"{},", 4 * MIB - 64) + b"{}]"),
        {},
    ),
}


# ------------------------------------------------------------------------ the server


def serve(case: str) -> None:
    """Answer every GET with the case's body; print the port, serve until killed."""
    _, make, options = CASES[case]
    made = make()
    bodies = made if isinstance(made, dict) else {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.close_connection = True
            body = bodies.get(self.path.split("?")[0], made) if bodies else made
            assert isinstance(body, bytes)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            if options.get("gzip"):
                self.send_header("Content-Encoding", "gzip")
            if options.get("length") != "none":
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                view = memoryview(body)
                for at in range(0, len(body), MIB):
                    self.wfile.write(view[at : at + MIB])
            except OSError:
                pass  # the client stopped reading: the point of a cap

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    port = str(httpd.server_address[1]).encode()
    for path, body in bodies.items():
        bodies[path] = body.replace(b'"$PORT"', port)
    print(httpd.server_address[1], flush=True)
    httpd.serve_forever()


# --------------------------------------------------------------------- the measurer


def _status() -> dict[str, float]:
    fields: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def measure(case: str, url: str, cycles: int) -> dict[str, Any]:
    from gpuledger.pipeline import Pipeline, PipelineConfig, _ray_client
    from gpuledger.sources.engines.source import EngineScraper, EngineSource
    from gpuledger.sources.ray.state import RayClusterSource

    source_kind = CASES[case][0]
    config = PipelineConfig(node="bench", mode="cluster", ray_address=url)
    if source_kind == "serve":
        return measure_serve(case, url, cycles)
    if source_kind == "ray":
        source: Any = RayClusterSource(_ray_client(config), "", "ray")
    else:
        # As node_sources builds it at the default deadline (5 s).
        scraper = EngineScraper(timeout_seconds=2.5, max_body_bytes=config.engine_max_body_bytes)
        targets = [f"{url}/metrics?engine={i}" for i in range(ENGINES)]
        source = EngineSource(scraper, targets, discovery=False)
    pipeline = Pipeline(config, sources=[source])
    start = _status()["VmRSS"]
    rss: list[float] = []
    up = 0
    reasons: set[str] = set()
    cpu = time.process_time()
    wall = time.monotonic()
    for _ in range(cycles):
        published = pipeline.cycle()
        reasons.update(r for (_, r) in published.errors_total)
        up += _engines_up(published) if source_kind == "vllm" else _up(published)
        rss.append(_status()["VmRSS"])
    cpu = time.process_time() - cpu
    wall = time.monotonic() - wall
    pipeline.close()
    return _figures(case, cycles, reasons, start, rss, up, cpu, wall)


def measure_serve(case: str, url: str, cycles: int) -> dict[str, Any]:
    """The Serve source through its runner: it needs the Ray source's local nodes, given
    here (one Ray node at 127.0.0.1, whose metrics port is the server's)."""
    from gpuledger.model import Snapshots
    from gpuledger.model.ray import RAY_LOCAL, LocalRayNode, RayNode, RaySnapshot
    from gpuledger.sources.base import SourceRunner
    from gpuledger.sources.ray.serve import ServeClient, ServeSource

    node = RayNode(SERVE_NODE, "127.0.0.1", None, "ALIVE", True)
    inputs = Snapshots({RAY_LOCAL: (LocalRayNode(RaySnapshot(nodes=(node,)), node, None),)})
    source = ServeSource(ServeClient(url, timeout_seconds=4.0))
    runner: SourceRunner[Any] = SourceRunner("serve", 5.0)
    start = _status()["VmRSS"]
    rss: list[float] = []
    reasons: set[str] = set()
    up = 0
    cpu, wall = time.process_time(), time.monotonic()
    for _ in range(cycles):
        _, status = runner.run(lambda: source.fetch(inputs))
        up += status.up
        reasons.update([status.error_reason or ""] if not status.up else [])
        rss.append(_status()["VmRSS"])
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    runner.close()
    return _figures(case, cycles, reasons, start, rss, up, cpu, wall)


def _figures(
    case: str,
    cycles: int,
    reasons: set[str],
    start: float,
    rss: list[float],
    up: float,
    cpu: float,
    wall: float,
) -> dict[str, Any]:
    """One case's figures, the same keys for every source."""
    return {
        "case": case,
        "cycles": cycles,
        "reasons": sorted(reasons),
        "rss_start_mib": round(start, 1),
        "rss_steady_mib": round(rss[-1], 1),
        "rss_max_after_cycle_mib": round(max(rss), 1),
        "rss_peak_mib": round(_status()["VmHWM"], 1),
        "rss_by_cycle_mib": [round(r) for r in rss],
        "up_per_cycle": up / cycles,
        "cpu_s_per_cycle": round(cpu / cycles, 3),
        "wall_s_per_cycle": round(wall / cycles, 3),
    }


def _up(published: Any) -> int:
    return sum(1 for s in published.ledger.sources if s.up)


def _engines_up(published: Any) -> int:
    return sum(1 for e in published.ledger.engines if e.up)


def run_case(case: str, cycles: int) -> dict[str, Any]:
    me = [sys.executable, str(Path(__file__).resolve())]
    server = subprocess.Popen([*me, "--serve", case], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        out = subprocess.run(
            [*me, "--measure", case, "--url", url, "--cycles", str(cycles)],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(f"{case}: the measuring process failed:\n{out.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result
    finally:
        server.kill()
        server.wait()


def combined(seconds: float) -> dict[str, Any]:
    """A real `gpuledger serve` (node mode, --interval 1) whose Ray dashboard and eight
    vLLM engines send the worst answers within their bounds, every cycle, at once (the two
    sources run in the same stage; Serve runs after Ray, never beside it)."""
    me = [sys.executable, str(Path(__file__).resolve())]
    servers = [
        subprocess.Popen([*me, "--serve", case], stdout=subprocess.PIPE, text=True)
        for case in ("ray-strings-at-budget", "vllm-wanted-at-bound")
    ]
    try:
        ray, vllm = (int(s.stdout.readline()) for s in servers if s.stdout is not None)
        command = [
            sys.executable, "-m", "gpuledger", "serve", "--listen", "127.0.0.1:0",
            "--interval", "1", "--kubernetes", "off", "--podresources-socket", "",
            "--nvml-library", "/nonexistent/libnvidia-ml.so.1", "--proc-root", "/nonexistent",
            "--ray-address", f"http://127.0.0.1:{ray}", "--log-level", "error",
            *[a for i in range(ENGINES) for a in ("--vllm-target", f"http://127.0.0.1:{vllm}/{i}")],
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT / "exporter")}
        agent = subprocess.Popen(command, env=env)
        try:
            time.sleep(seconds)
            fields = {
                k: int(v.split()[0]) / 1024
                for k, v in (
                    line.split(":", 1)
                    for line in Path(f"/proc/{agent.pid}/status").read_text().splitlines()
                )
                if k in ("VmRSS", "VmHWM")
            }
        finally:
            agent.terminate()
            agent.wait(30)
    finally:
        for server in servers:
            server.kill()
            server.wait()
    return {"case": "combined", "seconds": seconds, **{k: round(v, 1) for k, v in fields.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--combined", type=float, metavar="SECONDS", default=None)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.measure:
        print(json.dumps(measure(args.measure, args.url, args.cycles)))
        return
    if args.combined is not None:
        print(json.dumps(combined(args.combined)))
        return
    for case in args.only or list(CASES):
        result = run_case(case, args.cycles)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
