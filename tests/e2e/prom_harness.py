"""Helpers of the end-to-end Prometheus test (tests/e2e/test_prometheus.py).

A real Prometheus (Debian package `prometheus`) scraping `gpuledger simulate` processes and
a small static endpoint that stands in for dcgm-exporter and kube-state-metrics, with the
mixin's rules rendered so that every `for` is 0s.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_binary() -> str:
    """Path of the Prometheus server; fails (never skips) when it is missing."""
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )
    assert found, (
        "prometheus not found on PATH: install the Debian package prometheus "
        "(scripts/setup-env --test does it)"
    )
    return found


def _stop(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Stop one process this module started: SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


# ---------------------------------------------------------------------------- rules


def _jsonnet() -> Any:
    try:
        import _jsonnet
    except ImportError as exc:  # pragma: no cover - the `test` extra installs it
        raise AssertionError(
            "the PyPI package `jsonnet` (module _jsonnet) is missing: "
            ".venv/bin/pip install jsonnet (it belongs to the `test` extra)"
        ) from exc
    return _jsonnet


def mixin_config() -> dict[str, Any]:
    """The mixin's `_config` (config.libsonnet)."""
    text = _jsonnet().evaluate_snippet(
        "config", "(import 'mixin.libsonnet')._config", jpathdir=[str(REPO / "mixin")]
    )
    return json.loads(text)  # type: ignore[no-any-return]


def zero_for_rules() -> list[dict[str, Any]]:
    """The mixin's rule groups (recording rules + alerts) with every `for` set to 0s.

    The `for` boundaries themselves are tested by promtool (mixin/tests); here an alert
    fires on the first evaluation its condition holds, so a test need not wait minutes.
    """
    durations = sorted(k for k in mixin_config() if k.endswith("For"))
    assert durations, "config.libsonnet has no `…For` settings any more"
    overrides = ", ".join(f"{k}: '0s'" for k in durations)
    snippet = (
        f"local mixin = (import 'mixin.libsonnet') + {{ _config+:: {{ {overrides} }} }};\n"
        "mixin.prometheusRules.groups + mixin.prometheusAlerts.groups\n"
    )
    groups: list[dict[str, Any]] = json.loads(
        _jsonnet().evaluate_snippet("zero-for", snippet, jpathdir=[str(REPO / "mixin")])
    )
    alerts = [rule for group in groups for rule in group["rules"] if "alert" in rule]
    assert alerts, "the mixin renders no alerts"
    for rule in alerts:
        assert rule.get("for", "0s") == "0s", rule["alert"]
    return groups


# ---------------------------------------------------------------------------- exporters


class Simulated:
    """`gpuledger simulate FILE --listen 127.0.0.1:PORT --interval 0.5`, one process."""

    def __init__(self, scenario: Path, port: int | None = None) -> None:
        self.scenario = scenario
        self.port = port or free_port()
        self.target = f"127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuledger",
                "simulate",
                str(scenario),
                "--listen",
                self.target,
                "--interval",
                "0.5",
                "--log-level",
                "warning",
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started = time.monotonic()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the exporter serves a ledger in which every configured source is up."""
        deadline = time.monotonic() + timeout
        url = f"http://{self.target}/ledger.json"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    doc = json.loads(r.read())
                if all(s["up"] or s["reason"] == "disabled" for s in doc["sources"]):
                    return
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"gpuledger simulate {self.scenario.name} exited {self.proc.returncode}:\n"
                    + (self.proc.stderr.read() if self.proc.stderr else "")[-3000:]
                )
            assert time.monotonic() < deadline, (
                f"gpuledger simulate {self.scenario.name} never served a complete ledger"
            )
            time.sleep(0.2)

    def close(self) -> None:
        _stop(self.proc)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class StaticTargets:
    """A tiny HTTP server in this process: GET /<path> returns a fixed exposition.

    Stands in for dcgm-exporter and kube-state-metrics, whose series the PromQL guide
    joins with gpuledger's (docs/promql.md)."""

    def __init__(self, bodies: dict[str, str]) -> None:
        pages = {f"/{k.strip('/')}": v.encode() for k, v in bodies.items()}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path.split("?")[0])
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(samples: Iterable[tuple[str, dict[str, str], float]]) -> str:
    lines = []
    for name, labels, value in samples:
        body = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {value:g}")
    return "\n".join(lines) + "\n"


