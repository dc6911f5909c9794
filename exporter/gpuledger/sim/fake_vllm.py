"""A simulated vLLM `/metrics` endpoint for the scenario harness and tests.

:func:`render_exposition` writes the text a vLLM API server would serve for one or more
engines (data-parallel ranks, or several models behind one endpoint). Style ``"0.32"``
mirrors the real vLLM 0.32 exposition kept in ``shared/reference/vllm-0.32-cpu`` — the
same families, HELP/TYPE lines, label sets, histogram buckets and ``_created`` gauges, so
the body is as large as a real one. Style ``"0.10"`` uses the older names (V0 engine):
``vllm:gpu_cache_usage_perc``, no ``engine`` label, no waiting-by-reason, no
``_created`` series. Only the values in :class:`FakeEngine` vary; every other series
is zero or a fixed plausible value.

:class:`FakeVllmServer` serves that text on 127.0.0.1 (ephemeral port), and misbehaves
on request: see :data:`FAULTS`. Faults and engines can change while it runs.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import socket
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, get_args

from gpuledger.model import frozen_map

__all__ = [
    "FAULTS",
    "KIND",
    "STYLES",
    "FakeEngine",
    "FakeVllmServer",
    "Fault",
    "Style",
    "render_exposition",
]

# The engine kind this fake is (gpuledger.engines), and its styles, the default first.
KIND = "vllm"
Style = Literal["0.32", "0.10"]
STYLES: tuple[Style, ...] = get_args(Style)
Fault = Literal[
    "ok",  # 200 with the rendered exposition (gzip when the client accepts it)
    "hang",  # accept the connection, never answer
    "refuse",  # stop listening: connections are refused until the fault changes
    "http_500",
    "garbage",  # 200 with an HTML error page and binary bytes
    "truncated",  # Content-Length of the whole body, half of it sent, then close
    "huge",  # 200 streaming a valid exposition padded past `huge_bytes`
    "slow",  # answer normally after `slow_seconds`
    "trickle",  # headers at once, then the body in pieces over `slow_seconds`
]
FAULTS: tuple[Fault, ...] = get_args(Fault)

# Fixed start time so renders are deterministic (the reference sample's own epoch).
DEFAULT_CREATED = 1.7959403479e09


@dataclass(frozen=True)
class FakeEngine:
    """One engine's state. `waiting_by_reason` empty: all waiting count as capacity.

    Another kind's fake renders the same state (sim/fake_sglang.py): `style` is then
    one of its styles, and the fields it has no series for are unused.
    """

    model_name: str = "tiny"
    engine: int = 0
    running: float = 0.0
    waiting: float = 0.0
    waiting_by_reason: Mapping[str, float] = field(default_factory=frozen_map)
    kv_cache_usage: float = 0.0
    preemptions_total: float = 0.0
    num_gpu_blocks: int = 8192
    block_size: int = 128
    style: str = "0.32"

    def reasons(self) -> Mapping[str, float]:
        if self.waiting_by_reason:
            return self.waiting_by_reason
        return {"capacity": self.waiting, "deferred": 0.0}


# ----------------------------------------------------------------------- templates

Scope = Literal["engine", "model", "process"]
Kind = Literal["counter", "gauge", "histogram", "summary"]


@dataclass(frozen=True)
class _Family:
    name: str  # as on the HELP line: counters keep their `_total`
    kind: Kind
    help: str
    scope: Scope = "engine"
    extra: tuple[str, tuple[str, ...]] | None = None  # one varying label and its values
    const: tuple[tuple[str, str], ...] = ()  # fixed labels
    buckets: tuple[str, ...] = ()


# The tables below are data transcribed from the reference exposition (order, HELP text,
# label values, buckets); kept compact by hand.
# fmt: off
_TOKENS = ("1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "+Inf")
_ITERATION = (
    "1.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0", "2048.0",
    "4096.0", "8192.0", "16384.0", "+Inf",
)
_TTFT = (
    "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75",
    "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0",
    "+Inf",
)
_ITL = (
    "0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.4", "0.5", "0.75",
    "1.0", "2.5", "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "+Inf",
)
_LATENCY = (
    "0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0",
    "40.0", "50.0", "60.0", "120.0", "240.0", "480.0", "960.0", "1920.0", "7680.0", "+Inf",
)
_PREEMPT_BUCKETS = ("1.0", "2.0", "3.0", "4.0", "5.0", "10.0", "20.0", "+Inf")
_PARAMS_N = ("1.0", "2.0", "5.0", "10.0", "20.0", "+Inf")
_HTTP_HIGHR = (
    "0.01", "0.025", "0.05", "0.075", "0.1", "0.25", "0.5", "0.75", "1.0", "1.5", "2.0",
    "2.5", "3.0", "3.5", "4.0", "4.5", "5.0", "7.5", "10.0", "30.0", "60.0", "+Inf",
)
_MFU = "(for Model Flops Utilization calculations)."
_HTTP_NOTE = "Only value of header is respected. Otherwise ignored. No percentile calculated. "
_GENERATIONS = ("generation", ("0", "1", "2"))

_PROCESS_FAMILIES: tuple[_Family, ...] = (
    _Family("python_gc_objects_collected_total", "counter",
            "Objects collected during gc", "process", _GENERATIONS),
    _Family("python_gc_objects_uncollectable_total", "counter",
            "Uncollectable objects found during GC", "process", _GENERATIONS),
    _Family("python_gc_collections_total", "counter",
            "Number of times this generation was collected", "process", _GENERATIONS),
    _Family("python_info", "gauge", "Python platform information", "process", const=(
        ("implementation", "CPython"), ("major", "3"), ("minor", "11"),
        ("patchlevel", "7"), ("version", "3.11.7"))),
    _Family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", "process"),
    _Family("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
            "process"),
    _Family("process_start_time_seconds", "gauge",
            "Start time of the process since unix epoch in seconds.", "process"),
    _Family("process_cpu_seconds_total", "counter",
            "Total user and system CPU time spent in seconds.", "process"),
    _Family("process_open_fds", "gauge", "Number of open file descriptors.", "process"),
    _Family("process_max_fds", "gauge", "Maximum number of open file descriptors.", "process"),
)

_V032_FAMILIES: tuple[_Family, ...] = (
    _Family("vllm:estimated_flops_per_gpu_total", "counter",
            f"Estimated number of floating point operations per GPU {_MFU}"),
    _Family("vllm:estimated_read_bytes_per_gpu_total", "counter",
            f"Estimated number of bytes read from memory per GPU {_MFU}"),
    _Family("vllm:estimated_write_bytes_per_gpu_total", "counter",
            f"Estimated number of bytes written to memory per GPU {_MFU}"),
    _Family("vllm:num_requests_running", "gauge",
            "Number of requests in model execution batches."),
    _Family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    _Family("vllm:num_requests_waiting_by_reason", "gauge",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
            "budget, KV transfer, blocked status). Sum of all reasons equals "
            "vllm:num_requests_waiting.", extra=("reason", ())),
    _Family("vllm:engine_sleep_state", "gauge",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
            "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
            "sleep level 2.",
            extra=("sleep_state", ("awake", "weights_offloaded", "discard_all"))),
    _Family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    _Family("vllm:prefix_cache_queries_total", "counter",
            "Prefix cache queries, in terms of number of queried tokens."),
    _Family("vllm:prefix_cache_hits_total", "counter",
            "Prefix cache hits, in terms of number of cached tokens."),
    _Family("vllm:external_prefix_cache_queries_total", "counter",
            "External prefix cache queries from KV connector cross-instance cache sharing, "
            "in terms of number of queried tokens."),
    _Family("vllm:external_prefix_cache_hits_total", "counter",
            "External prefix cache hits from KV connector cross-instance cache sharing, in "
            "terms of number of cached tokens."),
    _Family("vllm:mm_cache_queries_total", "counter",
            "Multi-modal cache queries, in terms of number of queried items."),
    _Family("vllm:mm_cache_hits_total", "counter",
            "Multi-modal cache hits, in terms of number of cached items."),
    _Family("vllm:num_preemptions_total", "counter",
            "Cumulative number of preemption from the engine."),
    _Family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    _Family("vllm:prompt_tokens_by_source_total", "counter", "Number of prompt tokens by source.",
            extra=("source", ("local_compute", "local_cache_hit", "external_kv_transfer"))),
    _Family("vllm:prompt_tokens_cached_total", "counter",
            "Number of cached prompt tokens (local + external)."),
    _Family("vllm:prompt_tokens_cached_by_source_total", "counter",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local "
            "HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM "
            "instance) or external_unspecified. Counted at admission; sums to "
            "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
            extra=("source", ("device", "host", "p2p", "disk", "external_unspecified"))),
    _Family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
    _Family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
            extra=("finished_reason", ("stop", "length", "abort", "error", "repetition"))),
    _Family("vllm:admission_rejections_total", "counter",
            "Number of admission attempts rejected by a queue limit, by reason.", "model",
            extra=("reason", ("max_num_queued_reqs", "max_num_queued_tokens"))),
    _Family("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.",
            buckets=_TOKENS),
    _Family("vllm:request_generation_tokens", "histogram",
            "Number of generation tokens processed.", buckets=_TOKENS),
    _Family("vllm:iteration_tokens_total", "histogram",
            "Histogram of number of tokens per engine_step.", buckets=_ITERATION),
    _Family("vllm:request_max_num_generation_tokens", "histogram",
            "Histogram of maximum number of requested generation tokens.", buckets=_TOKENS),
    _Family("vllm:request_params_n", "histogram", "Histogram of the n request parameter.",
            buckets=_PARAMS_N),
    _Family("vllm:request_params_max_tokens", "histogram",
            "Histogram of the max_tokens request parameter.", buckets=_TOKENS),
    _Family("vllm:time_to_first_token_seconds", "histogram",
            "Histogram of time to first token in seconds.", buckets=_TTFT),
    _Family("vllm:inter_token_latency_seconds", "histogram",
            "Histogram of inter-token latency in seconds.", buckets=_ITL),
    _Family("vllm:request_time_per_output_token_seconds", "histogram",
            "Histogram of time_per_output_token_seconds per request.", buckets=_ITL),
    _Family("vllm:e2e_request_latency_seconds", "histogram",
            "Histogram of e2e request latency in seconds.", buckets=_LATENCY),
    _Family("vllm:request_queue_time_seconds", "histogram",
            "Histogram of time spent in WAITING phase for request.", buckets=_LATENCY),
    _Family("vllm:request_inference_time_seconds", "histogram",
            "Histogram of time spent in RUNNING phase for request.", buckets=_LATENCY),
    _Family("vllm:request_prefill_time_seconds", "histogram",
            "Histogram of time spent in PREFILL phase for request.", buckets=_LATENCY),
    _Family("vllm:request_decode_time_seconds", "histogram",
            "Histogram of time spent in DECODE phase for request.", buckets=_LATENCY),
    _Family("vllm:request_num_preemptions", "histogram",
            "Histogram of the number of times a request was preempted.",
            buckets=_PREEMPT_BUCKETS),
    _Family("vllm:request_prefill_kv_computed_tokens", "histogram",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            buckets=_TOKENS),
    _Family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig"),
)

_HTTP_FAMILIES: tuple[_Family, ...] = (
    _Family("http_requests_total", "counter",
            "Total number of requests by method, status and handler.", "process",
            const=(("handler", "/v1/completions"), ("method", "POST"), ("status", "2xx"))),
    _Family("http_request_size_bytes", "summary",
            f"Content length of incoming requests by handler. {_HTTP_NOTE}", "process",
            const=(("handler", "/v1/completions"),)),
    _Family("http_response_size_bytes", "summary",
            f"Content length of outgoing responses by handler. {_HTTP_NOTE}", "process",
            const=(("handler", "/v1/completions"),)),
    _Family("http_request_duration_highr_seconds", "histogram",
            "Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ", "process", buckets=_HTTP_HIGHR),
    _Family("http_request_duration_seconds", "histogram",
            "Latency with only few buckets by handler. Made to be only used if aggregation "
            "by handler is important. ", "process",
            const=(("handler", "/v1/completions"), ("method", "POST")),
            buckets=("0.1", "0.5", "1.0", "+Inf")),
)

# V0-engine names (vllm/engine/metrics.py, documented through the 0.x metrics pages):
# model_name is the only engine label and prometheus_client's _created series are off.
_V010_FAMILIES: tuple[_Family, ...] = (
    _Family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig"),
    _Family("vllm:num_requests_running", "gauge",
            "Number of requests currently running on GPU."),
    _Family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    _Family("vllm:num_requests_swapped", "gauge", "Number of requests swapped to CPU."),
    _Family("vllm:gpu_cache_usage_perc", "gauge",
            "GPU KV-cache usage. 1 means 100 percent usage."),
    _Family("vllm:cpu_cache_usage_perc", "gauge",
            "CPU KV-cache usage. 1 means 100 percent usage."),
    _Family("vllm:cpu_prefix_cache_hit_rate", "gauge", "CPU prefix cache block hit rate."),
    _Family("vllm:gpu_prefix_cache_hit_rate", "gauge", "GPU prefix cache block hit rate."),
    _Family("vllm:num_preemptions_total", "counter",
            "Cumulative number of preemption from the engine."),
    _Family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    _Family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
    _Family("vllm:iteration_tokens_total", "histogram",
            "Histogram of number of tokens per engine_step.", buckets=_ITERATION),
    _Family("vllm:time_to_first_token_seconds", "histogram",
            "Histogram of time to first token in seconds.", buckets=_TTFT),
    _Family("vllm:time_per_output_token_seconds", "histogram",
            "Histogram of time per output token in seconds.", buckets=_ITL),
    _Family("vllm:e2e_request_latency_seconds", "histogram",
            "Histogram of end to end request latency in seconds.", buckets=_LATENCY),
    _Family("vllm:request_queue_time_seconds", "histogram",
            "Histogram of time spent in WAITING phase for request.", buckets=_LATENCY),
    _Family("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.",
            buckets=_TOKENS),
    _Family("vllm:request_generation_tokens", "histogram",
            "Number of generation tokens processed.", buckets=_TOKENS),
    _Family("vllm:request_params_n", "histogram", "Histogram of the n request parameter.",
            buckets=_PARAMS_N),
    _Family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
            extra=("finished_reason", ("stop", "length", "abort"))),
)

_STATIC_VALUES: dict[str, float] = {
    "python_info": 1.0,
    "process_virtual_memory_bytes": 1.958776832e09,
    "process_resident_memory_bytes": 6.51710464e08,
    "process_open_fds": 35.0,
    "process_max_fds": 20000.0,
}


def _cache_config_labels(e: FakeEngine) -> dict[str, str]:
    """The cache_config_info label set of each style, sizes taken from the engine."""
    blocks, size = str(e.num_gpu_blocks), str(e.block_size)
    if e.style == "0.10":
        return {
            "block_size": size, "cache_dtype": "auto", "calculate_kv_scales": "False",
            "cpu_offload_gb": "0", "enable_prefix_caching": "False",
            "gpu_memory_utilization": "0.9", "is_attention_free": "False",
            "num_cpu_blocks": "2048", "num_gpu_blocks": blocks,
            "num_gpu_blocks_override": "None", "prefix_caching_hash_algo": "builtin",
            "sliding_window": "None", "swap_space": "4", "swap_space_bytes": "4294967296",
        }
    return {
        "_block_size_resolved": "True", "block_size": size, "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None", "effective_attention_block_size": size,
        "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": "True",
        "engine": str(e.engine), "gpu_memory_utilization": "0.92", "hash_block_size": "None",
        "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None", "kv_cache_max_concurrency": "2048.0",
        "kv_cache_memory_bytes": "1073741824",
        "kv_cache_size_tokens": str(e.num_gpu_blocks * e.block_size),
        "kv_offloading_backend": "native", "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
        "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None", "num_gpu_blocks": blocks, "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None", "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None", "sliding_window": "None",
        "swa_bounded_replay": "True", "use_kda_recoverssm": "False",
        "use_replayssm": "False", "user_specified_block_size": "False",
    }
# fmt: on


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    """Python's repr, with the exponent form prometheus_client (after Go) uses for big
    numbers: 1795940347.9 -> 1.7959403479e+09, as in the reference sample."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6 and "e" not in text:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0").rstrip(".")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _line(name: str, labels: Mapping[str, str], value: float) -> str:
    # vLLM's multiprocess collector writes labels sorted by name; so do we.
    if labels:
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        return f"{name}{{{inner}}} {_number(value)}"
    return f"{name} {_number(value)}"


