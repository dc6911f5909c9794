"""What the cluster view's /ledger page needs from the chart to find and read the node agents
(gpuledger/web/cluster_page.py through gpuledger/explain/agents.py): the agents' pod labels
and named port, the cluster view's right to list pods, and its service account token."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpuledger.explain.agents import AGENT_SELECTOR, COMPONENT_LABEL, PORT_NAME, find_agents
from tests.helm.chart import (
    NAMESPACE,
    Manifest,
    component,
    container,
    of_kind,
    pod_spec,
    render,
)


class TemplateLister:
    """The chart's pod templates as the API would list their pods (placed, with an IP)."""

    def __init__(self, templates: list[Manifest]) -> None:
        self.templates = templates

    def list_pods(
        self, *, namespace: str | None, label_selector: str = "", field_selector: str = ""
    ) -> list[Mapping[str, Any]]:
        key, _, value = AGENT_SELECTOR.partition("=")
        assert label_selector == AGENT_SELECTOR and not field_selector
        pods: list[Mapping[str, Any]] = []
        for i, t in enumerate(self.templates):
            meta = t["spec"]["template"]["metadata"]
            if meta["labels"].get(key) != value:
                continue
            pods.append(
                {
                    "metadata": {**meta, "namespace": NAMESPACE, "name": f"pod-{i}"},
                    "spec": {**t["spec"]["template"]["spec"], "nodeName": f"gpu-{i}"},
                    "status": {"phase": "Running", "podIP": f"10.0.0.{i + 1}"},
                }
            )
        return pods


@pytest.mark.parametrize("sets", [[], ["nameOverride=ledger"]])
def test_the_cluster_view_finds_the_node_agents_by_the_chart_labels(sets: list[str]) -> None:
    manifests = render(sets=sets)
    daemonset = component(manifests, "DaemonSet", "node")
    deployment = component(manifests, "Deployment", "cluster")
    agents = find_agents(
        TemplateLister([daemonset, deployment]), namespace=NAMESPACE, nodes=None, via="direct"
    )
    roles = {a.role: a for a in agents}
    assert set(roles) == {"node", "cluster"}
    (port,) = [p for p in container(daemonset)["ports"] if p["name"] == PORT_NAME]
    assert roles["node"].url == f"http://10.0.0.1:{port['containerPort']}"
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert labels[COMPONENT_LABEL] == "node"


def test_the_cluster_view_may_list_pods_and_has_its_token() -> None:
    manifests = render()
    deployment = component(manifests, "Deployment", "cluster")
    account = pod_spec(deployment)["serviceAccountName"]
    assert pod_spec(deployment)["automountServiceAccountToken"] is True
    bindings = [
        b for b in of_kind(manifests, "ClusterRoleBinding") if b["subjects"][0]["name"] == account
    ]
    (binding,) = bindings
    (role,) = [
        r
        for r in of_kind(manifests, "ClusterRole")
        if r["metadata"]["name"] == binding["roleRef"]["name"]
    ]
    # A ClusterRole bound cluster-wide: the agents are listed in the release's namespace.
    assert {"list"} <= set(role["rules"][0]["verbs"]) and role["rules"][0]["resources"] == ["pods"]
