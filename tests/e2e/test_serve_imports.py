"""`gpuledger serve` never loads the simulator or PyYAML.

The node agent's image runs `serve` only: the simulator (fake servers, a C build of the
fake NVML) and the YAML parser are dead weight there, and an import of them on the serve
path would make the image need what only `demo` and `simulate` need. The exporter is run
in a fresh interpreter under `python -X importtime`, which lists every module imported,
until it has served a snapshot of each page.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.conftest import REPO

# `import time:       123 |        456 |     gpuledger.sim.harness`
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)\s*$", re.M)
FORBIDDEN = ("gpuledger.sim", "yaml", "_yaml")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            r.read()
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if _status(base + "/readyz") == 200:
                return
        except OSError:
            pass  # not listening yet
        assert proc.poll() is None, f"gpuledger serve exited {proc.returncode}"
        assert time.monotonic() < deadline, "gpuledger serve never took its first snapshot"
        time.sleep(0.1)  # poll interval of the readiness wait above


def _serve_and_list_imports(tmp_path: Path) -> set[str]:
    """Modules a `serve` process imported by the time it answered every page."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "GPULEDGER_"))}
    env["PYTHONPATH"] = str(REPO / "exporter")
    (tmp_path / "proc").mkdir()
    stderr_path = tmp_path / "stderr.txt"
    argv = [sys.executable, "-X", "importtime", "-m", "gpuledger", "serve"]
    argv += ["--listen", f"127.0.0.1:{port}", "--interval", "0.2", "--kubernetes", "off"]
    argv += ["--nvml-library", str(tmp_path / "no-such-libnvidia-ml.so.1")]
    argv += ["--proc-root", str(tmp_path / "proc"), "--log-level", "warning"]
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=stderr, stderr=stderr)
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_ready(base, proc)
            for page in ("/metrics", "/ledger", "/ledger.json", "/"):
                assert _status(base + page) == 200, page
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert proc.returncode == 0, stderr_path.read_text(errors="replace")[-3000:]
    return set(_IMPORTED.findall(stderr_path.read_text(errors="replace")))


def test_serve_never_imports_the_simulator_or_yaml(tmp_path: Path) -> None:
    imported = _serve_and_list_imports(tmp_path)
    # The listing is read right: the serve path itself is in it.
    assert {"gpuledger.cli", "gpuledger.web.server", "gpuledger.pipeline"} <= imported
    loaded = sorted(m for m in imported if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert loaded == [], f"gpuledger serve imported {loaded}"
