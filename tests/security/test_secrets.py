"""Secrets in processes' environment and command line, in the Ray token (file and auth), in
the kubeconfig and in a vLLM target's URL never reach any output channel.

Channels grepped: /metrics (text and OpenMetrics), /ledger.json (source error messages
included), /ledger, /, the log at debug level (stderr of the serving process), stdout,
and `gpuledger explain` in text and JSON, both from a running exporter and from a scenario.
Each secret value carries the marker MARK, so a partial leak is caught too. Every channel
is also checked to hold real content, so the test cannot pass on empty output.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import parse_scenario
from gpuledger.sources.procfs.source import ALLOWED_ENV, ALLOWED_FLAGS
from tests.security.helpers import Served, configured_up, get, gpuledger, sources

MARK = "SeCrEt"
SECRETS = {
    "env HF_TOKEN": f"hf_{MARK}01",
    "env AWS_SECRET_ACCESS_KEY": f"aws{MARK}02",
    "env RAY_TOKEN": f"ray-env-{MARK}03",
    "env OPENAI_API_KEY": f"sk-openai-{MARK}04",
    "env VLLM_API_KEY": f"sk-vllm-{MARK}05",
    "flag --api-key": f"sk-flag-{MARK}06",
    "flag --api-key=": f"sk-inline-{MARK}07",
    "flag --hf-token": f"hf_flag_{MARK}08",
    "title string": f"sk-title-{MARK}09",
    "annotation": f"annotation-{MARK}10",
    "label": f"label-{MARK}11",
    "ray auth token": f"ray-auth-{MARK}12",
    "model path argument": f"/models/{MARK}13-private",
    "CUDA_VISIBLE_DEVICES tail": f"cvd{MARK}14",
    "ray token file": f"ray-file-{MARK}15",
    "kubeconfig token": f"k8s-bearer-{MARK}16",
    "vLLM URL password": f"url-pass-{MARK}17",
    "vLLM URL query": f"url-query-{MARK}18",
}
GPU0 = "GPU-75000000-0000-4000-8000-000000000000"
GPU1 = "GPU-75000000-0000-4000-8000-000000000001"
UID_A = "75757575-0000-4000-8000-75757575aaaa"
UID_B = "75757575-0000-4000-8000-75757575bbbb"
CID_A, CID_B = "a" * 64, "b" * 64


def cg(uid: str, cid: str) -> str:
    slice_ = f"kubepods-pod{uid.replace('-', '_')}.slice"
    return f"0::/kubepods.slice/{slice_}/cri-containerd-{cid}.scope"


def secret_environ() -> dict[str, str]:
    return {
        "HF_TOKEN": SECRETS["env HF_TOKEN"],
        "AWS_SECRET_ACCESS_KEY": SECRETS["env AWS_SECRET_ACCESS_KEY"],
        "RAY_TOKEN": SECRETS["env RAY_TOKEN"],
        "OPENAI_API_KEY": SECRETS["env OPENAI_API_KEY"],
        "VLLM_API_KEY": SECRETS["env VLLM_API_KEY"],
    }


def scenario_doc(*, ray_token: bool = True, phases: bool = True) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "node": "sec-node",
        "gpus": [{"uuid": GPU0}, {"uuid": GPU1}],
        "processes": [
            {
                "pid": 100,
                "cgroup": cg(UID_A, CID_A),
                "cmdline": [
                    "vllm",
                    "serve",
                    SECRETS["model path argument"],
                    "--api-key",
                    SECRETS["flag --api-key"],
                    f"--api-key={SECRETS['flag --api-key=']}",
                    "--hf-token",
                    SECRETS["flag --hf-token"],
                    "--max-num-seqs",
                    "8",
                    "--served-model-name",
                    "chat",
                ],
                "environ": {
                    **secret_environ(),
                    "NVIDIA_VISIBLE_DEVICES": GPU0,
                    "CUDA_VISIBLE_DEVICES": f"0,{SECRETS['CUDA_VISIBLE_DEVICES tail']}",
                },
            },
            {
                "pid": 101,
                "ppid": 100,
                "cgroup": cg(UID_A, CID_A),
                "cmdline": "VLLM::EngineCore",
                "environ": secret_environ(),
                "gpu_memory": {GPU0: "20GiB"},
            },
            {
                # A setproctitle-style title: the whole command line in argv[0].
                "pid": 200,
                "nspid": [200, 7],
                "cgroup": cg(UID_B, CID_B),
                "cmdline": f"ray::Trainer --api-key {SECRETS['title string']}",
                "environ": secret_environ(),
                "gpu_memory": {GPU1: "10GiB"},
            },
            {
                "pid": 300,
                "cmdline": ["python3", "notebook.py", "--token", SECRETS["flag --api-key"]],
                "environ": secret_environ(),
                "gpu_memory": {GPU1: "1GiB"},
            },
        ],
        "kubernetes": {
            "pods": [
                {
                    "namespace": "llm",
                    "name": "chat-0",
                    "uid": UID_A,
                    "labels": {"team-token": SECRETS["label"]},
                    "annotations": {"example.com/token": SECRETS["annotation"]},
                    "containers": [{"name": "vllm", "id": CID_A, "gpus": 1}],
                },
                {
                    "namespace": "ml",
                    "name": "ray-worker-0",
                    "uid": UID_B,
                    "pod_ip": "10.3.0.2",
                    "labels": {"ray.io/cluster": "rc", "team-token": SECRETS["label"]},
                    "containers": [{"name": "ray", "id": CID_B, "gpus": 1}],
                },
            ]
        },
        "podresources": {
            "allocations": [
                {"namespace": "llm", "pod": "chat-0", "container": "vllm", "devices": [GPU0]},
                {"namespace": "ml", "pod": "ray-worker-0", "container": "ray", "devices": [GPU1]},
            ]
        },
        "vllm": [
            {"pod": "llm/chat-0", "engines": [{"model_name": "chat", "running": 2, "waiting": 9}]},
            {"engines": [{"model_name": "static", "running": 1}]},
        ],
        "ray": {
            "nodes": [{"name": "w", "pod": "ml/ray-worker-0", "gpus": 1}],
            "actors": [{"class_name": "Trainer", "node": "w", "pid": 7, "num_gpus": 1}],
        },
    }
    if ray_token:
        doc["ray"]["token"] = SECRETS["ray auth token"]
    if phases:
        # Faults, so that error messages are written (and logged) too.
        doc["phases"] = [
            {
                "name": "broken",
                "after": "2s",
                "kubernetes_fault": "unauthorized",
                "podresources_fault": "unavailable",
                "vllm": {"llm/chat-0": {"fault": "garbage"}},
            }
        ]
    return doc


def assert_clean(channel: str, text: str) -> None:
    assert text.strip(), f"{channel} is empty: the check would prove nothing"
    for what, secret in SECRETS.items():
        assert secret not in text, f"{what} leaked into {channel}"
    assert MARK not in text, f"part of a secret leaked into {channel}"


def http_channels(base: str) -> dict[str, str]:
    channels = {}
    for path in ("/metrics", "/ledger.json", "/ledger", "/"):
        status, body = get(base + path)
        assert status == 200, (path, status)
        channels[path] = body
    import urllib.request

    request = urllib.request.Request(
        base + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        channels["/metrics (OpenMetrics)"] = resp.read().decode()
    return channels


QUERIES = (
    ["--pod", "llm/chat-0"],
    ["--pod", "ml/ray-worker-0"],
    ["--gpu", GPU1],
    ["--workload", "llm/chat-0"],
    ["--engine", "chat"],
)


def explain_channels(*source: str, queries: Any = QUERIES) -> dict[str, str]:
    """`gpuledger explain` for each kind of query, text and JSON, stdout and stderr."""
    channels = {}
    for query in queries:
        for output in ("text", "json"):
            result = gpuledger("explain", *source, *query, "--output", output)
            assert result.returncode in (0, 1), result.stderr
            key = f"explain {' '.join(query)} --output {output}"
            channels[key] = result.stdout + result.stderr
    return channels


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secrets") / "secrets.yaml"
    path.write_text(yaml.safe_dump(scenario_doc()))
    return path


def test_simulate_leaks_no_secret_on_any_channel(scenario_file: Path) -> None:
    served = Served(
        ["simulate", str(scenario_file), "--interval", "0.3", "--source-deadline", "2",
         "--log-level", "debug"]
    )  # fmt: skip
    try:
        healthy = served.wait(lambda d: all(configured_up(s) for s in sources(d).values()))
        channels = http_channels(served.base)
        assert "gpuledger_engine_requests" in channels["/metrics"]
        assert any(p["title"] == "VLLM::EngineCore" for p in healthy["processes"])
        channels.update(explain_channels("--from", served.base))
        broken = served.wait(lambda d: sources(d)["kubernetes"][1] == "unauthorized")
        messages = [m for _, _, m in sources(broken).values() if m]
        assert len(messages) >= 2, sources(broken)  # error messages exist to be checked
        for path, body in http_channels(served.base).items():
            channels[f"{path} while sources fail"] = body
        channels.update(
            {
                f"{k} while sources fail": v
                for k, v in explain_channels("--from", served.base).items()
            }
        )
    finally:
        served.close()
    log = served.log()
    served.remove_log()
    assert " DEBUG " in log and "source kubernetes is down" in log, log[-2000:]
    channels["log (debug)"] = log
    channels["stdout"] = served.stdout or "(banner-less)"
    for channel, text in channels.items():
        assert_clean(channel, text)


def test_one_shot_and_explain_from_a_scenario_leak_nothing(scenario_file: Path) -> None:
    once = gpuledger("simulate", str(scenario_file), "--once", "--log-level", "debug")
    assert once.returncode == 0, once.stderr
    assert "gpuledger_container_gpu_memory_used_bytes" in once.stdout
    assert_clean("simulate --once stdout", once.stdout)
    assert_clean("simulate --once log (debug)", once.stderr)
    # Each run stands the scenario up again: the two queries that print the most.
    queries = (["--pod", "llm/chat-0"], ["--gpu", GPU1])
    scenario_run = explain_channels("--scenario", str(scenario_file), queries=queries)
    for channel, text in scenario_run.items():
        assert_clean(channel, text)


@pytest.fixture
def fakes(tmp_path: Path) -> Iterator[SimulatedNode]:
    doc = scenario_doc(phases=False)
    doc["ray"]["token"] = SECRETS["ray token file"]
    node = SimulatedNode(parse_scenario(doc, "secrets.yaml"), tmp_path / "node")
    yield node
    node.close()


def test_serve_with_token_file_kubeconfig_token_and_url_credentials(
    fakes: SimulatedNode, tmp_path: Path
) -> None:
    """The real `serve` flags: --ray-token-file, a kubeconfig with a bearer token, and a
    --vllm-target URL with a password and a token in its query string."""
    assert fakes.apiserver is not None and fakes.ray is not None
    token_file = tmp_path / "ray-token"
    token_file.write_text(SECRETS["ray token file"] + "\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": fakes.apiserver.url}}],
                "users": [{"name": "u", "user": {"token": SECRETS["kubeconfig token"]}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    static = fakes.engines["static-1"]
    target = (
        f"http://scraper:{SECRETS['vLLM URL password']}@{static.host}:{static.port}"
        f"/metrics?token={SECRETS['vLLM URL query']}"
    )
    served = Served(
        [
            "serve", "--node-name", "sec-node", "--proc-root", str(fakes.proc_root),
            "--nvml-library", fakes.library_path, "--kubernetes", "on",
            "--kubeconfig", str(kubeconfig), "--podresources-socket", fakes.socket_path,
            "--vllm-target", target, "--ray-address", fakes.ray.url,
            "--ray-token-file", str(token_file), "--interval", "0.3",
            "--source-deadline", "2", "--log-level", "debug",
        ],
        env={"GPULEDGER_FAKE_NVML_STATE": str(fakes.state_file)},
    )  # fmt: skip
    try:
        healthy = served.wait(lambda d: all(configured_up(s) for s in sources(d).values()))
        assert {e["model_name"] for e in healthy["engines"]} == {"chat", "static"}
        channels = http_channels(served.base)
        # Now every credential is refused or its endpoint fails: the error paths write
        # messages (and log lines) that mention those endpoints.
        fakes.ray.set_token("another-token")
        fakes.apiserver.set_fault("unauthorized")
        static.set_fault("http_500")
        broken = served.wait(
            lambda d: (
                sources(d)["ray"][1] == "unauthorized"
                and sources(d)["kubernetes"][1] == "unauthorized"
            )
        )
        assert "rejected the token" in (sources(broken)["ray"][2] or "")
        for path, body in http_channels(served.base).items():
            channels[f"{path} while sources fail"] = body
        channels.update(explain_channels("--from", served.base))
    finally:
        served.close()
    log = served.log()
    served.remove_log()
    assert " DEBUG " in log and "source ray is down" in log, log[-2000:]
    channels["log (debug)"] = log
    for channel, text in channels.items():
        assert_clean(channel, text)


def test_only_whitelisted_environment_and_flags_are_read() -> None:
    """The lists docs/security.md publishes: no name that usually carries a secret."""
    risky = {"token", "key", "secret", "password", "passwd", "credential", "auth", "api"}
    for name in ALLOWED_ENV:
        assert not risky & set(name.lower().split("_")), name
    for flag in ALLOWED_FLAGS:
        assert not risky & set(flag.lower().strip("-").split("-")), flag
    documented = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    for name in (*ALLOWED_ENV, *ALLOWED_FLAGS):
        assert f"`{name}`" in documented, f"{name} is read but not documented"
