"""A simulated SGLang `/metrics` endpoint for the scenario harness and tests.

:func:`render_exposition` writes what an SGLang 0.5.23 HTTP server (`--enable-metrics`)
serves for its schedulers: an abridged transcription of the expositions SGLang's own
collectors rendered (tests/fixtures/sglang/): the same HELP/TYPE lines, label sets in the
multiprocess collector's order, buckets and `pid` label, for the series gpuledger reads and
a few beside them. The state is sim/fake_vllm.py's :class:`FakeEngine`: `engine` is the
data-parallel rank (the `dp_rank` label appears when any engine is not rank 0, as when a
data-parallel controller spawned the schedulers), `kv_cache_usage` is `token_usage`,
`preemptions_total` the retractions (no series until the first, as in SGLang);
`waiting_by_reason`, `num_gpu_blocks` and `block_size` have no SGLang series.

Styles: ``"0.5.23"`` (the default server), ``"0.5.23-priority"``
(`--enable-priority-scheduling`: the totals under `priority=""` and one priority, `"0"`,
holding them all beside, so a reader that sums double counts) and ``"0.5.23-underscore"``
(the same names spelled `sglang_`, as the issue reports a router rewrites them).

The server is sim/fake_vllm.py's, with this renderer: :func:`server`. With a
:class:`FakeServerInfo` it also answers `/server_info` and `/get_server_info` as 0.5.23
does (the shape of tests/fixtures/sglang/sglang-0.5.23-server_info.constructed.json:
the resolved arguments at the top, one `internal_states` object per DP rank), secrets
included, as a real one holds them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from gpuledger.sim.fake_vllm import FakeEngine, FakeVllmServer, Fault

__all__ = [
    "KIND",
    "STYLES",
    "FakeServerInfo",
    "Style",
    "render_exposition",
    "render_server_info",
    "server",
    "server_info_documents",
]

KIND = "sglang"
Style = Literal["0.5.23", "0.5.23-priority", "0.5.23-underscore"]
STYLES: tuple[Style, ...] = get_args(Style)

# A fixed scheduler PID for the `pid` label gauges of no multiprocess mode carry.
SCHEDULER_PID = 9094
MAX_TOTAL_NUM_TOKENS = 262144

# fmt: off
_QUEUE_BUCKETS = (
    "0.0", "0.001", "0.005", "0.01", "0.05", "0.1", "0.2", "0.5", "1.0", "2.0", "3.0", "4.0",
    "5.0", "10.0", "15.0", "20.0", "30.0", "40.0", "50.0", "60.0", "70.0", "80.0", "90.0",
    "100.0", "200.0", "300.0", "400.0", "500.0", "600.0", "700.0", "800.0", "900.0", "1000.0",
    "1200.0", "1400.0", "1600.0", "1800.0", "2000.0", "2500.0", "3000.0", "+Inf",
)
_TTFT_BUCKETS = (
    "0.1", "0.2", "0.4", "0.6", "0.8", "1.0", "2.0", "4.0", "6.0", "8.0", "10.0", "20.0",
    "40.0", "60.0", "80.0", "100.0", "200.0", "400.0", "+Inf",
)
# fmt: on


@dataclass(frozen=True)
class _Gauge:
    name: str
    help: str
    value: str  # which FakeEngine value: running, waiting, kv, or a constant


_GAUGES = (
    _Gauge("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", "max"),
    _Gauge("num_running_reqs", "The number of running requests.", "running"),
    _Gauge("num_queue_reqs", "The number of requests in the waiting queue.", "waiting"),
    _Gauge("num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", "0"),
    _Gauge("gen_throughput", "The generation throughput (token/s).", "0"),
    _Gauge("token_usage", "The token usage.", "kv"),
    _Gauge("full_token_usage", "The token usage for full attention layers.", "kv"),
)
# Split by priority when priority scheduling is on.
_BY_PRIORITY = frozenset({"running", "waiting"})


def _labels(labels: Mapping[str, str]) -> str:
    # prometheus_client's multiprocess collector writes labels sorted by name.
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _number(value: float) -> str:
    return repr(float(value))


def _scheduler_labels(e: FakeEngine, ranked: bool, priority: str | None) -> dict[str, str]:
    labels = {
        "engine_type": "unified",
        "model_name": e.model_name,
        "moe_ep_rank": "0",
        "pp_rank": "0",
        "tp_rank": "0",
    }
    if ranked:
        labels["dp_rank"] = str(e.engine)
    if priority is not None:
        labels["priority"] = priority
    return labels


def _value(e: FakeEngine, which: str) -> float:
    values = {
        "running": e.running,
        "waiting": e.waiting,
        "kv": e.kv_cache_usage,
        "max": float(MAX_TOTAL_NUM_TOKENS),
    }
    return values.get(which, 0.0)


def _gauge(p: str, g: _Gauge, engines: Sequence[FakeEngine], ranked: bool, prio: bool) -> list[str]:
    out = [f"# HELP {p}{g.name} {g.help}", f"# TYPE {p}{g.name} gauge"]
    for e in engines:
        total = _labels(_scheduler_labels(e, ranked, "" if prio else None))
        out.append(f"{p}{g.name}{total} {_number(_value(e, g.value))}")
        if prio and g.value in _BY_PRIORITY:  # one priority holding every request
            part = _labels(_scheduler_labels(e, ranked, "0"))
            out.append(f"{p}{g.name}{part} {_number(_value(e, g.value))}")
    return out


def _retractions(p: str, engines: Sequence[FakeEngine], ranked: bool, prio: bool) -> list[str]:
    name = f"{p}num_retracted_reqs"
    out = [f"# HELP {name} The number of retracted requests.", f"# TYPE {name} gauge"]
    for e in engines:
        labels = {**_scheduler_labels(e, ranked, "" if prio else None), "pid": str(SCHEDULER_PID)}
        out.append(f"{name}{_labels(labels)} 0.0")
    counted = [e for e in engines if e.preemptions_total > 0]
    if counted:  # a labelled counter has no sample before its first retraction
        total = f"{p}num_retracted_requests"
        out += [
            f"# HELP {total} Total number of retracted requests.",
            f"# TYPE {total} counter",
        ]
        out += [
            f"{total}_total{_labels(_scheduler_labels(e, ranked, '' if prio else None))}"
            f" {_number(e.preemptions_total)}"
            for e in counted
        ]
    return out


def _histogram(
    name: str, help_text: str, buckets: tuple[str, ...], label_sets: Sequence[dict[str, str]]
) -> list[str]:
    out = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for labels in label_sets:
        out += [f"{name}_bucket{_labels({**labels, 'le': le})} 0.0" for le in buckets]
        out += [f"{name}_count{_labels(labels)} 0.0", f"{name}_sum{_labels(labels)} 0.0"]
    return out


def _tokenizer_labels(engines: Sequence[FakeEngine], prio: bool) -> list[dict[str, str]]:
    """The HTTP server's own series: one label set per model, streaming or not."""
    models = sorted({e.model_name for e in engines})
    extra = {"priority": "0"} if prio else {}
    return [
        {"engine_type": "unified", "is_streaming": s, "model_name": m, **extra}
        for m in models
        for s in ("false", "true")
    ]


