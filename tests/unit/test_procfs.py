"""procfs parsing: only whitelisted environment and flags survive; odd files are normal."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.sources.procfs.source import (
    ProcfsSource,
    parse_environ,
    parse_flags,
    parse_status,
    parse_title,
)

SECRET_ENV = (
    b"HF_TOKEN=hf_abc\0AWS_SECRET_ACCESS_KEY=xyz\0CUDA_VISIBLE_DEVICES=1,0\0"
    b"NVIDIA_VISIBLE_DEVICES=all\0PATH=/usr/bin\0VLLM_API_KEY=k\0VLLM_DP_RANK=3\0"
)


def test_environ_keeps_only_whitelisted_names() -> None:
    assert parse_environ(SECRET_ENV) == {
        "CUDA_VISIBLE_DEVICES": "1,0",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "VLLM_DP_RANK": "3",
    }


def test_flags_keep_only_engine_configuration() -> None:
    cmdline = (
        b"\0".join(
            [
                b"python3",
                b"-m",
                b"vllm.entrypoints.openai.api_server",
                b"--model",
                b"/m/llama",
                b"--api-key",
                b"sk-123",
                b"--tensor-parallel-size",
                b"4",
                b"--max-num-seqs=128",
                b"-dp",
                b"2",
                b"--hf-token",
                b"hf_x",
                b"--served-model-name",
                b"llama",
            ]
        )
        + b"\0"
    )
    assert parse_flags(cmdline) == {
        "tensor_parallel_size": "4",
        "max_num_seqs": "128",
        "data_parallel_size": "2",
        "served_model_name": "llama",
    }


def test_flag_without_value_is_not_taken_from_the_next_flag() -> None:
    assert parse_flags(b"vllm\0--max-num-seqs\0--api-key\0secret\0") == {}


def test_titles() -> None:
    assert parse_title(b"VLLM::EngineCore\0") == "VLLM::EngineCore"
    assert parse_title(b"VLLM::Worker_TP1\0\0\0") == "VLLM::Worker_TP1"
    assert parse_title(b"/usr/bin/python3\0train.py\0--token\0abc\0") == "python3"
    # setproctitle-style: a whole command line in argv[0]; only the first word is a title.
    assert parse_title(b"ray::Trainer.step --password hunter2\0") == "ray::Trainer.step"
    assert parse_title(b"") == ""


def test_status_nspid_and_ppid() -> None:
    text = "Name:\tpython3\nPPid:\t4100\nNSpid:\t4242\t17\n"
    assert parse_status(text) == (4100, (4242, 17))
    assert parse_status("garbage\nPPid:\tx\n") == (None, ())


@given(st.binary(max_size=400))
def test_parsers_never_raise_on_garbage(raw: bytes) -> None:
    parse_environ(raw)
    parse_flags(raw)
    parse_title(raw)
    parse_status(raw.decode(errors="replace"))


def _proc(root: Path, pid: int, ppid: int, **files: bytes) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    (base / "status").write_text(f"Name:\tx\nPPid:\t{ppid}\nNSpid:\t{pid}\n")
    for name, content in files.items():
        (base / name).write_bytes(content)


def test_walks_ancestors_and_tolerates_missing_files(tmp_path: Path) -> None:
    _proc(tmp_path, 30, 20, cmdline=b"VLLM::Worker_TP0\0", cgroup=b"0::/\n")
    _proc(tmp_path, 20, 10, cmdline=b"VLLM::EngineCore\0")  # no cgroup, no environ
    # pid 10 (the parent) has vanished.
    snap = ProcfsSource(str(tmp_path)).read([30, 999])
    assert set(snap.processes) == {30, 20}
    assert snap.processes[30].ppid == 20
    assert snap.processes[20].title == "VLLM::EngineCore"
    assert snap.processes[20].environ == {}


def test_parent_loop_terminates(tmp_path: Path) -> None:
    _proc(tmp_path, 5, 6)
    _proc(tmp_path, 6, 5)
    assert set(ProcfsSource(str(tmp_path)).read([5]).processes) == {5, 6}


def _ray_executor_host(root: Path) -> None:
    """A Ray-executor engine's processes as the vLLM 0.32 capture shows them
    (tests/fixtures/ray/vllm-0.32-ray/processes.json): the API server and its EngineCore
    hold no GPU; the GPU worker is the raylet's child."""
    _proc(root, 6913, 1, cmdline=b"python\0-m\0vllm.entrypoints.openai.api_server\0-tp\0002\0")
    _proc(root, 7137, 6913, cmdline=b"VLLM::EngineCore" + b"\0" * 125)
    _proc(root, 6641, 1, cmdline=b"raylet\0")
    _proc(root, 7438, 6641, cmdline=b"ray::RayWorkerProc.run" + b"\0" * 100)
    _proc(root, 500, 1, cmdline=b"sshd\0")


def test_engine_processes_and_their_api_servers_are_read_while_engines_are_scraped(
    tmp_path: Path,
) -> None:
    _ray_executor_host(tmp_path)
    source = ProcfsSource(str(tmp_path))
    # NVML lists the worker only: without engines, its ancestors are all there is.
    assert set(source.read([7438]).processes) == {7438, 6641}
    snap = source.read([7438], engines=True)
    assert set(snap.processes) == {7438, 6641, 7137, 6913}
    assert snap.processes[6913].flags["tensor_parallel_size"] == "2"
    assert 6913 in snap.sockets  # the API server's sockets are read: it is one now
    # NVML down or listing nothing: the engine's own tree is still read.
    assert set(source.read([], engines=True).processes) == {7137, 6913}


def test_the_engine_scan_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuledger.sources.procfs import source as procfs

    _ray_executor_host(tmp_path)
    for pid in range(8000, 8010):
        _proc(tmp_path, pid, 6913, cmdline=b"VLLM::EngineCore_DP1\0")
    monkeypatch.setattr(procfs, "MAX_ENGINE_PROCESSES", 3)
    assert len(ProcfsSource(str(tmp_path)).engine_pids(time.monotonic() + 5)) == 3
    # Past its deadline the scan stops at once, with what it found.
    assert ProcfsSource(str(tmp_path)).engine_pids(time.monotonic() - 1) == []
