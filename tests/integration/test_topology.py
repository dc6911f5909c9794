"""The links between an engine's GPUs, through the simulator: the fake NVML answers the
topology calls from the scenario's placement, the real pynvml reads them, and the weakest
link of each engine reaches its series, /ledger.json and explain.

The node: 8 GPUs, 0-3 on NUMA node 0 (0 and 1 behind switch sw0, NVLink-bridged; 2 and 3
behind sw1, bridged), 4-7 on NUMA node 1 likewise. Engine `split` runs TP 4 on GPUs
0,1,4,5 (its GPUs meet across NUMA nodes); engine `pair` runs TP 2 on GPUs 2,3.
"""

from __future__ import annotations

from typing import Any

from gpuledger.document.codec import from_json
from gpuledger.explain.chain import explain, render_text
from gpuledger.export.document import document_json, ledger_document
from gpuledger.model.nvml import LINK_LEVELS
from tests.conftest import pick

GPUS = [f"GPU-70000000-0000-4000-8000-{i:012d}" for i in range(8)]
UIDS = {
    "split": "70000000-1111-4222-8333-000000000001",
    "pair": "70000000-1111-4222-8333-000000000002",
}


def cg(name: str) -> str:
    uid = UIDS[name].replace("-", "_")
    return f"0::/kubepods.slice/kubepods-pod{uid}.slice/cri-containerd-{name[0] * 64}.scope"


def gpu(i: int) -> dict[str, Any]:
    placement = {
        "numa_node": i // 4,
        "host_bridge": i // 4,
        "pcie_switches": [f"sw{i // 2}"],
    }
    if i % 2 == 0:
        placement["nvlink_peers"] = [i + 1]  # bridged pairs 0-1, 2-3, 4-5, 6-7
    return {"uuid": GPUS[i], "index": i, **placement}


def tp_engine(name: str, server: int, gpus: list[int]) -> list[dict[str, Any]]:
    """Pod `name`'s API server (PID `server`) at TP len(gpus), its EngineCore and one
    Worker per GPU."""
    flags = ["--tensor-parallel-size", str(len(gpus)), "--max-num-seqs", "8"]
    procs: list[dict[str, Any]] = [
        {"pid": server, "cmdline": ["vllm", "serve", "/models/m", *flags]},
        {"pid": server + 1, "ppid": server, "cmdline": "VLLM::EngineCore"},
    ]
    procs.extend(
        {
            "pid": server + 2 + tp,
            "ppid": server + 1,
            "cmdline": f"VLLM::Worker_TP{tp}",
            "gpu_memory": {GPUS[g]: "60GiB"},
        }
        for tp, g in enumerate(gpus)
    )
    return [{**p, "cgroup": cg(name)} for p in procs]


def pod(name: str, gpus: int) -> dict[str, Any]:
    return {
        "namespace": "llm",
        "name": f"{name}-0",
        "uid": UIDS[name],
        "owner": {"kind": "StatefulSet", "name": name},
        "containers": [{"name": "vllm", "id": name[0] * 64, "gpus": gpus}],
    }


def topology_node() -> dict[str, Any]:
    return {
        "node": "topo",
        "gpus": [gpu(i) for i in range(8)],
        "processes": [*tp_engine("split", 1000, [0, 1, 4, 5]), *tp_engine("pair", 2000, [2, 3])],
        "kubernetes": {"pods": [pod("split", 4), pod("pair", 2)]},
        "engines": [
            {"kind": "vllm", "pod": f"llm/{n}-0", "engines": [{"model_name": n}]}
            for n in ("split", "pair")
        ],
    }


def _weakest(samples: list[Any], model: str) -> dict[str, float]:
    rows = pick(samples, "gpuledger_engine_gpu_link_weakest", model_name=model)
    return {labels["link"]: v for _, labels, v in rows}


def _document(run: Any) -> Any:
    published, _ = run.exporter.current()
    return from_json(document_json(ledger_document(published)))


def test_tp4_across_numa_is_system_and_tp2_on_nvlink_is_nvlink(simulate: Any) -> None:
    run = simulate(topology_node())
    samples = run.settle()
    for model, link in (("split", "system"), ("pair", "nvlink")):
        states = _weakest(samples, model)
        assert set(states) == set(LINK_LEVELS)  # a state set: every level, one of them 1
        assert {k for k, v in states.items() if v == 1} == {link}
    doc = _document(run)
    assert {e.model_name: e.gpu_link for e in doc.engines} == {"split": "system", "pair": "nvlink"}
    text = render_text(explain([doc], pod="llm/split-0"))
    assert "TP 4 over GPUs 0,1,4,5: weakest link system (crosses NUMA)" in text, text
    text = render_text(explain([doc], pod="llm/pair-0"))
    assert "TP 2 over GPUs 2,3: weakest link nvlink (NVLink)" in text, text


def test_a_failing_nvlink_query_makes_the_link_unknown_not_a_guess(simulate: Any) -> None:
    """NVLink queries of GPUs 2 and 3 fail (999, unknown error): whether NVLink joins them
    is unknown, so the pair's engine is (one answering end would have said: its link ends
    at the other); the other engine's GPUs answered."""
    doc = topology_node()
    for i in (2, 3):
        doc["gpus"][i]["nvlink_error"] = 999
    run = simulate(doc)
    samples = run.settle()
    assert _weakest(samples, "pair")["unknown"] == 1
    assert _weakest(samples, "split")["system"] == 1


def test_without_placement_nvml_cannot_say(simulate: Any) -> None:
    """No topology in the scenario: nvmlDeviceGetTopologyCommonAncestor answers
    NOT_SUPPORTED, as on a platform NVML cannot read; NVLink alone still says nvlink."""
    doc = topology_node()
    for g in doc["gpus"]:
        del g["numa_node"]
    run = simulate(doc)
    samples = run.settle()
    assert _weakest(samples, "pair")["nvlink"] == 1
    assert _weakest(samples, "split")["unknown"] == 1
