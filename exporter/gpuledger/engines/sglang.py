"""SGLang: everything gpuledger knows that only SGLang does, as one EngineKind. Pure.

Facts come from the SGLang 0.5.23 package (`sglang/srt/`, read, not copied) and the two
expositions its own metrics collectors rendered (tests/fixtures/sglang/README.md); no
other release was checked.

- `/metrics` is served on the API port only with `--enable-metrics`, by the HTTP server
  process, from a multiprocess registry its scheduler processes write.
- Scheduler series carry `model_name` (the served model name, else the model path),
  `engine_type` (unified, prefill, decode), `tp_rank`, `pp_rank`, `moe_ep_rank`; `dp_rank`
  only when a data-parallel controller started the scheduler (absent: rank 0), and
  `priority` only with `--enable-priority-scheduling`: then the total is under
  `priority=""` and each priority seen has its own series beside it, so only the total is
  read (`split_label`). Only the scheduler of attention TP rank 0 reports unless
  `--enable-metrics-for-all-schedulers`; the TP ranks then report one batch's state, and
  the last sample read stands.
- `sglang:num_running_reqs` / `sglang:num_queue_reqs` are the batch and the queue;
  `sglang:token_usage` (0-1, the fullest of its KV pools) is the KV usage;
  `sglang:num_retracted_requests_total` (decode requests pushed back to the queue when
  KV runs out) stands for preemptions. There is no info series of the cache config and
  no series of the batch-slot bound: that is `--max-running-requests` when given (the
  generic `max_num_seqs`); the scheduler may lower it to fit its KV pool, and without the
  flag derives it, which only its server info says (below); never guessed.
- The `sglang_` spelling: SGLang 0.5.23 itself only writes `sglang:`, and nothing in the
  package rewrites it; the issue reports a router that does, and other consumers accept
  both, so the same names under `sglang_` are read too, unverified against a capture.

Processes: the HTTP server keeps its command line (`python -m sglang.launch_server …`,
`sglang serve …`) and is the API server; the schedulers, spawned by it (or by the data
parallel controller), hold the GPUs and are titled `sglang::scheduler` plus, in order,
`_DP<d>` (data parallel), `_PP<p>`, `_ATTN_CP<c>`, `_MOE_DP<m>`, `_TP<t>` (tensor
parallel > 1), `_EP<e>`. `sglang::detokenizer`, `sglang::data_parallel_controller`,
`sglang::detokenizer_router` and `sglang::tokenizer_worker:<pid>` are its too, hold no
GPU and are no engine process here.

Server info: `GET /server_info` (`/get_server_info` is its deprecated alias, 0.5.23
`entrypoints/http_server.py`) answers the resolved `ServerArgs` (`tp_size`, `dp_size`,
`pp_size`, `max_running_requests`, `mem_fraction_static`, `served_model_name`, ...)
and `internal_states`, one object per DP rank, whose
`effective_max_running_requests_per_dp` is the bound the scheduler really uses after
fitting it to its KV pool (`scheduler_components/internal_state.py`). The same body
holds `api_key`, `admin_api_key`, the whole `launch_command` and the schedulers'
environment, so only the keys named here are read. With `--api-key` the endpoint asks
for it (only `/health*`, `/ready*` and `/metrics*` are open, `utils/auth.py`); gpuledger
holds no key, and the flags stand.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from gpuledger.engines.kinds import (
    DATA_PARALLEL_SIZE,
    PIPELINE_PARALLEL_SIZE,
    TENSOR_PARALLEL_SIZE,
    WORKER,
    EngineKind,
    EngineProcess,
    ExpositionNames,
    MetricName,
)
from gpuledger.model.base import frozen_map
from gpuledger.model.serverinfo import ServerInfo

NAME = "sglang"
TITLE_PREFIX = "sglang::"
_PARTS = ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP")
_PART = re.compile(r"_(" + "|".join(_PARTS) + r")(\d+)")
_SCHEDULER = re.compile(r"^sglang::scheduler((?:_(?:" + "|".join(_PARTS) + r")\d+)*)$")


def _names(prefix: str) -> ExpositionNames:
    return ExpositionNames(
        marker=prefix,
        running=f"{prefix}num_running_reqs",
        waiting=f"{prefix}num_queue_reqs",
        waiting_by_reason="",
        # token_usage: the fullest pool (full attention, SWA, mamba); full_token_usage
        # where only that one is exposed.
        kv_usage=(f"{prefix}token_usage", f"{prefix}full_token_usage"),
        preemptions=frozenset(
            {f"{prefix}num_retracted_requests_total", f"{prefix}num_retracted_requests"}
        ),
        cache_config="",
        cache_config_labels=(),
        rank_label="dp_rank",
        split_label="priority",
    )


METRICS = _names("sglang:")
# The spelling the issue reports a router rewrites to (see the module docstring).
METRICS_UNDERSCORE = _names("sglang_")

# The version map (native spelling). Only 0.5.23 was read: `since` () means "in 0.5.23,
# earlier releases not checked". SGLang documents no deprecation rule; none is mapped.
VERSIONS: tuple[MetricName, ...] = (
    MetricName("sglang:num_running_reqs"),
    MetricName("sglang:num_queue_reqs"),
    MetricName("sglang:token_usage"),
    MetricName("sglang:full_token_usage"),
    # A labelled counter: no sample before the first retraction.
    MetricName("sglang:num_retracted_requests_total", after_event=True),
    MetricName("sglang:max_total_num_tokens"),
    # Cited by docs/metrics.md beside the queue (the engine's own histograms).
    MetricName("sglang:queue_time_seconds"),
    MetricName("sglang:time_to_first_token_seconds"),
)


def title_parts(suffix: str) -> dict[str, int]:
    """`_DP1_MOE_DP0_TP3` -> {DP: 1, MOE_DP: 0, TP: 3} (MOE_DP is not the DP rank)."""
    return {k: int(v) for k, v in _PART.findall(suffix)}


def parse_title(title: str, pid: int = 0) -> EngineProcess | None:
    """`sglang::scheduler_DP1_TP3` -> worker, dp 1, tp 3; None for other titles (the
    detokenizer, the DP controller: SGLang's, but holding no GPU)."""
    match = _SCHEDULER.match(title)
    if match is None:
        return None
    parts = title_parts(match.group(1))
    return EngineProcess(pid, WORKER, parts.get("DP"), parts.get("PP"), parts.get("TP"), NAME)


# /server_info's resolved fields read, -> the generic configuration key.
_SERVER_INFO_KEYS: Mapping[str, str] = {
    "tp_size": TENSOR_PARALLEL_SIZE,
    "dp_size": DATA_PARALLEL_SIZE,
    "pp_size": PIPELINE_PARALLEL_SIZE,
    "max_running_requests": "max_num_seqs",
    "mem_fraction_static": "mem_fraction_static",
    "served_model_name": "served_model_name",
}
_EFFECTIVE_MAX = "effective_max_running_requests_per_dp"


def _scalar(value: object) -> str | None:
    """A JSON number or short string as a configuration value; None for anything else
    (null, a bool, a list), which is then unknown rather than a guess."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return format(value, "g") if isinstance(value, float) else str(value)
    if isinstance(value, str) and 0 < len(value) <= 256:
        return value
    return None


def _effective_max(states: object) -> str | None:
    """The schedulers' bound when every DP rank reports the same one (the list's order
    is not documented as the rank order, so differing values are not assigned)."""
    if not isinstance(states, list):
        return None
    values = {_scalar(state.get(_EFFECTIVE_MAX)) for state in states if isinstance(state, dict)}
    values.discard(None)
    return values.pop() if len(values) == 1 else None


def parse_server_info(body: bytes) -> ServerInfo:
    """The whitelisted fields of a `/server_info` body. Raises ValueError, naming no
    part of the body, when it is not a JSON object."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("server info is not JSON") from None
    if not isinstance(document, dict):
        raise ValueError("server info is not a JSON object")
    config = {
        key: value
        for field, key in _SERVER_INFO_KEYS.items()
        if (value := _scalar(document.get(field))) is not None
    }
    return ServerInfo(frozen_map(config), _effective_max(document.get("internal_states")))


