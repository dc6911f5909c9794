"""A simulated endpoint picker (EPP) of a Gateway API Inference Extension InferencePool.

:func:`render_picker` writes the `/metrics` text one pool's picker serves, in the shapes
of tests/fixtures/gateway/ (read its README.md): llm-d-router v0.10.0, which emits each
metric under its `llm_d_epp_*` name and its legacy twin (`names="both"`,
`epp-metrics.prom`), the same without the twins (`"llm_d_epp"`), or GIE v1.5.0, the
legacy names only (`"legacy"`, `epp-metrics-legacy.prom`). Families and label sets are
upstream's, sorted as client_golang writes them; averages are over the endpoints the
picker has (v0.10.0 rounds them to 2 decimals, v1.5.0 does not), and the flow-control
series exist only with `flow_control` (the feature gate). The request-duration histogram,
the flow-control request counter and the scheduler's attempts are fixed plausible values.

:class:`FakePicker` serves it on a loopback address (its own, as a Service's clusterIP),
optionally behind a bearer token (`--metrics-endpoint-auth`: 401 without it), and
misbehaves on request: see :data:`FAULTS`. State and fault change while it runs.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Final, Literal, get_args

from gpuledger.sim.fake_vllm import FakeVllmServer
from gpuledger.sim.fake_vllm import Fault as ServerFault

__all__ = [
    "DEFAULT_MODEL",
    "FAULTS",
    "NAMES",
    "FakeEndpoint",
    "FakePicker",
    "FakePickerState",
    "Fault",
    "Names",
    "build",
    "render_picker",
]

Names = Literal["both", "llm_d_epp", "legacy"]
NAMES: Final[tuple[Names, ...]] = get_args(Names)
Fault = Literal[
    "ok",  # 200 with the exposition
    "refuse",  # not listening: connections refused until the fault changes
    "hang",  # accept, never answer
    "http_500",
    "garbage",  # 200 with an HTML page: not an exposition
    "huge",  # 200 streaming an exposition padded to `huge_bytes` (50 MB), no Content-Length
    "slow",  # headers at once, then a twentieth of the body every `slow_seconds`
]
FAULTS: Final[tuple[Fault, ...]] = get_args(Fault)
DEFAULT_MODEL: Final = "meta-llama/Llama-3.1-8B-Instruct"
HUGE_BYTES: Final = 50 * 1000 * 1000
METRICS_PATH: Final = "/metrics"

# Each naming's build (`*_info`): llm-d-router v0.10.0, or GIE v1.5.0 for the legacy names.
_BUILDS: Final[Mapping[str, tuple[str, str]]] = {
    "router": ("v0.10.0", "71f4f0999f95b96c49a9d0c4afbd18dfdb943c26"),
    "gie": ("v1.5.0", "df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849"),
}
# The request-queue-duration buckets (pkg/epp/metrics), and the fixed counts in them.
_BUCKETS: Final = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
_BUCKETS_TAIL: Final = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_CUMULATIVE: Final = (10, 35, 52, 70, 81, 92, 101, 108, 114, 117, 119, 120, 120, 120, 120, 120)
_DISPATCHED: Final = 120
_DURATION_SUM: Final = 6.84
_FAILED_ATTEMPTS: Final = 2
_FIRST_ATTEMPTS: Final = 41  # success count of the first endpoint; one less for each next


@dataclass(frozen=True)
class FakeEndpoint:
    """One endpoint the picker has: a ready member pod's target port."""

    pod: str
    namespace: str
    rank: int  # the port's index in targetPorts: the endpoint is `<pod>-rank-<rank>`
    port: int
    queue: float = 0.0  # waiting requests, as it last read them from the engine
    running: float = 0.0
    kv_cache_usage: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.pod}-rank-{self.rank}"


@dataclass(frozen=True)
class FakePickerState:
    """What one pool's picker reports."""

    pool: str  # --pool-name
    names: Names = "both"
    flow_control: bool = True
    queued: float = 0.0  # requests its flow-control queue holds
    queued_bytes: float = 0.0
    saturation: float = 0.0
    ready_endpoints: float = 0.0
    endpoints: tuple[FakeEndpoint, ...] = ()
    model_name: str = DEFAULT_MODEL


