"""vLLM layer through the harness: engines' /metrics joined to pods, processes and GPUs."""

from __future__ import annotations

from typing import Any

from tests.conftest import pick, samples, value

G0 = "GPU-20000000-0000-4000-8000-000000000000"
G1 = "GPU-20000000-0000-4000-8000-000000000001"
G2 = "GPU-20000000-0000-4000-8000-000000000002"
UID = "aaaaaaaa-1111-4222-8333-444444444444"
UID_SOLO = "bbbbbbbb-1111-4222-8333-444444444444"
CID, CID_SOLO = "a" * 64, "b" * 64
MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def cg(uid: str, cid: str) -> str:
    return (
        f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    )


def scenario() -> dict[str, Any]:
    return {
        "node": "n1",
        "gpus": [{"uuid": G0}, {"uuid": G1}, {"uuid": G2}],
        "processes": [
            # TP=2 engine: API server -> EngineCore -> two workers.
            {
                "pid": 100,
                "ppid": 90,
                "cgroup": cg(UID, CID),
                "cmdline": [
                    "python3",
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    "/models/llama",
                    "--tensor-parallel-size",
                    "2",
                    "--max-num-seqs",
                    "64",
                    "--api-key",
                    "sk-never-export-me",
                ],
                "environ": {"HF_TOKEN": "hf_never_export_me"},
            },
            {
                "pid": 101,
                "ppid": 100,
                "cgroup": cg(UID, CID),
                "cmdline": "VLLM::EngineCore",
                "gpu_memory": {G0: "512MiB"},
            },
            {
                "pid": 102,
                "ppid": 101,
                "cgroup": cg(UID, CID),
                "cmdline": "VLLM::Worker_TP0",
                "gpu_memory": {G0: "70GiB"},
            },
            {
                "pid": 103,
                "ppid": 101,
                "cgroup": cg(UID, CID),
                "cmdline": "VLLM::Worker_TP1",
                "gpu_memory": {G1: "70GiB"},
            },
            # One-GPU engine: the model runs inside EngineCore, no Worker process.
            {
                "pid": 200,
                "ppid": 190,
                "cgroup": cg(UID_SOLO, CID_SOLO),
                "cmdline": ["vllm", "serve", "/models/qwen", "--max-num-seqs", "256"],
            },
            {
                "pid": 201,
                "ppid": 200,
                "cgroup": cg(UID_SOLO, CID_SOLO),
                "cmdline": "VLLM::EngineCore",
                "gpu_memory": {G2: "20GiB"},
            },
        ],
        "kubernetes": {
            "pods": [
                {
                    "namespace": "llm",
                    "name": "llama-0",
                    "uid": UID,
                    "owner": {"kind": "StatefulSet", "name": "llama"},
                    "containers": [{"name": "vllm", "id": CID, "gpus": 2}],
                },
                {
                    "namespace": "llm",
                    "name": "qwen-0",
                    "uid": UID_SOLO,
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "0"},
                    "owner": {"kind": "StatefulSet", "name": "qwen"},
                    "containers": [{"name": "vllm", "id": CID_SOLO, "gpus": 1}],
                },
            ]
        },
        "vllm": [
            {
                "pod": "llm/llama-0",
                "engines": [
                    {
                        "model_name": MODEL,
                        "running": 64,
                        "waiting": 37,
                        "waiting_by_reason": {"capacity": 30, "deferred": 7},
                        "kv_cache_usage": 0.42,
                        "preemptions_total": 3,
                        "num_gpu_blocks": 9000,
                        "block_size": 16,
                    }
                ],
            },
            {
                "pod": "llm/qwen-0",
                "engines": [
                    {
                        "model_name": "Qwen/Qwen2.5-7B-Instruct",
                        "running": 3,
                        "waiting": 0,
                        "kv_cache_usage": 0.05,
                    }
                ],
            },
        ],
        "phases": [{"name": "llama-hangs", "vllm": {"llm/llama-0": {"fault": "hang"}}}],
    }