def dcgm_exposition(scenario: dict[str, Any]) -> str:
    """dcgm-exporter's GPU utilization (percent) and framebuffer use for the scenario's
    GPUs, labelled the way dcgm-exporter labels them (`UUID`, `gpu`, `Hostname`, …)."""
    samples = []
    for i, gpu in enumerate(scenario.get("gpus", [])):
        index = str(gpu.get("index", i))
        labels = {
            "gpu": index,
            "UUID": gpu["uuid"],
            "device": f"nvidia{index}",
            "modelName": gpu.get("name", "NVIDIA H100 80GB HBM3"),
            "Hostname": scenario.get("node", "sim-node"),
            "DCGM_FI_DRIVER_VERSION": "550.54.15",
        }
        samples.append(("DCGM_FI_DEV_GPU_UTIL", labels, 100 * float(gpu.get("utilization", 0))))
    return exposition(samples)


_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def ksm_exposition(scenarios: Iterable[dict[str, Any]]) -> str:
    """kube-state-metrics' kube_pod_info and kube_pod_status_phase for every pod of the
    scenarios (`uid` is the Pod UID), and kube_node_status_capacity of every node-mode
    scenario's node (its GPUs as nvidia.com/gpu)."""
    samples = []
    for scenario in scenarios:
        if scenario.get("mode", "node") == "node":
            node = {"node": scenario.get("node", "sim-node")}
            for resource, value in (("cpu", 64), ("nvidia_com_gpu", len(scenario["gpus"]))):
                samples.append(
                    (
                        "kube_node_status_capacity",
                        {
                            **node,
                            "resource": resource,
                            "unit": "core" if resource == "cpu" else "integer",
                        },
                        value,
                    )
                )
        for pod in scenario.get("kubernetes", {}).get("pods", []):
            pending = bool(pod.get("pending"))
            node = "" if pending else scenario.get("node", "sim-node")
            owner = pod.get("owner") or {}
            ids = {"namespace": pod.get("namespace", "default"), "pod": pod["name"]}
            ids["uid"] = pod["uid"]
            samples.append(
                (
                    "kube_pod_info",
                    {
                        **ids,
                        "node": node,
                        "host_ip": "" if pending else "10.0.0.7",
                        "pod_ip": pod.get("pod_ip", ""),
                        "created_by_kind": owner.get("kind", "<none>"),
                        "created_by_name": owner.get("name", "<none>"),
                        "priority_class": "gpu-batch" if pending else "gpu-serving",
                        "host_network": "false",
                    },
                    1,
                )
            )
            phase = pod.get("phase", "Pending" if pending else "Running")
            for p in _PHASES:
                samples.append(
                    ("kube_pod_status_phase", {**ids, "phase": p}, 1 if p == phase else 0)
                )
    return exposition(samples)


def load_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- Prometheus


class PrometheusError(AssertionError):
    pass


class _Transient(Exception):
    """An API call that may succeed if tried again."""


# One API call, retries included. Generous: on a loaded 2-core machine a query answered
# past its 10 s timeout once, and failing there says nothing about the mixin.
API_DEADLINE = 90.0
ATTEMPT_TIMEOUT = 20.0
_TRANSIENT_STATUS = {502, 503, 504}