def _gauge_value(name: str, e: FakeEngine | None, extra: str | None) -> float:
    if e is None:
        return _STATIC_VALUES.get(name, 0.0)
    if name == "vllm:num_requests_running":
        return e.running
    if name == "vllm:num_requests_waiting":
        return e.waiting
    if name == "vllm:num_requests_waiting_by_reason":
        return e.reasons().get(extra or "", 0.0)
    if name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        return e.kv_cache_usage
    if name == "vllm:num_preemptions_total":
        return e.preemptions_total
    if name == "vllm:engine_sleep_state":
        return 1.0 if extra == "awake" else 0.0
    return 0.0


def _label_sets(
    fam: _Family, engines: Sequence[FakeEngine]
) -> Iterator[tuple[FakeEngine | None, str | None, dict[str, str]]]:
    if fam.scope == "process":
        owners: list[tuple[FakeEngine | None, dict[str, str]]] = [(None, {})]
    elif fam.scope == "model":
        seen: dict[str, FakeEngine] = {}
        for e in engines:
            seen.setdefault(e.model_name, e)
        owners = [(e, {"model_name": m}) for m, e in seen.items()]
    else:
        owners = []
        for e in engines:
            labels = {"model_name": e.model_name}
            if e.style == "0.32":
                labels["engine"] = str(e.engine)
            owners.append((e, labels))
    for owner, labels in owners:
        labels.update(fam.const)
        if fam.extra is None:
            yield owner, None, labels
            continue
        key, values = fam.extra
        if fam.name == "vllm:num_requests_waiting_by_reason" and owner is not None:
            values = tuple(owner.reasons())
        for value in values:
            yield owner, value, {**labels, key: value}


