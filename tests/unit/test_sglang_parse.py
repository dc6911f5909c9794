"""SGLang as an engine kind: its expositions (rendered by SGLang 0.5.23's own collectors),
its titles, flags and discovery (tests/fixtures/sglang/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuledger.engines import BY_NAME, KINDS, flag_whitelist, is_engine_title, parse_engine_title
from gpuledger.engines.kinds import EngineProcess
from gpuledger.engines.sglang import METRICS, SGLANG, parse_server_info
from gpuledger.ledger.engines import group_engine_processes
from gpuledger.model.procfs import ProcessInfo
from gpuledger.sources.engines.discovery import discover_targets
from gpuledger.sources.engines.exposition import ExpositionError, looks_like, parse_exposition
from gpuledger.sources.procfs.source import parse_flags
from tests.unit.ledger_inputs import pod

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"
QWEN = "Qwen/Qwen2.5-7B-Instruct"


def fixture(name: str) -> str:
    return (FIXTURES / f"sglang-0.5.23{name}.txt").read_text()


def test_the_default_server_exposition() -> None:
    (engine,) = parse_exposition(fixture(""), SGLANG)
    assert (engine.model_name, engine.engine) == (QWEN, "0")  # no dp_rank label: rank 0
    assert engine.requests_running == 4.0
    assert engine.requests_waiting == 40.0
    assert engine.kv_cache_usage_ratio == 0.93
    assert dict(engine.waiting_by_reason) == {}
    # No retraction yet: the labelled counter has no sample, and is not guessed as 0.
    assert engine.preemptions_total is None
    assert dict(engine.cache_config) == {}


def test_priorities_are_parts_of_the_total_and_never_added_to_it() -> None:
    (engine,) = parse_exposition(fixture("-priority-dp1"), SGLANG)
    assert (engine.model_name, engine.engine) == (QWEN, "1")  # dp_rank="1"
    # priority="" is the total (4 running = 3 + 1, 40 queued = 30 + 10).
    assert (engine.requests_running, engine.requests_waiting) == (4.0, 40.0)
    assert engine.kv_cache_usage_ratio == 0.93


def test_the_total_wins_in_whatever_order_the_parts_come() -> None:
    text = (
        "# TYPE sglang:num_queue_reqs gauge\n"
        'sglang:num_queue_reqs{model_name="m",priority=""} 7\n'
        'sglang:num_queue_reqs{model_name="m",priority="None"} 2\n'
        'sglang:num_queue_reqs{model_name="m",priority="5"} 5\n'
    )
    (engine,) = parse_exposition(text, SGLANG)
    assert engine.requests_waiting == 7.0


def test_a_target_serving_only_parts_has_no_engine() -> None:
    text = 'sglang:num_queue_reqs{model_name="m",priority="5"} 5\n'
    assert parse_exposition(text, SGLANG) == ()


def test_data_parallel_ranks_are_engines() -> None:
    lines = [
        f'sglang:num_running_reqs{{model_name="m",dp_rank="{r}",tp_rank="0"}} {r + 1}\n'
        for r in (0, 1)
    ]
    got = parse_exposition("".join(lines), SGLANG)
    assert [(e.engine, e.requests_running) for e in got] == [("0", 1.0), ("1", 2.0)]


def test_the_underscore_spelling_reads_alike() -> None:
    text = fixture("-priority-dp1").replace("sglang:", "sglang_")
    assert looks_like(text, SGLANG.markers) and not looks_like(text, (METRICS.marker,))
    (engine,) = parse_exposition(text, SGLANG)
    assert (engine.engine, engine.requests_running, engine.requests_waiting) == ("1", 4.0, 40.0)
    assert engine.kv_cache_usage_ratio == 0.93


def test_retractions_stand_for_preemptions() -> None:
    text = (
        "# TYPE sglang:num_retracted_requests counter\n"
        'sglang:num_retracted_requests_total{model_name="m",tp_rank="0"} 3.0\n'
    )
    (engine,) = parse_exposition(text, SGLANG)
    assert engine.preemptions_total == 3.0


def test_an_sglang_body_is_not_vllm_and_garbage_is_refused() -> None:
    body = fixture("")
    assert [k.name for k in KINDS if looks_like(body, k.markers)] == ["sglang"]
    with pytest.raises(ExpositionError):
        parse_exposition("<html>502</html>\n\x00\x01\n", SGLANG)


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        ("sglang::scheduler", EngineProcess(7, "worker", None, None, None, "sglang")),
        ("sglang::scheduler_TP1", EngineProcess(7, "worker", None, None, 1, "sglang")),
        ("sglang::scheduler_DP1_TP0", EngineProcess(7, "worker", 1, None, 0, "sglang")),
        ("sglang::scheduler_PP1_TP3", EngineProcess(7, "worker", None, 1, 3, "sglang")),
        # MOE_DP is not the data-parallel rank, ATTN_CP not the pipeline rank.
        (
            "sglang::scheduler_DP2_ATTN_CP1_MOE_DP0_TP3_EP3",
            EngineProcess(7, "worker", 2, None, 3, "sglang"),
        ),
        ("sglang::detokenizer", None),
        ("sglang::data_parallel_controller", None),
        ("sglang::tokenizer_worker:123", None),
        ("sglang::scheduler_XX1", None),
    ],
)
def test_titles(title: str, expected: EngineProcess | None) -> None:
    assert parse_engine_title(title, 7) == expected
    assert is_engine_title(title)


def test_the_http_server_keeps_its_command_line_and_is_the_api_server() -> None:
    assert not is_engine_title("python3")  # `python -m sglang.launch_server …`


def _proc(pid: int, ppid: int, title: str, flags: dict[str, str] | None = None) -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=ppid, nspid=(pid,), title=title, flags=flags or {})


def test_a_tp2_engine_groups_under_its_http_server_with_its_flags() -> None:
    cmdline = (
        b"python3\0-m\0sglang.launch_server\0--model-path\0/m/qwen\0--tp-size\x002"
        b"\0--max-running-requests=4\0--api-key\0s3cret"
    )
    flags = parse_flags(cmdline)
    procs = {
        10: _proc(10, 1, "python3", flags),
        11: _proc(11, 10, "sglang::scheduler_TP0"),
        12: _proc(12, 10, "sglang::scheduler_TP1"),
        13: _proc(13, 10, "sglang::detokenizer"),
    }
    (group,) = group_engine_processes(procs).values()
    server = group.servers[10]
    assert dict(server.flags) == {
        "tensor_parallel_size": "2",
        "pipeline_parallel_size": "1",
        "data_parallel_size": "1",
        "max_num_seqs": "4",
        "port": "30000",
    }
    assert "/m/qwen" not in str(server)  # the model path is never kept
    assert [p.pid for p in server.by_rank[0]] == [11, 12]


def test_a_kind_keeps_only_its_own_flags() -> None:
    # --port is SGLang's: a vLLM server's port is not its configuration.
    flags = parse_flags(b"vllm\0serve\0m\0--port\x008000\0--max-num-seqs\x004")
    procs = {10: _proc(10, 1, "vllm", flags), 11: _proc(11, 10, "VLLM::EngineCore")}
    (group,) = group_engine_processes(procs).values()
    assert "port" not in group.servers[10].flags
    assert group.servers[10].flags["max_num_seqs"] == "4"


def test_no_two_kinds_read_one_flag_differently() -> None:
    whitelist = flag_whitelist()
    for kind in KINDS:
        assert all(whitelist[f] == key for f, key in kind.flags.items())


def test_discovery_by_the_sglang_annotation() -> None:
    (target,) = discover_targets(
        [pod(1, ip="10.0.0.1", annotations={SGLANG.port_annotation: "30000"})], ()
    )
    assert (target.kind, target.url) == ("sglang", "http://10.0.0.1:30000/metrics")
    assert BY_NAME["sglang"] is SGLANG


SERVER_INFO = FIXTURES / "sglang-0.5.23-server_info.constructed.json"


def test_server_info_gives_the_resolved_configuration_and_the_effective_bound() -> None:
    info = parse_server_info(SERVER_INFO.read_bytes())
    assert dict(info.config) == {
        "tensor_parallel_size": "2",
        "data_parallel_size": "1",
        "pipeline_parallel_size": "1",
        "max_num_seqs": "4",
        "mem_fraction_static": "0.88",
        "served_model_name": QWEN,
    }
    assert info.effective_max_num_seqs == "4"


def test_server_info_keeps_no_key_it_does_not_name() -> None:
    document = json.loads(SERVER_INFO.read_bytes())
    canary = "sk-canary-9f1d"
    document.update(api_key=canary, admin_api_key=canary, launch_command=f"--api-key {canary}")
    document["internal_states"][0]["env_vars"] = {"HF_TOKEN": canary}
    assert canary not in repr(parse_server_info(json.dumps(document).encode()))


def test_ranks_that_disagree_on_their_bound_leave_it_unknown() -> None:
    document = json.loads(SERVER_INFO.read_bytes())
    state = document["internal_states"][0]
    document["internal_states"] = [
        {**state, "effective_max_running_requests_per_dp": 4},
        {**state, "effective_max_running_requests_per_dp": 6},
    ]
    document["max_running_requests"] = None
    info = parse_server_info(json.dumps(document).encode())
    assert info.effective_max_num_seqs is None and "max_num_seqs" not in info.config


@pytest.mark.parametrize(
    "body",
    [b"<html>sk-secret</html>", b"[1, 2]", b"[" * 100_000, b'{"tp_size": '],
)
def test_a_body_that_is_no_server_info_is_refused_without_quoting_it(body: bytes) -> None:
    with pytest.raises(ValueError) as raised:
        parse_server_info(body)
    assert "sk-secret" not in str(raised.value) and "tp_size" not in str(raised.value)


def test_odd_values_are_unknown_not_guessed() -> None:
    odd = {"tp_size": True, "dp_size": [2], "pp_size": None, "max_running_requests": "x" * 300}
    assert dict(parse_server_info(json.dumps(odd).encode()).config) == {}
