"""The chart's span receiver (spans.*): off by default; on, the node agents get the
receiver's settings, and engines reach the agent on their own node through a Service with
internalTrafficPolicy Local or the agent's host ports; a NetworkPolicy admits the senders
named in spans.from, and refuses to render without them."""

from __future__ import annotations

from typing import Any

from tests.helm.chart import CHART, of_kind, render, run_helm

SPANS = "spans-values.yaml"


def env_of(manifests: list[dict[str, Any]]) -> dict[str, str]:
    (daemonset,) = of_kind(manifests, "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def ports_of(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (daemonset,) = of_kind(manifests, "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    ports: list[dict[str, Any]] = container["ports"]
    return ports


def test_the_receiver_is_off_by_default() -> None:
    manifests = render()
    assert "GPULEDGER_OTLP_RECEIVER" not in env_of(manifests)
    assert not [s for s in of_kind(manifests, "Service") if s["metadata"]["name"].endswith("-otlp")]
    assert all("hostPort" not in p for p in ports_of(manifests))


def test_engines_reach_the_agent_on_their_own_node_through_a_local_service() -> None:
    manifests = render(SPANS)
    env = env_of(manifests)
    assert env["GPULEDGER_OTLP_RECEIVER"] == "on"
    assert env["GPULEDGER_OTLP_GRPC_LISTEN"] == ":4317"
    assert env["GPULEDGER_OTLP_MAX_BODY_BYTES"] == "4194304"
    (otlp,) = [s for s in of_kind(manifests, "Service") if s["metadata"]["name"].endswith("-otlp")]
    assert otlp["spec"]["internalTrafficPolicy"] == "Local"
    assert [(p["name"], p["targetPort"]) for p in otlp["spec"]["ports"]] == [
        ("otlp-http", "metrics"),
        ("otlp-grpc", "otlp-grpc"),
    ]
    assert all("hostPort" not in p for p in ports_of(manifests))


def test_or_through_the_agents_host_ports() -> None:
    manifests = render(SPANS, sets=["spans.route=hostPort"])
    assert [(p["name"], p.get("hostPort")) for p in ports_of(manifests)] == [
        ("metrics", 9402),
        ("otlp-grpc", 4317),
    ]
    assert not [s for s in of_kind(manifests, "Service") if s["metadata"]["name"].endswith("-otlp")]


def test_a_network_policy_admits_the_named_senders_on_the_receivers_ports() -> None:
    scrapers = "networkPolicy.from[0].namespaceSelector.matchLabels.team=monitoring"
    manifests = render(SPANS, sets=["networkPolicy.enabled=true", scrapers])
    (node,) = [
        p for p in of_kind(manifests, "NetworkPolicy") if p["metadata"]["name"].endswith("-node")
    ]
    senders = node["spec"]["ingress"][-1]
    assert [p["port"] for p in senders["ports"]] == [9402, 4317]
    assert senders["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llm"}}}
    ]
    sets = ["spans.enabled=true", "networkPolicy.enabled=true", scrapers]
    args = ["template", "gl", str(CHART), *(a for item in sets for a in ("--set", item))]
    result = run_helm("3", *args, check=False)
    assert result.returncode != 0
    refused = result.stderr
    assert "list in spans.from the engines that may send spans" in refused