def _render_family(
    fam: _Family, engines: Sequence[FakeEngine], created: float, with_created: bool
) -> list[str]:
    if fam.name == "vllm:cache_config_info":
        out = [f"# HELP {fam.name} {fam.help}", f"# TYPE {fam.name} gauge"]
        # Without model_name (and, before 0.10, engine) on this series, engines can
        # render the same line: write it once, as prometheus_client would.
        out += dict.fromkeys(_line(fam.name, _cache_config_labels(e), 1.0) for e in engines)
        return out
    out = [f"# HELP {fam.name} {fam.help}", f"# TYPE {fam.name} {fam.kind}"]
    sets = list(_label_sets(fam, engines))
    base = fam.name.removesuffix("_total") if fam.kind == "counter" else fam.name
    for owner, extra, labels in sets:
        if fam.kind in ("counter", "gauge"):
            if fam.name == "process_start_time_seconds":
                value = created - 67.0
            elif fam.name == "process_cpu_seconds_total":
                value = 11.7
            else:
                value = _gauge_value(fam.name, owner, extra)
            out.append(_line(fam.name, labels, value))
            continue
        for le in fam.buckets:
            out.append(_line(f"{fam.name}_bucket", {**labels, "le": le}, 0.0))
        out.append(_line(f"{fam.name}_count", labels, 0.0))
        out.append(_line(f"{fam.name}_sum", labels, 0.0))
    if with_created and fam.kind != "gauge":
        out.append(f"# HELP {base}_created {fam.help}")
        out.append(f"# TYPE {base}_created gauge")
        out += [_line(f"{base}_created", labels, created) for _, _, labels in sets]
    return out


