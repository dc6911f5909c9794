"""The Serve source against a real Ray Serve application under load (`ray[serve]` from the
test extra), on a Ray head started as tests/integration/test_ray_real.py starts it.

* the head is `ray start --head --block` (tests/integration/ray_head.py; token auth on,
  Ray 2.60's default) with every port chosen free, Serve's proxy port with them, its temp
  dir and HOME private to the test, the dashboard on 127.0.0.1;
* a driver deploys `blockapp`: deployment `Blocker`, 2 replicas, `max_ongoing_requests=2`,
  every request sleeping far longer than the test; then 10 concurrent HTTP requests go to
  Serve's proxy, so 2 + 2 run in the replicas and the other 6 wait in the proxy's router.

gpuledger's own sources (RayLocalSource, then ServeSource, as the pipeline runs them) must
report that router queue and the requests each replica runs, and the verdict must say the
requests wait in the routing layer. Everything started is ended however the test goes; a
cluster that does not come up fails the test with the tail of its logs: nothing is skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuledger.explain.chain import verdicts
from gpuledger.export.document import ledger_document
from gpuledger.export.published import Published
from gpuledger.ledger import Ledger, build_ledger
from gpuledger.model import Snapshots
from gpuledger.model.ray import RAY_LOCAL
from gpuledger.model.serve import SERVE
from gpuledger.sources.ray.serve import ServeClient, ServeSource
from gpuledger.sources.ray.state import RayLocalSource, RayStateClient
from tests.integration.ray_head import end, ray_head, read_line

pytestmark = pytest.mark.slow

START_TIMEOUT_SECONDS = 60.0  # for the application to deploy
SETTLE_TIMEOUT_SECONDS = 45.0
CLIENTS = 10
REPLICAS = 2
MAX_ONGOING = 2

DRIVER = r"""
import asyncio, json, sys
import ray
from ray import serve

ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)


@serve.deployment(
    num_replicas=2, max_ongoing_requests=2, ray_actor_options={"num_cpus": 0.1}
)
class Blocker:
    async def __call__(self, request):
        await asyncio.sleep(600)  # longer than the test: requests pile up
        return "late"


serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[2])})
serve.run(Blocker.bind(), name="blockapp", route_prefix="/block", blocking=False)
print(json.dumps({"ray_version": ray.__version__}), flush=True)
sys.stdin.read()  # until the test closes stdin
"""


@dataclass(frozen=True)
class ServeCluster:
    url: str
    token: str
    proxy: str
    started_seconds: float


def _send_blocking_requests(proxy: str) -> None:
    def one() -> None:
        with contextlib.suppress(Exception):  # ended with the cluster
            urllib.request.urlopen(proxy + "/block", timeout=120).read()

    for _ in range(CLIENTS):
        threading.Thread(target=one, daemon=True).start()


@pytest.fixture(scope="module")
def serve_cluster() -> Iterator[ServeCluster]:
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("starlette") is None:
        pytest.fail(
            "ray[serve] is not installed in this environment: install the test extra "
            "(pip install -e '.[test]'); this test needs a real Ray Serve application"
        )
    started = time.monotonic()
    with ray_head("glserve-", num_gpus=0, auth_mode="token", extra_ports=1) as head:
        assert head.token is not None
        (proxy,) = head.extra_ports
        driver: subprocess.Popen[str] | None = None
        try:
            with (head.tmp / "driver.log").open("wb") as driver_log:
                driver = subprocess.Popen(
                    [sys.executable, "-c", DRIVER, head.gcs, str(proxy)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=driver_log,
                    env=head.env, text=True, start_new_session=True,
                )  # fmt: skip
            if not read_line(driver, time.monotonic() + START_TIMEOUT_SECONDS):
                pytest.fail(f"the Serve application did not deploy\n{head.logs()}")
            proxy_url = f"http://127.0.0.1:{proxy}"
            _send_blocking_requests(proxy_url)
            yield ServeCluster(head.url, head.token, proxy_url, time.monotonic() - started)
        finally:
            if driver is not None and driver.stdin is not None:
                with contextlib.suppress(OSError):
                    driver.stdin.close()
            end(driver, grace_seconds=2)


def _ledger(cluster: ServeCluster) -> Ledger:
    """One cycle of the Ray and Serve sources, as the pipeline runs them (no Kubernetes:
    the only Ray node is this host's), joined."""
    ray = RayLocalSource(RayStateClient(cluster.url, token=cluster.token))
    local = ray.fetch(Snapshots())
    serve = ServeSource(ServeClient(cluster.url, token=cluster.token), "", "ray")
    snapshot = serve.fetch(Snapshots({RAY_LOCAL: local}))
    values: dict[Any, Any] = {RAY_LOCAL: local, SERVE: snapshot}
    return build_ledger(Snapshots(values), node="here", mode="node", taken_at=time.time())


def _queued(ledger: Ledger) -> float:
    serve = ledger.serve
    return sum(d.router_queued or 0 for d in serve.deployments) if serve is not None else 0.0


def test_a_real_router_queue_and_the_replicas_under_it(serve_cluster: ServeCluster) -> None:
    # Ray's metrics reach the export port some seconds late: wait for the whole picture.
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    ledger = _ledger(serve_cluster)
    while not (
        _queued(ledger) == CLIENTS - REPLICAS * MAX_ONGOING
        and ledger.serve is not None
        and [r.ongoing for r in ledger.serve.replicas] == [MAX_ONGOING] * REPLICAS
    ):
        assert time.monotonic() < deadline, f"Serve never showed its queue: {ledger.serve}"
        time.sleep(1.0)
        ledger = _ledger(serve_cluster)
    assert ledger.serve is not None
    (d,) = ledger.serve.deployments
    assert (d.namespace, d.workload, d.application, d.deployment) == (
        "",
        "ray",
        "blockapp",
        "Blocker",
    )
    assert (d.status, d.max_ongoing_requests, d.target_replicas) == (
        "HEALTHY",
        MAX_ONGOING,
        REPLICAS,
    )
    assert d.router_queued == CLIENTS - REPLICAS * MAX_ONGOING
    assert d.router_at_replicas == REPLICAS * MAX_ONGOING
    assert {r.state for r in d.replicas} == {"RUNNING"}
    assert all(r.pid for r in d.replicas)
    # The same through /ledger.json and explain: the routing layer holds the requests.
    verdict = verdicts([ledger_document(Published(ledger))])[("", "ray")]
    assert (verdict.stage, verdict.reason) == ("routing", "serve_router_queue")
    assert verdict.evidence[0].startswith(
        f"Serve deployment blockapp/Blocker: {CLIENTS - REPLICAS * MAX_ONGOING} request(s) queued"
    )
    assert serve_cluster.started_seconds < 90
