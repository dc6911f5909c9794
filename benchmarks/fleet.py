"""A simulated fleet of node agents as Prometheus would hold it, for the fleet page.

`Fleet(nodes)`: every node runs two pods of workloads with four replicas each (on four
neighbouring nodes), so `nodes` nodes hold `nodes / 2` workloads; their engines are set up
so that the mixin's rules judge them serving, engine queueing (KV cache), starting (a pod
not Ready), idle or routing (imbalance), by workload number; and the cluster view reports
`PENDING_WORKLOADS` workloads of two pods not placed. `openmetrics()` writes what the agents
and the cluster view would have exposed over the last ten minutes (every series with the
`node`, `instance` and `job` labels a scrape adds), `document(node)` what each node agent
serves as /ledger.json.

`AgentFarm` is one HTTP server that answers as every agent: node i is at 127.1.x.y (the
whole 127/8 is loopback on Linux), so Prometheus' `instance` label is a distinct address per
agent, and the farm counts the /ledger.json reads each address got.
`FleetPrometheus` loads the series with `promtool tsdb create-blocks-from openmetrics` and
starts a real Prometheus on them with the mixin's rendered recording rules, which it
evaluates itself: the recorded series are the real rules' names and answers.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpuledger.document.codec import to_json
from gpuledger.document.v1 import SCHEMA, EngineDoc, LedgerDocument, PendingDoc, PodDoc

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "mixin" / "rendered" / "gpuledger.rules.yaml"
REPLICAS = 4
PODS_PER_NODE = 2
GPUS = 8
PENDING_WORKLOADS = 50
# Every series' cluster label, as a Prometheus holding several clusters (Thanos) has it.
CLUSTER = {"cluster": "sim"}
CLUSTER_VIEW = -1  # AgentFarm's key of the cluster view's reads
# (workload, replica) whose engine runs on the Ray executor, its workers on other nodes.
RAY_ENGINE = ("llm-0000", 0)
STEP_SECONDS = 60
SAMPLES = 10
# What the rules make of each kind of workload: (stage, reason).
KINDS = (
    ("serving", None),
    ("engine_queueing", "kv_cache"),
    ("starting", "pod_not_ready"),
    ("idle", None),
    ("routing", "imbalance"),
)


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    workload: str
    node: int
    replica: int
    kind: int  # index into KINDS


def _node_name(i: int) -> str:
    return f"gpu-node-{i:04d}"


def _address(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


def _engine_state(pod: Pod) -> dict[str, float]:
    """The engine series of a pod's engine that make its workload's stage."""
    stage = KINDS[pod.kind][0]
    if stage == "engine_queueing":
        return {"up": 1, "waiting": 20, "running": 32, "kv": 0.95}
    if stage == "starting" and pod.replica == 0:
        return {"up": 0, "waiting": 0, "running": 0, "kv": 0.0, "starting": 1}
    if stage == "idle":
        return {"up": 1, "waiting": 0, "running": 0, "kv": 0.0}
    if stage == "routing":
        if pod.replica == 0:
            return {"up": 1, "waiting": 25, "running": 32, "kv": 0.3}
        return {"up": 1, "waiting": 0, "running": 4, "kv": 0.1}
    return {"up": 1, "waiting": 0, "running": 10, "kv": 0.3}


class Fleet:
    def __init__(self, nodes: int, port: int, cluster_instance: str = "127.0.0.1:1") -> None:
        self.nodes = nodes
        self.port = port
        self.cluster_instance = cluster_instance
        self.workloads = nodes * PODS_PER_NODE // REPLICAS
        self.pods: list[Pod] = []
        for k in range(self.workloads):
            for r in range(REPLICAS):
                node = (k * PODS_PER_NODE + r) % nodes
                ns, name = f"team-{k % 20:02d}", f"llm-{k:04d}"
                uid = f"{k:08x}-0000-4000-8000-{r:012x}"
                self.pods.append(Pod(ns, f"{name}-{r}", uid, name, node, r, k % len(KINDS)))
        self.by_node: dict[int, list[Pod]] = {}
        for p in self.pods:
            self.by_node.setdefault(p.node, []).append(p)

    def instance(self, node: int) -> str:
        return f"{_address(node)}:{self.port}"

    def node_of_address(self, host: str) -> int | None:
        parts = host.split(".")
        if len(parts) != 4 or parts[:2] != ["127", "1"]:
            return None
        i = int(parts[2]) * 250 + int(parts[3]) - 1
        return i if 0 <= i < self.nodes else None

    def expected(self) -> dict[tuple[str, str], tuple[str, str | None]]:
        """(namespace, workload) -> (stage, reason) the rules should give."""
        out = {(p.namespace, p.workload): KINDS[p.kind] for p in self.pods}
        for m in range(PENDING_WORKLOADS):
            out[("batch", f"pending-{m:03d}")] = ("pending_placement", "insufficient_gpu")
        return out

    def nodes_of(self, namespace: str, workload: str) -> set[int]:
        return {p.node for p in self.pods if (p.namespace, p.workload) == (namespace, workload)}

    def ray_worker_nodes(self) -> tuple[int, ...]:
        """Where the Ray workers of RAY_ENGINE's engine run: far from its pods."""
        return (self.nodes // 2, self.nodes // 2 + 1)

    # ------------------------------------------------------------------ series

    def _series(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        """(family, type, labels, value) of every series of the fleet."""
        for i in range(self.nodes):
            base = {**CLUSTER, "job": "gpuledger-node", "instance": self.instance(i)}
            base["node"] = _node_name(i)
            for g in range(GPUS):
                yield "gpuledger_gpu_up", "gauge", {**base, "gpu_uuid": f"GPU-{i:04d}-{g}"}, 1
            for p in self.by_node.get(i, []):
                yield from self._pod_series(base, p)
        for i in self.ray_worker_nodes():
            base = {**CLUSTER, "job": "gpuledger-node", "instance": self.instance(i)}
            base["node"] = _node_name(i)
            worker = {**base, "namespace": "ray", "pod": f"raycluster-worker-{i}"}
            worker |= {"pod_uid": f"r{i:07x}", "workload": "raycluster"}
            worker |= {"ray_job_id": "01000000", "ray_driver_node_id": "d" * 56}
            worker |= {"class_name": "RayWorkerProc", "bundle_index": "0"}
            worker |= {"tp_rank": "1", "pp_rank": "0"}
            yield "gpuledger_ray_worker_info", "gauge", worker, 1
        cluster = {**CLUSTER, "job": "gpuledger-cluster", "instance": self.cluster_instance}
        cluster["node"] = "cluster-view"
        for m in range(PENDING_WORKLOADS):
            for r in range(2):
                labels = {**cluster, "namespace": "batch", "workload": f"pending-{m:03d}"}
                labels |= {"pod": f"pending-{m:03d}-{r}", "pod_uid": f"p{m:07x}-{r}"}
                yield "gpuledger_pod_pending_gpus", "gauge", labels, 8
                pending = {**labels, "reason": "insufficient_gpu"}
                yield "gpuledger_pod_pending_placement", "gauge", pending, 1

    def _pod_series(
        self, base: dict[str, str], p: Pod
    ) -> Iterator[tuple[str, str, dict[str, str], float]]:
        pod = {**base, "namespace": p.namespace, "pod": p.name, "pod_uid": p.uid}
        pod["workload"] = p.workload
        state = _engine_state(p)
        yield "gpuledger_pod_starting", "gauge", pod, state.get("starting", 0)
        engine = {**pod, "model_name": "meta-llama/Llama-3.1-8B-Instruct", "engine": "0"}
        engine["target"] = f"10.{p.node // 250}.{p.node % 250}.{p.replica}:8000"
        yield "gpuledger_engine_up", "gauge", engine, state["up"]
        if not state["up"]:
            return
        for s in ("waiting", "running"):
            yield "gpuledger_engine_requests", "gauge", {**engine, "state": s}, state[s]
        yield "gpuledger_engine_kv_cache_usage_ratio", "gauge", engine, state["kv"]
        yield "gpuledger_engine_max_num_seqs", "gauge", engine, 32
        if (p.workload, p.replica) == RAY_ENGINE:
            job = {"ray_job_id": "01000000", "ray_driver_node_id": "d" * 56}
            yield "gpuledger_engine_ray_job_info", "gauge", {**engine, **job}, 1

    def openmetrics(self, path: Path, end: float) -> int:
        """Writes the series, SAMPLES samples each up to `end`; the series count."""
        by_family: dict[str, list[tuple[dict[str, str], float]]] = {}
        types: dict[str, str] = {}
        for family, kind, labels, value in self._series():
            types[family] = kind
            by_family.setdefault(family, []).append((labels, value))
        times = [end - STEP_SECONDS * (SAMPLES - 1 - t) for t in range(SAMPLES)]
        with path.open("w") as out:
            for family, rows in by_family.items():
                out.write(f"# TYPE {family} {types[family]}\n")
                for labels, value in rows:
                    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    for t in times:
                        out.write(f"{family}{{{text}}} {value:g} {t:.3f}\n")
            out.write("# EOF\n")
        return sum(len(rows) for rows in by_family.values())

    # ------------------------------------------------------------------ documents

    def document(self, node: int) -> LedgerDocument:
        pods, engines = [], []
        for p in self.by_node.get(node, []):
            state = _engine_state(p)
            starting = bool(state.get("starting"))
            pods.append(
                PodDoc(
                    namespace=p.namespace,
                    name=p.name,
                    uid=p.uid,
                    workload=p.workload,
                    phase="Running",
                    ready=not starting,
                    starting=starting,
                    gpu_requests=4,
                    node=_node_name(node),
                )
            )
            engines.append(_engine_doc(p, state))
        return LedgerDocument(
            schema=SCHEMA,
            version="fleet-sim",
            node=_node_name(node),
            taken_at=time.time(),
            pods=tuple(pods),
            engines=tuple(engines),
        )

    def cluster_document(self) -> LedgerDocument:
        pending = tuple(
            PendingDoc(
                namespace="batch",
                name=f"pending-{m:03d}-{r}",
                uid=f"p{m:07x}-{r}",
                workload=f"pending-{m:03d}",
                reason="insufficient_gpu",
                gpus=8,
            )
            for m in range(PENDING_WORKLOADS)
            for r in range(2)
        )
        return LedgerDocument(
            schema=SCHEMA,
            version="fleet-sim",
            node="cluster-view",
            mode="cluster",
            taken_at=time.time(),
            pending=pending,
        )


def _engine_doc(p: Pod, state: dict[str, float]) -> EngineDoc:
    up = bool(state["up"])
    return EngineDoc(
        namespace=p.namespace,
        pod=p.name,
        pod_uid=p.uid,
        workload=p.workload,
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        engine="0",
        url=f"http://10.{p.node // 250}.{p.node % 250}.{p.replica}:8000/metrics",
        origin="annotation",
        up=up,
        requests_running=state["running"] if up else None,
        requests_waiting=state["waiting"] if up else None,
        waiting_by_reason={},
        kv_cache_usage_ratio=state["kv"] if up else None,
        preemptions_total=0.0 if up else None,
        config={"max_num_seqs": "32"},
        gpus=(),
        gpus_configured=None,
        gpus_in_use=None,
        target=f"10.{p.node // 250}.{p.node % 250}.{p.replica}:8000",
    )


class AgentFarm:
    """One server answering /ledger.json as every node agent, by the address reached."""

    def __init__(self) -> None:
        self.fleet: Fleet | None = None
        self.reads: Counter[int] = Counter()
        self.bodies: dict[int, bytes] = {}
        farm = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                host = self.request.getsockname()[0]
                node = farm.fleet.node_of_address(host) if farm.fleet else None
                if host == "127.0.0.1":
                    node = CLUSTER_VIEW  # the cluster view is at 127.0.0.1
                if node is None or not self.path.startswith("/ledger.json"):
                    self.send_error(404)
                    return
                farm.reads[node] += 1
                body = farm.body(node)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        # Every address of 127/8 is this host's: listening on all of them is one socket.
        self.server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def cluster_instance(self) -> str:
        return f"127.0.0.1:{self.port}"

    def body(self, node: int) -> bytes:
        if node not in self.bodies:
            assert self.fleet is not None
            doc = (
                self.fleet.cluster_document() if node == CLUSTER_VIEW else self.fleet.document(node)
            )
            self.bodies[node] = json.dumps(to_json(doc)).encode()
        return self.bodies[node]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tool(name: str) -> str:
    found = shutil.which(name) or (
        f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
    )
    assert found, f"{name} not found: install the Debian package prometheus (scripts/setup-env)"
    return found


class FleetPrometheus:
    """A real Prometheus on the fleet's series (backfilled), evaluating the mixin's rules."""

    def __init__(self, fleet: Fleet, workdir: Path) -> None:
        self.workdir = workdir
        data = workdir / "data"
        source = workdir / "fleet.om"
        # The samples end 30 s ago: blocks wholly in the past, before the head's range.
        self.series = fleet.openmetrics(source, time.time() - 30)
        subprocess.run(
            [
                _tool("promtool"),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(source),
                str(data),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=600,
        )
        source.unlink()
        config = workdir / "prometheus.yml"
        config.write_text(
            f"global:\n  evaluation_interval: 2s\nrule_files: [{json.dumps(str(RULES))}]\n"
        )
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                _tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                # The backfilled samples stay the latest for an hour: the rules (evaluated
                # now) and the page's instant queries see them.
                "--query.lookback-delta=1h",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=30) as r:
            return list(json.loads(r.read())["data"]["result"])

    def wait_judged(self, workloads: int, timeout: float = 300.0) -> None:
        """Until the rules have given every workload its stage."""
        deadline = time.monotonic() + timeout
        expr = "count(namespace_workload_stage_reason:gpuledger_stage_reason_code:group)"
        while True:
            try:
                found = self.query(expr)
                if found and int(float(found[0]["value"][1])) >= workloads:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the rules never judged {workloads} workloads: {self._log_tail()}"
                )
            time.sleep(1)

    def _log_tail(self) -> str:
        self.log.flush()
        return (self.workdir / "prometheus.log").read_text()[-2000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.log.close()


__all__ = ["AgentFarm", "Fleet", "FleetPrometheus"]
