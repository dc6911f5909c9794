"""A real local Ray head for the integration tests (`ray[default]` from the test extra).

`ray_head()` runs `ray start --head --block` with every port chosen free here (so parallel
runs on one machine do not collide), its temp dir and HOME private to the test (nothing
lands in the real ~/.ray), the dashboard on 127.0.0.1, and waits until the dashboard
answers. It yields the head's addresses and the environment its drivers run with; the
process group (Ray's daemons included) is ended and the temp dir removed however the test
goes. A head that does not come up fails the test with the tail of its logs: nothing is
skipped.

The tests' own drivers are started by the tests, with `RayHead.env`, their logs in
`RayHead.tmp/driver*.log` (shown by `logs()` with the head's).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

START_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class RayHead:
    url: str  # the dashboard, http://127.0.0.1:<port>
    gcs: str  # 127.0.0.1:<port>, what a driver's ray.init(address=...) takes
    token: str | None  # None: RAY_AUTH_MODE=disabled
    tmp: Path  # Ray's temp dir, HOME, and the logs
    env: dict[str, str]  # the RAY_* environment the head runs with, for its drivers
    extra_ports: tuple[int, ...]  # free ports chosen with Ray's, for the test's own use

    def logs(self) -> str:
        return logs(self.tmp)


def free_ports(count: int) -> list[int]:
    # Held open together so the ports differ; Ray binds them right after.
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def logs(tmp: Path) -> str:
    """The tails of `ray start`'s output, the drivers' logs and Ray's own."""
    parts = [f"--- ray start:\n{_tail(tmp / 'head.log')}"]
    for driver in sorted(tmp.glob("driver*.log")):
        parts.append(f"--- {driver.stem}:\n{_tail(driver)}")
    for name in ("dashboard.log", "raylet.out", "gcs_server.out"):
        for found in sorted(tmp.glob(f"session_*/logs/{name}"))[-1:]:
            parts.append(f"--- {name}:\n{_tail(found)}")
    return "\n".join(parts)


def end(process: subprocess.Popen[Any] | None, grace_seconds: float) -> None:
    """SIGTERM the process group we started, then SIGKILL what is left of it."""
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_seconds)
    # Ray's daemons share the group and may outlive the `ray start` process itself.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


def read_line(process: subprocess.Popen[str], deadline: float) -> str | None:
    """A line of the process's stdout, or None if it exits or the deadline passes first."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=0.5):
                return process.stdout.readline()
            if process.poll() is not None:
                return None
    return None


@contextlib.contextmanager
def ray_head(
    prefix: str, *, num_gpus: int, auth_mode: str = "disabled", extra_ports: int = 0
) -> Iterator[RayHead]:
    """A Ray head with 4 CPUs and `num_gpus` logical GPUs (Ray's own ledger: no hardware).

    `auth_mode` is RAY_AUTH_MODE: "token" (Ray 2.60's default for local clusters, with a
    fresh token) or "disabled". `extra_ports` more free ports are chosen with Ray's.
    """
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        pytest.fail(f"the `ray` command is missing next to {sys.executable}")
    # Short: Ray puts unix sockets under it (107-byte limit).
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    token = secrets.token_hex(16) if auth_mode == "token" else None
    gcs, dash, agent_http, agent_grpc, env_agent, metrics, client, *extra = free_ports(
        7 + extra_ports
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        RAY_AUTH_MODE=auth_mode,
        RAY_USAGE_STATS_ENABLED="0",
        # SIGTERM would otherwise drain the node for up to 30 s before stopping.
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
        HOME=str(tmp),  # nothing lands in the real ~/.ray
    )
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    process: subprocess.Popen[Any] | None = None
    try:
        with (tmp / "head.log").open("wb") as head_log:
            process = subprocess.Popen(
                [
                    str(ray_cli), "start", "--head", "--block", "--disable-usage-stats",
                    "--node-ip-address=127.0.0.1", f"--port={gcs}",
                    "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                    f"--dashboard-agent-listen-port={agent_http}",
                    f"--dashboard-agent-grpc-port={agent_grpc}",
                    f"--runtime-env-agent-port={env_agent}", f"--metrics-export-port={metrics}",
                    f"--ray-client-server-port={client}",
                    "--min-worker-port=0", "--max-worker-port=0",
                    "--num-cpus=4", f"--num-gpus={num_gpus}", "--object-store-memory=100000000",
                    f"--temp-dir={tmp}",
                ],
                stdout=head_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )  # fmt: skip
        url = f"http://127.0.0.1:{dash}"
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            if process.poll() is not None:
                pytest.fail(f"ray start exited with {process.returncode}\n{logs(tmp)}")
            if time.monotonic() > deadline:
                pytest.fail(f"the Ray dashboard did not answer on {url}\n{logs(tmp)}")
            with contextlib.suppress(requests.RequestException):
                # 401: up, with token auth on.
                if requests.get(url + "/api/v0/nodes", timeout=2).status_code in (200, 401):
                    break
            time.sleep(0.5)
        yield RayHead(url, f"127.0.0.1:{gcs}", token, tmp, env, tuple(extra))
    finally:
        end(process, grace_seconds=15)
        shutil.rmtree(tmp, ignore_errors=True)