SGLANG = EngineKind(
    name=NAME,
    metrics=(METRICS, METRICS_UNDERSCORE),
    title_prefix=TITLE_PREFIX,
    parse_title=parse_title,
    # The HTTP server's flags (argparse long names and aliases, 0.5.23).
    flags={
        "--tp-size": TENSOR_PARALLEL_SIZE,
        "--tensor-parallel-size": TENSOR_PARALLEL_SIZE,
        "--dp-size": DATA_PARALLEL_SIZE,
        "--data-parallel-size": DATA_PARALLEL_SIZE,
        "--pp-size": PIPELINE_PARALLEL_SIZE,
        "--pipeline-parallel-size": PIPELINE_PARALLEL_SIZE,
        # The batch-slot bound, under the generic key the stage rules read.
        "--max-running-requests": "max_num_seqs",
        "--mem-fraction-static": "mem_fraction_static",
        "--served-model-name": "served_model_name",
        "--port": "port",
    },
    # Absent flags: argparse's defaults. --max-running-requests and
    # --mem-fraction-static have none (the server derives them); --served-model-name
    # defaults to the model path, which the metrics' model_name already shows.
    flag_defaults={
        TENSOR_PARALLEL_SIZE: "1",
        PIPELINE_PARALLEL_SIZE: "1",
        DATA_PARALLEL_SIZE: "1",
        "port": "30000",
    },
    env=frozenset(),
    port_annotation="gpuledger.io/sglang-port",
    path_annotation="gpuledger.io/sglang-path",
    scheme_annotation="gpuledger.io/sglang-scheme",
    versions=VERSIONS,
    server_info_paths=("/server_info", "/get_server_info"),
    parse_server_info=parse_server_info,
)