@dataclass(frozen=True)
class _Family:
    """One metric under both namings: `llm_d` (router v0.9.0+) and its `legacy` twin."""

    llm_d: str | None
    legacy: str | None
    kind: str
    help: str  # after "[ALPHA] "
    legacy_help: str | None = None  # the twin's own text where it differs
    deprecated: bool = True  # v0.10.0 marks the twin "[Deprecated: Use <llm_d>]"
    gie_help: str | None = None  # GIE v1.5.0's text where it differs from the twin's


_SATURATION = (
    "Pool saturation signal gating Flow Control dispatch. 1.0 is the gating set point; values "
    "above 1.0 indicate the magnitude of oversubscription past it. An empty pool reads as 1.0. "
    "With the default utilization detector, endpoints with missing or stale metrics score as "
    "fully saturated (fail-closed; see {}flow_control_stale_endpoints)."
)
_STALE = (
    "Number of candidate endpoints whose metrics are missing or older than the staleness "
    "threshold, as of the most recent saturation evaluation. Recorded by the utilization "
    "saturation detector, which scores these endpoints as fully saturated in "
    "flow_control_pool_saturation (fail-closed): a nonzero value during a dispatch stall "
    "indicates a metrics collection problem rather than genuine overload."
)
_FAMILIES: Final[Mapping[str, _Family]] = {
    "average_kv": _Family(
        "llm_d_epp_average_kv_cache_utilization",
        "inference_pool_average_kv_cache_utilization",
        "gauge",
        "The average kv cache utilization for an inference server pool.",
    ),
    "average_queue": _Family(
        "llm_d_epp_average_queue_size",
        "inference_pool_average_queue_size",
        "gauge",
        "The average number of requests pending in the model server queue.",
    ),
    "average_running": _Family(
        "llm_d_epp_average_running_requests",
        "inference_pool_average_running_requests",
        "gauge",
        "The average number of running requests across model servers in the pool.",
    ),
    "std_dev_kv": _Family(
        "llm_d_epp_std_dev_kv_cache_utilization",
        None,
        "gauge",
        "The standard deviation kv cache utilization for an inference server pool.",
    ),
    "std_dev_queue": _Family(
        "llm_d_epp_std_dev_queue_size",
        None,
        "gauge",
        "The standard deviation number of requests pending in the model server queue.",
    ),
    "std_dev_running": _Family(
        "llm_d_epp_std_dev_running_requests",
        None,
        "gauge",
        "The standard deviation number of running requests across model servers in the pool.",
    ),
    "ready": _Family(
        "llm_d_epp_ready_endpoints",
        "inference_pool_ready_pods",
        "gauge",
        "The number of ready endpoints in the inference server pool.",
        legacy_help="The number of ready pods in the inference server pool.",
    ),
    "per_endpoint_queue": _Family(
        "llm_d_epp_per_endpoint_queue_size",
        "inference_pool_per_pod_queue_size",
        "gauge",
        "The total number of requests pending in the model server queue for each underlying "
        "endpoint.",
        legacy_help="The total number of requests pending in the model server queue for each "
        "underlying pod.",
        deprecated=False,
    ),
    "queue_size": _Family(
        "llm_d_epp_flow_control_queue_size",
        "inference_extension_flow_control_queue_size",
        "gauge",
        "Current number of requests actively held in the Flow Control queue.",
    ),
    "queue_bytes": _Family(
        "llm_d_epp_flow_control_queue_bytes",
        "inference_extension_flow_control_queue_bytes",
        "gauge",
        "Current total size in bytes of requests actively held in the Flow Control queue.",
    ),
    "queue_duration": _Family(
        "llm_d_epp_flow_control_request_queue_duration_seconds",
        "inference_extension_flow_control_request_queue_duration_seconds",
        "histogram",
        "Distribution of total time requests spend in the Flow Control layer (from enqueue to "
        "final outcome).",
    ),
    "saturation": _Family(
        "llm_d_epp_flow_control_pool_saturation",
        "inference_extension_flow_control_pool_saturation",
        "gauge",
        _SATURATION.format(""),
        legacy_help=_SATURATION.format("llm_d_epp_"),
        gie_help="Current saturation level of the inference pool (0.0 = empty, 1.0 = fully "
        "saturated).",
    ),
    "requests": _Family(
        "llm_d_epp_flow_control_requests_total",
        None,
        "counter",
        "Total number of requests processed by the Flow Control layer.",
    ),
    "stale": _Family("llm_d_epp_flow_control_stale_endpoints", None, "gauge", _STALE),
    "attempts": _Family(
        "llm_d_epp_scheduler_attempts_total",
        "inference_extension_scheduler_attempts_total",
        "counter",
        "Total number of scheduling attempts.",
    ),
    "info": _Family(
        "llm_d_epp_info",
        "inference_extension_info",
        "gauge",
        "General information of the current build of Inference Extension.",
        deprecated=False,
    ),
}
# The twins' label names where they differ from the llm_d_epp_ ones.
_LEGACY_LABELS: Final[Mapping[str, str]] = {
    "model_server_endpoint": "model_server_pod",
    "endpoint_name": "pod_name",
}

