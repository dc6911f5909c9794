"""Faults in the fake NVML: each stays inside its own GPU or source."""

from __future__ import annotations

from typing import Any

from tests.conftest import pick, value

GPU0 = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
GPU1 = "GPU-bbbbbbbb-0000-4000-8000-000000000001"


def doc(**nvml: Any) -> dict[str, Any]:
    return {
        "nvml": nvml,
        "gpus": [{"uuid": GPU0}, {"uuid": GPU1}],
        "processes": [
            {"pid": 10, "gpu_memory": {GPU0: "1GiB"}},
            {"pid": 11, "gpu_memory": {GPU1: "2GiB"}},
        ],
        "phases": [
            {"name": "lost", "gpus": {GPU1: {"lost": True}}},
            {"name": "back", "gpus": {GPU1: {"lost": False}}},
        ],
    }


def test_lost_gpu_is_down_while_the_other_keeps_reporting(simulate: Any) -> None:
    run = simulate(doc())
    s = run.scrape(phase="lost")
    assert value(s, "gpuledger_gpu_up", gpu_uuid=GPU1) == 0
    assert value(s, "gpuledger_gpu_up", gpu_uuid=GPU0) == 1
    assert value(s, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=GPU0) == 1024**3
    # No invented numbers for the lost GPU, but it keeps its identity.
    assert not pick(s, "gpuledger_gpu_memory_used_bytes", gpu_uuid=GPU1)
    assert pick(s, "gpuledger_gpu_info", gpu_uuid=GPU1)
    assert value(s, "gpuledger_source_up", source="nvml") == 1
    # And it comes back by itself.
    s = run.scrape(phase="back")
    assert value(s, "gpuledger_gpu_up", gpu_uuid=GPU1) == 1
    assert value(s, "gpuledger_gpu_memory_used_bytes", gpu_uuid=GPU1) == 2 * 1024**3


def test_driver_without_v3_process_query_falls_back_to_v2(simulate: Any) -> None:
    s = simulate(doc(variants=["no_v3", "no_memory_v2"])).scrape()
    assert value(s, "gpuledger_source_up", source="nvml") == 1
    assert value(s, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=GPU1) == 2 * 1024**3
    assert value(s, "gpuledger_gpu_memory_total_bytes", gpu_uuid=GPU0) == 80 * 1024**3


def test_no_nvml_library_is_a_down_source_not_a_crash(simulate: Any) -> None:
    run = simulate(doc(library="missing"))
    s = run.scrape()
    assert value(s, "gpuledger_source_up", source="nvml") == 0
    assert value(s, "gpuledger_source_errors_total", source="nvml", reason="library_not_found") == 1
    assert not pick(s, "gpuledger_gpu_info")
    assert value(s, "gpuledger_source_up", source="procfs") == 1
    s = run.scrape()
    assert value(s, "gpuledger_source_errors_total", source="nvml", reason="library_not_found") == 2
    published, _ = run.exporter.current()
    nvml = next(st for st in published.ledger.sources if st.source == "nvml")
    assert "--nvml-library" in (nvml.error_message or "")


def test_driver_not_loaded(simulate: Any) -> None:
    s = simulate(doc(init_error=9)).scrape()
    assert value(s, "gpuledger_source_up", source="nvml") == 0
    assert value(s, "gpuledger_source_errors_total", source="nvml", reason="driver_not_loaded") == 1


def test_process_vanishing_between_nvml_and_procfs(simulate: Any, tmp_path: Any) -> None:
    run = simulate(doc())
    # NVML still lists pid 11, but its /proc entry is gone: whether it was in a pod is
    # unknown, so its memory is counted neither as a pod's nor as unattributed.
    import shutil

    shutil.rmtree(run.node.proc_root / "11")
    run.exporter.run_once()
    body, _ = run.exporter.render(None)
    from tests.conftest import samples

    s = samples(body.decode())
    assert value(s, "gpuledger_source_up", source="procfs") == 1
    assert value(s, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=GPU1) == 0
    assert value(s, "gpuledger_unattributed_gpu_memory_used_bytes", gpu_uuid=GPU0) == 1024**3
