"""The chart's gateway (cluster.gateway): off by default and granting nothing new; on, the
cluster view reads InferencePools, their pods and pickers' Services, and sends pickers the
token of a service account that may only GET /metrics, mounted into the cluster view alone,
never its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuledger.cli.flags import build_parser
from gpuledger.cli.serve import serve_config
from tests.helm.chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    component,
    env_of,
    of_kind,
    pod_spec,
    render,
    run_helm,
)

GATEWAY = "gateway-values.yaml"
READER = f"{RELEASE}-gpuledger-picker-reader"


def _names(manifests: list[dict[str, Any]], kind: str) -> set[str]:
    return {m["metadata"]["name"] for m in of_kind(manifests, kind)}


def _cluster_role(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (role,) = [
        r for r in of_kind(manifests, "ClusterRole") if r["metadata"]["name"].endswith("-cluster")
    ]
    return role


def test_off_by_default_it_grants_nothing_and_says_off() -> None:
    manifests = render()
    assert READER not in _names(manifests, "ServiceAccount") | _names(manifests, "Secret")
    rules = _cluster_role(manifests)["rules"]
    assert not [r for r in rules if "inference.networking.k8s.io" in r["apiGroups"]]
    assert not [r for r in rules if "services" in r["resources"]]
    assert env_of(component(manifests, "Deployment", "cluster"))["GPULEDGER_GATEWAY"] == "off"


def test_on_the_cluster_view_may_read_pools_pods_and_picker_services_only() -> None:
    manifests = render(GATEWAY)
    rules = _cluster_role(manifests)["rules"]
    assert {
        "apiGroups": ["inference.networking.k8s.io"],
        "resources": ["inferencepools"],
        "verbs": ["get", "list", "watch"],
    } in rules
    assert {"apiGroups": [""], "resources": ["services"], "verbs": ["get"]} in rules
    assert all("nonResourceURLs" not in r for r in rules)
    env = env_of(component(manifests, "Deployment", "cluster"))
    assert env["GPULEDGER_GATEWAY"] == "auto"
    assert (
        env["GPULEDGER_GATEWAY_PICKER_URLS"] == "llm/pool-b=https://pool-b-epp.llm.svc:9090/metrics"
    )
    assert env["GPULEDGER_GATEWAY_PICKER_TOKEN_FILE"] == "/etc/gpuledger/picker-token/token"
    assert env["GPULEDGER_GATEWAY_PICKER_CA_FILE"] == "/etc/gpuledger/picker-ca/ca.crt"


def test_pickers_get_a_token_that_may_only_get_metrics_mounted_into_the_cluster_view_alone() -> (
    None
):
    manifests = render(GATEWAY)
    (secret,) = [s for s in of_kind(manifests, "Secret") if s["metadata"]["name"] == READER]
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == READER
    (account,) = [
        a for a in of_kind(manifests, "ServiceAccount") if a["metadata"]["name"] == READER
    ]
    assert account["automountServiceAccountToken"] is False
    (role,) = [r for r in of_kind(manifests, "ClusterRole") if r["metadata"]["name"] == READER]
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    (binding,) = [
        b for b in of_kind(manifests, "ClusterRoleBinding") if b["metadata"]["name"] == READER
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": READER, "namespace": NAMESPACE}
    ]
    # Mounted into the cluster view only; the cluster view still runs as its own account.
    deployment = component(manifests, "Deployment", "cluster")
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["picker-token"]["secret"]["secretName"] == READER
    assert pod_spec(deployment)["serviceAccountName"] != READER
    (daemonset,) = of_kind(manifests, "DaemonSet")
    assert "picker-token" not in {v["name"] for v in pod_spec(daemonset)["volumes"]}
    assert not [k for k in env_of(daemonset) if k.startswith("GPULEDGER_GATEWAY_PICKER")]


def test_an_existing_secret_is_used_instead_of_creating_the_reader() -> None:
    manifests = render(GATEWAY, sets=["cluster.gateway.pickerToken.existingSecret=my-picker-token"])
    assert READER not in _names(manifests, "ServiceAccount") | _names(manifests, "Secret")
    assert READER not in _names(manifests, "ClusterRole")
    volumes = {
        v["name"]: v for v in pod_spec(component(manifests, "Deployment", "cluster"))["volumes"]
    }
    assert volumes["picker-token"]["secret"]["secretName"] == "my-picker-token"


def test_the_schema_refuses_a_picker_url_that_is_no_http_url() -> None:
    result = run_helm(
        "3",
        "template",
        RELEASE,
        str(CHART),
        "--set",
        "cluster.gateway.enabled=true",
        "--set",
        "cluster.gateway.pickerURLs.llm/pool-a=ftp://x",
        check=False,
    )
    assert result.returncode != 0 and "pickerURLs" in result.stderr


def test_the_rendered_settings_are_what_the_exporter_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cluster view's GATEWAY variables, through serve's own flags, give the pipeline
    the gateway on, the configured picker URL and the picker token (from its file)."""
    env = env_of(component(render(GATEWAY), "Deployment", "cluster"))
    token = tmp_path / "token"
    token.write_text("picker-token-canary\n")
    for name, value in env.items():
        if name.startswith("GPULEDGER_GATEWAY"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("GPULEDGER_GATEWAY_PICKER_TOKEN_FILE", str(token))
    monkeypatch.setenv("GPULEDGER_GATEWAY_PICKER_CA_FILE", str(tmp_path / "ca.crt"))
    args = build_parser().parse_args(["serve", "--mode", "cluster", "--kubernetes", "on"])
    config = serve_config(args)
    assert config.gateway is True
    assert config.gateway_picker_urls == (
        ("llm/pool-b", "https://pool-b-epp.llm.svc:9090/metrics"),
    )
    assert config.gateway_picker_token == "picker-token-canary"
    assert "picker-token-canary" not in repr(config)
