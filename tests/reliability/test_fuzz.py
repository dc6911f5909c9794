"""Bad input through the sources' real fetch paths: no exception escapes a source.

The parsers have their own fuzz tests (tests/unit/test_cgroup.py, test_devices.py,
test_vllm_parse.py, test_scheduling.py, test_scenario.py). These feed garbage where the
exporter really meets it: HTTP bodies served to the vLLM scraper, the Ray client and the
pod informer; protobuf bytes from the kubelet; NVML values from the fake driver; files in
a proc root, then through the join; and scenario files through `load_scenario`. Each
fetch either returns a snapshot or reports a reason from its source's vocabulary, never
`internal_error` (which means a bug that the runner merely contained).
"""

from __future__ import annotations

import json
import shutil
import string
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.identity.scheduling import PENDING_REASONS
from gpuledger.ledger import build_ledger
from gpuledger.ledger.ray import (
    build_ray_cluster,
    gpu_actor_counts,
    pending_gpus,
    placement_group_counts,
)
from gpuledger.model import Snapshots, SourceStatus
from gpuledger.model.engines import EngineTarget
from gpuledger.model.nvml import NVML, Gpu, GpuProcess, NvmlSnapshot
from gpuledger.model.procfs import PROCESSES
from gpuledger.sim.fake_apiserver import FakeApiServer, make_pod, pod_scheduled_false
from gpuledger.sim.fake_kubelet import FakeKubelet
from gpuledger.sim.fake_nvml import (
    STATE_ENV,
    FakeGpu,
    FakeNvmlState,
    FakeProcess,
    build_fake_nvml,
    write_state,
)
from gpuledger.sim.scenario import Scenario, ScenarioError, load_scenario
from gpuledger.sources.base import SourceError, SourceRunner
from gpuledger.sources.engines.source import REASONS as VLLM_REASONS
from gpuledger.sources.engines.source import EngineScraper
from gpuledger.sources.kubernetes.pods import PodInformer
from gpuledger.sources.nvml import NvmlSource
from gpuledger.sources.podresources import PodResourcesSource
from gpuledger.sources.procfs.source import ProcfsSource
from gpuledger.sources.ray import state as ray_source
from tests.reliability.harness import BodyServer

FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SECRET = "sk-fuzz-never-echo-me"
KUBERNETES_REASONS = {
    "unauthorized",
    "forbidden",
    "throttled",
    "server_error",
    "tls",
    "http_error",
    "unreachable",
    "timeout",
    "bad_response",
    "too_large",
    "not_synced",
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)


