"""The simulator's gateway (issue 23): a scenario's InferencePools and their endpoint pickers
stood up by the harness, reached over HTTP as the exporter's gateway sources reach them:
the pools listed from the API server, each pool's pods by its matchLabels, its picker's
Service, and the picker's metrics at `http://<clusterIP>:<http-metrics port>/metrics`."""

from __future__ import annotations

import base64
import copy
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuledger.sim.harness import SimulatedNode
from gpuledger.sim.scenario import Scenario, load_scenario, parse_scenario
from tests.conftest import REPO

SCENARIOS = REPO / "tests" / "fixtures" / "scenarios"
FIXTURES = REPO / "tests" / "fixtures" / "gateway"
POOLS = "/apis/inference.networking.k8s.io/v1/inferencepools"
TOKEN = "gateway-picker-token"
PODS = ("vllm-a-5d8c7b9f4-2xk9p", "vllm-a-5d8c7b9f4-7hq2m", "vllm-a-5d8c7b9f4-wn4tz")


def get(url: str, token: str | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str) -> Any:
    status, body = get(url)
    assert status == 200, (url, status, body[:200])
    return json.loads(body)


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimulatedNode]:
    with SimulatedNode(load_scenario(SCENARIOS / "gateway-cluster.yaml")) as node:
        yield node


def api(node: SimulatedNode) -> str:
    assert node.apiserver is not None
    return node.apiserver.url


def picker_url(node: SimulatedNode, namespace: str, pool: dict[str, Any]) -> str:
    """What the exporter builds: the Service's clusterIP and its `http-metrics` port."""
    ref = pool["spec"]["endpointPickerRef"]
    service = get_json(f"{api(node)}/api/v1/namespaces/{namespace}/services/{ref['name']}")
    [port] = [p["port"] for p in service["spec"]["ports"] if p["name"] == "http-metrics"]
    return f"http://{service['spec']['clusterIP']}:{port}/metrics"


def pools(node: SimulatedNode) -> dict[str, dict[str, Any]]:
    listed = get_json(f"{api(node)}{POOLS}?limit=500&resourceVersion=0")
    return {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in listed["items"]}


def scrape(node: SimulatedNode, key: str, token: str | None = TOKEN) -> dict[str, list[Any]]:
    namespace = key.split("/", maxsplit=1)[0]
    status, body = get(picker_url(node, namespace, pools(node)[key]), token)
    assert status == 200, body[:200]
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def value(families: dict[str, list[Any]], name: str) -> float:
    [sample] = families[name]
    return float(sample.value)


def test_the_pool_list_is_shaped_as_the_api_server_serves_it(cluster: SimulatedNode) -> None:
    listed = get_json(f"{api(cluster)}{POOLS}?limit=500&resourceVersion=0")
    assert (listed["apiVersion"], listed["kind"]) == (
        "inference.networking.k8s.io/v1",
        "InferencePoolList",
    )
    assert listed["metadata"]["resourceVersion"].isdigit()
    names = [p["metadata"]["name"] for p in listed["items"]]
    assert names == ["pool-a", "pool-empty", "pool-down"]
    [upstream] = [
        p
        for p in json.loads((FIXTURES / "inferencepool-v1.json").read_text())["items"]
        if p["metadata"]["name"] == "pool-a"
    ]
    mine = listed["items"][0]
    # pool-a is the fixture's pool-a (the router chart's), but for its own ids.
    assert mine["spec"] == upstream["spec"]
    assert mine["status"] == upstream["status"]
    for key in ("uid", "resourceVersion"):
        assert mine["metadata"].pop(key) and upstream["metadata"].pop(key)
    assert mine["metadata"] == upstream["metadata"]
    assert {(k, mine[k]) for k in ("apiVersion", "kind")} == {
        (k, upstream[k]) for k in ("apiVersion", "kind")
    }
    empty = listed["items"][1]["spec"]
    assert empty["endpointPickerRef"]["failureMode"] == "FailClose"  # the CRD's default
    assert empty["endpointPickerRef"]["name"] == "pool-empty-epp"