# One sample of a family: (suffix of the name, labels, value).
_Sample = tuple[str, Mapping[str, str], float]


def go_float(value: float) -> str:
    """A value as client_golang writes it (strconv 'g', shortest): `1e+06`, `0.0001`."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(float(value))).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    point = len(text) + exponent  # digits before the decimal point
    power = point - 1
    if power < -4 or power >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        body = f"{mantissa}e{'-' if power < 0 else '+'}{abs(power):02d}"
    elif point <= 0:
        body = "0." + "0" * -point + text
    elif point >= len(text):
        body = text + "0" * (point - len(text))
    else:
        body = text[:point] + "." + text[point:]
    return ("-" if sign else "") + body


def _round2(value: float) -> float:
    """Go's math.Round(v*100)/100 (halves away from zero), as router v0.10.0 rounds."""
    scaled = value * 100
    return math.copysign(math.floor(abs(scaled) + 0.5), scaled) / 100


def _samples(state: FakePickerState, router: bool) -> dict[str, list[_Sample]]:
    """Each family's samples, in the llm_d_epp_ label names."""
    pool = {"name": state.pool}
    ends = sorted(state.endpoints, key=lambda e: (e.pod, e.rank))
    out: dict[str, list[_Sample]] = {"ready": [("", pool, state.ready_endpoints)]}
    if ends:
        # Over the endpoints with fresh metrics; with none, only `ready` (0) is written.
        columns = {
            "queue": [e.queue for e in ends],
            "running": [e.running for e in ends],
            "kv": [e.kv_cache_usage for e in ends],
        }
        for key, values in columns.items():
            mean = sum(values) / len(values)
            out[f"average_{key}"] = [("", pool, _round2(mean) if router else mean)]
            if router:  # the sample standard deviation, v0.10.0 only
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                out[f"std_dev_{key}"] = [("", pool, _round2(spread))]
        out["per_endpoint_queue"] = [
            ("", {"model_server_endpoint": e.name, "name": state.pool}, e.queue) for e in ends
        ]
    if state.flow_control:
        flow = {
            "fairness_id": "default-flow",
            "inference_pool": state.pool,
            "model_name": state.model_name,
            "priority": "0",
            "target_model_name": state.model_name,
        }
        out["queue_size"] = [("", flow, state.queued)]
        out["queue_bytes"] = [("", flow, state.queued_bytes)]
        out["saturation"] = [("", {"inference_pool": state.pool}, state.saturation)]
        dispatched = {**flow, "outcome": "Dispatched"}
        buckets = [
            ("_bucket", {**dispatched, "le": go_float(le)}, float(count))
            for le, count in zip(_BUCKETS + _BUCKETS_TAIL, _CUMULATIVE, strict=True)
        ]
        out["queue_duration"] = [
            *buckets,
            ("_bucket", {**dispatched, "le": "+Inf"}, float(_DISPATCHED)),
            ("_sum", dispatched, _DURATION_SUM),
            ("_count", dispatched, float(_DISPATCHED)),
        ]
        if router:
            counted = {"inference_pool": state.pool, "outcome": "Dispatched", "priority": "0"}
            out["requests"] = [("", counted, float(_DISPATCHED))]
            out["stale"] = [("", {"detector": "utilization-detector"}, 0.0)]
    failed = {"endpoint_name": "", "namespace": "", "port": "", "status": "failure"}
    attempts: list[_Sample] = [
        ("", {**failed, "target_model_name": state.model_name}, float(_FAILED_ATTEMPTS))
    ]
    for i, e in enumerate(ends):
        labels = {"endpoint_name": e.pod, "namespace": e.namespace, "port": str(e.port)}
        labels |= {"status": "success", "target_model_name": state.model_name}
        attempts.append(("", labels, float(max(1, _FIRST_ATTEMPTS - i))))
    out["attempts"] = attempts
    ref, commit = _BUILDS["router" if router else "gie"]
    out["info"] = [("", {"build_ref": ref, "commit": commit}, 1.0)]
    return out


