"""The gateway's two cluster-mode sources against the upstream shapes in
tests/fixtures/gateway/ (README.md names the versions: InferencePool v1 from GIE v1.6.0, the
picker's metrics from llm-d-router v0.10.0 and GIE v1.5.0, its Service from the router's
chart): pools resolved to member pods and the picker's URL, the picker's queue read under
one deadline and byte cap, each hostile picker costing only its own reading, and the
picker token going to pickers only."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from gpuledger.model import NOT_CONFIGURED, Snapshots
from gpuledger.model.gateway import INFERENCE_POOLS, InferencePool, PoolsSnapshot
from gpuledger.net.kubeapi import ApiException
from gpuledger.sources.base import SourceError
from gpuledger.sources.gateway.picker import PickerSource, read_exposition
from gpuledger.sources.kubernetes import lists, pools
from gpuledger.sources.kubernetes.pools import InferencePoolSource, picker_url, pool_of

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gateway"
POOL_LIST = json.loads((FIXTURES / "inferencepool-v1.json").read_text())
SERVICE = json.loads((FIXTURES / "epp-service.json").read_text())
METRICS = (FIXTURES / "epp-metrics.prom").read_text()
LEGACY = (FIXTURES / "epp-metrics-legacy.prom").read_text()


def _pod(name: str, uid: str, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "llm",
        "uid": uid,
        "labels": {"app": "vllm-a"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "vllm-a-5d8c7b9f4", "controller": True}],
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-08-20T10:00:00Z"
    return {
        "metadata": metadata,
        "spec": {"nodeName": "gpu-node-1"},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.11",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class _Body:
    def __init__(self, body: object) -> None:
        self.body = json.dumps(body).encode()

    def release_conn(self) -> None:
        pass


def _source(
    monkeypatch: pytest.MonkeyPatch, *, pool_status: int = 200, **kwargs: Any
) -> tuple[InferencePoolSource, list[tuple[str, dict[str, Any]]]]:
    """A source over a fake API: the fixture's pools, pool-a's pods, its picker Service."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def list_objects(client: Any, path: str, **params: Any) -> _Body:
        calls.append((path, params))
        if path.endswith("/inferencepools"):
            if pool_status != 200:
                raise ApiException(status=pool_status, reason="x")
            return _Body(POOL_LIST)
        if path == "/api/v1/namespaces/llm/pods":
            if params["label_selector"] == "app=vllm-a":
                pods = [
                    _pod("vllm-a-5d8c7b9f4-2xk9p", "u1"),
                    _pod("vllm-a-5d8c7b9f4-7hq2m", "u2", ready=False),
                    _pod("vllm-a-5d8c7b9f4-old", "u3", deleting=True),
                ]
                return _Body({"items": pods, "metadata": {}})
            return _Body({"items": [], "metadata": {}})
        if path == "/api/v1/namespaces/llm/services/pool-a-epp":
            return _Body(SERVICE)
        raise ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(pools.kubeapi, "list_objects", list_objects)
    monkeypatch.setattr(lists, "read_bounded", lambda body, limit, deadline: body.body)
    client = SimpleNamespace(configuration=SimpleNamespace(host="https://k8s:6443"))
    return InferencePoolSource(api_client=client, **kwargs), calls


def test_the_pool_list_is_read_as_upstream_writes_it() -> None:
    found = [p for item in POOL_LIST["items"] for p in pool_of(item)]
    assert [(p.namespace, p.name) for p in found] == [
        ("llm", "pool-a"),
        ("llm", "pool-b"),
        ("llm", "pool-empty"),
    ]
    a = found[0]
    assert (a.selector, a.target_ports, a.accepted) == ({"app": "vllm-a"}, (8000,), "True")
    assert a.picker is not None
    assert (a.picker.service, a.picker.port, a.picker.failure_mode) == (
        "pool-a-epp",
        9002,
        "FailOpen",
    )
    assert found[2].accepted is None  # no controller wrote a status


def test_the_picker_url_is_the_services_cluster_ip_and_http_metrics_port() -> None:
    assert picker_url(SERVICE, "llm", "pool-a-epp") == "http://10.96.0.50:9090/metrics"
    headless = {"spec": {"clusterIP": "None", "ports": [{"name": "grpc-ext-proc", "port": 9002}]}}
    assert picker_url(headless, "llm", "x") == "http://x.llm.svc:9090/metrics"