def render_exposition(engines: Sequence[FakeEngine], *, created: float = DEFAULT_CREATED) -> str:
    """The `/metrics` text of one API server fronting `engines` (one style for all)."""
    styles = {e.style for e in engines}
    if len(styles) > 1:
        raise ValueError("all engines behind one endpoint must share a style")
    style = styles.pop() if styles else "0.32"
    if style not in STYLES:
        raise ValueError(f"style {style!r} is none of {', '.join(STYLES)}")
    lines: list[str] = []
    if style == "0.32":
        families = _PROCESS_FAMILIES + _V032_FAMILIES + _HTTP_FAMILIES
    else:
        families = _PROCESS_FAMILIES + _V010_FAMILIES
    for fam in families:
        if fam.scope != "process" and not engines:
            continue
        # 0.32 writes _created gauges for its own and the HTTP instrumentator's counters
        # and histograms (not for the python/process collectors); V0 disabled them.
        with_created = style == "0.32" and not fam.name.startswith(("python_", "process_"))
        lines += _render_family(fam, engines, created, with_created)
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------- server

_TEXT = "text/plain; version=0.0.4; charset=utf-8"
_GARBAGE = (
    b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway"
    b"</h1></center><hr><center>nginx</center></body></html>\n\x00\x01\x02\xff\xfe\n"
)
_PAD_LINE = b"# padding: a server that keeps writing must be cut off by the scraper's cap\n"


