"""Engines told apart on a shared host or pod, through the simulator: each target is bound
to the API server that listens on its port (docs/design.md, identity rule 6), and gets
that server's flags, processes, GPUs and parallelism check. Where the sockets cannot be
read, the old one-server-per-pod rule applies and /ledger.json says so."""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger.document.codec import from_json
from gpuledger.export.document import document_json, ledger_document
from tests.conftest import pick, value

GPUS = [f"GPU-30000000-0000-4000-8000-{i:012d}" for i in range(8)]
UID = "cccccccc-1111-4222-8333-444444444444"
CID = "c" * 64
MODEL = "Qwen/Qwen2.5-7B-Instruct"


def cg(uid: str, cid: str) -> str:
    return (
        f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
    )


def api_server(pid: int, max_num_seqs: int, tp: int = 1, **extra: Any) -> dict[str, Any]:
    flags = ["--max-num-seqs", str(max_num_seqs), "--tensor-parallel-size", str(tp)]
    return {"pid": pid, "cmdline": ["vllm", "serve", "/models/m", *flags], **extra}


def bare_host(socket: str = "readable") -> dict[str, Any]:
    """8 single-GPU engines on one host, no Kubernetes: API server 1000+10i, its
    EngineCore (the model runs in it) on GPU i, --max-num-seqs 16(i+1)."""
    processes: list[dict[str, Any]] = []
    for i in range(8):
        server = 1000 + 10 * i
        processes.append(api_server(server, 16 * (i + 1)))
        processes.append(
            {
                "pid": server + 1,
                "ppid": server,
                "cmdline": "VLLM::EngineCore",
                "gpu_memory": {GPUS[i]: "30GiB"},
            }
        )
    return {
        "node": "bare",
        "gpus": [{"uuid": g} for g in GPUS],
        "processes": processes,
        "vllm": [
            {
                "api_server": 1000 + 10 * i,
                "socket": socket,
                "engines": [{"model_name": MODEL, "running": i, "waiting": 0}],
            }
            for i in range(8)
        ],
    }


def shared_pod(socket: str = "readable") -> dict[str, Any]:
    """One pod, 8 GPUs, two API servers at TP 4: server 100 (--max-num-seqs 64) on GPUs
    0-3, server 200 (--max-num-seqs 128) on GPUs 4-7, each EngineCore -> 4 Workers."""
    processes: list[dict[str, Any]] = []
    for server, seqs, first in ((100, 64, 0), (200, 128, 4)):
        processes.append(api_server(server, seqs, tp=4, cgroup=cg(UID, CID)))
        processes.append(
            {
                "pid": server + 1,
                "ppid": server,
                "cgroup": cg(UID, CID),
                "cmdline": "VLLM::EngineCore",
            }
        )
        processes.extend(
            {
                "pid": server + 2 + tp,
                "ppid": server + 1,
                "cgroup": cg(UID, CID),
                "cmdline": f"VLLM::Worker_TP{tp}",
                "gpu_memory": {GPUS[first + tp]: "70GiB"},
            }
            for tp in range(4)
        )
    return {
        "node": "n1",
        "gpus": [{"uuid": g} for g in GPUS],
        "processes": processes,
        "kubernetes": {
            "pods": [
                {
                    "namespace": "llm",
                    "name": "two-engines-0",
                    "uid": UID,
                    "owner": {"kind": "StatefulSet", "name": "two-engines"},
                    "containers": [{"name": "vllm", "id": CID, "gpus": 8}],
                }
            ]
        },
        "vllm": [
            {
                "pod": "llm/two-engines-0",
                "name": name,
                "api_server": server,
                "socket": socket,
                "engines": [{"model_name": model}],
            }
            for name, server, model in (("small", 100, "small"), ("large", 200, "large"))
        ],
    }


def _document(run: Any) -> dict[str, Any]:
    published, _ = run.exporter.current()
    return dict(document_json(ledger_document(published)))


def _by_target(run: Any) -> dict[str, dict[str, Any]]:
    return {e["target"]: e for e in _document(run)["engines"]}


