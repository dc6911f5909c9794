"""procfs parsing: only whitelisted environment and flags survive; odd files are normal."""

from __future__ import annotations

from pathlib import Path

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