def test_pools_resolve_to_their_ready_and_not_ready_pods_never_terminating_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, calls = _source(monkeypatch)
    snapshot = source.fetch()
    by_name = {p.name: p for p in snapshot.pools}
    a = by_name["pool-a"]
    assert [(m.name, m.uid, m.workload, m.ready) for m in a.members] == [
        ("vllm-a-5d8c7b9f4-2xk9p", "u1", "vllm-a", True),
        ("vllm-a-5d8c7b9f4-7hq2m", "u2", "vllm-a", False),
    ]
    assert a.picker_metrics_url == "http://10.96.0.50:9090/metrics"
    assert by_name["pool-empty"].members == ()
    # pool-b's Service does not exist: no URL this minute, and no error for the source.
    assert by_name["pool-b"].picker_metrics_url is None
    assert list(source.item_errors(snapshot)) == []
    # The Service is read once a minute, not every cycle.
    source.fetch()
    assert sum(1 for path, _ in calls if path.endswith("/services/pool-a-epp")) == 1


def test_a_configured_picker_url_wins_over_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    source, calls = _source(monkeypatch, picker_urls={"llm/pool-a": "https://epp.example:9443/m"})
    a = next(p for p in source.fetch().pools if p.name == "pool-a")
    assert a.picker_metrics_url == "https://epp.example:9443/m"
    assert not any(path.endswith("/services/pool-a-epp") for path, _ in calls)


def test_a_cluster_without_the_api_has_no_pools_and_a_forbidden_one_says_what_rbac_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, _ = _source(monkeypatch, pool_status=404)
    with pytest.raises(SourceError) as missing:
        source.fetch()
    assert missing.value.reason == NOT_CONFIGURED
    source, _ = _source(monkeypatch, pool_status=403)
    with pytest.raises(SourceError) as forbidden:
        source.fetch()
    assert forbidden.value.reason == "forbidden"
    assert "list on inferencepools (inference.networking.k8s.io)" in str(forbidden.value)


@pytest.mark.parametrize("text", [METRICS, LEGACY], ids=["llm-d-router-v0.10.0", "gie-v1.5.0"])
def test_both_metric_generations_give_the_same_reading(text: str) -> None:
    r = read_exposition(text, "pool-a")
    assert r.up and r.names == ("llm_d_epp" if "llm_d_epp_" in text else "legacy")
    assert (r.queued_requests, r.queued_bytes, r.ready_endpoints, r.saturation) == (
        30.0,
        61440.0,
        3.0,
        0.2,
    )
    assert r.average_kv_cache_utilization == 0.42
    assert r.endpoint_queues == {
        "vllm-a-5d8c7b9f4-2xk9p-rank-0": 0.0,
        "vllm-a-5d8c7b9f4-7hq2m-rank-0": 1.0,
        "vllm-a-5d8c7b9f4-wn4tz-rank-0": 0.0,
    }


def test_another_pools_samples_and_flow_control_off_are_not_this_pools_queue() -> None:
    assert read_exposition(METRICS, "pool-b").queued_requests is None
    without_flow_control = "\n".join(
        line for line in METRICS.splitlines() if "flow_control" not in line
    )
    r = read_exposition(without_flow_control, "pool-a")
    assert (r.up, r.queued_requests, r.ready_endpoints) == (True, None, 3.0)


# ------------------------------------------------------------------ the picker over HTTP

CANARY = "picker-canary-7f3a"


class _Picker(BaseHTTPRequestHandler):
    """Each path a kind of picker: ok, hang, trickle, huge, garbage, auth, redirect."""

    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        kind = self.path.strip("/").split("/")[0]
        _Picker.seen.append((kind, self.headers.get("Authorization")))
        if kind == "hang":
            time.sleep(5)
            return
        if kind == "redirect":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/ok")
            self.end_headers()
            return
        if kind == "auth" and self.headers.get("Authorization") != f"Bearer {CANARY}":
            self._send(401, b"Unauthorized")
            return
        if kind == "trickle":
            self.send_response(200)
            self.end_headers()
            for ch in METRICS.encode()[:20]:
                self.wfile.write(bytes([ch]))
                self.wfile.flush()
                time.sleep(0.5)
            return
        if kind == "huge":
            self.send_response(200)
            self.end_headers()
            line = b"# padding " + b"x" * 1000 + b"\n"
            for _ in range(50 * 1024):
                self.wfile.write(line)
            return
        if kind == "garbage":
            self._send(200, b"<html>" + CANARY.encode() + b" not metrics {{{ </html>\n")
            return
        self._send(200, METRICS.encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def picker_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Picker)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Picker.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def _pool(name: str, url: str) -> InferencePool:
    return InferencePool("llm", name, f"uid-{name}", {"app": name}, (8000,), None, url, ())