def test_eight_engines_on_a_bare_host_each_have_their_own(simulate: Any) -> None:
    run = simulate(bare_host())
    s = run.settle()
    engines = _by_target(run)
    assert len(engines) == 8
    for i in range(8):
        server = 1000 + 10 * i
        target = run.node.engines[f"static-{i}"].url.split("//")[1].split("/")[0]
        e = engines[target]
        assert (e["process_binding"], e["sockets"]) == ("socket", "read")
        assert e["api_server_pid"] == server
        assert e["pids"] == [server, server + 1]
        assert e["config"]["max_num_seqs"] == str(16 * (i + 1))
        assert [g["gpu_uuid"] for g in e["gpus"]] == [GPUS[i]]
        assert (e["gpus_configured"], e["gpus_in_use"]) == (1, 1)
        labels = {"target": target, "model_name": MODEL}
        assert value(s, "gpuledger_engine_max_num_seqs", **labels) == 16 * (i + 1)
        gpu = pick(s, "gpuledger_engine_gpu_info", **labels)
        assert [r[1]["gpu_uuid"] for r in gpu] == [GPUS[i]]
        assert value(s, "gpuledger_engine_gpus", state="in_use", **labels) == 1


def test_two_tp4_engines_in_one_pod_each_have_their_own(simulate: Any) -> None:
    run = simulate(shared_pod())
    s = run.settle()
    engines = {e["model_name"]: e for e in _document(run)["engines"]}
    for model, server, seqs, first in (("small", 100, 64, 0), ("large", 200, 128, 4)):
        e = engines[model]
        assert (e["pod"], e["process_binding"], e["api_server_pid"]) == (
            "two-engines-0",
            "socket",
            server,
        )
        assert e["pids"] == [server, server + 1, *(server + 2 + tp for tp in range(4))]
        assert e["config"]["max_num_seqs"] == str(seqs)
        assert e["config"]["tensor_parallel_size"] == "4"
        assert {(g["role"], g["rank"], g["gpu_uuid"]) for g in e["gpus"]} == {
            ("worker", str(tp), GPUS[first + tp]) for tp in range(4)
        }
        assert (e["gpus_configured"], e["gpus_in_use"]) == (4, 4)
        labels = {"pod_uid": UID, "model_name": model}
        assert value(s, "gpuledger_engine_max_num_seqs", **labels) == seqs
        assert value(s, "gpuledger_engine_gpus", state="configured", **labels) == 4
    # The two targets are one pod's IP on two ports (one annotation lists both).
    targets = [e["target"] for e in engines.values()]
    assert len({t.rsplit(":", 1)[0] for t in targets}) == 1 and len(set(targets)) == 2


@pytest.mark.parametrize("scenario", [bare_host, shared_pod])
def test_unreadable_sockets_fall_back_to_the_old_rule(simulate: Any, scenario: Any) -> None:
    """Without SYS_PTRACE the fd links cannot be read: two or more API servers in the
    pod (or on the host) are not told apart, and /ledger.json says so."""
    run = simulate(scenario("unreadable"))
    s = run.settle()
    for e in _document(run)["engines"]:
        assert (e["process_binding"], e["sockets"]) == ("ambiguous", "unreadable")
        assert (e["api_server_pid"], e["pids"], e["gpus"]) == (None, [], [])
        assert "max_num_seqs" not in e["config"]
        assert e["gpus_configured"] is None and e["gpus_in_use"] is None
    assert not pick(s, "gpuledger_engine_gpu_info")
    assert not pick(s, "gpuledger_engine_max_num_seqs")


def test_one_server_with_unreadable_sockets_is_still_joined(simulate: Any) -> None:
    doc = bare_host("unreadable")
    doc["processes"] = doc["processes"][:2]  # the first engine's two processes
    doc["vllm"] = doc["vllm"][:1]
    run = simulate(doc)
    run.settle()
    (e,) = _document(run)["engines"]
    assert (e["process_binding"], e["sockets"], e["api_server_pid"]) == (
        "only_api_server",
        "unreadable",
        1000,
    )
    assert e["config"]["max_num_seqs"] == "16"
    assert [g["gpu_uuid"] for g in e["gpus"]] == [GPUS[0]]


def test_explain_and_the_page_say_when_engines_are_not_told_apart(simulate: Any) -> None:
    from gpuledger.explain.chain import explain, render_text
    from gpuledger.web.node_page import render_page

    run = simulate(shared_pod("unreadable"))
    run.settle()
    doc = from_json(_document(run))
    text = render_text(explain([doc], pod="llm/two-engines-0"))
    lines = [line.strip() for line in text.splitlines()]
    said = (
        "processes unknown: several API servers here and their sockets could not be read "
        "(the agent needs SYS_PTRACE), so its GPUs, flags and parallelism are not joined"
    )
    assert lines.count(said) == 2, text
    assert 'data-binding="ambiguous">2 not joined to processes' in render_page(doc)

    # Bound by their sockets, nothing more is said.
    readable = simulate(shared_pod())
    readable.settle()
    doc = from_json(_document(readable))
    assert "processes unknown" not in render_text(explain([doc], pod="llm/two-engines-0"))
    assert "data-binding" not in render_page(doc)
