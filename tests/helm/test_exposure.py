"""The chart's exposure controls: NetworkPolicies, TLS and basic auth (exporter.webConfig),
and the ServiceMonitor/PodMonitor settings that scrape through them.

Lint, Kubernetes-schema validation and labels of the `secure` scenario are covered by
test_chart.py's per-scenario tests; these assert what each setting does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CHART,
    CI_DIR,
    HELM_MAJORS,
    NAMESPACE,
    RELEASE,
    SCENARIOS,
    Manifest,
    component,
    container,
    env_of,
    of_kind,
    one,
    pod_spec,
    render,
    run_helm,
)

SECURE = "secure-values.yaml"
WEB_DIR = "/etc/gpuledger/web"
WORKLOADS = (("DaemonSet", "node"), ("Deployment", "cluster"))


def _secure_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CI_DIR / SECURE).read_text())
    return values


def _pod_labels(workload: Manifest) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector of matchLabels only (what the chart writes) against pod labels."""
    assert set(selector) == {"matchLabels"}, selector
    match: dict[str, str] = selector["matchLabels"]
    return match.items() <= labels.items()


def _workloads(manifests: list[Manifest]) -> dict[str, Manifest]:
    return {name: component(manifests, kind, name) for kind, name in WORKLOADS}


def _write_values(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _fails(sets: list[str], major: str) -> str:
    args = ["template", RELEASE, str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = run_helm(major, *args, check=False)
    assert result.returncode != 0, result.stdout
    return result.stderr


def test_secure_scenario_is_one_of_the_scenarios() -> None:
    assert SECURE in SCENARIOS


# --- NetworkPolicy --------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != SECURE])
def test_no_network_policy_unless_enabled(scenario: str) -> None:
    assert not of_kind(render(scenario), "NetworkPolicy")
    assert not of_kind(render(), "NetworkPolicy")


def test_one_policy_per_component_selecting_exactly_its_pods() -> None:
    manifests = render(SECURE)
    policies = of_kind(manifests, "NetworkPolicy")
    workloads = _workloads(manifests)
    assert len(policies) == len(workloads) == 2
    for name, workload in workloads.items():
        selecting = [
            p for p in policies if _selects(p["spec"]["podSelector"], _pod_labels(workload))
        ]
        assert len(selecting) == 1, f"{name} pods are selected by {len(selecting)} policies"
        (policy,) = selecting
        assert policy["metadata"]["labels"]["app.kubernetes.io/component"] == name
        assert policy["metadata"]["namespace"] == workload["metadata"]["namespace"] == NAMESPACE
        # It selects what the workload's own selector selects.
        assert policy["spec"]["podSelector"] == workload["spec"]["selector"]


def test_policies_admit_ingress_on_the_metrics_port_only_and_leave_egress_alone() -> None:
    manifests = render(SECURE)
    for name, workload in _workloads(manifests).items():
        policy = component(manifests, "NetworkPolicy", name)
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"]
        assert "egress" not in spec
        (rule,) = spec["ingress"]
        (metrics,) = [p for p in container(workload)["ports"] if p["name"] == "metrics"]
        assert rule["ports"] == [{"port": metrics["containerPort"], "protocol": "TCP"}]


def test_port_follows_exporter_port() -> None:
    manifests = render(SECURE, sets=["exporter.port=9500"])
    for policy in of_kind(manifests, "NetworkPolicy"):
        assert policy["spec"]["ingress"][0]["ports"] == [{"port": 9500, "protocol": "TCP"}]


def test_node_policy_admits_the_users_peers_and_the_cluster_view() -> None:
    manifests = render(SECURE)
    user_peers = _secure_values()["networkPolicy"]["from"]
    workloads = _workloads(manifests)
    node_from = component(manifests, "NetworkPolicy", "node")["spec"]["ingress"][0]["from"]
    assert node_from[: len(user_peers)] == user_peers
    (extra,) = node_from[len(user_peers) :]
    # A bare podSelector: pods of the policy's own namespace, i.e. the cluster view's.
    assert set(extra) == {"podSelector"}
    assert _selects(extra["podSelector"], _pod_labels(workloads["cluster"]))
    assert not _selects(extra["podSelector"], _pod_labels(workloads["node"]))
    # The cluster view is read by Prometheus only.
    cluster_from = component(manifests, "NetworkPolicy", "cluster")["spec"]["ingress"][0]["from"]
    assert cluster_from == user_peers


def test_without_the_cluster_view_the_node_policy_admits_only_the_users_peers() -> None:
    manifests = render(SECURE, sets=["cluster.enabled=false"])
    (policy,) = of_kind(manifests, "NetworkPolicy")
    assert policy["metadata"]["labels"]["app.kubernetes.io/component"] == "node"
    assert policy["spec"]["ingress"][0]["from"] == _secure_values()["networkPolicy"]["from"]
    only_cluster = of_kind(render(SECURE, sets=["node.enabled=false"]), "NetworkPolicy")
    assert [p["metadata"]["labels"]["app.kubernetes.io/component"] for p in only_cluster] == [
        "cluster"
    ]


def test_policies_follow_namespace_override() -> None:
    manifests = render(SECURE, sets=["namespaceOverride=gpu-ops"])
    for policy in of_kind(manifests, "NetworkPolicy"):
        assert policy["metadata"]["namespace"] == "gpu-ops"


def test_node_agents_are_not_host_network_so_the_policy_applies() -> None:
    spec = pod_spec(one(render(SECURE), "DaemonSet"))
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork")


@pytest.mark.parametrize("major", HELM_MAJORS)
def test_enabled_policy_without_peers_is_refused(major: str) -> None:
    assert "networkPolicy.from" in _fails(["networkPolicy.enabled=true"], major)


@pytest.mark.parametrize("major", HELM_MAJORS)
def test_schema_rejects_a_peer_that_is_not_a_network_policy_peer(major: str) -> None:
    stderr = _fails(["networkPolicy.enabled=true", "networkPolicy.from[0].namespace=x"], major)
    assert "namespace" in stderr


# --- exporter.webConfig ----------------------------------------------------------------------


def test_web_config_secrets_are_mounted_read_only_and_named_by_the_flag_variable() -> None:
    values = _secure_values()["exporter"]["webConfig"]
    for workload in _workloads(render(SECURE)).values():
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        projected = volumes["web-config"]["projected"]
        assert [s["secret"]["name"] for s in projected["sources"]] == [
            values["secretName"],
            values["tlsSecretName"],
        ]
        # Whole Secrets (no items, no subPath): rotated certificates reach the pod.
        assert all(set(s["secret"]) == {"name"} for s in projected["sources"])
        assert projected["defaultMode"] == 0o440
        mounts = [m for m in container(workload)["volumeMounts"] if m["name"] == "web-config"]
        assert mounts == [{"name": "web-config", "mountPath": WEB_DIR, "readOnly": True}]
        assert env_of(workload)["GPULEDGER_WEB_CONFIG_FILE"] == f"{WEB_DIR}/web-config.yml"


def test_web_config_without_a_tls_secret_projects_one_secret() -> None:
    manifests = render(sets=["exporter.webConfig.secretName=gpuledger-web-config"])
    for workload in _workloads(manifests).values():
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert volumes["web-config"]["projected"]["sources"] == [
            {"secret": {"name": "gpuledger-web-config"}}
        ]


def test_no_web_config_by_default() -> None:
    for workload in _workloads(render()).values():
        assert "GPULEDGER_WEB_CONFIG_FILE" not in env_of(workload)
        assert "web-config" not in {v["name"] for v in pod_spec(workload)["volumes"]}
        assert "web-config" not in {m["name"] for m in container(workload)["volumeMounts"]}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_secret_ever_becomes_an_environment_variable(scenario: str) -> None:
    for kind, _ in WORKLOADS:
        for workload in of_kind(render(scenario), kind):
            c = container(workload)
            assert "envFrom" not in c
            for entry in c["env"]:
                assert "secretKeyRef" not in entry.get("valueFrom", {}), entry["name"]


@pytest.mark.parametrize("major", HELM_MAJORS)
@pytest.mark.parametrize("flag", ["tls=true", "tlsSecretName=gpuledger-tls"])
def test_tls_without_the_web_config_secret_is_refused(major: str, flag: str) -> None:
    assert "exporter.webConfig.secretName" in _fails([f"exporter.webConfig.{flag}"], major)


@pytest.mark.parametrize("major", HELM_MAJORS)
def test_schema_rejects_a_secret_name_kubernetes_would_refuse(major: str) -> None:
    stderr = _fails(["exporter.webConfig.secretName=Web_Config"], major)
    assert "secretName" in stderr


def test_probes_use_https_with_tls_and_http_otherwise() -> None:
    for workload in _workloads(render(SECURE)).values():
        c = container(workload)
        assert c["livenessProbe"]["httpGet"] == {
            "path": "/healthz",
            "port": "metrics",
            "scheme": "HTTPS",
        }
        assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Basic auth without TLS: /healthz and /readyz stay open, the probes stay plain HTTP.
    auth_only = render(sets=["exporter.webConfig.secretName=gpuledger-web-config"])
    for workload in _workloads(auth_only).values():
        c = container(workload)
        assert "scheme" not in c["livenessProbe"]["httpGet"]
        assert "scheme" not in c["readinessProbe"]["httpGet"]


def test_a_users_non_http_probe_is_kept_as_is_with_tls(tmp_path: Path) -> None:
    # httpGet: null removes the default's handler (Helm merges maps).
    probe = {"httpGet": None, "tcpSocket": {"port": "metrics"}}
    values = _write_values(tmp_path, {"node": {"livenessProbe": probe}})
    liveness = container(one(render(SECURE, values), "DaemonSet"))["livenessProbe"]
    assert "httpGet" not in liveness
    assert liveness["tcpSocket"] == {"port": "metrics"}


# --- ServiceMonitor / PodMonitor ------------------------------------------------------------


def _endpoint(monitor: Manifest) -> dict[str, Any]:
    spec = monitor["spec"]
    (endpoint,) = spec.get("endpoints") or spec["podMetricsEndpoints"]
    found: dict[str, Any] = endpoint
    return found


def test_service_monitor_scrapes_over_https_with_tls_config_and_basic_auth() -> None:
    values = _secure_values()["serviceMonitor"]
    endpoint = _endpoint(one(render(SECURE), "ServiceMonitor"))
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == values["tlsConfig"]
    assert endpoint["basicAuth"] == values["basicAuth"]


def test_pod_monitor_scrapes_over_https_with_tls_config_and_basic_auth(tmp_path: Path) -> None:
    tls_config = {"ca": {"secret": {"name": "gpuledger-tls", "key": "ca.crt"}}, "serverName": "x"}
    basic_auth = {
        "username": {"name": "scrape-auth", "key": "username"},
        "password": {"name": "scrape-auth", "key": "password"},
    }
    values = _write_values(
        tmp_path,
        {
            "serviceMonitor": {"enabled": False},
            "podMonitor": {"enabled": True, "tlsConfig": tls_config, "basicAuth": basic_auth},
        },
    )
    endpoint = _endpoint(one(render(SECURE, values), "PodMonitor"))
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == tls_config
    assert endpoint["basicAuth"] == basic_auth


def test_monitors_scrape_plain_http_by_default() -> None:
    for scenario, kind in (
        ("kube-prometheus-stack-values.yaml", "ServiceMonitor"),
        ("no-ray-values.yaml", "PodMonitor"),
    ):
        endpoint = _endpoint(one(render(scenario), kind))
        assert endpoint["scheme"] == "http"
        assert "tlsConfig" not in endpoint and "basicAuth" not in endpoint


def test_basic_auth_without_tls_keeps_http() -> None:
    sets = [
        "exporter.webConfig.secretName=gpuledger-web-config",
        "serviceMonitor.enabled=true",
        "serviceMonitor.basicAuth.username.name=scrape-auth",
        "serviceMonitor.basicAuth.username.key=username",
        "serviceMonitor.basicAuth.password.name=scrape-auth",
        "serviceMonitor.basicAuth.password.key=password",
    ]
    endpoint = _endpoint(one(render(sets=sets), "ServiceMonitor"))
    assert endpoint["scheme"] == "http"
    assert endpoint["basicAuth"]["password"] == {"name": "scrape-auth", "key": "password"}


@pytest.mark.parametrize("major", HELM_MAJORS)
def test_schema_rejects_basic_auth_that_is_not_secret_key_selectors(major: str) -> None:
    stderr = _fails(["serviceMonitor.enabled=true", "serviceMonitor.basicAuth.user=x"], major)
    assert "user" in stderr
    stderr = _fails(["podMonitor.enabled=true", "podMonitor.basicAuth.username.name=x"], major)
    assert "key" in stderr


# --- cluster.agentAccess: the cluster view reading protected node agents ----------------------

AGENT_AUTH_DIR = "/etc/gpuledger/agent-auth"
AGENT_CA_DIR = "/etc/gpuledger/agent-ca"


def _agent_env(workload: Manifest) -> dict[str, Any]:
    return {k: v for k, v in env_of(workload).items() if k.startswith("GPULEDGER_AGENT_")}


def _volumes(workload: Manifest) -> dict[str, Any]:
    return {v["name"]: v for v in pod_spec(workload)["volumes"]}


def _mounts(workload: Manifest) -> dict[str, Any]:
    return {m["name"]: m for m in container(workload)["volumeMounts"]}


def test_the_cluster_view_reads_tls_agents_with_the_tls_secrets_ca_and_an_auth_file() -> None:
    manifests = render(SECURE)
    access = _secure_values()["cluster"]["agentAccess"]
    tls_secret = _secure_values()["exporter"]["webConfig"]["tlsSecretName"]
    cluster = component(manifests, "Deployment", "cluster")
    assert _agent_env(cluster) == {
        "GPULEDGER_AGENT_TLS": "true",
        # cert-manager's ca.crt, from the TLS Secret the web-config volume already projects
        "GPULEDGER_AGENT_CA_FILE": f"{WEB_DIR}/ca.crt",
        "GPULEDGER_AGENT_SERVER_NAME": access["serverName"],
        "GPULEDGER_AGENT_AUTH_FILE": f"{AGENT_AUTH_DIR}/auth",
    }
    volumes, mounts = _volumes(cluster), _mounts(cluster)
    assert {"secret": {"name": tls_secret}} in volumes["web-config"]["projected"]["sources"]
    assert "agent-ca" not in volumes and "agent-ca" not in mounts
    # The password is a file in a read-only mount, never an environment variable's value.
    assert volumes["agent-auth"]["secret"] == {
        "secretName": access["authSecretName"],
        "defaultMode": 0o440,
        "items": [{"key": "auth", "path": "auth"}],
    }
    assert mounts["agent-auth"] == {
        "name": "agent-auth",
        "mountPath": AGENT_AUTH_DIR,
        "readOnly": True,
    }
    # Only the cluster view reads other agents.
    assert not _agent_env(component(manifests, "DaemonSet", "node"))
    assert "agent-auth" not in _volumes(component(manifests, "DaemonSet", "node"))


def test_a_ca_secret_of_its_own_is_mounted_and_named(tmp_path: Path) -> None:
    values = _write_values(
        tmp_path,
        {
            "exporter": {"webConfig": {"tlsSecretName": ""}},
            "cluster": {"agentAccess": {"caSecretName": "agents-ca", "caKey": "bundle.pem"}},
        },
    )
    cluster = component(render(SECURE, values), "Deployment", "cluster")
    assert _agent_env(cluster)["GPULEDGER_AGENT_CA_FILE"] == f"{AGENT_CA_DIR}/bundle.pem"
    assert _volumes(cluster)["agent-ca"]["secret"] == {
        "secretName": "agents-ca",
        "defaultMode": 0o440,
        "items": [{"key": "bundle.pem", "path": "bundle.pem"}],
    }
    assert _mounts(cluster)["agent-ca"] == {
        "name": "agent-ca",
        "mountPath": AGENT_CA_DIR,
        "readOnly": True,
    }


def test_basic_auth_alone_reads_the_agents_over_http_with_the_auth_file() -> None:
    sets = [
        "exporter.webConfig.secretName=gpuledger-web-config",
        "cluster.agentAccess.authSecretName=gpuledger-agent-auth",
        "cluster.agentAccess.caSecretName=ignored-without-tls",
    ]
    cluster = component(render(sets=sets), "Deployment", "cluster")
    assert _agent_env(cluster) == {"GPULEDGER_AGENT_AUTH_FILE": f"{AGENT_AUTH_DIR}/auth"}
    assert "agent-ca" not in _volumes(cluster)


def test_no_agent_access_by_default() -> None:
    for scenario in [s for s in SCENARIOS if s != SECURE]:
        cluster = component(render(scenario), "Deployment", "cluster")
        assert not _agent_env(cluster)
        assert not {"agent-ca", "agent-auth"} & set(_volumes(cluster))


@pytest.mark.parametrize("major", HELM_MAJORS)
def test_tls_without_a_ca_for_the_cluster_view_is_refused(major: str) -> None:
    sets = ["exporter.webConfig.secretName=gpuledger-web-config", "exporter.webConfig.tls=true"]
    stderr = _fails(sets, major)
    assert "cluster.agentAccess.caSecretName" in stderr
    assert "exporter.webConfig.tlsSecretName" in stderr
    # Without the cluster view nothing reads the agents: no CA needed.
    assert of_kind(render(sets=[*sets, "cluster.enabled=false"], major=major), "DaemonSet")


@pytest.mark.parametrize("major", HELM_MAJORS)
@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("authSecretName=Agent_Auth", "authSecretName"),
        ("caSecretName=CA", "caSecretName"),
        ("serverName=not/a/name", "serverName"),
        ("password=x", "password"),
    ],
)
def test_schema_rejects_bad_agent_access(major: str, item: str, message: str) -> None:
    assert message in _fails([f"cluster.agentAccess.{item}"], major)