def _sort_key(sample: _Sample) -> tuple[str, ...]:
    """client_golang's order within a family: by label values in label-name order."""
    _, labels, _ = sample
    return tuple(labels[k] for k in sorted(labels) if k != "le")


def _line(name: str, labels: Mapping[str, str], value: float) -> str:
    names = sorted(k for k in labels if k != "le") + (["le"] if "le" in labels else [])
    text = ",".join(f'{k}="{_escape(labels[k])}"' for k in names)
    return f"{name}{{{text}}} {go_float(value)}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _named(family: _Family, legacy: bool, router: bool) -> tuple[str, str] | None:
    """(name, HELP text) of one of the family's two names, or None if it has none."""
    if not legacy:
        assert family.llm_d is not None
        return family.llm_d, family.help
    if family.legacy is None:
        return None
    text = family.legacy_help or family.help
    if not router:
        return family.legacy, family.gie_help or text
    if family.deprecated:
        text = f"[Deprecated: Use {family.llm_d}] {text}"
    return family.legacy, text


def _blocks(state: FakePickerState) -> Iterator[tuple[str, list[str]]]:
    router = state.names != "legacy"
    samples = _samples(state, router)
    namings = {"both": (False, True), "llm_d_epp": (False,), "legacy": (True,)}[state.names]
    for key, family in _FAMILIES.items():
        if key not in samples:
            continue
        for legacy in namings:
            named = _named(family, legacy, router)
            if named is None:
                continue
            name, text = named
            lines = [f"# HELP {name} [ALPHA] {text}", f"# TYPE {name} {family.kind}"]
            ordered = sorted(samples[key], key=_sort_key)  # stable: a histogram keeps its order
            for suffix, labels, value in ordered:
                renamed = {_LEGACY_LABELS.get(k, k) if legacy else k: v for k, v in labels.items()}
                lines.append(_line(name + suffix, renamed, value))
            yield name, lines


def render_picker(state: FakePickerState) -> str:
    """The picker's `/metrics` text: families sorted by name, as the registry gathers."""
    return "".join("\n".join(lines) + "\n" for _, lines in sorted(_blocks(state)))


def build(names: Names) -> tuple[str, str]:
    """(build_ref, commit) the picker of this naming reports in its `*_info`."""
    return _BUILDS["gie" if names == "legacy" else "router"]


# -------------------------------------------------------------------------- server

# The HTTP side is the fake engines' (fake_vllm.FakeVllmServer: faults, token, clean stop);
# a picker's `slow` is its `trickle`, one twentieth of the body every `slow_seconds`.
_SERVER_FAULT: Final[Mapping[str, ServerFault]] = {"slow": "trickle"}


class FakePicker:
    """One pool's endpoint picker: `/metrics` on `host` (a port of its own), live state.

    Use as a context manager, or start()/stop(); stop() joins every thread and closes
    every socket, including connections held by `hang` and `slow`.
    """

    def __init__(
        self,
        state: FakePickerState,
        *,
        host: str = "127.0.0.1",
        token: str | None = None,
        fault: Fault = "ok",
        huge_bytes: int = HUGE_BYTES,
        slow_seconds: float = 1.0,
    ) -> None:
        self._lock = threading.Lock()
        self._state = state
        self._fault: Fault = fault
        self._server = FakeVllmServer(
            (),
            path=METRICS_PATH,
            fault=_SERVER_FAULT.get(fault, fault),
            gzip_enabled=False,
            slow_seconds=20 * slow_seconds,
            huge_bytes=huge_bytes,
            host=host,
            render=lambda _engines: render_picker(self.state),
            token=token,
        )

    # -- lifecycle
    def start(self) -> FakePicker:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> FakePicker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def token(self) -> str | None:
        return self._server.token

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def requests(self) -> int:
        return self._server.requests_served

    @property
    def authorizations(self) -> list[str | None]:
        """Each request's Authorization header."""
        return self._server.authorizations

    @property
    def state(self) -> FakePickerState:
        with self._lock:
            return self._state

    @property
    def fault(self) -> Fault:
        with self._lock:
            return self._fault

    # -- live changes
    def set_state(self, state: FakePickerState) -> None:
        with self._lock:
            self._state = state

    def set_fault(self, fault: str) -> None:
        chosen = next((f for f in FAULTS if f == fault), None)
        if chosen is None:
            raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
        with self._lock:
            self._fault = chosen
        self._server.set_fault(_SERVER_FAULT.get(chosen, chosen))