def test_pools_page_and_are_found_by_namespace_and_name(cluster: SimulatedNode) -> None:
    seen, token = [], ""
    while True:
        query = {"limit": "1"} | ({"continue": token} if token else {"resourceVersion": "0"})
        page = get_json(f"{api(cluster)}{POOLS}?{urllib.parse.urlencode(query)}")
        seen += [p["metadata"]["name"] for p in page["items"]]
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert seen == ["pool-a", "pool-empty", "pool-down"]
    base = f"{api(cluster)}/apis/inference.networking.k8s.io/v1/namespaces"
    assert len(get_json(f"{base}/llm/inferencepools")["items"]) == 3
    assert get_json(f"{base}/other/inferencepools")["items"] == []
    assert get_json(f"{base}/llm/inferencepools/pool-down")["metadata"]["name"] == "pool-down"
    assert get(f"{base}/llm/inferencepools/pool-z")[0] == 404
    bogus = base64.urlsafe_b64encode(b'{"id": "gone", "offset": 1}').decode()
    assert get(f"{api(cluster)}{POOLS}?limit=1&continue={bogus}")[0] == 410
    assert get(f"{api(cluster)}{POOLS}?limit=1&continue={bogus}&resourceVersion=0")[0] == 400


def test_each_pools_pods_by_its_match_labels(cluster: SimulatedNode) -> None:
    by_pool = {}
    for key, pool in pools(cluster).items():
        namespace = key.split("/")[0]
        selector = ",".join(f"{k}={v}" for k, v in pool["spec"]["selector"]["matchLabels"].items())
        query = urllib.parse.urlencode({"labelSelector": selector})
        listed = get_json(f"{api(cluster)}/api/v1/namespaces/{namespace}/pods?{query}")
        by_pool[key] = sorted(p["metadata"]["name"] for p in listed["items"])
    assert by_pool == {
        "llm/pool-a": list(PODS),
        "llm/pool-empty": [],
        "llm/pool-down": ["vllm-down-7c9d8e6f5-q4r8s"],
    }
    [pod] = get_json(
        f"{api(cluster)}/api/v1/namespaces/llm/pods?labelSelector=app%3Dvllm-a,pod-template-hash%3D5d8c7b9f4&limit=1"
    )["items"]
    assert pod["metadata"]["uid"] == "6a7e0001-5555-4666-8777-000000000001"
    assert pod["spec"]["nodeName"] == "gpu-node-gw"


def test_the_pickers_service_is_shaped_as_the_charts(cluster: SimulatedNode) -> None:
    mine = get_json(f"{api(cluster)}/api/v1/namespaces/llm/services/pool-a-epp")
    upstream = json.loads((FIXTURES / "epp-service.json").read_text())
    ip = mine["spec"]["clusterIP"]
    assert ip.startswith("127.79.") and mine["spec"]["clusterIPs"] == [ip]
    [metrics] = [p for p in mine["spec"]["ports"] if p["name"] == "http-metrics"]
    assert metrics["port"] == metrics["targetPort"] == cluster.pickers["llm/pool-a"].port
    for doc in (mine, upstream):
        doc["spec"]["clusterIP"], doc["spec"]["clusterIPs"] = "-", ["-"]
        doc["spec"]["ports"][1]["port"] = doc["spec"]["ports"][1]["targetPort"] = 0
        doc["metadata"]["uid"] = doc["metadata"]["resourceVersion"] = "-"
    assert mine == upstream
    assert get(f"{api(cluster)}/api/v1/namespaces/llm/services/nobody-epp")[0] == 404
    assert get(f"{api(cluster)}/api/v1/namespaces/other/services/pool-a-epp")[0] == 404
    listed = get_json(f"{api(cluster)}/api/v1/namespaces/llm/services")
    assert {s["metadata"]["name"] for s in listed["items"]} == {
        "pool-a-epp",
        "pool-empty-epp",
        "pool-down-epp",
    }


