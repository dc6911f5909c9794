"""No metric family has two samples with one label set, whatever the inputs: colliding
identities through the pure ledger and the real collector (issue 14, item 4)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuledger.ledger import Ledger, build_ledger
from gpuledger.model import Snapshots
from gpuledger.model.bundle import Key
from gpuledger.model.engines import ENGINES, EnginesSnapshot, EngineTarget, endpoint_of
from gpuledger.model.kubernetes import PODS, PodInfo
from gpuledger.model.nvml import NVML
from gpuledger.model.podresources import PODRESOURCES
from gpuledger.model.procfs import PROCESSES
from gpuledger.model.ray import RAY_LOCAL
from gpuledger.sources.engines.discovery import discover_targets
from tests.unit.ledger_inputs import (
    NODE,
    actor,
    allocations,
    exposition,
    gpus,
    local_ray,
    pod,
    pods,
    process,
    procs,
    ray_node,
    repeated,
    scrape,
    series,
)

PORT = {"gpuledger.io/vllm-port": "8000"}
# Two static targets on one host serving the same model (the case), and two more
# that never answered; podA's endpoint once more, and a second endpoint of podA.
STATIC = (
    "http://10.9.9.9:8000/metrics",
    "http://10.9.9.9:8001/metrics",
    "http://10.9.9.8:8000/metrics",
    "http://10.9.9.8:8001/metrics",
    "http://10.0.0.1:8000/metrics",
    "http://10.0.0.1:8001/metrics",
)


def colliding_pods() -> list[PodInfo]:
    """Two pods named `web` in two namespaces, and a terminating `web` in `a` that the
    new one replaced (same namespace and name, another UID). One container name, `c`."""
    a = pod(1, namespace="a", name="web", ip="10.0.0.1", annotations=PORT)
    b = pod(2, namespace="b", name="web", ip="10.0.0.2", annotations=PORT)
    old = replace(pod(3, namespace="a", name="web"), deletion=True)
    return [a, b, old]


def answers(target: EngineTarget, down: set[str]) -> list[tuple[str, str]]:
    if endpoint_of(target.url) in down:
        return []
    if target.pod == "web" and target.namespace == "b":
        return [("m", "0"), ("m", "1")]  # one model on two DP ranks
    return [("m", "0")]


def colliding_ledger(previous: Ledger | None = None, down: frozenset[str] = frozenset()) -> Ledger:
    pod_list = colliding_pods()
    targets = discover_targets(pod_list, STATIC)
    vllm = EnginesSnapshot(
        tuple(scrape(t, answers(t, set(down)), up=endpoint_of(t.url) not in down) for t in targets)
    )
    table = [
        process(100 + i, uid=p.uid, container=p.container_ids["c"]) for i, p in enumerate(pod_list)
    ]
    table.append(process(200))
    nvml = gpus(2, {0: [100, 101, 102], 1: [200]})
    nvml = replace(nvml, gpus=(*nvml.gpus, nvml.gpus[0]))  # a driver repeating a UUID
    ray_pod = pod_list[0]
    ray = (
        local_ray(ray_node("r1", 2.0, "10.0.0.1"), ray_pod, [actor(1, "W", "r1", 1.0)]),
        local_ray(ray_node("r2", 2.0, "10.0.0.1"), ray_pod, [actor(2, "W", "r2", 1.0)]),
    )
    snapshots: dict[Key[Any], object] = {
        NVML: nvml,
        PROCESSES: procs(table),
        PODS: pods(pod_list),
        PODRESOURCES: allocations([(p, 0) for p in pod_list]),
        ENGINES: vllm,
        RAY_LOCAL: ray,
    }
    return build_ledger(Snapshots(snapshots), previous, node=NODE, mode="node", taken_at=0.0)


def engine_up(text: str, host: str) -> list[float]:
    return [
        v
        for name, labels, v in values(text)
        if name == "gpuledger_engine_up" and labels.get("target", "").startswith(host)
    ]


def values(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def test_colliding_identities_never_repeat_a_label_set() -> None:
    first = colliding_ledger()
    text = exposition(first)
    assert not repeated(text)
    names = {name for name, _ in series(text)}
    # The collisions did reach the families they could have broken.
    assert {"gpuledger_engine_up", "gpuledger_container_gpu_processes"} <= names
    assert {"gpuledger_gpu_allocation_info", "gpuledger_ray_actor_gpus"} <= names
    # podA's endpoint, listed twice, is one target; its second endpoint is another.
    pod_a = [
        labels["target"]
        for name, labels, _ in values(text)
        if name == "gpuledger_engine_up" and labels["namespace"] == "a"
    ]
    assert sorted(pod_a) == ["10.0.0.1:8000", "10.0.0.1:8001"]
    # Two DP ranks of one model in one pod are two engines.
    ranks = [
        labels["engine"]
        for name, labels, _ in values(text)
        if name == "gpuledger_engine_up" and labels["namespace"] == "b"
    ]
    assert sorted(ranks) == ["0", "1"]


def test_two_static_targets_of_one_model_keep_their_own_up() -> None:
    never = frozenset({"10.9.9.8:8000", "10.9.9.8:8001"})
    first = colliding_ledger(down=never)
    second = colliding_ledger(first, down=never | {"10.9.9.9:8001"})
    text = exposition(second)
    assert not repeated(text)
    assert sorted(engine_up(text, "10.9.9.9:")) == [0.0, 1.0]
    # Targets that never answered: one series each, with empty model and engine.
    silent = [
        labels
        for name, labels, _ in values(text)
        if name == "gpuledger_engine_up" and labels["target"].startswith("10.9.9.8:")
    ]
    assert len(silent) == 2 and all(labels["model_name"] == "" for labels in silent)
    assert not repeated(exposition(colliding_ledger(second, down=frozenset(STATIC))))


def test_endpoints_tell_targets_apart() -> None:
    assert endpoint_of("http://user:secret@Host.example:8000/metrics?token=x") == (
        "host.example:8000"
    )
    assert endpoint_of("https://h/metrics") == "h:443"
    assert endpoint_of("http://[fd00::1]:9/vllm/metrics") == "[fd00::1]:9/vllm/metrics"
    assert endpoint_of("http://h:99999/metrics") == "<invalid url>"
    same = discover_targets([], ("http://h:80/metrics", "http://h/metrics", "http://h:81/metrics"))
    assert [t.url for t in same] == ["http://h:80/metrics", "http://h:81/metrics"]