def test_each_hostile_picker_costs_only_its_own_reading_within_the_deadline(
    picker_server: str,
) -> None:
    kinds = ["ok", "hang", "trickle", "huge", "garbage", "auth"]
    # Each named after its pool: the good one's samples are pool-a's.
    targets = [_pool("pool-a" if k == "ok" else k, f"{picker_server}/{k}/metrics") for k in kinds]
    source = PickerSource(timeout_seconds=2.0, max_body_bytes=4 * 1024 * 1024)
    started = time.monotonic()
    snapshot = source.fetch(Snapshots({INFERENCE_POOLS: PoolsSnapshot(tuple(targets))}))
    elapsed = time.monotonic() - started
    source.close()
    assert elapsed < 3.0, elapsed  # one deadline for all, never a per-read timeout
    by_pool = {r.pool: r for r in snapshot.readings}
    assert by_pool["pool-a"].up and by_pool["pool-a"].queued_requests == 30.0
    assert {k: by_pool[k].error_reason for k in kinds[1:]} == {
        "hang": "timeout",
        "trickle": "timeout",
        "huge": "too_large",
        "garbage": "garbage",
        "auth": "http_401",
    }
    assert sorted(source.item_errors(snapshot)) == sorted(
        ["timeout", "timeout", "too_large", "garbage", "http_401"]
    )
    for r in snapshot.readings:  # what a body says never reaches a message
        assert CANARY not in (r.error_message or "")


def test_the_picker_token_goes_to_pickers_only_and_never_through_a_redirect(
    picker_server: str,
) -> None:
    targets = (
        _pool("auth", f"{picker_server}/auth/metrics"),
        _pool("redirect", f"{picker_server}/redirect/metrics"),
    )
    source = PickerSource(timeout_seconds=2.0, token=CANARY)
    snapshot = source.fetch(Snapshots({INFERENCE_POOLS: PoolsSnapshot(targets)}))
    source.close()
    by_pool = {r.pool: r for r in snapshot.readings}
    # Authorized; its body is pool-a's picker, so nothing in it is this pool's.
    assert (by_pool["auth"].up, by_pool["auth"].queued_requests) == (True, None)
    assert by_pool["redirect"].error_reason == "http_302"  # not followed: /ok never asked
    assert sorted(_Picker.seen) == [("auth", f"Bearer {CANARY}"), ("redirect", f"Bearer {CANARY}")]
    assert CANARY not in repr(source)
    for r in snapshot.readings:
        assert CANARY not in repr(r)


def test_without_a_picker_token_no_authorization_is_sent(picker_server: str) -> None:
    source = PickerSource(timeout_seconds=2.0)
    pool = (_pool("pool-a", f"{picker_server}/ok/metrics"),)
    snapshot = source.fetch(Snapshots({INFERENCE_POOLS: PoolsSnapshot(pool)}))
    source.close()
    assert snapshot.readings[0].up
    assert _Picker.seen == [("ok", None)]


def test_a_service_that_failed_to_answer_is_asked_again_next_cycle_a_missing_one_in_a_minute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, calls = _source(monkeypatch)
    original = pools.kubeapi.list_objects
    failing = {"now": True}

    def flaky(client: Any, path: str, **params: Any) -> Any:
        if path.endswith("/services/pool-a-epp") and failing["now"]:
            calls.append((path, params))
            raise ApiException(status=500, reason="Internal Server Error")
        return original(client, path, **params)

    monkeypatch.setattr(pools.kubeapi, "list_objects", flaky)
    first = {p.name: p for p in source.fetch().pools}
    assert first["pool-a"].picker_metrics_url is None
    failing["now"] = False
    second = {p.name: p for p in source.fetch().pools}
    assert second["pool-a"].picker_metrics_url == "http://10.96.0.50:9090/metrics"
    # pool-b's Service is missing (404): asked once, not every cycle.
    assert sum(1 for path, _ in calls if path.endswith("/services/pool-b-epp")) == 1