class _Server(ThreadingHTTPServer):
    # Non-daemon handler threads, joined by server_close(): stop() leaks no thread.
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: FakeVllmServer) -> None:
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # a client that connects and sends nothing is dropped
    server_version = "uvicorn"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.owner._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests run many servers; request logs are noise

    def do_GET(self) -> None:
        owner = self.server.owner
        fault, engines, path = owner._state()
        owner._count_request(self.headers.get("Authorization"))
        try:
            if owner.token is not None and fault != "hang" and not owner._authorized(self.headers):
                self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8")
                return
            asked = self.path.split("?", 1)[0]
            document, document_fault = owner._document(asked)
            if document is not None:
                self._answer(owner, document_fault, document, "application/json")
                return
            if asked != path:
                self._send(404, b"Not Found", "text/plain")
                return
            self._answer(owner, fault, lambda: owner.render(engines).encode(), _TEXT)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the scraper gave up (cap, deadline): expected

    def _answer(
        self, owner: FakeVllmServer, fault: Fault, render: Callable[[], bytes], ctype: str
    ) -> None:
        if fault == "hang":
            owner._stopping.wait()
            return
        if fault == "http_500":
            self._send(500, b"Internal Server Error", "text/plain")
            return
        if fault == "garbage":
            self._send(200, _GARBAGE, ctype)
            return
        if fault == "slow" and owner._stopping.wait(owner.slow_seconds):
            return
        body = render()
        if fault == "truncated":
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])  # cut mid-line, then close
            return
        if fault == "huge":
            self._stream_huge(owner, body)
            return
        if fault == "trickle":
            self._trickle(owner, body)
            return
        self._send(200, body, ctype, compress=True)

    def _gzip_wanted(self) -> bool:
        accepted = self.headers.get("Accept-Encoding", "")
        return self.server.owner.gzip_enabled and "gzip" in accepted

    def _send(self, status: int, body: bytes, ctype: str, *, compress: bool = False) -> None:
        encoding = "identity"
        if compress and self._gzip_wanted():
            body = gzip.compress(body)
            encoding = "gzip"
        self.server.owner._note_encoding(encoding)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if encoding != "identity":
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream_huge(self, owner: FakeVllmServer, body: bytes) -> None:
        # No Content-Length: the body ends when we close (HTTP/1.0), so only the
        # scraper's cap can stop it early. gzip'd when accepted, to test decoded caps.
        compressor = zlib.compressobj(wbits=31) if self._gzip_wanted() else None
        owner._note_encoding("gzip" if compressor else "identity")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if compressor:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        block = body + _PAD_LINE * (max(1, 256 * 1024 // len(_PAD_LINE)))
        sent = 0
        while sent < owner.huge_bytes and not owner._stopping.is_set():
            data = block if sent == 0 else block[len(body) :]
            sent += len(data)
            self.wfile.write(compressor.compress(data) if compressor else data)
        if compressor:
            self.wfile.write(compressor.flush())

    def _trickle(self, owner: FakeVllmServer, body: bytes) -> None:
        owner._note_encoding("identity")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        pieces = 20
        step = max(1, len(body) // pieces + 1)
        for start in range(0, len(body), step):
            self.wfile.write(body[start : start + step])
            self.wfile.flush()
            if owner._stopping.wait(owner.slow_seconds / pieces):
                return


class FakeVllmServer:
    """A vLLM `/metrics` endpoint on 127.0.0.1 whose engines and faults change live.

    Use as a context manager, or call start()/stop(). stop() joins every thread and
    closes every socket, including connections held by the ``hang`` fault.
    """

    def __init__(
        self,
        engines: Sequence[FakeEngine] = (FakeEngine(),),
        *,
        path: str = "/metrics",
        fault: Fault = "ok",
        gzip_enabled: bool = True,
        slow_seconds: float = 2.0,
        huge_bytes: int = 32 * 1024 * 1024,
        host: str = "127.0.0.1",
        render: Callable[[Sequence[FakeEngine]], str] = render_exposition,
        documents: Mapping[str, Callable[[], bytes]] | None = None,
        document_fault: Fault = "ok",
        token: str | None = None,
    ) -> None:
        """`render`: the exposition of the engines, of this fake's kind by default (the
        HTTP side and its faults are every kind's, and the endpoint picker's: fake_picker.py).
        `documents`: other paths it answers (JSON, such as SGLang's `/server_info`), under
        their own `document_fault`. `token`: answer 401 without `Authorization: Bearer
        <token>` (every request's header is kept in `authorizations`)."""
        self.token = token
        self.authorizations: list[str | None] = []
        self.render = render
        self.documents: Mapping[str, Callable[[], bytes]] = dict(documents or {})
        self.document_fault: Fault = document_fault
        render(engines)  # fail fast on mixed styles
        # Any 127.0.0.0/8 address works on Linux: the harness gives each pod its own.
        self.host = host
        self._engines: tuple[FakeEngine, ...] = tuple(engines)
        self._path = path
        self._fault: Fault = fault
        self.gzip_enabled = gzip_enabled
        self.slow_seconds = slow_seconds
        self.huge_bytes = huge_bytes
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self.requests_served = 0
        self.last_content_encoding: str | None = None

    # -- lifecycle
    def start(self) -> FakeVllmServer:
        self._stopping.clear()
        if self._fault != "refuse":
            self._listen()
        else:  # reserve a port number so `url` is stable before the first listen
            with socket.socket() as probe:
                probe.bind((self.host, 0))
                self._port = probe.getsockname()[1]
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._unlisten()

    def __enter__(self) -> FakeVllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}{self._path}"

    # -- live changes
    def set_engines(self, engines: Sequence[FakeEngine]) -> None:
        self.render(engines)
        with self._lock:
            self._engines = tuple(engines)

    def set_documents(self, documents: Mapping[str, Callable[[], bytes]], fault: Fault) -> None:
        """Replace the other paths it answers, and their fault."""
        with self._lock:
            self.documents, self.document_fault = dict(documents), fault

    def set_fault(self, fault: Fault, *, slow_seconds: float | None = None) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        if slow_seconds is not None:
            self.slow_seconds = slow_seconds
        with self._lock:
            previous, self._fault = self._fault, fault
        if fault == "refuse" and previous != "refuse":
            self._unlisten()
        elif previous == "refuse" and fault != "refuse" and not self._stopping.is_set():
            self._listen()

    # -- internals
    def _listen(self) -> None:
        if self._httpd is not None:
            return
        self._httpd = _Server((self.host, self._port), self)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-vllm-{self._port}",
            daemon=True,
        )
        self._thread.start()

    def _unlisten(self) -> None:
        httpd, thread = self._httpd, self._thread
        self._httpd, self._thread = None, None
        if httpd is None:
            return
        httpd.shutdown()  # stops accepting; returns once serve_forever has exited
        with self._lock:
            conns = list(self._conns)
        for conn in conns:  # wake handlers blocked on a silent client
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if not self._stopping.is_set():
            # Handlers in `hang` wait for _stopping: release them so close can join.
            self._stopping.set()
            httpd.server_close()
            self._stopping.clear()
        else:
            httpd.server_close()
        if thread is not None:
            thread.join()

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _state(self) -> tuple[Fault, tuple[FakeEngine, ...], str]:
        with self._lock:
            return self._fault, self._engines, self._path

    def _document(self, path: str) -> tuple[Callable[[], bytes] | None, Fault]:
        with self._lock:
            return self.documents.get(path), self.document_fault

    def _count_request(self, authorization: str | None) -> None:
        with self._lock:
            self.requests_served += 1
            self.authorizations.append(authorization)

    def _authorized(self, headers: Any) -> bool:
        scheme, _, value = (headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and value.strip() == self.token

    def _note_encoding(self, encoding: str) -> None:
        with self._lock:
            self.last_content_encoding = encoding
