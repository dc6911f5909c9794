"""The `gpuledger` command as a user runs it: a real subprocess."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import REPO, samples, value

GOLDEN = REPO / "tests" / "golden" / "demo.prom"
# Values that legitimately change from run to run.
_VOLATILE = re.compile(
    r"^(gpuledger_(source_duration_seconds|source_cpu_seconds_total|"
    r"source_last_success_timestamp_seconds|"
    r"snapshot_age_seconds)\{[^}]*\}) \S+$",
    re.M,
)
# The simulated engines listen on ephemeral ports: the `target` label's port varies.
_TARGET_PORT = re.compile(r'(target="[^":]*):\d+"')


def gpuledger(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gpuledger", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def normalise(exposition: str) -> str:
    return _TARGET_PORT.sub(r'\1:PORT"', _VOLATILE.sub(r"\1 0", exposition))


def test_demo_once_matches_golden_exposition() -> None:
    result = gpuledger("demo", "--once", "--log-level", "error")
    assert result.returncode == 0, result.stderr
    got = normalise(result.stdout)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), "exposition changed: rerun with UPDATE_GOLDEN=1 and review"


def test_golden_exposition_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package prometheus; .ci/run installs it)"
    result = subprocess.run(
        [promtool, "check", "metrics"], input=GOLDEN.read_text(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_secrets_in_demo_never_reach_the_output() -> None:
    result = gpuledger("demo", "--once", "--log-level", "debug")
    assert result.returncode == 0
    for secret in ("sk-demo-do-not-leak", "hf_demo_secret", "demo-aws-secret", "/models/llama"):
        assert secret not in result.stdout
        assert secret not in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["serve", "--interval", "0"], "must be greater than 0"),
        (["serve", "--listen", "nonsense"], "expected [HOST]:PORT"),
        (["serve", "--mode", "galaxy"], "invalid choice: 'galaxy'"),
        (["serve", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "the following arguments are required"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = gpuledger(*args)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GPULEDGER_INTERVAL", "abc", "'abc' is not a number of seconds"),
        ("GPULEDGER_INTERVAL", "-1", "'-1' must be greater than 0"),
        ("GPULEDGER_SOURCE_DEADLINE", "0", "'0' must be greater than 0"),
        ("GPULEDGER_LOG_LEVEL", "loud", "invalid choice: 'loud'"),
        ("GPULEDGER_LOG_FORMAT", "xml", "invalid choice: 'xml'"),
        ("GPULEDGER_MODE", "galaxy", "invalid choice: 'galaxy'"),
        ("GPULEDGER_KUBERNETES", "maybe", "invalid choice: 'maybe'"),
        ("GPULEDGER_VLLM_DISCOVERY", "yes", "invalid choice: 'yes'"),
        ("GPULEDGER_LISTEN", "nope", "expected [HOST]:PORT"),
        ("GPULEDGER_PENDING_ALL_PODS", "yes", "expected true or false"),
        ("GPULEDGER_AGENT_TLS", "yes", "expected true or false"),
        ("GPULEDGER_AGENT_SERVER_NAME", "a b", "'a b' is not a DNS name or an IP address"),
    ],
)
def test_bad_environment_values_exit_2_with_one_line_like_flags(
    variable: str, value: str, message: str
) -> None:
    result = gpuledger("serve", "--nvml-library", "/nonexistent.so", env={variable: value})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    # --help still works whatever the environment holds.
    assert gpuledger("serve", "--help", env={variable: value}).returncode == 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_environment_variables_set_flags() -> None:
    env_result = subprocess.run(
        [sys.executable, "-m", "gpuledger", "serve", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter"), "GPULEDGER_INTERVAL": "-3"},
    )
    # The env default is validated like the flag would be only when used; help shows it.
    assert "GPULEDGER_INTERVAL" in env_result.stdout


def test_invalid_scenario_names_file_path_and_expectation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  - uuid: GPU-1\n    memory_total: lots\n")
    result = gpuledger("simulate", str(bad), "--once")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "gpuledger: error: bad.yaml: gpus[0].memory_total: expected a size like 80GiB or an "
        "integer number of bytes, got 'lots'"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serve_simulated_node_endpoints() -> None:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuledger",
            "demo",
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            "0.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _ = _get(base + "/readyz")
                if status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "exporter never became ready"
            time.sleep(0.1)
        assert _get(base + "/healthz") == (200, "ok\n")
        status, landing = _get(base + "/")
        assert status == 200 and 'href="metrics"' in landing
        status, body = _get(base + "/metrics")
        assert status == 200
        s = samples(body)
        assert value(s, "gpuledger_source_up", source="nvml") == 1
        assert value(s, "gpuledger_snapshot_age_seconds") < 30
        assert _get(base + "/nope")[0] == 404
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "SIMULATED" in out