def keyed(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with the field names a parser looks for, holding any JSON value."""
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), json_values, max_size=8)


@pytest.fixture(scope="module")
def body_server() -> Iterator[BodyServer]:
    server = BodyServer()
    yield server
    server.close()


# ----------------------------------------------------------------------------- vLLM

VLLM_NAMES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:cache_config_info",
]
label_value = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12).map(
    lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
)
exposition_line = st.builds(
    lambda name, labels, val: f"{name}{{{labels}}} {val}",
    st.sampled_from(VLLM_NAMES),
    st.lists(
        st.builds(
            lambda k, v: f'{k}="{v}"',
            st.sampled_from(["model_name", "engine", "reason", "num_gpu_blocks", "x"]),
            label_value,
        ),
        max_size=3,
    ).map(",".join),
    st.sampled_from(["0", "1", "-1", "NaN", "+Inf", "1e308", "3.5", "x", ""]),
) | st.sampled_from(["# TYPE vllm:num_requests_running gauge", "# HELP x y", "", "#"])
vllm_bodies = (
    st.lists(exposition_line, max_size=30).map(lambda lines: "\n".join(lines).encode())
    | st.text(max_size=500).map(str.encode)
    | st.binary(max_size=500)
)


@FUZZ
@given(
    body=vllm_bodies,
    status=st.sampled_from([200, 200, 200, 204, 302, 404, 500]),
    gzip=st.booleans(),
    origin=st.sampled_from(["static", "annotation", "prometheus_annotation"]),
)
def test_vllm_scrape_reports_a_reason_for_any_answer(
    body_server: BodyServer, body: bytes, status: int, gzip: bool, origin: Any
) -> None:
    served = body + f"\n# {SECRET}\n".encode()
    headers = {"Content_Encoding": "gzip"} if gzip else {}  # garbage claiming to be gzip
    body_server.serve(served, status, **headers)
    with EngineScraper(timeout_seconds=2.0, max_body_bytes=64 * 1024) as scraper:
        result = scraper.scrape_one(EngineTarget(body_server.url + "/metrics", origin=origin))
    if not result.up:
        reason = result.error_reason or ""
        assert reason in VLLM_REASONS or reason.startswith("http_"), reason
        assert reason != "internal_error", result.error_message
        message = result.error_message or ""
        assert SECRET not in message and "\n" not in message


# ------------------------------------------------------------------------------ Ray

NODE_KEYS = ["node_id", "node_ip", "node_name", "state", "is_head_node", "resources_total"]
ACTOR_KEYS = ["actor_id", "class_name", "state", "pid", "node_id", "required_resources",
              "placement_group_id", "job_id", "name"]  # fmt: skip
GROUP_KEYS = ["placement_group_id", "name", "state", "bundles", "stats", "strategy"]
ray_rows = st.lists(
    keyed(NODE_KEYS) | keyed(ACTOR_KEYS) | keyed(GROUP_KEYS) | json_values, max_size=6
)
ray_listing = st.fixed_dictionaries(
    {
        "result": ray_rows | json_values,
        "total": json_values,
        "num_after_truncation": json_values,
        "num_filtered": json_values,
        "partial_failure_warning": json_values,
        "warnings": json_values,
    }
)
ray_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "result": st.booleans() | json_values,
            "msg": json_values,
            "data": st.fixed_dictionaries(
                {
                    "result": ray_listing | json_values,
                    "clusterStatus": st.fixed_dictionaries(
                        {"loadMetricsReport": st.fixed_dictionaries({"usageByNode": json_values})}
                    )
                    | json_values,
                }
            )
            | json_values,
        }
    ),
)


@FUZZ
@given(payload=ray_bodies, status=st.sampled_from([200, 200, 400, 401, 500]))
def test_ray_client_reports_a_reason_for_any_answer(
    body_server: BodyServer, payload: Any, status: int
) -> None:
    body_server.serve(json.dumps(payload).encode(), status)
    client = ray_source.RayStateClient(body_server.url, timeout_seconds=2.0)
    try:
        snapshot = client.fetch_cluster()
    except SourceError as exc:
        assert exc.reason in ray_source.REASONS, exc.reason
        assert "\n" not in exc.message
        return
    finally:
        client.close()
    # What the ledger does with it must not fail either.
    gpu_actor_counts(snapshot)
    pending_gpus(snapshot)
    placement_group_counts(snapshot)
    build_ray_cluster(snapshot, "ns", "wl")


# ----------------------------------------------------------------------- Kubernetes

POD_KEYS = ["metadata", "spec", "status", "kind"]
pod_like = st.fixed_dictionaries(
    {
        "metadata": keyed(["uid", "name", "namespace", "labels", "ownerReferences",
                           "annotations", "deletionTimestamp", "resourceVersion"]),
        "spec": keyed(["nodeName", "containers", "initContainers"]),
        "status": keyed(["phase", "podIP", "conditions", "containerStatuses"]),
    }
) | keyed(POD_KEYS) | json_values  # fmt: skip
list_bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "kind": st.just("PodList"),
            "metadata": keyed(["resourceVersion", "continue"]) | json_values,
            "items": st.lists(pod_like, max_size=4) | json_values,
        }
    ),
)


@settings(FUZZ, max_examples=25)
@given(payload=list_bodies)
def test_pod_informer_reports_a_reason_for_any_list_answer(
    body_server: BodyServer, payload: Any
) -> None:
    body_server.serve(json.dumps(payload).encode(), 200, Content_Type="application/json")
    configuration = kubernetes.client.Configuration(host=body_server.url)
    configuration.retries = 0
    informer = PodInformer(
        "node",
        node_name="n1",
        api_client=kubernetes.client.ApiClient(configuration),
        request_timeout_seconds=2.0,
        watch_timeout_seconds=1,
        backoff_base_seconds=0.05,
    )
    informer.start()
    try:
        give_up = time.monotonic() + 10
        while time.monotonic() < give_up:
            stats = informer.stats()
            if stats.lists or stats.failures:
                break
            time.sleep(0.01)
        runner: SourceRunner[Any] = SourceRunner("kubernetes", 2.0)
        _, status = runner.run(informer.fetch)
        runner.close()
    finally:
        informer.stop()
    if not status.up:
        assert status.error_reason in KUBERNETES_REASONS, (status, payload)


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


scheduler_messages = st.text(max_size=300) | st.builds(
    lambda n, clauses, tail: f"0/{n} nodes are available: {clauses}.{tail}",
    st.integers(0, 10**6),
    st.lists(
        st.builds(
            lambda count, what: f"{count} {what}",
            st.integers(0, 10**6),
            st.sampled_from(
                [
                    "Insufficient nvidia.com/gpu",
                    "node(s) didn't match Pod's node affinity/selector",
                    "node(s) had untolerated taint {x: y}",
                    "Too many pods",
                    "",
                ]
            ),
        ),
        max_size=4,
    ).map(", ".join),
    st.text(max_size=40),
)


@settings(FUZZ, max_examples=25)
@given(
    messages=st.lists(scheduler_messages, min_size=1, max_size=3),
    reason=st.sampled_from(["Unschedulable", "SchedulingGated", "", "Whatever"]),
)
def test_scheduler_messages_through_the_cluster_informer(
    apiserver: FakeApiServer, messages: list[str], reason: str
) -> None:
    names = [f"p{i}" for i in range(len(messages))]
    for name, message in zip(names, messages, strict=True):
        apiserver.add_pod(
            make_pod(
                "fuzz",
                name,
                phase="Pending",
                containers=[("main", 1, None)],
                conditions=[pod_scheduled_false(reason, message)],
            )
        )
    informer = PodInformer("cluster", api_client=apiserver.api_client())
    try:
        assert informer.wait_synced(10)
        pods = informer.fetch().pods
    finally:
        informer.stop()
        for name in names:
            apiserver.delete_pod("fuzz", name)
    for pod in pods:
        assert pod.pending_reason in PENDING_REASONS, (pod.pending_reason, messages)


# ---------------------------------------------------------------------- PodResources

ids = st.text(max_size=40)


@pytest.fixture(scope="module")
def kubelet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeKubelet]:
    short = Path("/tmp") / f"glf-{time.monotonic_ns() % 10**8}"
    short.mkdir()
    with FakeKubelet(short / "kubelet.sock") as fake:
        yield fake
    shutil.rmtree(short, ignore_errors=True)


@FUZZ
@given(
    pods=st.lists(
        st.tuples(
            ids,
            ids,
            st.lists(
                st.tuples(
                    ids,
                    st.lists(
                        st.tuples(
                            st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "x"])
                            | ids,
                            st.lists(ids, max_size=4),
                        ),
                        max_size=3,
                    ),
                ),
                max_size=3,
            ),
        ),
        max_size=4,
    ),
    garbage=st.none() | st.binary(max_size=200),
)
def test_podresources_any_answer(
    kubelet: FakeKubelet, pods: list[Any], garbage: bytes | None
) -> None:
    kubelet.set_pods(pods)
    if garbage is None:
        kubelet.set_fault("ok")
    else:
        kubelet.garbage_bytes = garbage
        kubelet.set_fault("garbage")
    source = PodResourcesSource(kubelet.socket_path, timeout_seconds=2.0)
    try:
        snapshot = source.fetch()
    except SourceError as exc:
        assert garbage is not None and exc.reason == "internal", exc.reason
        assert "\n" not in exc.message
        return
    finally:
        source.close()
    for allocation in snapshot.allocations:
        assert allocation.device_id == allocation.device_id.strip() and allocation.device_id
        assert allocation.position >= 0


# ----------------------------------------------------------------------------- NVML

token = st.text(alphabet=string.ascii_letters + string.digits + "-:._", min_size=1, max_size=40)
fake_gpus = st.lists(
    st.builds(
        FakeGpu,
        index=st.just(0),
        uuid=token.map(lambda t: "GPU-" + t),
        name=st.text(alphabet=string.printable.strip(), min_size=1, max_size=40),
        pci_bus_id=st.builds(
            lambda d, b, dev, f: f"{d:08X}:{b:02X}:{dev:02X}.{f}",
            st.integers(0, 0xFFFF),
            st.integers(0, 0xFF),
            st.integers(0, 0x1F),
            st.integers(0, 7),
        ),
        memory_total=st.integers(0, 2**64 - 1),
        memory_used=st.integers(0, 2**64 - 1),
        util_gpu=st.integers(0, 100),
        util_memory=st.integers(0, 100),
        mig_mode=st.booleans(),
        lost=st.booleans(),
    ),
    max_size=6,
)


@pytest.fixture(scope="module")
def nvml_library() -> str:
    return str(build_fake_nvml())


@FUZZ
@given(
    gpus=fake_gpus,
    processes=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 2**32 - 1), st.integers(0, 2**64 - 1)),
        max_size=20,
    ),
    driver=token,
)
def test_nvml_any_values(
    nvml_library: str,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    gpus: list[FakeGpu],
    processes: list[tuple[int, int, int]],
    driver: str,
) -> None:
    numbered = tuple(
        FakeGpu(**{**g.__dict__, "index": i}) for i, g in enumerate(gpus)
    )  # indices 0..n-1
    state_file = tmp_path_factory.mktemp("nvml") / "state"
    write_state(
        state_file,
        FakeNvmlState(
            gpus=numbered,
            processes=tuple(FakeProcess(i % max(len(gpus), 1), p, m) for i, p, m in processes),
            driver_version=driver,
        ),
    )
    monkeypatch.setenv(STATE_ENV, str(state_file))
    source = NvmlSource(nvml_library)
    try:
        snapshot = source.fetch()
    finally:
        source.close()
    for gpu in snapshot.gpus:
        if gpu.utilization_ratio is not None:
            assert 0.0 <= gpu.utilization_ratio <= 1.0
        for proc in gpu.processes:
            total = gpu.memory_total_bytes or 0
            assert proc.used_memory_bytes is None or proc.used_memory_bytes <= total


# ------------------------------------------------------- procfs, then through the join

GPUS = [f"GPU-73000000-0000-4000-8000-00000000000{i}" for i in range(3)]
UID = "73737373-0000-4000-8000-737373737373"
CID = "c" * 64
device_entry = st.sampled_from(
    [*GPUS, GPUS[1][:12], "0", "1", "2", "7", "-1", "all", "none", "void", "", "MIG-x", " 1"]
) | st.text(max_size=8)
device_list = st.lists(device_entry, max_size=4).map(",".join)
cgroup_text = st.sampled_from(
    [
        f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n0::/",
        "0::/system.slice/x.service",
        "0::/../../kubepods/pod" + UID,
        "",
    ]
) | st.text(max_size=200)
environ_bytes = st.builds(
    lambda nvd, cvd, order, junk: (
        (
            f"NVIDIA_VISIBLE_DEVICES={nvd}\0CUDA_VISIBLE_DEVICES={cvd}\0"
            f"CUDA_DEVICE_ORDER={order}\0{SECRET}=1\0"
        ).encode()
        + junk
    ),
    device_list,
    device_list,
    st.sampled_from(["PCI_BUS_ID", "FASTEST_FIRST", "", "x"]),
    st.binary(max_size=50),
)
# argv[0]'s first word is the process title, exported by design (docs/security.md):
# programs, never secrets. Everything after it may hold one.
PROGRAMS = ["VLLM::EngineCore", "VLLM::Worker_TP1", "python3", "/usr/bin/python3", "ray::W"]
CMDLINE_WORDS = ["--max-num-seqs", "--tensor-parallel-size", "--served-model-name", "4", "=",
                 "--api-key", SECRET, f"--api-key={SECRET}", f"--hf-token={SECRET}"]  # fmt: skip
process_files = st.fixed_dictionaries(
    {
        "status": st.sampled_from(
            # Parents form a chain (100 <- 101 <- 102): parent cycles are
            # test_churn.py's test_pid_reuse_parent_cycle_does_not_hang_the_join.
            ["Name:\tx\nPPid:\t1\nNSpid:\t{pid}\t7\n", "PPid:\t{parent}\n", "NSpid:\n", ""]
        ).map(str.encode)
        | st.binary(max_size=100),
        "cgroup": cgroup_text.map(str.encode) | st.binary(max_size=100),
        "cmdline": st.tuples(
            st.sampled_from(PROGRAMS) | st.text(alphabet=string.ascii_letters, max_size=10),
            st.lists(st.sampled_from(CMDLINE_WORDS) | st.text(max_size=10), max_size=6),
        ).map(lambda argv: b"\0".join(a.encode() for a in (argv[0], *argv[1])))
        | st.binary(max_size=100),
        "environ": environ_bytes | st.binary(max_size=100),
    }
)


def _nvml_snapshot(pids: list[int]) -> NvmlSnapshot:
    return NvmlSnapshot(
        driver_version="550",
        gpus=tuple(
            Gpu(
                i,
                uuid,
                "H100",
                f"00000000:{0x18 + i * 0x10:02X}:00.0",
                up=True,
                memory_total_bytes=80 * 2**30,
                memory_used_bytes=2**30,
                processes=tuple(GpuProcess(p, 2**30) for p in pids if p % 3 == i),
            )
            for i, uuid in enumerate(GPUS)
        ),
    )


@FUZZ
@given(files=st.lists(process_files, min_size=1, max_size=3))
def test_procfs_any_files_then_the_join(
    tmp_path_factory: pytest.TempPathFactory, files: list[dict[str, bytes]]
) -> None:
    root = tmp_path_factory.mktemp("proc")
    pids = [100 + i for i in range(len(files))]
    for pid, contents in zip(pids, files, strict=True):
        base = root / str(pid)
        base.mkdir()
        for name, data in contents.items():
            filled = data.replace(b"{pid}", str(pid).encode())
            (base / name).write_bytes(filled.replace(b"{parent}", str(pid - 1).encode()))
    try:
        procs = ProcfsSource(str(root)).read(pids)
    except SourceError as exc:
        assert exc.reason == "pids_not_visible"
        return
    bundle = Snapshots(
        {NVML: _nvml_snapshot(pids), PROCESSES: procs}, (SourceStatus("procfs", True, 0.0),)
    )
    ledger = build_ledger(bundle, node="n1", mode="node", taken_at=0.0)
    text = repr(ledger)
    assert SECRET not in text, "a value outside the whitelist reached the ledger"
    for process in ledger.processes:
        for uuid in process.cuda_devices or ():
            assert uuid in GPUS


# -------------------------------------------------------------------- scenario files


@settings(FUZZ, max_examples=150)
@given(
    text=st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | st.sampled_from(
        [
            b"gpus: [\xff\xfe]\n",
            b"gpus: " + b"[" * 3000 + b"]" * 3000,
            b"node: !!python/object/apply:os.system ['true']\n",
            b"description: &a [1]\nprocesses: [*a, *a]\n",
        ]
    )
)
def test_any_scenario_file_loads_or_says_why(
    tmp_path_factory: pytest.TempPathFactory, text: bytes
) -> None:
    path = tmp_path_factory.mktemp("scenario") / "fuzz.yaml"
    path.write_bytes(text)
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        message = str(exc)
        assert message.startswith(("fuzz.yaml: ", str(path))), message
        assert "\n" not in message and len(message) < 400
        return
    assert isinstance(scenario, Scenario)


def test_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    """A kilobyte of YAML aliases that expands to billions of values."""
    lines = ['l0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 10)]
    for where in ("description:\n", "processes:\n  - cmdline:\n"):
        indent = "  " if where.startswith("description") else "      "
        path = tmp_path / "bomb.yaml"
        path.write_text(where + "\n".join(indent + line for line in lines) + "\n")
        started = time.monotonic()
        with pytest.raises(ScenarioError, match=r"bomb\.yaml"):
            load_scenario(path)
        assert time.monotonic() - started < 10


def test_source_errors_stay_one_line() -> None:
    """Reasons are label values: short lower-case words."""
    for reason in (*VLLM_REASONS, *ray_source.REASONS, *KUBERNETES_REASONS):
        assert reason.isidentifier() and reason == reason.lower(), reason
