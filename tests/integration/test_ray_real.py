"""The Ray client against a real local Ray cluster (`ray[default]` from the test extra).

One cluster at a time, module-scoped, started twice: with token auth on (as Ray 2.60
local clusters default to) and with RAY_AUTH_MODE=disabled.

* the head is `ray start --head --block` (tests/integration/ray_head.py) with every port
  chosen free (so parallel runs on one machine do not collide), its temp dir and HOME
  private to the test, the dashboard on 127.0.0.1;
* a driver process connects and creates two GPU actors holding both logical GPUs (no
  GPU hardware needed: `--num-gpus 2` is Ray's own ledger), a CPU actor in a created
  placement group, a GPU actor pending creation, a placement group that never fits
  (INFEASIBLE) and one waiting for GPUs the actors hold (NO_RESOURCES) with an actor
  inside it.

Both processes are ended however the tests go. A cluster that does not come up fails
the tests with the tail of its logs: nothing here is skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuledger.identity.raynodes import node_for_pod
from gpuledger.ledger.ray import gpu_actor_counts, pending_gpus, placement_group_counts
from gpuledger.model.ray import RaySnapshot
from gpuledger.sim.fake_ray import (
    FakeRayDashboard,
    actor_entry,
    node_entry,
    placement_group_entry,
)
from gpuledger.sources.base import SourceError
from gpuledger.sources.ray.state import RayStateClient
from tests.integration.ray_head import end, ray_head, read_line
from tests.json_shape import same_shape

pytestmark = pytest.mark.slow

START_TIMEOUT_SECONDS = 60.0  # for the driver's actors
SETTLE_TIMEOUT_SECONDS = 30.0

DRIVER = r"""
import json, os, sys
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)


@ray.remote(num_gpus=1, num_cpus=0)
class GpuWorker:
    def pid(self):
        return os.getpid()


@ray.remote(num_cpus=1)
class CpuWorker:
    def pid(self):
        return os.getpid()