class Prometheus:
    """A real Prometheus server in a temporary directory."""

    def __init__(
        self,
        workdir: Path,
        scrape_configs: list[dict[str, Any]],
        rule_groups: list[dict[str, Any]],
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        (workdir / "data").mkdir(parents=True, exist_ok=True)
        rules = workdir / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": rule_groups}, sort_keys=False, width=10**6))
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(rules)],
            "scrape_configs": scrape_configs,
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            cwd=workdir,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"prometheus never ready:\n{self.log_tail()}"
            time.sleep(0.2)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>: its `data`, retried until API_DEADLINE while Prometheus is
        slow or briefly not answering (a loaded machine: one query once took over 10 s).
        A query Prometheus rejects fails at once."""
        url = f"{self.base}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        give_up = time.monotonic() + API_DEADLINE
        while True:
            try:
                return self._api_once(url, f"{path} {params}", give_up)
            except _Transient as exc:
                assert self.proc.poll() is None, f"prometheus exited:\n{self.log_tail()}"
                if time.monotonic() >= give_up:
                    raise PrometheusError(
                        f"{path} {params}: no answer in {API_DEADLINE:g}s: {exc}"
                    ) from None
                time.sleep(0.5)  # between attempts: Prometheus is busy, not down

    def _api_once(self, url: str, what: str, give_up: float) -> Any:
        timeout = max(1.0, min(ATTEMPT_TIMEOUT, give_up - time.monotonic()))
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            doc = json.loads(exc.read() or b"{}")
            message = f"HTTP {exc.code}: {doc.get('errorType')}: {doc.get('error')}"
            if exc.code in _TRANSIENT_STATUS or doc.get("errorType") == "timeout":
                raise _Transient(message) from None
            raise PrometheusError(f"{what}: {message}") from None
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
            # Refused, reset, timed out, cut short: the server is there but overloaded.
            raise _Transient(f"{type(exc).__name__}: {exc}") from None
        if doc.get("status") != "success":
            raise PrometheusError(f"{what}: {doc}")
        if doc.get("warnings"):
            raise PrometheusError(f"{what}: warnings {doc['warnings']}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result as a list of {metric, value} (vector or scalar)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            return data["result"]  # type: ignore[no-any-return]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise PrometheusError(f"{expr!r}: unexpected result type {data['resultType']}")

    def query_range(self, expr: str, start: float, end: float, step: float) -> Any:
        return self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}"
        )

    def alerts(self, state: str = "firing") -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["state"] == state]

    def target_health(self) -> dict[str, str]:
        """`job instance` -> health of every active target."""
        active = self.api("targets", state="active")["activeTargets"]
        return {f"{t['labels']['job']} {t['labels']['instance']}": t["health"] for t in active}

    def wait_for(
        self, what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5
    ) -> Any:
        """Poll `check` until it returns something truthy; fail with its last answer."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            last = check()
            if last:
                return last
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log_tail()}"
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(interval)

    def rule_evaluations(self) -> dict[str, str]:
        """`file group` -> when Prometheus last evaluated that rule group."""
        groups = self.api("rules")["groups"]
        return {f"{g['file']} {g['name']}": g["lastEvaluation"] for g in groups}

    def wait_next_evaluation(self, timeout: float = 60.0) -> None:
        """Until every rule group (recording rules and alerts) has been evaluated again
        since this call: what a test waits for to see the rules' next answer."""
        before = self.rule_evaluations()

        def evaluated_again() -> bool:
            now = self.rule_evaluations()
            return all(now.get(group) != last for group, last in before.items())

        self.wait_for("every rule group evaluated again", evaluated_again, timeout)

    def close(self) -> None:
        _stop(self.proc)
        self._log.close()


# ---------------------------------------------------------------------------- dashboards

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
# Grafana's interval variables, as a 1s-scrape Prometheus would get them.
INTERVALS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}


def grafana_regex_escape(value: str) -> str:
    """A single selected value of a multi-value variable, as Grafana writes it into a
    `=~"…"` matcher: regex metacharacters escaped, inside a PromQL string."""
    # Grafana's prometheusSpecialRegexEscape: `\` -> `\\\\`, a metacharacter c -> `\\c`.
    out = value.replace("\\", "\\" * 4)
    return "".join("\\\\" + c if c in "$^*{}[]'+?.()|" else c for c in out)


def substitute(expr: str, values: dict[str, str]) -> str:
    """A panel query as Grafana sends it: interval variables, then the dashboard's
    variables (`values`: name -> already-escaped regex; missing ones are `All` = `.*`)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in INTERVALS:
            return INTERVALS[name]
        return values.get(name, ".*")

    return _VARIABLE.sub(one, expr)


def variables_used(expr: str) -> set[str]:
    return {
        m.group(1) or m.group(2)
        for m in _VARIABLE.finditer(expr)
        if (m.group(1) or m.group(2)) not in INTERVALS
    }