def test_engine_queues_and_cache(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    labels = {"pod_uid": UID, "model_name": MODEL, "engine": "0"}
    assert value(s, "gpuledger_engine_up", **labels) == 1
    assert value(s, "gpuledger_engine_requests", state="waiting", **labels) == 37
    assert value(s, "gpuledger_engine_requests", state="running", **labels) == 64
    assert (
        value(s, "gpuledger_engine_requests_waiting_by_reason", reason="capacity", **labels) == 30
    )
    assert value(s, "gpuledger_engine_kv_cache_usage_ratio", **labels) == 0.42
    assert value(s, "gpuledger_engine_preemptions_total", **labels) == 3
    row = pick(s, "gpuledger_engine_up", **labels)[0][1]
    assert (row["namespace"], row["pod"], row["workload"]) == ("llm", "llama-0", "llama")


def test_engine_config_from_whitelisted_flags_and_cache_config(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    config = pick(s, "gpuledger_engine_config_info", pod_uid=UID)[0][1]
    assert config["tensor_parallel_size"] == "2"
    assert config["pipeline_parallel_size"] == "1"  # vLLM's default when the flag is absent
    assert config["max_num_seqs"] == "64"
    assert (config["num_gpu_blocks"], config["block_size"]) == ("9000", "16")


def test_engine_processes_map_to_gpus_with_roles(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    rows = pick(s, "gpuledger_engine_gpu_info", pod_uid=UID)
    assert {(r[1]["role"], r[1]["rank"], r[1]["gpu_uuid"]) for r in rows} == {
        ("engine_core", "0", G0),
        ("worker", "0", G0),
        ("worker", "1", G1),
    }
    solo = pick(s, "gpuledger_engine_gpu_info", pod_uid=UID_SOLO)
    assert {(r[1]["role"], r[1]["gpu_uuid"]) for r in solo} == {("engine_core", G2)}


def test_prometheus_annotation_discovery(simulate: Any) -> None:
    s = simulate(scenario()).settle()
    assert value(s, "gpuledger_engine_up", pod="qwen-0") == 1
    assert value(s, "gpuledger_engine_requests", pod="qwen-0", state="running") == 3


def test_hung_engine_is_down_alone_and_keeps_its_labels(simulate: Any) -> None:
    run = simulate(scenario())
    run.settle()
    s = run.scrape(phase="llama-hangs")
    assert value(s, "gpuledger_engine_up", pod_uid=UID, model_name=MODEL, engine="0") == 0
    assert not pick(s, "gpuledger_engine_requests", pod_uid=UID)
    assert value(s, "gpuledger_engine_up", pod="qwen-0") == 1
    assert value(s, "gpuledger_source_up", source="vllm") == 1


def test_secrets_never_reach_the_exposition_or_ledger(simulate: Any) -> None:
    run = simulate(scenario())
    run.settle()
    body, _ = run.exporter.render(None)
    published, _ = run.exporter.current()
    for channel in (body.decode(), repr(published)):
        assert "sk-never-export-me" not in channel
        assert "hf_never_export_me" not in channel
        assert "/models/llama" not in channel
    assert samples(body.decode())


def _engine_pod(
    name: str, uid: str, cid: str, pid: int, flags: list[str], workers: list[tuple[str, str]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A pod running one vLLM server: API server, EngineCore, and workers (title, gpu)."""
    procs = [
        {"pid": pid, "ppid": 1, "cgroup": cg(uid, cid), "cmdline": ["vllm", "serve", *flags]},
        {"pid": pid + 1, "ppid": pid, "cgroup": cg(uid, cid), "cmdline": "VLLM::EngineCore"},
    ]
    for i, (title, gpu) in enumerate(workers):
        procs.append(
            {
                "pid": pid + 2 + i,
                "ppid": pid + 1,
                "cgroup": cg(uid, cid),
                "cmdline": title,
                "gpu_memory": {gpu: "40GiB"},
            }
        )
    pod = {
        "namespace": "serve",
        "name": name,
        "uid": uid,
        "owner": {"kind": "ReplicaSet", "name": "chat-6b8f9c7d5"},
        "labels": {"pod-template-hash": "6b8f9c7d5"},
        "containers": [{"name": "vllm", "id": cid, "gpus": 4}],
    }
    return pod, procs


def user_cases() -> dict[str, Any]:
    gpus = [f"GPU-30000000-0000-4000-8000-00000000000{i}" for i in range(6)]
    uids = [f"{c * 8}-2222-4333-8444-{c * 12}" for c in "cdef"]
    cids = [c * 64 for c in "cdef"]
    # chat-a: TP=4 configured, only two workers hold GPUs. chat-b: idle sibling replica.
    pod_a, procs_a = _engine_pod(
        "chat-a",
        uids[0],
        cids[0],
        1000,
        ["--tensor-parallel-size", "4", "--max-num-seqs", "32"],
        [("VLLM::Worker_TP0", gpus[0]), ("VLLM::Worker_TP1", gpus[1])],
    )
    pod_b, procs_b = _engine_pod(
        "chat-b", uids[1], cids[1], 2000, ["--max-num-seqs", "32"], [("VLLM::Worker_TP0", gpus[2])]
    )
    # Still loading: Running, not Ready, endpoint refuses.
    pod_c, procs_c = _engine_pod("chat-c", uids[2], cids[2], 3000, [], [])
    pod_c["ready"] = False
    queue = {
        "model_name": "chat",
        "running": 32,
        "waiting": 50,
        "waiting_by_reason": {"capacity": 50},
        "kv_cache_usage": 0.12,
    }
    return {
        "node": "n1",
        "gpus": [{"uuid": g} for g in gpus],
        "processes": procs_a + procs_b + procs_c,
        "kubernetes": {"pods": [pod_a, pod_b, pod_c]},
        "vllm": [
            {"pod": "serve/chat-a", "engines": [queue]},
            {
                "pod": "serve/chat-b",
                "engines": [
                    {"model_name": "chat", "running": 0, "waiting": 0, "kv_cache_usage": 0.0}
                ],
            },
            {"pod": "serve/chat-c", "fault": "refuse"},
        ],
        "phases": [
            {
                "name": "kv-full",
                "vllm": {
                    "serve/chat-a": {
                        "engines": [{**queue, "kv_cache_usage": 0.99, "preemptions_total": 40}]
                    }
                },
            },
            {
                "name": "deferred-only",
                "vllm": {
                    "serve/chat-a": {
                        "engines": [
                            {
                                **queue,
                                "running": 3,
                                "waiting": 9,
                                "waiting_by_reason": {"deferred": 9},
                            }
                        ]
                    }
                },
            },
        ],
    }


def test_tp4_configured_but_two_gpus_in_use(simulate: Any) -> None:
    s = simulate(user_cases()).settle()
    assert value(s, "gpuledger_engine_gpus", pod="chat-a", state="configured") == 4
    assert value(s, "gpuledger_engine_gpus", pod="chat-a", state="in_use") == 2
    assert value(s, "gpuledger_engine_gpus", pod="chat-b", state="configured") == 1
    assert value(s, "gpuledger_engine_gpus", pod="chat-b", state="in_use") == 1


def test_running_at_max_num_seqs_with_kv_headroom(simulate: Any) -> None:
    s = simulate(user_cases()).settle()
    labels = {"pod": "chat-a"}
    assert value(s, "gpuledger_engine_max_num_seqs", **labels) == 32
    assert value(s, "gpuledger_engine_requests", state="running", **labels) == 32
    assert value(s, "gpuledger_engine_kv_cache_usage_ratio", **labels) == 0.12


def test_two_replicas_of_one_workload_one_queueing(simulate: Any) -> None:
    s = simulate(user_cases()).settle()
    waiting = {
        r[1]["pod"]: r[2]
        for r in pick(s, "gpuledger_engine_requests", state="waiting", workload="chat")
    }
    assert waiting == {"chat-a": 50, "chat-b": 0}


def test_model_still_loading(simulate: Any) -> None:
    s = simulate(user_cases()).settle()
    assert value(s, "gpuledger_engine_up", pod="chat-c") == 0
    assert pick(s, "gpuledger_engine_up", pod="chat-c")[0][1]["model_name"] == ""
    assert value(s, "gpuledger_pod_starting", pod="chat-c") == 1
    assert value(s, "gpuledger_pod_starting", pod="chat-a") == 0


def test_kv_full_with_preemptions_then_deferred_only(simulate: Any) -> None:
    run = simulate(user_cases())
    before = run.settle()
    assert value(before, "gpuledger_engine_preemptions_total", pod="chat-a") == 0
    full = run.scrape(phase="kv-full")
    assert value(full, "gpuledger_engine_kv_cache_usage_ratio", pod="chat-a") == 0.99
    assert value(full, "gpuledger_engine_preemptions_total", pod="chat-a") == 40
    deferred = run.scrape(phase="deferred-only")
    by_reason = {
        r[1]["reason"]: r[2]
        for r in pick(deferred, "gpuledger_engine_requests_waiting_by_reason", pod="chat-a")
    }
    assert by_reason == {"deferred": 9}


def test_retitled_engine_processes_inherit_the_api_servers_devices(simulate: Any) -> None:
    """setproctitle overwrites a VLLM:: process's /proc environ: its CUDA_VISIBLE_DEVICES
    comes from the API server it inherited it from (seen on a real vLLM 0.32)."""
    gpus = [f"GPU-80000000-0000-4000-8000-00000000000{i}" for i in range(3)]
    doc = {
        "gpus": [{"uuid": g} for g in gpus],
        "processes": [
            {
                "pid": 10,
                "ppid": 1,
                "cmdline": ["vllm", "serve", "/m"],
                "environ": {"CUDA_VISIBLE_DEVICES": "2"},
            },
            # What a real EngineCore/Worker environ shows: vLLM's own variables only.
            {
                "pid": 11,
                "ppid": 10,
                "cmdline": "VLLM::EngineCore",
                "environ": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
            },
            {
                "pid": 12,
                "ppid": 11,
                "cmdline": "VLLM::Worker_TP0",
                "environ": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"},
                "gpu_memory": {gpus[2]: "10GiB"},
            },
        ],
    }
    run = simulate(doc)
    run.scrape()
    published, _ = run.exporter.current()
    views = {p.pid: p for p in published.ledger.processes}
    assert views[12].cuda_devices == (gpus[2],)
    assert views[11].cuda_devices == (gpus[2],)
    assert views[10].cuda_devices == (gpus[2],)