workers = [GpuWorker.options(name=f"gpu-{i}").remote() for i in range(2)]
gpu_pids = ray.get([w.pid.remote() for w in workers])
cpu_group = placement_group([{"CPU": 1}], name="cpu-group")
ray.get(cpu_group.ready())
in_group = PlacementGroupSchedulingStrategy(cpu_group, placement_group_bundle_index=0)
cpu = CpuWorker.options(name="cpu-in-group", scheduling_strategy=in_group).remote()
cpu_pid = ray.get(cpu.pid.remote())
pending = GpuWorker.options(name="pending").remote()
infeasible = placement_group([{"GPU": 4}], name="infeasible")
waiting = placement_group([{"GPU": 1}], name="waiting")
in_waiting = GpuWorker.options(
    name="in-waiting", scheduling_strategy=PlacementGroupSchedulingStrategy(waiting)
).remote()
print(json.dumps({
    "gpu_pids": gpu_pids,
    "cpu_pid": cpu_pid,
    "node_id": ray.get_runtime_context().get_node_id(),
    "ray_version": ray.__version__,
}), flush=True)
sys.stdin.read()  # until the test closes stdin
ray.shutdown()
"""


@dataclass(frozen=True)
class Cluster:
    url: str
    token: str | None  # None: RAY_AUTH_MODE=disabled
    gpu_pids: tuple[int, ...]
    cpu_pid: int
    node_id: str
    ray_version: str
    started_seconds: float
    settled: RaySnapshot


def _settled(snap: RaySnapshot) -> bool:
    states = {(g.name, g.scheduling_state) for g in snap.placement_groups}
    return (
        gpu_actor_counts(snap).get(("GpuWorker", "ALIVE")) == 2.0
        and {("infeasible", "INFEASIBLE"), ("waiting", "NO_RESOURCES")} <= states
        and len(snap.actors) == 5
        # cluster_status is written by the autoscaler monitor every few seconds, and one
        # report may carry the GPU actors before the CPU group's bundle: wait for both.
        and all(n.gpus_available == 0.0 for n in snap.nodes)
        and all(
            n.resources_available is not None and n.resources_available.get("CPU") == 3.0
            for n in snap.nodes
        )
    )


@pytest.fixture(scope="module", params=["token", "disabled"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    auth_mode: str = request.param
    if importlib.util.find_spec("ray") is None:
        pytest.fail(
            "ray[default] is not installed in this environment: install the test extra "
            "(pip install -e '.[test]'); these tests need a real local Ray cluster"
        )
    started = time.monotonic()
    with ray_head("glray-", num_gpus=2, auth_mode=auth_mode) as head:
        driver: subprocess.Popen[str] | None = None
        try:
            with (head.tmp / "driver.log").open("wb") as driver_log:
                driver = subprocess.Popen(
                    [sys.executable, "-c", DRIVER, head.gcs],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=driver_log,
                    env=head.env, text=True, start_new_session=True,
                )  # fmt: skip
            line = read_line(driver, time.monotonic() + START_TIMEOUT_SECONDS)
            if not line:
                pytest.fail(f"the Ray driver did not set up its actors\n{head.logs()}")
            info = json.loads(line)
            client_ = RayStateClient(head.url, token=head.token)
            deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
            snap = client_.fetch_cluster()
            while not _settled(snap):
                if time.monotonic() > deadline:
                    pytest.fail(f"Ray state did not settle: {snap}\n{head.logs()}")
                time.sleep(0.5)
                snap = client_.fetch_cluster()
            client_.close()
            yield Cluster(
                url=head.url,
                token=head.token,
                gpu_pids=tuple(info["gpu_pids"]),
                cpu_pid=info["cpu_pid"],
                node_id=info["node_id"],
                ray_version=info["ray_version"],
                started_seconds=time.monotonic() - started,
                settled=snap,
            )
        finally:
            if driver is not None and driver.stdin is not None:
                with contextlib.suppress(OSError):
                    driver.stdin.close()  # the driver shuts Ray's side down itself
                with contextlib.suppress(subprocess.TimeoutExpired):
                    driver.wait(timeout=10)
            end(driver, grace_seconds=2)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[RayStateClient]:
    c = RayStateClient(cluster.url, token=cluster.token)
    yield c
    c.close()


def test_cluster_came_up_quickly(cluster: Cluster) -> None:
    assert cluster.ray_version.startswith("2.")
    assert cluster.started_seconds < 90


def test_token_auth(cluster: Cluster) -> None:
    if cluster.token is None:
        # Auth disabled: no token needed, and a token sent anyway is ignored.
        assert len(RayStateClient(cluster.url).fetch_nodes()) == 1
        assert len(RayStateClient(cluster.url, token="unused").fetch_nodes()) == 1
        return
    with pytest.raises(SourceError) as missing:
        RayStateClient(cluster.url).fetch_cluster()
    assert missing.value.reason == "unauthorized"
    assert "401" in missing.value.message and "--ray-token-file" in missing.value.message
    with pytest.raises(SourceError) as wrong:
        RayStateClient(cluster.url, token="0" * 32).fetch_nodes()
    assert wrong.value.reason == "unauthorized"
    assert "403" in wrong.value.message
    assert cluster.token not in missing.value.message + wrong.value.message


def test_logical_gpus_per_node(cluster: Cluster, client: RayStateClient) -> None:
    snap = client.fetch_cluster()
    (node,) = snap.nodes
    assert node.node_id == cluster.node_id
    assert (node.state, node.is_head) == ("ALIVE", True)
    assert node.gpus_total == 2.0
    assert node.gpus_available == 0.0  # both held by the ALIVE GPU actors
    assert node.resources_total["CPU"] == 4.0
    assert node.resources_available is not None
    assert node.resources_available["CPU"] == 3.0  # the CPU group's bundle
    assert node.labels.get("ray.io/node-id") == node.node_id
    # Ray names the node by its IP unless told otherwise: both discovery paths find it.
    assert node_for_pod(snap.nodes, node.node_ip, "") == node
    assert node.hostname is not None
    assert node_for_pod(snap.nodes, "10.255.255.1", node.hostname) == node


def test_actors_by_class_and_state(cluster: Cluster, client: RayStateClient) -> None:
    snap = client.fetch_cluster()
    assert gpu_actor_counts(snap) == {
        ("GpuWorker", "ALIVE"): 2.0,
        ("GpuWorker", "PENDING_CREATION"): 2.0,
    }
    alive = {a.name: a for a in snap.actors if a.state == "ALIVE"}
    assert sorted([alive["gpu-0"].pid or 0, alive["gpu-1"].pid or 0]) == sorted(cluster.gpu_pids)
    for actor in (alive["gpu-0"], alive["gpu-1"]):
        assert actor.node_id == cluster.node_id and actor.num_gpus == 1.0
        # No PID namespace between the test and Ray here: the PID is a host PID.
        assert actor.pid is not None and Path(f"/proc/{actor.pid}").exists()
    cpu = alive["cpu-in-group"]
    assert (cpu.pid, cpu.num_gpus) == (cluster.cpu_pid, 0.0)
    assert cpu.placement_group_id is not None
    pending = {a.name: a for a in snap.actors if a.state == "PENDING_CREATION"}
    assert set(pending) == {"pending", "in-waiting"}
    assert all(a.pid is None and a.node_id is None for a in pending.values())
    # Ray rewrote the in-group request to GPU_group_<pg>: still one GPU.
    assert pending["in-waiting"].num_gpus == 1.0


def test_placement_groups_by_scheduling_state(client: RayStateClient) -> None:
    snap = client.fetch_cluster()
    assert placement_group_counts(snap) == {
        ("PENDING", "INFEASIBLE"): 1,
        ("PENDING", "NO_RESOURCES"): 1,
        ("CREATED", "FINISHED"): 1,
    }
    groups = {g.name: g for g in snap.placement_groups}
    assert groups["infeasible"].gpus == 4.0
    assert groups["waiting"].bundles[0].node_id is None
    assert groups["cpu-group"].bundles[0].node_id is not None
    assert groups["infeasible"].created_timestamp_seconds is not None
    assert abs(groups["infeasible"].created_timestamp_seconds - time.time()) < 600


def test_pending_gpus(client: RayStateClient) -> None:
    # 4 (infeasible) + 1 (waiting) from groups; the actor inside `waiting` is not counted
    # twice, the one outside any group is.
    assert pending_gpus(client.fetch_cluster()) == {"placement_group": 5.0, "actor": 1.0}


def test_filters_are_applied_by_ray(cluster: Cluster, client: RayStateClient) -> None:
    pending = client.fetch_actors(state="PENDING_CREATION")
    assert {a.name for a in pending} == {"pending", "in-waiting"}
    on_node = client.fetch_actors(node_id=cluster.node_id)
    assert {a.name for a in on_node} == {"gpu-0", "gpu-1", "cpu-in-group"}
    snap = client.fetch_cluster(node_id=cluster.node_id, placement_groups=False)
    assert len(snap.actors) == 3 and snap.placement_groups == ()
    assert snap.warnings == ()


def test_small_limit_warns(client: RayStateClient, cluster: Cluster) -> None:
    limited = RayStateClient(cluster.url, token=cluster.token, limit=2)
    snap = limited.fetch_cluster()
    assert len(snap.actors) == 2
    assert "actors: limit reached, 2 of 5 returned" in snap.warnings
    limited.close()


def test_rays_own_errors_come_through(cluster: Cluster) -> None:
    with pytest.raises(SourceError) as caught:
        RayStateClient(cluster.url, token=cluster.token, limit=20000).fetch_nodes()
    assert caught.value.reason == "api_error"
    assert "exceeds the supported limit 10000" in caught.value.message


# --------------------------------------------------------------------------- the fake


def _raw(cluster: Cluster, path: str, detail: bool) -> Any:
    params = {"detail": "true"} if detail else {}
    headers = {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}
    reply = requests.get(cluster.url + path, params=params, headers=headers, timeout=10)
    assert reply.status_code == 200
    return reply.json()


def _rows(reply: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = reply["data"]["result"]["result"]
    return rows


@pytest.mark.parametrize("detail", [False, True])
def test_fake_answers_like_the_real_dashboard(cluster: Cluster, detail: bool) -> None:
    """Field by field: rows built by the fake's helpers against the live rows."""
    real_nodes = _raw(cluster, "/api/v0/nodes", detail)
    real_actors = _raw(cluster, "/api/v0/actors", detail)
    real_groups = _raw(cluster, "/api/v0/placement_groups", detail)
    real_node = _rows(real_nodes)[0]
    real_alive = next(a for a in _rows(real_actors) if a["name"] == "gpu-0")
    real_pending = next(a for a in _rows(real_actors) if a["name"] == "pending")
    real_infeasible = next(g for g in _rows(real_groups) if g["name"] == "infeasible")

    node = node_entry(
        real_node["node_ip"], gpus=2, cpus=4, is_head=True, node_id=real_node["node_id"]
    )
    alive = actor_entry("GpuWorker", node_id=node["node_id"], pid=1234, name="gpu-0")
    pending = actor_entry("GpuWorker", state="PENDING_CREATION", name="pending")
    infeasible = placement_group_entry("infeasible", [{"GPU": 4}], scheduling_state="INFEASIBLE")
    with FakeRayDashboard() as fake:
        fake.set_nodes([node])
        fake.set_actors([alive, pending])
        fake.set_placement_groups([infeasible])
        params = {"detail": "true"} if detail else {}
        for path, real, real_row in (
            ("/api/v0/nodes", real_nodes, real_node),
            ("/api/v0/actors", real_actors, real_alive),
            ("/api/v0/placement_groups", real_groups, real_infeasible),
        ):
            got = requests.get(fake.url + path, params=params, timeout=5).json()
            # Envelope and listing keys, then the row: same columns, same order, same types.
            assert list(got) == list(real)
            assert list(got["data"]["result"]) == list(real["data"]["result"])
            fake_row = _rows(got)[0]
            assert list(fake_row) == list(real_row), path
            same_shape(fake_row, real_row, path)
        fake_pending = _rows(
            requests.get(fake.url + "/api/v0/actors", params=params, timeout=5).json()
        )[1]
        assert fake_pending["pid"] == real_pending["pid"] == 0
        assert fake_pending["node_id"] is None and real_pending["node_id"] is None
        if detail:
            assert fake_pending["required_resources"] == real_pending["required_resources"]
            assert real_infeasible["bundles"][0]["node_id"] == ""
            assert infeasible["bundles"][0]["node_id"] == ""


