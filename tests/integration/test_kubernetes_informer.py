"""The pod informer with the real `kubernetes` client against the fake API server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kubernetes.client
import kubernetes.watch
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from gpuledger.identity.scheduling import DEFAULT_GPU_RESOURCES
from gpuledger.model.kubernetes import PodInfo
from gpuledger.sim.fake_apiserver import FakeApiServer, make_pod, pod_scheduled_false
from gpuledger.sources.base import SourceError
from gpuledger.sources.kubernetes.pods import PodInformer, bare_container_id, gpu_request, pod_info

T = TypeVar("T")
NODE = "gpu-node-1"
HEX_A = "a" * 64
HEX_B = "b" * 64
HEX_C = "c" * 64
GPU_MESSAGE = (
    "0/6 nodes are available: 2 node(s) had untolerated taint "
    "{node-role.kubernetes.io/control-plane: }, 4 Insufficient nvidia.com/gpu. preemption: "
    "0/6 nodes are available: 2 Preemption is not helpful for scheduling, 4 No preemption "
    "victims found for incoming pod."
)
TAINT_MESSAGE = (
    "0/3 nodes are available: 3 node(s) had untolerated taint {dedicated: training}. "
    "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)


def eventually(probe: Callable[[], T], accept: Callable[[T], bool], timeout: float = 5.0) -> T:
    """Poll `probe` until `accept` holds; the last value either way (assert on it)."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not accept(value) and time.monotonic() < deadline:
        time.sleep(0.02)
        value = probe()
    return value


def names(informer: PodInformer) -> set[str]:
    try:
        return {p.name for p in informer.fetch().pods}
    except SourceError:
        return set()


def error_reason(informer: PodInformer) -> str | None:
    try:
        informer.fetch()
    except SourceError as exc:
        return exc.reason
    return None


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer(bookmark_interval=0.2) as fake:
        yield fake


@pytest.fixture
def informers() -> Iterator[Callable[..., PodInformer]]:
    made: list[PodInformer] = []

    def make(server: FakeApiServer | None, mode: str = "node", **options: Any) -> PodInformer:
        settings: dict[str, Any] = {
            "node_name": NODE if mode == "node" else None,
            "api_client": server.api_client() if server is not None else None,
            "watch_timeout_seconds": 2,
            "request_timeout_seconds": 1.0,
            "backoff_base_seconds": 0.05,
            "backoff_cap_seconds": 0.3,
            "page_size": 2,  # exercise continue tokens with a handful of pods
        }
        settings.update(options)
        informer = PodInformer(mode, **settings)  # type: ignore[arg-type]
        made.append(informer)
        return informer

    yield make
    for informer in made:
        informer.stop()


def by_name(informer: PodInformer) -> dict[str, PodInfo]:
    return {p.name: p for p in informer.fetch().pods}