def test_pool_a_picker_holds_30_over_its_three_ready_endpoints(cluster: SimulatedNode) -> None:
    families = scrape(cluster, "llm/pool-a")
    assert value(families, "llm_d_epp_flow_control_queue_size") == 30
    assert value(families, "llm_d_epp_flow_control_queue_bytes") == 61440
    assert value(families, "llm_d_epp_flow_control_pool_saturation") == 0.2
    assert value(families, "llm_d_epp_ready_endpoints") == 3
    assert value(families, "inference_pool_ready_pods") == 3
    assert value(families, "llm_d_epp_average_running_requests") == 4
    assert value(families, "llm_d_epp_average_kv_cache_utilization") == 0.4
    queues = {
        s.labels["model_server_endpoint"]: s.value
        for s in families["llm_d_epp_per_endpoint_queue_size"]
    }
    assert queues == {f"{pod}-rank-0": 0 for pod in PODS}


def test_the_picker_wants_its_token(cluster: SimulatedNode) -> None:
    url = picker_url(cluster, "llm", pools(cluster)["llm/pool-a"])
    assert get(url)[0] == 401
    assert get(url, "not-it")[0] == 401
    assert get(url, TOKEN)[0] == 200
    config = cluster.pipeline_config()
    assert config.gateway and config.gateway_picker_token == TOKEN


def test_pickers_of_pools_without_ready_pods_report_none(cluster: SimulatedNode) -> None:
    for key in ("llm/pool-empty", "llm/pool-down"):
        families = scrape(cluster, key, token=None)  # no token on these pickers
        assert value(families, "llm_d_epp_ready_endpoints") == 0, key
        assert "llm_d_epp_per_endpoint_queue_size" not in families, key
        assert "llm_d_epp_average_queue_size" not in families, key


def test_pickers_each_have_their_own_address(cluster: SimulatedNode) -> None:
    hosts = [p.host for p in cluster.pickers.values()]
    assert sorted(hosts) == ["127.79.0.1", "127.79.0.2", "127.79.0.3"]


# ------------------------------------------------------------------ phases and faults


def cluster_doc() -> dict[str, Any]:
    doc = {
        "mode": "cluster",
        "kubernetes": {
            "pods": [
                {"namespace": "llm", "name": f"a-{i}", "labels": {"app": "a"}} for i in range(3)
            ]
        },
        "engines": [
            {"kind": "vllm", "pod": f"llm/a-{i}", "engines": [{"running": 2, "waiting": i}]}
            for i in range(3)
        ],
        "gateway": {
            "pools": [
                {
                    "namespace": "llm",
                    "name": "pool-a",
                    "selector": {"app": "a"},
                    "target_ports": [8000, 8001],
                    "picker": {"queued": 5, "names": "legacy"},
                }
            ]
        },
    }
    return copy.deepcopy(doc)


def test_phases_move_the_picker_with_pods_engines_and_patches() -> None:
    doc = cluster_doc()
    doc["phases"] = [
        {
            "name": "later",
            "pods": {"llm/a-0": {"ready": False}},
            "engines": {"llm/a-2": {"engines": [{"running": 2, "waiting": 9}]}},
            "gateway": {"llm/pool-a": {"queued": 1, "saturation": 1.2, "fault": "http_500"}},
        },
        {"name": "mended", "gateway": {"llm/pool-a": {"fault": "ok"}}},
    ]
    scenario = parse_scenario(doc, "t.yaml")
    with SimulatedNode(scenario) as node:
        url = node.pickers["llm/pool-a"].url
        families = {f.name: f.samples for f in text_string_to_metric_families(get(url)[1].decode())}
        queues = {
            s.labels["model_server_pod"]: s.value
            for s in families["inference_pool_per_pod_queue_size"]
        }
        # Rank 0 is each pod's engines entry; rank 1 (port 8001) has none: idle.
        assert queues == {
            "a-0-rank-0": 0,
            "a-0-rank-1": 0,
            "a-1-rank-0": 1,
            "a-1-rank-1": 0,
            "a-2-rank-0": 2,
            "a-2-rank-1": 0,
        }
        assert value(families, "inference_pool_ready_pods") == 6
        assert "llm_d_epp_ready_endpoints" not in families  # GIE v1.5.0 names only
        node.apply(scenario.at_phase("later"))
        assert get(url)[0] == 500
        node.apply(scenario.at_phase("mended"))
        families = {f.name: f.samples for f in text_string_to_metric_families(get(url)[1].decode())}
        assert value(families, "inference_pool_ready_pods") == 4
        assert value(families, "inference_extension_flow_control_queue_size") == 1
        assert value(families, "inference_extension_flow_control_queue_bytes") == 2048
        assert value(families, "inference_extension_flow_control_pool_saturation") == 1.2
        queues = {
            s.labels["model_server_pod"]: s.value
            for s in families["inference_pool_per_pod_queue_size"]
        }
        assert queues == {"a-1-rank-0": 1, "a-1-rank-1": 0, "a-2-rank-0": 9, "a-2-rank-1": 0}