def test_fake_serving_real_rows_gives_the_same_snapshot(
    cluster: Cluster, client: RayStateClient
) -> None:
    """Scenarios with Ray state produce the same series: the client cannot tell the fake
    from Ray, availability (derived by the fake, reported by Ray's monitor) included."""
    real = client.fetch_cluster()
    real_status = _raw(cluster, "/api/cluster_status", False)["data"]["clusterStatus"]
    with FakeRayDashboard() as fake:
        fake.set_nodes(_rows(_raw(cluster, "/api/v0/nodes", True)))
        fake.set_actors(_rows(_raw(cluster, "/api/v0/actors", True)))
        fake.set_placement_groups(_rows(_raw(cluster, "/api/v0/placement_groups", True)))
        simulated = RayStateClient(fake.url).fetch_cluster()
        fake_status = requests.get(fake.url + "/api/cluster_status", timeout=5).json()
    assert simulated.actors == real.actors
    assert simulated.placement_groups == real.placement_groups
    assert simulated.nodes == real.nodes
    fake_report = fake_status["data"]["clusterStatus"]["loadMetricsReport"]
    real_report = real_status["loadMetricsReport"]
    assert set(fake_report) == set(real_report)
    (fake_usage,) = fake_report["usageByNode"].values()
    (real_usage,) = real_report["usageByNode"].values()
    # Ray also reports the group-rewritten names (CPUGroup<pg>...); the base ones agree.
    assert fake_usage.items() <= real_usage.items()
    assert {"GPU", "CPU", "memory", "objectStoreMemory"} <= set(fake_usage)


