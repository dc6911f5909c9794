"""vLLM: everything gpuledger knows that only vLLM does, as one EngineKind. Pure.

Facts come from vLLM's source and the captures in tests/fixtures and ../shared/reference
(0.10 and 0.32 expositions, process trees, a Ray-executor engine).
"""

from __future__ import annotations

import re

from gpuledger.engines.kinds import (
    ENGINE_CORE,
    WORKER,
    EngineKind,
    EngineProcess,
    ExpositionNames,
    MetricName,
    RayExecutor,
    RequestSpans,
    title_ranks,
)

NAME = "vllm"
TITLE_PREFIX = "VLLM::"
# setproctitle titles: the API server -> `VLLM::EngineCore[_DP<r>]` -> `VLLM::Worker…`.
_TITLE = re.compile(r"^VLLM::(EngineCore|Worker)((?:_[A-Z]+\d+)*)$")

METRICS = ExpositionNames(
    marker="vllm:",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    waiting_by_reason="vllm:num_requests_waiting_by_reason",  # 0.20+: capacity, deferred
    # A 0-1 ratio despite "perc" (HELP: 1 = 100%). Older engines (V0, before the rename
    # in 0.9/0.10) used gpu_cache_usage_perc and had no `engine` label; newer ones
    # expose both for a while.
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    preemptions=frozenset({"vllm:num_preemptions_total", "vllm:num_preemptions"}),
    # Grows a label every release: only these survive.
    cache_config="vllm:cache_config_info",
    cache_config_labels=("num_gpu_blocks", "block_size"),
)


# The version map: every name above, and those the docs cite, by release. vLLM's rule
# (docs/usage/metrics.md): deprecated in X.Y, hidden in X.Y+1 (back with
# --show-hidden-metrics-for-version=X.Y), removed in X.Y+2. `since` () is every release
# gpuledger reads; a dated one is the release the name came in.
VERSIONS: tuple[MetricName, ...] = (
    MetricName("vllm:num_requests_running"),
    MetricName("vllm:num_requests_waiting"),
    MetricName("vllm:num_requests_waiting_by_reason", since=(0, 20)),
    MetricName("vllm:kv_cache_usage_perc", since=(0, 10)),
    # Deprecated for kv_cache_usage_perc (vLLM #18354), shown in 0.10, removed in 0.12
    # (vLLM #29330).
    MetricName("vllm:gpu_cache_usage_perc", deprecated=(0, 10)),
    MetricName("vllm:num_preemptions_total"),
    MetricName("vllm:cache_config_info"),
    # Cited by docs/metrics.md beside the queue (the engine's own histograms).
    MetricName("vllm:request_queue_time_seconds"),
    MetricName("vllm:time_to_first_token_seconds"),
)


def parse_title(title: str, pid: int = 0) -> EngineProcess | None:
    """`VLLM::Worker_DP1_PP0_TP3` -> worker, dp 1, pp 0, tp 3; None for other titles."""
    match = _TITLE.match(title)
    if match is None:
        return None
    parts = title_ranks(match.group(2))
    role = ENGINE_CORE if match.group(1) == "EngineCore" else WORKER
    return EngineProcess(pid, role, parts.get("DP"), parts.get("PP"), parts.get("TP"), NAME)


# vllm/tracing.py's SpanAttributes: one SERVER span `llm_request` per finished request.
# 0.32 sends these but time_in_scheduler and response.model (older and newer releases).
SPANS = RequestSpans(
    span_name="llm_request",
    request_id="gen_ai.request.id",
    process_id="vllm.process_id",
    latencies={
        "gen_ai.latency.time_in_queue": "queue_seconds",
        "gen_ai.latency.time_to_first_token": "ttft_seconds",
        "gen_ai.latency.e2e": "e2e_seconds",
        "gen_ai.latency.time_in_model_prefill": "prefill_seconds",
        "gen_ai.latency.time_in_model_decode": "decode_seconds",
        "gen_ai.latency.time_in_model_inference": "inference_seconds",
        "gen_ai.latency.time_in_scheduler": "scheduler_seconds",
    },
    counts={
        "gen_ai.usage.prompt_tokens": "prompt_tokens",
        "gen_ai.usage.completion_tokens": "completion_tokens",
        "gen_ai.request.max_tokens": "max_tokens",
    },
    model="gen_ai.response.model",
)

VLLM = EngineKind(
    name=NAME,
    metrics=(METRICS,),
    title_prefix=TITLE_PREFIX,
    parse_title=parse_title,
    # Identity rule 6: the API server's configuration. Short aliases map to the long name.
    flags={
        "--tensor-parallel-size": "tensor_parallel_size",
        "-tp": "tensor_parallel_size",
        "--pipeline-parallel-size": "pipeline_parallel_size",
        "-pp": "pipeline_parallel_size",
        "--data-parallel-size": "data_parallel_size",
        "-dp": "data_parallel_size",
        "--max-num-seqs": "max_num_seqs",
        "--max-num-batched-tokens": "max_num_batched_tokens",
        "--gpu-memory-utilization": "gpu_memory_utilization",
        "--served-model-name": "served_model_name",
        # `ray`: the engine's workers are Ray actors on any node (ledger/rayengines.py).
        "--distributed-executor-backend": "distributed_executor_backend",
    },
    flag_defaults={
        "tensor_parallel_size": "1",
        "pipeline_parallel_size": "1",
        "data_parallel_size": "1",
    },
    env=frozenset({"VLLM_DP_RANK", "VLLM_DP_RANK_LOCAL", "VLLM_DP_SIZE"}),
    port_annotation="gpuledger.io/vllm-port",
    path_annotation="gpuledger.io/vllm-path",
    scheme_annotation="gpuledger.io/vllm-scheme",
    ray=RayExecutor(
        # `--distributed-executor-backend ray`: the EngineCore is the job's driver.
        driver_title=re.compile(r"^VLLM::EngineCore(?:_DP(\d+))?$"),
        driver="VLLM::EngineCore",
        # RayExecutorV2 (0.32's default) and the legacy RayDistributedExecutor.
        worker_classes=frozenset({"RayWorkerProc", "RayWorkerWrapper"}),
        # `vllm_Worker_<instance>_TP<t>[_PP<p>][_PCP<c>]` (RayExecutorV2; `_PP` only
        # when pipeline parallel); the legacy executor's actors are unnamed.
        worker_name=re.compile(r"^vllm_Worker_([^_]+)((?:_[A-Z]+\d+)*)$"),
        worker_prefix="vllm_Worker_",
    ),
    versions=VERSIONS,
    spans=SPANS,
)