def served(doc: dict[str, Any]) -> Scenario:
    return parse_scenario(doc, "t.yaml")


def test_not_served_is_a_404_and_kubernetes_faults_reach_the_gateway_paths() -> None:
    doc = cluster_doc()
    doc["gateway"]["fault"] = "not_served"
    doc["phases"] = [{"name": "forbidden", "kubernetes_fault": "forbidden"}]
    scenario = served(doc)
    with SimulatedNode(scenario) as node:
        assert get(f"{api(node)}{POOLS}")[0] == 404
        # The Service is still there (a cluster without the CRD has Services).
        assert get(f"{api(node)}/api/v1/namespaces/llm/services/pool-a-epp")[0] == 200
        node.apply(scenario.at_phase("forbidden"))
        assert get(f"{api(node)}{POOLS}")[0] == 403
        assert get(f"{api(node)}/api/v1/namespaces/llm/services/pool-a-epp")[0] == 403


def test_a_refusing_picker_is_not_listening_and_a_hanging_one_never_answers() -> None:
    doc = cluster_doc()
    doc["gateway"]["pools"][0]["picker"]["fault"] = "refuse"
    doc["phases"] = [{"name": "hang", "gateway": {"llm/pool-a": {"fault": "hang"}}}]
    scenario = served(doc)
    with SimulatedNode(scenario) as node:
        url = picker_url(node, "llm", pools(node)["llm/pool-a"])
        with pytest.raises(urllib.error.URLError) as refused:
            get(url)
        assert isinstance(refused.value.reason, ConnectionRefusedError)
        node.apply(scenario.at_phase("hang"))
        with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
            get(url, timeout=0.5)
    with pytest.raises(urllib.error.URLError):  # closed with the node
        get(url, timeout=0.5)


def test_the_first_pickers_token_is_the_exporters_and_no_gateway_no_flag() -> None:
    doc = cluster_doc()
    doc["gateway"]["pools"] = [
        {"namespace": "llm", "name": "p0", "selector": {"app": "a"}},
        {"namespace": "llm", "name": "p1", "selector": {"app": "a"}, "picker": {"token": "one"}},
        {"namespace": "llm", "name": "p2", "selector": {"app": "a"}, "picker": {"token": "two"}},
    ]
    with SimulatedNode(served(doc)) as node:
        config = node.pipeline_config()
        assert config.gateway and config.gateway_picker_token == "one"
        assert sorted(node.pickers) == ["llm/p1", "llm/p2"]  # p0 has no picker
        [p0] = [
            p for p in get_json(f"{api(node)}{POOLS}")["items"] if p["metadata"]["name"] == "p0"
        ]
        assert "endpointPickerRef" not in p0["spec"]
        assert get(node.pickers["llm/p2"].url, "one")[0] == 401
    del doc["gateway"]
    with SimulatedNode(served(doc)) as node:
        config = node.pipeline_config()
        assert not config.gateway and config.gateway_picker_token is None
        assert get(f"{api(node)}{POOLS}")[0] == 404
