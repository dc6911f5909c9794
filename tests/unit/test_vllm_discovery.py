"""vLLM discovery: several API servers in one pod, one target each."""

from __future__ import annotations

from gpuledger.sources.engines.discovery import MAX_PORTS_PER_POD, discover_targets
from tests.unit.ledger_inputs import pod


def test_one_annotation_lists_several_ports() -> None:
    p = pod(1, ip="10.0.0.7", annotations={"gpuledger.io/vllm-port": "8000, 8001"})
    targets = discover_targets([p], ())
    assert [t.url for t in targets] == [
        "http://10.0.0.7:8000/metrics",
        "http://10.0.0.7:8001/metrics",
    ]
    assert {(t.pod, t.pod_uid, t.origin) for t in targets} == {("pod-1", p.uid, "annotation")}


def test_a_bad_port_in_the_list_drops_the_pod_and_the_list_is_capped() -> None:
    bad = pod(1, ip="10.0.0.7", annotations={"gpuledger.io/vllm-port": "8000,http"})
    assert discover_targets([bad], ()) == ()
    many = ",".join(str(8000 + i) for i in range(MAX_PORTS_PER_POD + 4))
    lots = pod(2, ip="10.0.0.8", annotations={"gpuledger.io/vllm-port": many})
    assert len(discover_targets([lots], ())) == MAX_PORTS_PER_POD


def test_prometheus_port_stays_one_port() -> None:
    p = pod(1, ip="10.0.0.7", annotations={"prometheus.io/port": "8000,8001"})
    assert discover_targets([p], ()) == ()