def render_exposition(engines: Sequence[FakeEngine]) -> str:
    """The `/metrics` text of one SGLang HTTP server fronting `engines` (one style)."""
    styles = {e.style for e in engines}
    if len(styles) > 1:
        raise ValueError("all engines behind one endpoint must share a style")
    style = styles.pop() if styles else STYLES[0]
    if style not in STYLES:
        raise ValueError(f"style {style!r} is none of {', '.join(STYLES)}")
    prefix = "sglang_" if style.endswith("underscore") else "sglang:"
    prio = style.endswith("priority")
    ranked = len(engines) > 1 or any(e.engine != 0 for e in engines)
    lines = _retractions(prefix, engines, ranked, prio)
    tokenizer = _tokenizer_labels(engines, prio)
    if engines:
        name = f"{prefix}num_requests_total"
        lines += [f"# HELP {name} Number of requests processed.", f"# TYPE {name} counter"]
        lines += [f"{name}{_labels(labels)} 0.0" for labels in tokenizer]
        queue = [_scheduler_labels(e, ranked, "" if prio else None) for e in engines]
        lines += _histogram(
            f"{prefix}queue_time_seconds",
            "Histogram of queueing time in seconds.",
            _QUEUE_BUCKETS,
            queue,
        )
        lines += _histogram(
            f"{prefix}time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
            tokenizer,
        )
    for gauge in _GAUGES:
        if engines:
            lines += _gauge(prefix, gauge, engines, ranked, prio)
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class FakeServerInfo:
    """What `/server_info` reports: the resolved arguments and, per DP rank, the bound
    the scheduler settled on (`effective_max_running_requests_per_dp`)."""

    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    max_running_requests: int | None = None
    effective_max_running_requests: int = 4096
    mem_fraction_static: float = 0.88
    served_model_name: str = "tiny"
    # Secrets a real answer carries (the API keys, the command line, the environment).
    api_key: str | None = None
    launch_command: str = "python -m sglang.launch_server --model-path tiny"
    environment: Mapping[str, str] = field(default_factory=dict)
    fault: Fault = "ok"


def render_server_info(info: FakeServerInfo) -> bytes:
    states = [
        {
            "world_size": info.tp_size * info.pp_size,
            "effective_max_running_requests_per_dp": info.effective_max_running_requests,
            "last_gen_throughput": 0.0,
            "env_vars": dict(info.environment),
        }
        for _ in range(info.dp_size)
    ]
    document = {
        "tp_size": info.tp_size,
        "dp_size": info.dp_size,
        "pp_size": info.pp_size,
        "max_running_requests": info.max_running_requests,
        "mem_fraction_static": info.mem_fraction_static,
        "served_model_name": info.served_model_name,
        "api_key": info.api_key,
        "admin_api_key": info.api_key,
        "launch_command": info.launch_command,
        "status": "ready",
        "internal_states": states,
        "version": "0.5.23",
        "frontend": "python",
    }
    return json.dumps(document).encode()


def server_info_documents(info: FakeServerInfo | None) -> dict[str, Callable[[], bytes]]:
    """The server-info paths and their answer (FakeVllmServer's `documents`); none
    without one."""
    if info is None:
        return {}
    answer = render_server_info(info)
    return {"/server_info": lambda: answer, "/get_server_info": lambda: answer}


def server(
    engines: Sequence[FakeEngine],
    *,
    fault: Fault = "ok",
    host: str = "127.0.0.1",
    server_info: FakeServerInfo | None = None,
) -> FakeVllmServer:
    """A fake SGLang HTTP server: the shared fake server with this renderer, and its
    server info when given (else those paths answer 404)."""
    return FakeVllmServer(
        engines,
        fault=fault,
        host=host,
        render=render_exposition,
        documents=server_info_documents(server_info),
        document_fault=server_info.fault if server_info is not None else "ok",
    )