def test_exporter_joins_real_ray_actors_to_their_gpu_memory(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The whole exporter against real Ray: logical GPUs from the state API, physical memory
    from NVML by the actors' real PIDs (fake NVML listing them), through the real /proc."""
    from gpuledger.pipeline import Pipeline, PipelineConfig
    from gpuledger.sim.fake_nvml import (
        STATE_ENV,
        FakeGpu,
        FakeNvmlState,
        FakeProcess,
        build_fake_nvml,
        write_state,
    )
    from gpuledger.web.server import Exporter
    from tests.conftest import samples, value

    uuids = [f"GPU-70000000-0000-4000-8000-00000000000{i}" for i in range(2)]
    state = tmp_path / "nvml.state"
    write_state(
        state,
        FakeNvmlState(
            gpus=tuple(
                FakeGpu(
                    i,
                    uuids[i],
                    "NVIDIA H100 80GB HBM3",
                    f"00000000:{0x18 + i:02X}:00.0",
                    80 * 2**30,
                    2**30,
                    50,
                    10,
                )
                for i in range(2)
            ),
            processes=tuple(FakeProcess(i, pid, 2**30) for i, pid in enumerate(cluster.gpu_pids)),
        ),
    )
    os.environ[STATE_ENV] = str(state)
    pipeline = Pipeline(
        PipelineConfig(
            node="ray-host",
            proc_root="/proc",
            nvml_library=str(build_fake_nvml()),
            ray_address=cluster.url,
            ray_token=cluster.token,
        )
    )
    exporter = Exporter(pipeline.cycle, 1.0)
    try:
        exporter.run_once()
        body, _ = exporter.render(None)
    finally:
        pipeline.close()
    s = samples(body.decode())
    assert value(s, "gpuledger_source_up", source="ray") == 1
    assert value(s, "gpuledger_ray_node_gpus", state="total", ray_node_id=cluster.node_id) == 2
    assert value(s, "gpuledger_ray_actor_gpus", class_name="GpuWorker", state="ALIVE") == 2
    for uuid in uuids:
        assert (
            value(
                s,
                "gpuledger_ray_actor_gpu_memory_used_bytes",
                class_name="GpuWorker",
                gpu_uuid=uuid,
            )
            == 2**30
        )
    assert value(s, "gpuledger_ray_actors_without_gpu_memory", class_name="GpuWorker") == 0
    if cluster.token:
        assert cluster.token.encode() not in body