def test_initial_list_node_selector_and_fields(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    server.add_pod(
        make_pod(
            "serving",
            "llama-5b6c7f889c-x7k2p",
            uid="0b8e6f0c-1111-4111-8111-111111111111",
            node=NODE,
            labels={"pod-template-hash": "5b6c7f889c", "app": "llama"},
            owner=("ReplicaSet", "llama-5b6c7f889c"),
            containers=[("vllm", 2, f"containerd://{HEX_A}"), ("proxy", 0, f"cri-o://{HEX_B}")],
            init_containers=[("fetch-model", 0, f"docker://{HEX_C}")],
            pod_ip="10.244.1.7",
        )
    )
    server.add_pod(
        make_pod(
            "serving", "db-0", node=NODE, owner=("StatefulSet", "db"), containers=[("pg", 0, None)]
        )
    )
    server.add_pod(make_pod("batch", "train-abcde", node=NODE, owner=("Job", "train")))
    server.add_pod(make_pod("serving", "elsewhere", node="gpu-node-2"))

    informer = informers(server)
    assert informer.wait_synced(5)
    pods = by_name(informer)
    assert set(pods) == {"llama-5b6c7f889c-x7k2p", "db-0", "train-abcde"}  # node-2 filtered
    assert server.requests["list"] >= 2  # three pods at page size two: a continue token

    llama = pods["llama-5b6c7f889c-x7k2p"]
    assert llama.uid == "0b8e6f0c-1111-4111-8111-111111111111"
    assert (llama.namespace, llama.node_name, llama.phase) == ("serving", NODE, "Running")
    assert llama.workload == "llama"
    assert llama.gpu_requests == 2
    assert llama.pod_ip == "10.244.1.7"
    assert dict(llama.container_ids) == {"vllm": HEX_A, "proxy": HEX_B, "fetch-model": HEX_C}
    assert llama.ready and not llama.deletion
    assert llama.pending_reason is None and llama.pending_since is None
    assert llama.labels["app"] == "llama"

    assert pods["db-0"].workload == "db"
    assert dict(pods["db-0"].container_ids) == {}  # not started: no id yet
    assert pods["train-abcde"].workload == "train"


def test_not_synced_before_first_list(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    server.set_fault("hang")
    informer = informers(server)
    with pytest.raises(SourceError) as caught:
        informer.fetch()  # starts the informer; the list is still in flight
    assert caught.value.reason == "not_synced"
    server.set_fault("ok")
    assert informer.wait_synced(5)
    assert eventually(lambda: error_reason(informer), lambda r: r is None) is None


def test_watch_add_modify_delete(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    server.add_pod(make_pod("ns", "a", node=NODE))
    informer = informers(server)
    assert informer.wait_synced(5)

    server.add_pod(make_pod("ns", "b", node=NODE, phase="Pending", containers=[("main", 1, None)]))
    server.add_pod(make_pod("ns", "other-node", node="gpu-node-2"))
    assert eventually(lambda: names(informer), lambda n: n == {"a", "b"}) == {"a", "b"}

    started = make_pod(
        "ns",
        "b",
        node=NODE,
        labels={"stage": "up"},
        containers=[("main", 1, f"containerd://{HEX_A}")],
    )
    started["metadata"]["uid"] = by_name(informer)["b"].uid
    server.update_pod(started)
    b = eventually(lambda: by_name(informer)["b"], lambda p: p.phase == "Running")
    assert b.phase == "Running" and b.ready and dict(b.container_ids) == {"main": HEX_A}
    assert b.labels["stage"] == "up" and b.gpu_requests == 1

    old_uid = by_name(informer)["a"].uid
    server.delete_pod("ns", "a")
    assert eventually(lambda: names(informer), lambda n: n == {"b"}) == {"b"}

    # Same name, new Pod: a new UID, never the old one's identity.
    server.add_pod(make_pod("ns", "a", node=NODE))
    a = eventually(lambda: by_name(informer).get("a"), lambda p: p is not None)
    assert a is not None and a.uid != old_uid

    terminating = make_pod("ns", "a", uid=a.uid, node=NODE, deleting=True)
    server.update_pod(terminating)
    assert eventually(lambda: by_name(informer)["a"].deletion, bool)


def test_cluster_mode_pending_pods_and_reasons(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    since = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    server.add_pod(
        make_pod(
            "serving",
            "llama-5b6c7f889c-aaaaa",
            node=None,
            phase="Pending",
            labels={"pod-template-hash": "5b6c7f889c"},
            owner=("ReplicaSet", "llama-5b6c7f889c"),
            containers=[("vllm", 4, None)],
            conditions=[pod_scheduled_false("Unschedulable", GPU_MESSAGE, since)],
        )
    )
    server.add_pod(
        make_pod(
            "research",
            "ray-head",
            node=None,
            phase="Pending",
            labels={"ray.io/cluster": "rc-research"},
            containers=[("ray", 1, None)],
            scheduling_gates=["kueue.x-k8s.io/admission"],
            conditions=[
                pod_scheduled_false(
                    "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates"
                )
            ],
        )
    )
    server.add_pod(
        make_pod(
            "batch",
            "etl",
            node=None,
            phase="Pending",
            conditions=[pod_scheduled_false("Unschedulable", TAINT_MESSAGE)],
        )
    )
    # Not yet seen by the scheduler, placed but starting, and running: none is unplaced.
    server.add_pod(make_pod("batch", "fresh", node=None, phase="Pending"))
    placed = make_pod("serving", "starting", node=NODE, phase="Pending")
    placed["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    server.add_pod(placed)
    server.add_pod(make_pod("serving", "running", node=NODE))

    informer = informers(server, "cluster")
    assert informer.wait_synced(5)
    pods = by_name(informer)
    assert set(pods) == {"llama-5b6c7f889c-aaaaa", "ray-head", "etl"}
    llama = pods["llama-5b6c7f889c-aaaaa"]
    assert (llama.pending_reason, llama.gpu_requests, llama.workload) == (
        "insufficient_gpu",
        4,
        "llama",
    )
    assert llama.pending_since == since and llama.node_name is None
    assert pods["ray-head"].pending_reason == "scheduling_gated"
    assert pods["ray-head"].workload == "rc-research"
    assert pods["etl"].pending_reason == "taint"

    # The scheduler places the GPU pod: it leaves the selector and the cache.
    bound = make_pod(
        "serving",
        "llama-5b6c7f889c-aaaaa",
        uid=llama.uid,
        node=NODE,
        phase="Pending",
        containers=[("vllm", 4, None)],
        conditions=[{"type": "PodScheduled", "status": "True"}],
    )
    server.update_pod(bound)
    # The fresh pod gets its verdict: now it is unplaced.
    verdict = make_pod(
        "batch",
        "fresh",
        uid=by_uid_name(server, "batch", "fresh"),
        node=None,
        phase="Pending",
        conditions=[
            pod_scheduled_false("Unschedulable", "0/3 nodes are available: 3 Insufficient cpu.")
        ],
    )
    server.update_pod(verdict)
    expected = {"ray-head", "etl", "fresh"}
    assert eventually(lambda: names(informer), lambda n: n == expected) == expected
    assert by_name(informer)["fresh"].pending_reason == "other"

    # Kueue admits the gated pod and the scheduler then finds no GPU.
    admitted = make_pod(
        "research",
        "ray-head",
        uid=pods["ray-head"].uid,
        node=None,
        phase="Pending",
        labels={"ray.io/cluster": "rc-research"},
        containers=[("ray", 1, None)],
        conditions=[pod_scheduled_false("Unschedulable", GPU_MESSAGE)],
    )
    server.update_pod(admitted)
    head = eventually(
        lambda: by_name(informer)["ray-head"], lambda p: p.pending_reason == "insufficient_gpu"
    )
    assert head.pending_reason == "insufficient_gpu"


def by_uid_name(server: FakeApiServer, namespace: str, name: str) -> str:
    for pod in server.pods():
        if (pod["metadata"]["namespace"], pod["metadata"]["name"]) == (namespace, name):
            return str(pod["metadata"]["uid"])
    raise KeyError(name)


def test_cluster_mode_gpu_only(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    for name, gpus in (("wants-gpu", 1), ("cpu-only", 0)):
        server.add_pod(
            make_pod(
                "ns",
                name,
                node=None,
                phase="Pending",
                containers=[("main", gpus, None)],
                conditions=[pod_scheduled_false("Unschedulable", GPU_MESSAGE)],
            )
        )
    informer = informers(server, "cluster", pending_gpu_only=True)
    assert informer.wait_synced(5)
    assert names(informer) == {"wants-gpu"}


def test_410_gone_relists_without_lost_or_stale_pods(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    for name in ("keep", "drop", "change"):
        server.add_pod(make_pod("ns", name, node=NODE))
    informer = informers(server)
    assert informer.wait_synced(5)
    assert informer.stats().lists == 1

    # The watch stalls; meanwhile pods change and the server forgets that history.
    # set_fault takes the lock open watches send under: nothing after it reaches the informer.
    server.set_fault("hang")
    server.delete_pod("ns", "drop")
    server.add_pod(make_pod("ns", "new", node=NODE))
    changed = make_pod("ns", "change", uid=by_uid_name(server, "ns", "change"), node=NODE)
    changed["metadata"]["labels"] = {"v": "2"}
    server.update_pod(changed)
    server.expire_history()
    server.set_fault("ok")

    expected = {"keep", "change", "new"}
    assert eventually(lambda: names(informer), lambda n: n == expected) == expected
    assert by_name(informer)["change"].labels == {"v": "2"}
    stats = informer.stats()
    assert stats.gone >= 1 and stats.lists >= 2
    assert error_reason(informer) is None  # a 410 is routine, not an outage

    # And the watch after the relist is live again.
    server.delete_pod("ns", "keep")
    assert eventually(lambda: names(informer), lambda n: n == {"change", "new"}) == {
        "change",
        "new",
    }


def test_api_server_down_then_back(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    server.add_pod(make_pod("ns", "a", node=NODE))
    server.add_pod(make_pod("ns", "b", node=NODE))
    informer = informers(server)
    assert informer.wait_synced(5)

    server.set_fault("refuse")
    assert eventually(lambda: error_reason(informer), lambda r: r is not None) == "unreachable"
    with pytest.raises(SourceError) as caught:
        informer.fetch()
    assert "Kubernetes API" in caught.value.message
    # The cache is kept (marked unsynced) for callers that want it, and to resume from.
    stale = informer.cached()
    assert not stale.synced and {p.name for p in stale.pods} == {"a", "b"}

    # Changes while down are not missed: the relist on recovery replaces the cache.
    server.delete_pod("ns", "a")
    server.add_pod(make_pod("ns", "c", node=NODE))
    server.set_fault("ok")
    assert eventually(lambda: names(informer), lambda n: n == {"b", "c"}) == {"b", "c"}
    assert informer.cached().synced


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("forbidden", "forbidden"), ("unauthorized", "unauthorized"), ("http_500", "server_error")],
)
def test_http_errors_have_reasons(
    server: FakeApiServer, informers: Callable[..., PodInformer], fault: Any, reason: str
) -> None:
    server.add_pod(make_pod("ns", "a", node=NODE))
    server.set_fault(fault)
    informer = informers(server)
    informer.start()
    assert eventually(lambda: error_reason(informer), lambda r: r == reason) == reason
    with pytest.raises(SourceError) as caught:
        informer.fetch()
    assert "\n" not in caught.value.message and "Bearer" not in caught.value.message
    server.set_fault("ok")
    assert eventually(lambda: names(informer), lambda n: n == {"a"}) == {"a"}


def test_hung_api_server_times_out(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    server.add_pod(make_pod("ns", "a", node=NODE))
    informer = informers(server, watch_timeout_seconds=1, request_timeout_seconds=0.5)
    assert informer.wait_synced(5)
    server.set_fault("hang")
    # An open watch is given its timeout plus the request timeout, then the relist hangs.
    assert eventually(lambda: error_reason(informer), lambda r: r is not None, 6) == "timeout"
    server.set_fault("ok")
    assert eventually(lambda: error_reason(informer), lambda r: r is None) is None


def test_bookmarks_keep_the_resource_version_moving(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    server.add_pod(make_pod("ns", "a", node=NODE))
    informer = informers(server, watch_timeout_seconds=5)
    assert informer.wait_synced(5)
    before = informer.stats().events
    # Changes elsewhere move the global resourceVersion; bookmarks carry it to us.
    for i in range(3):
        server.add_pod(make_pod("ns", f"far-{i}", node="gpu-node-2"))
    after = eventually(lambda: informer.stats().events, lambda n: n > before)
    assert after > before and names(informer) == {"a"}


def test_kubeconfig(
    server: FakeApiServer, informers: Callable[..., PodInformer], tmp_path: Path
) -> None:
    server.add_pod(make_pod("ns", "a", node=NODE))
    path = server.kubeconfig(tmp_path / "kubeconfig")
    informer = informers(None, kubeconfig=str(path))
    assert informer.wait_synced(5)
    assert names(informer) == {"a"}


def test_outside_a_cluster_without_kubeconfig(
    informers: Callable[..., PodInformer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    informer = informers(None)
    informer.start()
    assert eventually(lambda: error_reason(informer), lambda r: r == "config") == "config"


def test_stop_is_prompt_with_an_open_watch(
    server: FakeApiServer, informers: Callable[..., PodInformer]
) -> None:
    informer = informers(server, watch_timeout_seconds=30)
    assert informer.wait_synced(5)
    # The watch is open (the server has it) and idle.
    assert eventually(lambda: server.requests["watch"], lambda n: n >= 1) >= 1
    started = time.monotonic()
    informer.stop()
    assert time.monotonic() - started < 1.0


# --- the fake server speaks the protocol the client expects ---


def test_fake_watch_from_expired_version_is_410(server: FakeApiServer) -> None:
    server.add_pod(make_pod("ns", "a", node=NODE))
    old = str(server.resource_version)
    server.expire_history()
    core = kubernetes.client.CoreV1Api(server.api_client())
    watch = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
    with pytest.raises(ApiException) as caught:
        for _ in watch.stream(  # type: ignore[no-untyped-call]
            core.list_pod_for_all_namespaces, resource_version=old, timeout_seconds=2
        ):
            pass
    assert caught.value.status == 410


def test_fake_continue_token_expires(server: FakeApiServer) -> None:
    for i in range(3):
        server.add_pod(make_pod("ns", f"p{i}", node=NODE))
    core = kubernetes.client.CoreV1Api(server.api_client())
    first = core.list_pod_for_all_namespaces(limit=1)
    assert first.metadata is not None and first.metadata._continue
    assert len(first.items) == 1
    server.add_pod(make_pod("ns", "late", node=NODE))
    second = core.list_pod_for_all_namespaces(limit=5, _continue=first.metadata._continue)
    # A consistent snapshot: the pod created after the first page is not in it.
    assert [p.metadata.name for p in second.items if p.metadata] == ["p1", "p2"]
    again = core.list_pod_for_all_namespaces(limit=1)
    assert again.metadata is not None
    server.expire_history()
    with pytest.raises(ApiException) as caught:
        core.list_pod_for_all_namespaces(limit=1, _continue=again.metadata._continue)
    assert caught.value.status == 410


def test_fake_rejects_unknown_field_selector(server: FakeApiServer) -> None:
    core = kubernetes.client.CoreV1Api(server.api_client())
    with pytest.raises(ApiException) as caught:
        core.list_pod_for_all_namespaces(field_selector="spec.bogus=1")
    assert caught.value.status == 400


# --- pod JSON -> PodInfo, without a server ---

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "metadata",
                    "spec",
                    "status",
                    "uid",
                    "name",
                    "labels",
                    "containers",
                    "resources",
                    "limits",
                    "containerStatuses",
                    "containerID",
                    "conditions",
                    "type",
                    "status",
                    "ownerReferences",
                    "kind",
                    "nodeName",
                    "podIP",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@given(_JSON)
def test_pod_info_tolerates_any_shape(obj: Any) -> None:
    if isinstance(obj, dict):
        info = pod_info(obj)
        assert info is None or isinstance(info, PodInfo)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (f"containerd://{HEX_A}", HEX_A),
        (f"cri-o://{HEX_B}", HEX_B),
        (f"docker://{HEX_C}", HEX_C),
        (HEX_A.upper(), HEX_A),
        ("", None),
        (None, None),
    ],
)
def test_bare_container_id(value: Any, expected: str | None) -> None:
    assert bare_container_id(value) == expected


def test_gpu_request_counts_sidecars_and_init_peak() -> None:
    def container(gpus: int, **extra: Any) -> dict[str, Any]:
        return {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}, **extra}

    spec = {
        "containers": [container(1), container(1)],
        "initContainers": [container(3), container(1, restartPolicy="Always")],
    }
    assert gpu_request(spec, DEFAULT_GPU_RESOURCES) == 3  # the init peak beats 1+1+1
    spec["containers"] = [container(2), container(1)]
    assert gpu_request(spec, DEFAULT_GPU_RESOURCES) == 4  # 2+1 plus the sidecar's 1
    mig = {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "2", "cpu": "4"}}}]}
    assert gpu_request(mig, DEFAULT_GPU_RESOURCES) == 2
    requests_only = {"containers": [{"resources": {"requests": {"nvidia.com/gpu": 1}}}]}
    assert gpu_request(requests_only, DEFAULT_GPU_RESOURCES) == 1


def test_pending_since_parses_the_transition_time() -> None:
    pod = make_pod(
        "ns",
        "p",
        node=None,
        phase="Pending",
        conditions=[pod_scheduled_false("Unschedulable", TAINT_MESSAGE, 1_767_225_600.0)],
    )
    info = pod_info(pod)
    assert info is not None
    assert info.pending_since == 1_767_225_600.0 and info.pending_reason == "taint"
