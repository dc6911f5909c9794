"""`gpuledger demo` and a plain `gpuledger serve` as real processes on loopback ports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tests.conftest import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """`gpuledger <args> --listen 127.0.0.1:PORT --interval 0.5`, stopped by close()."""

    def __init__(self, *args: str) -> None:
        self.base = f"http://127.0.0.1:{_free_port()}"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("GPULEDGER_") and k != "KUBERNETES_SERVICE_HOST"
        }
        listen = self.base.removeprefix("http://")
        flags = ["--listen", listen, "--interval", "0.5", "--log-level", "warning"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuledger", *args, *flags],
            env={**env, "PYTHONPATH": str(REPO / "exporter")},
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def text(self, path: str) -> str:
        status, body = self.get(path)
        assert status == 200, (path, status, body[:200])
        return body.decode()

    def document(self) -> dict[str, Any]:
        return json.loads(self.text("/ledger.json"))  # type: ignore[no-any-return]

    def wait_ready(self, complete: bool = True, timeout: float = 60.0) -> Served:
        """Until a ledger is served; with `complete`, one in which no source is down."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.get("/readyz")[0] == 200:
                    states = [s["state"] for s in self.document()["sources"]]
                    if not complete or "down" not in states:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                stderr = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"gpuledger exited {self.proc.returncode}: {stderr[-2000:]}")
            assert time.monotonic() < deadline, "the exporter never became ready"
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def demo() -> Served:
    return Served("demo").wait_ready()


def serve_without_hardware() -> Served:
    """A real `serve` on a box without NVIDIA's library and without Kubernetes: nvml is
    down (library_not_found), the Kubernetes, PodResources, vLLM and Ray sources are not
    configured."""
    served = Served("serve", "--nvml-library", "/nonexistent.so", "--kubernetes", "off")
    return served.wait_ready(complete=False)
