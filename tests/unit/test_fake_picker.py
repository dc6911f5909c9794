"""The fake endpoint picker (sim/fake_picker.py) says what the upstream pickers say, in
their words: the fixtures of tests/fixtures/gateway/ are its reference, byte for byte for
their state, family and label names for any other."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.sim.fake_picker import (
    FakeEndpoint,
    FakePicker,
    FakePickerState,
    go_float,
    render_picker,
)
from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "gateway"
PODS = ("vllm-a-5d8c7b9f4-2xk9p", "vllm-a-5d8c7b9f4-7hq2m", "vllm-a-5d8c7b9f4-wn4tz")
# The fixtures' state (README.md, "Files"): queues 0/1/0, running 4/5/3, KV 0.40/0.45/0.41.
ENDPOINTS = tuple(
    FakeEndpoint(pod, "llm", 0, 8000, queue, running, kv)
    for pod, queue, running, kv in zip(PODS, (0, 1, 0), (4, 5, 3), (0.40, 0.45, 0.41), strict=True)
)
# The llm_d_epp_ families' legacy twins, and the label names the twins use instead.
TWINS = {
    "llm_d_epp_average_kv_cache_utilization": "inference_pool_average_kv_cache_utilization",
    "llm_d_epp_average_queue_size": "inference_pool_average_queue_size",
    "llm_d_epp_average_running_requests": "inference_pool_average_running_requests",
    "llm_d_epp_ready_endpoints": "inference_pool_ready_pods",
    "llm_d_epp_per_endpoint_queue_size": "inference_pool_per_pod_queue_size",
    "llm_d_epp_flow_control_queue_size": "inference_extension_flow_control_queue_size",
    "llm_d_epp_flow_control_queue_bytes": "inference_extension_flow_control_queue_bytes",
    "llm_d_epp_flow_control_request_queue_duration_seconds": (
        "inference_extension_flow_control_request_queue_duration_seconds"
    ),
    "llm_d_epp_flow_control_pool_saturation": "inference_extension_flow_control_pool_saturation",
    "llm_d_epp_scheduler_attempts": "inference_extension_scheduler_attempts",
    "llm_d_epp_info": "inference_extension_info",
}
RENAMED = {"model_server_endpoint": "model_server_pod", "endpoint_name": "pod_name"}


def fixture_state(names: str = "both", **changes: object) -> FakePickerState:
    state = FakePickerState(
        pool="pool-a",
        names=names,  # type: ignore[arg-type]
        queued=30,
        queued_bytes=61440,
        saturation=0.2,
        ready_endpoints=3,
        endpoints=ENDPOINTS,
    )
    return FakePickerState(**{**state.__dict__, **changes})  # type: ignore[arg-type]


def shape(text: str) -> dict[str, set[tuple[str, frozenset[str]]]]:
    """Family name -> its samples' (name, label names), as Prometheus' parser reads them."""
    return {
        f.name: {(s.name, frozenset(s.labels)) for s in f.samples}
        for f in text_string_to_metric_families(text)
    }


def values(text: str) -> dict[str, dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    return {
        f.name: {(s.name, frozenset(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(text)
    }


@pytest.mark.parametrize(
    ("names", "fixture"), [("both", "epp-metrics.prom"), ("legacy", "epp-metrics-legacy.prom")]
)
def test_the_fixtures_state_renders_as_the_fixture(names: str, fixture: str) -> None:
    assert render_picker(fixture_state(names)) == (FIXTURES / fixture).read_text()


@pytest.mark.parametrize(
    ("names", "fixture"),
    [("both", "epp-metrics.prom"), ("legacy", "epp-metrics-legacy.prom")],
)
def test_another_state_keeps_the_fixtures_families_and_label_names(
    names: str, fixture: str
) -> None:
    """Any state: the families and label sets are upstream's (the fake cannot drift)."""
    other = tuple(
        FakeEndpoint(f"pod-{i}", "ns", rank, 8000 + rank, i * 2.0, 8.0, 0.9)
        for i in range(4)
        for rank in range(2)
    )
    state = fixture_state(names, pool="p", endpoints=other, queued=7, model_name="qwen")
    assert shape(render_picker(state)) == shape((FIXTURES / fixture).read_text())


def test_llm_d_epp_names_alone_are_the_fixtures_llm_d_epp_families() -> None:
    wanted = {
        name: samples
        for name, samples in shape((FIXTURES / "epp-metrics.prom").read_text()).items()
        if name.startswith("llm_d_epp_")
    }
    assert shape(render_picker(fixture_state("llm_d_epp"))) == wanted


def test_both_namings_give_the_same_numbers() -> None:
    """Each legacy twin carries its llm_d_epp_ family's samples, its labels renamed."""
    states = [fixture_state(), fixture_state(endpoints=ENDPOINTS[:1], queued=0, saturation=1.5)]
    for state in states:
        families = values(render_picker(state))
        for new, old in TWINS.items():
            renamed = {
                (name.replace(new, old), frozenset((RENAMED.get(k, k), v) for k, v in labels)): v
                for (name, labels), v in families[new].items()
            }
            assert renamed == families[old], new


