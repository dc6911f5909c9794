"""A `gpuledger` subprocess serving on a free port, and the channels a user can read."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def gpuledger(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "gpuledger", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter"), **(env or {})},
        cwd=REPO,
    )


class Served:
    """`gpuledger <args> --listen 127.0.0.1:<port>`; stderr (the log) kept for reading."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.stderr_path = f"/tmp/gpuledger-{self.port}.stderr"
        self._stderr = open(self.stderr_path, "w+")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuledger", *args, "--listen", f"127.0.0.1:{self.port}"],
            env={**os.environ, "PYTHONPATH": str(REPO / "exporter"), **(env or {})},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.stdout = ""

    def ledger(self) -> dict[str, Any] | None:
        try:
            status, body = get(self.base + "/ledger.json", timeout=2)
        except OSError:
            return None
        return json.loads(body) if status == 200 else None

    def wait(self, done: Any, timeout: float = 60) -> dict[str, Any]:
        """Poll /ledger.json until `done(doc)`."""
        give_up = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.log()
            doc = self.ledger()
            if doc is not None and done(doc):
                return doc
            assert time.monotonic() < give_up, (
                f"not reached in {timeout}s: {doc and doc['sources']}"
            )
            time.sleep(0.2)

    def log(self) -> str:
        if not self._stderr.closed:
            self._stderr.flush()
        with open(self.stderr_path) as f:
            return f.read()

    def close(self) -> None:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=20)
        self.stdout = out or ""
        self._stderr.close()

    def remove_log(self) -> None:
        os.unlink(self.stderr_path)


def sources(doc: dict[str, Any]) -> dict[str, tuple[bool, str | None, str | None]]:
    return {s["source"]: (s["up"], s["reason"], s["message"]) for s in doc["sources"]}


def configured_up(status: tuple[bool, str | None, str | None]) -> bool:
    """Up, or not configured here (reason `disabled`: e.g. DRA on an API server without
    resource.k8s.io) — what "every source answers" means for a test."""
    up, reason, _ = status
    return up or reason == "disabled"