def test_llm_d_epp_and_legacy_pickers_read_the_same() -> None:
    """A router (rounded averages) and a GIE v1.5.0 picker of one state agree to 2 decimals."""
    router = values(render_picker(fixture_state("llm_d_epp")))
    gie = values(render_picker(fixture_state("legacy")))
    for new, old in TWINS.items():
        if new == "llm_d_epp_info":
            continue
        mine = {(RENAMED.get(k, k), v) for s in router[new] for k, v in s[1]}
        theirs = {(k, v) for s in gie[old] for k, v in s[1]}
        assert mine == theirs, new
        assert sorted(round(v, 2) for v in router[new].values()) == sorted(
            round(v, 2) for v in gie[old].values()
        ), new


def test_the_state_is_what_it_reports() -> None:
    state = fixture_state(queued=12, queued_bytes=9000, saturation=1.25, ready_endpoints=2)
    families = values(render_picker(state))

    def one(name: str) -> float:
        [value] = families[name].values()
        return value

    assert one("llm_d_epp_flow_control_queue_size") == 12
    assert one("llm_d_epp_flow_control_queue_bytes") == 9000
    assert one("llm_d_epp_flow_control_pool_saturation") == 1.25
    assert one("llm_d_epp_ready_endpoints") == 2
    assert one("llm_d_epp_average_queue_size") == 0.33
    queues = {
        dict(labels)["model_server_endpoint"]: v
        for (_, labels), v in families["llm_d_epp_per_endpoint_queue_size"].items()
    }
    assert queues == {f"{pod}-rank-0": q for pod, q in zip(PODS, (0, 1, 0), strict=True)}


def test_flow_control_off_has_no_flow_control_series_at_all() -> None:
    text = render_picker(fixture_state(flow_control=False))
    assert "flow_control" not in text
    assert "llm_d_epp_ready_endpoints" in text


def test_a_picker_without_endpoints_writes_ready_zero_and_no_averages() -> None:
    families = values(render_picker(fixture_state(endpoints=(), ready_endpoints=0)))
    assert list(families["llm_d_epp_ready_endpoints"].values()) == [0]
    assert not [name for name in families if "average" in name or "per_endpoint" in name]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (1, "1"),
        (61440, "61440"),
        (1e6, "1e+06"),
        (52428800, "5.24288e+07"),
        (0.0001, "0.0001"),
        (1e-5, "1e-05"),
        (1 / 3, "0.3333333333333333"),
        (-2.5, "-2.5"),
        (float("inf"), "+Inf"),
    ],
)
def test_values_are_written_as_client_golang_writes_them(value: float, text: str) -> None:
    assert go_float(value) == text


# ---------------------------------------------------------------------------------- server


@pytest.fixture
def picker() -> Iterator[FakePicker]:
    with FakePicker(fixture_state(), token="s3cret", huge_bytes=2_000_000) as served:
        yield served


def get(url: str, token: str | None = "s3cret", timeout: float = 3.0) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        ) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_it_serves_its_state_with_the_token_and_401_without(picker: FakePicker) -> None:
    status, body = get(picker.url)
    assert status == 200
    assert body.decode() == (FIXTURES / "epp-metrics.prom").read_text()
    assert get(picker.url, token=None)[0] == 401
    assert get(picker.url, token="wrong")[0] == 401
    assert get(picker.url.replace("/metrics", "/other"))[0] == 404
    picker.set_state(fixture_state(queued=0))
    assert b"llm_d_epp_flow_control_queue_size{" in get(picker.url)[1]
    assert picker.authorizations[0] == "Bearer s3cret"


def test_faults(picker: FakePicker) -> None:
    picker.set_fault("http_500")
    assert get(picker.url)[0] == 500
    picker.set_fault("garbage")
    status, body = get(picker.url)
    assert status == 200
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(body.decode()))
    picker.set_fault("huge")
    status, body = get(picker.url)
    assert status == 200 and len(body) >= 2_000_000  # padded past huge_bytes
    picker.set_fault("refuse")
    with pytest.raises(urllib.error.URLError) as refused:
        get(picker.url)
    assert isinstance(refused.value.reason, ConnectionRefusedError)
    picker.set_fault("ok")  # listening again, on the same port
    assert get(picker.url)[0] == 200


def test_hang_and_slow_answer_nothing_whole_in_time(picker: FakePicker) -> None:
    for fault in ("hang", "slow"):
        picker.set_fault(fault)
        started = time.monotonic()
        with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
            get(picker.url, timeout=1.0)
        assert time.monotonic() - started < 6.0, fault  # the 1 s timeout, on a loaded CI
    picker.set_fault("ok")
    assert get(picker.url)[0] == 200


def test_a_picker_that_starts_refusing_has_its_port_already() -> None:
    with FakePicker(fixture_state(), fault="refuse") as refusing:
        assert refusing.port > 0
        with pytest.raises(urllib.error.URLError):
            get(refusing.url, token=None)
        refusing.set_fault("ok")
        assert get(refusing.url, token=None)[0] == 200
