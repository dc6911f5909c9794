"""The Helm chart (helm/gpuledger) with a real helm v3 and v4.

Lint and render every install scenario (ci/*-values.yaml), validate the rendered objects
against the Kubernetes OpenAPI schemas of the oldest and newest supported Kubernetes
(kubernetes-validate, strict: unknown fields fail), and assert what a user would notice:
host access, security context, RBAC, labels and selectors, optional objects.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from gpuledger import __version__
from tests.helm.chart import (
    CHART,
    CI_DIR,
    HELM_MAJORS,
    NAMESPACE,
    RELEASE,
    REPO,
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

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - the test extra installs it
    kubernetes_validate = None

# Chart.yaml kubeVersion is ">=1.28.0-0": validate against that and the newest schemas.
OLDEST_KUBERNETES = "1.28.0"
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
OPTIONAL_KINDS = MONITORING_KINDS | {"ConfigMap", "NetworkPolicy"}
# The mixin's rules and dashboards select scrape jobs with this (config.libsonnet).
MIXIN_JOB_SELECTOR = re.compile(r"gpuledger.*")
READ_VERBS = {"get", "list", "watch"}
READ_VERBS_ORDER = ["get", "list", "watch"]


def test_scenarios_cover_the_install_cases() -> None:
    assert {
        "minimal-values.yaml",
        "kube-prometheus-stack-values.yaml",
        "no-ray-values.yaml",
        "mig-timeslicing-values.yaml",
        "secure-values.yaml",
    } <= set(SCENARIOS)


def test_app_version_is_the_exporter_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert chart["kubeVersion"] == f">={OLDEST_KUBERNETES}-0"


# --- helm lint / template with both majors ------------------------------------------------


@pytest.mark.parametrize("major", HELM_MAJORS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict(major: str, scenario: str) -> None:
    result = run_helm(major, "lint", "--strict", str(CHART), "-f", str(CI_DIR / scenario))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("major", HELM_MAJORS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_template_renders_the_same_with_both_majors(major: str, scenario: str) -> None:
    manifests = render(scenario, major=major)
    assert of_kind(manifests, "DaemonSet") or of_kind(manifests, "Deployment")
    assert manifests == render(scenario, major="3")


@pytest.mark.parametrize("major", HELM_MAJORS)
def test_kubernetes_older_than_supported_is_refused(major: str) -> None:
    result = run_helm(
        major, "template", RELEASE, str(CHART), "--kube-version", "1.27.0", check=False
    )
    assert result.returncode != 0
    assert "kubeVersion" in result.stderr or "incompatible" in result.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_notes_render(scenario: str) -> None:
    # helm v4's client-side dry run renders NOTES.txt without a cluster (v3's needs one).
    result = run_helm(
        "4",
        "install",
        RELEASE,
        str(CHART),
        "--dry-run=client",
        "--namespace",
        NAMESPACE,
        "-f",
        str(CI_DIR / scenario),
    )
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} get" in notes or "kubectl -n monitoring get" in notes
    assert "gpuledger_source_up" in notes


# --- schemas -------------------------------------------------------------------------------


def _validator() -> Any:
    if kubernetes_validate is None:
        pytest.fail("kubernetes-validate is required: .venv/bin/pip install kubernetes-validate")
    return kubernetes_validate


# Fields of the Prometheus Operator objects the chart writes (monitoring.coreos.com/v1);
# kubernetes-validate has no schemas for CRDs, so these are checked structurally.
_MONITOR_SPEC = {"jobLabel", "namespaceSelector", "selector", "endpoints", "podMetricsEndpoints"}
_ENDPOINT = {
    "port",
    "path",
    "scheme",
    "interval",
    "scrapeTimeout",
    "honorLabels",
    "relabelings",
    "metricRelabelings",
    "tlsConfig",
    "basicAuth",
}
# Endpoint TLSConfig (ServiceMonitor) / SafeTLSConfig (PodMonitor: no *File fields).
_SAFE_TLS_CONFIG = {
    "ca",
    "cert",
    "keySecret",
    "serverName",
    "insecureSkipVerify",
    "minVersion",
    "maxVersion",
}
_TLS_CONFIG = _SAFE_TLS_CONFIG | {"caFile", "certFile", "keyFile"}
_SECRET_KEY_SELECTOR = {"name", "key", "optional"}
_RELABEL = {
    "action",
    "sourceLabels",
    "separator",
    "targetLabel",
    "regex",
    "modulus",
    "replacement",
}
_RULE = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


def _check_monitoring_object(manifest: Manifest) -> None:
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
    spec = manifest["spec"]
    if manifest["kind"] == "PrometheusRule":
        assert set(spec) == {"groups"}
        for group in spec["groups"]:
            assert set(group) <= {"name", "interval", "rules", "limit"}, group.keys()
            for rule in group["rules"]:
                assert set(rule) <= _RULE, rule.keys()
                assert ("record" in rule) != ("alert" in rule)
                assert isinstance(rule["expr"], str)
                assert all(isinstance(v, str) for v in rule.get("labels", {}).values())
                assert all(isinstance(v, str) for v in rule.get("annotations", {}).values())
        return
    assert set(spec) <= _MONITOR_SPEC, spec.keys()
    assert isinstance(spec["selector"], dict)
    endpoints = spec["endpoints" if manifest["kind"] == "ServiceMonitor" else "podMetricsEndpoints"]
    for endpoint in endpoints:
        assert set(endpoint) <= _ENDPOINT, endpoint.keys()
        assert _DURATION.match(endpoint["interval"]) and _DURATION.match(endpoint["scrapeTimeout"])
        assert isinstance(endpoint["honorLabels"], bool)
        assert endpoint["scheme"] in ("http", "https")
        tls_fields = _TLS_CONFIG if manifest["kind"] == "ServiceMonitor" else _SAFE_TLS_CONFIG
        tls_config = endpoint.get("tlsConfig", {})
        assert set(tls_config) <= tls_fields, tls_config.keys()
        if "basicAuth" in endpoint:
            assert set(endpoint["basicAuth"]) <= {"username", "password"}
            for selector in endpoint["basicAuth"].values():
                assert set(selector) <= _SECRET_KEY_SELECTOR and {"name", "key"} <= set(selector)
        for relabel in endpoint.get("relabelings", []) + endpoint.get("metricRelabelings", []):
            assert set(relabel) <= _RELABEL, relabel.keys()


@pytest.mark.parametrize("kube_version", [OLDEST_KUBERNETES, "latest"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_manifests_validate_against_kubernetes_schemas(scenario: str, kube_version: str) -> None:
    validator = _validator()
    version = validator.latest_version() if kube_version == "latest" else kube_version
    manifests = render(scenario, kube_version=version)
    assert manifests
    for manifest in manifests:
        if manifest["kind"] in MONITORING_KINDS:
            _check_monitoring_object(manifest)
            continue
        try:
            validator.validate(manifest, version, strict=True)
        except validator.ValidationError as exc:
            pytest.fail(
                f"{manifest['kind']}/{manifest['metadata']['name']} is not valid for "
                f"Kubernetes {version}: {exc.message} at {list(exc.path)}"
            )


def test_strict_validation_rejects_an_unknown_field() -> None:
    """Guards the check above: an unknown field must fail, not pass silently."""
    validator = _validator()
    daemonset = one(render(), "DaemonSet")
    pod_spec(daemonset)["hostPIDs"] = True
    with pytest.raises(validator.ValidationError):
        validator.validate(daemonset, OLDEST_KUBERNETES, strict=True)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["cluster.mode=galaxy"], "mode"),
        (["exporter.logFormat=galaxy"], "logFormat"),
        (["exporter.port=70000"], "port"),
        (["ray.workload=no-slash"], "workload"),
        (["jobName="], "jobName"),
        (["node.podResources.hostPath=relative/dir"], "hostPath"),
        (["node.resources.request.cpu=1"], "resources"),  # a typo of requests
    ],
)
@pytest.mark.parametrize("major", HELM_MAJORS)
def test_schema_rejects_bad_values(major: str, sets: list[str], message: str) -> None:
    args = ["template", RELEASE, str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = run_helm(major, *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize("major", HELM_MAJORS)
@pytest.mark.parametrize("interval", ["-1", "0"])
def test_schema_rejects_non_positive_interval(major: str, interval: str, tmp_path: Any) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(f"exporter:\n  interval: {interval}\n")
    result = run_helm(major, "template", RELEASE, str(CHART), "-f", str(values), check=False)
    assert result.returncode != 0
    assert "interval" in result.stderr, result.stderr


# --- the node agent ------------------------------------------------------------------------


def test_daemonset_runs_in_the_host_pid_namespace_with_minimal_host_access() -> None:
    daemonset = one(render(), "DaemonSet")
    spec = pod_spec(daemonset)
    assert spec["hostPID"] is True
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    # The only host path: the kubelet's pod-resources *directory*, read-only.
    host_volumes = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    assert host_volumes == {
        "pod-resources": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    }
    mounts = {m["name"]: m for m in container(daemonset)["volumeMounts"]}
    assert mounts["pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True
    env = env_of(daemonset)
    assert env["GPULEDGER_PODRESOURCES_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert (
        env["GPULEDGER_PROC_ROOT"] == "/proc"
    )  # with hostPID, the container's /proc is the host's
    assert env["GPULEDGER_MODE"] == "node"


def test_daemonset_node_name_comes_from_the_downward_api() -> None:
    for kind in ("DaemonSet", "Deployment"):
        env = env_of(one(render(), kind))
        assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_daemonset_security_context_drops_everything_but_what_environ_needs() -> None:
    daemonset = one(render(), "DaemonSet")
    security = container(daemonset)["securityContext"]
    assert security["capabilities"]["drop"] == ["ALL"]
    # DAC_READ_SEARCH: /proc/<pid>/environ is mode 0400, owned by the process's user.
    # SYS_PTRACE: reading it is a PTRACE_MODE_READ_FSCREDS check (proc_pid_environ(5)).
    assert sorted(security["capabilities"]["add"]) == ["DAC_READ_SEARCH", "SYS_PTRACE"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert pod_spec(daemonset)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_daemonset_probes_use_healthz_and_readyz() -> None:
    for kind in ("DaemonSet", "Deployment"):
        workload = one(render(), kind)
        c = container(workload)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {"metrics": 9402}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_daemonset_schedules_on_gpu_nodes() -> None:
    spec = pod_spec(one(render(), "DaemonSet"))
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = {expr["key"] for term in terms for expr in term["matchExpressions"]}
    assert {"feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"} <= keys


def test_daemonset_nvml_access_choices() -> None:
    default = one(render(), "DaemonSet")
    assert "runtimeClassName" not in pod_spec(default)
    env = env_of(default)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"

    runtime_class = one(render(sets=["node.nvml.runtimeClassName=nvidia"]), "DaemonSet")
    assert pod_spec(runtime_class)["runtimeClassName"] == "nvidia"

    no_env = one(render(sets=["node.nvml.env=false"]), "DaemonSet")
    assert not {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"} & set(env_of(no_env))


def test_daemonset_without_pod_resources_has_no_host_path() -> None:
    daemonset = one(render(sets=["node.podResources.enabled=false"]), "DaemonSet")
    assert not [v for v in pod_spec(daemonset)["volumes"] if "hostPath" in v]
    assert env_of(daemonset)["GPULEDGER_PODRESOURCES_SOCKET"] == ""


# docs/install.md, "Resources": measured by benchmarks/rss_serve.py (steady) and
# benchmarks/hostile_memory.py (the worst answers each source may be sent).
DEFAULT_RESOURCES = {
    "DaemonSet": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "384Mi"}},
    "Deployment": {"requests": {"cpu": "50m", "memory": "192Mi"}, "limits": {"memory": "512Mi"}},
}


def test_resources_default_to_the_measured_budget_and_priority_class_is_optional() -> None:
    manifests = render()
    for kind, resources in DEFAULT_RESOURCES.items():
        workload = one(manifests, kind)
        assert container(workload)["resources"] == resources  # no CPU limit: no throttling
        assert "priorityClassName" not in pod_spec(workload)
    cleared = render(sets=["node.resources=null", "cluster.resources=null"])
    for kind in DEFAULT_RESOURCES:
        assert "resources" not in container(one(cleared, kind))
    daemonset = one(render("kube-prometheus-stack-values.yaml"), "DaemonSet")
    assert pod_spec(daemonset)["priorityClassName"] == "system-node-critical"
    assert container(daemonset)["resources"]["requests"]["memory"]


def test_gpu_resources_reach_the_exporter() -> None:
    env = env_of(one(render("mig-timeslicing-values.yaml"), "DaemonSet"))
    assert env["GPULEDGER_GPU_RESOURCES"] == "nvidia.com/gpu,nvidia.com/gpu.shared,nvidia.com/mig-*"


# --- the cluster view ----------------------------------------------------------------------


def test_deployment_is_one_cluster_mode_replica_with_its_own_service_account() -> None:
    manifests = render()
    deployment = one(manifests, "Deployment")
    daemonset = one(manifests, "DaemonSet")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert env_of(deployment)["GPULEDGER_MODE"] == "cluster"
    account = pod_spec(deployment)["serviceAccountName"]
    assert account != pod_spec(daemonset)["serviceAccountName"]
    assert account in {sa["metadata"]["name"] for sa in of_kind(manifests, "ServiceAccount")}


def test_deployment_needs_no_host_access_and_runs_as_non_root() -> None:
    deployment = one(render(), "Deployment")
    spec = pod_spec(deployment)
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    assert not [v for v in spec["volumes"] if "hostPath" in v]
    assert spec["securityContext"]["runAsNonRoot"] is True
    security = container(deployment)["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False


# --- RBAC ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rbac_is_read_only_pods(scenario: str) -> None:
    """Pods, and DRA's objects where read: the node agent its slices, the cluster view claims
    and every node's slices (its count of DRA GPU nodes); with the gateway on, the cluster
    view InferencePools and Services too (the picker reader: tests/helm/test_gateway_chart.py)."""
    manifests = render(scenario)
    roles = [
        r
        for r in of_kind(manifests, "ClusterRole") + of_kind(manifests, "Role")
        if not r["metadata"]["name"].endswith("-picker-reader")
    ]
    assert roles
    dra = {"node": ["resourceslices"], "cluster": ["resourceclaims", "resourceslices"]}
    gateway = {(("inference.networking.k8s.io",), ("inferencepools",)), (("",), ("services",))}
    for role in roles:
        name = role["metadata"]["name"]
        granted = {(tuple(r["apiGroups"]), tuple(r["resources"])) for r in role["rules"]}
        want = dra["node" if name.endswith("-node") else "cluster"]
        if scenario == "gateway-values.yaml" and name.endswith("-cluster"):
            assert gateway <= granted, name
            granted -= gateway
        assert granted == {(("",), ("pods",)), (("resource.k8s.io",), tuple(want))}, name
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= READ_VERBS, rule["verbs"]
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule


def test_rbac_grants_exactly_list_and_watch_to_each_account() -> None:
    manifests = render()
    roles = {r["metadata"]["name"]: r for r in of_kind(manifests, "ClusterRole")}
    bindings = of_kind(manifests, "ClusterRoleBinding")
    accounts = {
        pod_spec(one(manifests, kind))["serviceAccountName"] for kind in ("DaemonSet", "Deployment")
    }
    bound = {}
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "ClusterRole"
        role = roles[binding["roleRef"]["name"]]
        (subject,) = binding["subjects"]
        assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE
        bound[subject["name"]] = role
    assert set(bound) == accounts
    for role in bound.values():
        node = role["metadata"]["name"].endswith("-node")
        dra = ["resourceslices"] if node else ["resourceclaims", "resourceslices"]
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
            {"apiGroups": ["resource.k8s.io"], "resources": dra, "verbs": READ_VERBS_ORDER},
        ]


def test_rbac_can_be_left_to_the_user() -> None:
    manifests = render(sets=["rbac.create=false"])
    assert not of_kind(manifests, "ClusterRole") and not of_kind(manifests, "ClusterRoleBinding")


# --- labels, selectors, services -----------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_carries_the_standard_labels(scenario: str) -> None:
    for manifest in render(scenario):
        labels = manifest["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "gpuledger"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == __version__
        assert (
            labels["helm.sh/chart"]
            == f"gpuledger-{yaml.safe_load((CHART / 'Chart.yaml').read_text())['version']}"
        )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_selectors_match_their_pods_and_services_select_them(scenario: str) -> None:
    manifests = render(scenario)
    # The scrape Services; the span receiver's node-local Service (spans.route: service,
    # port otlp-http) selects the node agents too but is no scrape target.
    services = [
        s for s in of_kind(manifests, "Service") if "gpuledger.io/job" in s["metadata"]["labels"]
    ]
    for kind in ("DaemonSet", "Deployment"):
        for workload in of_kind(manifests, kind):
            selector = workload["spec"]["selector"]["matchLabels"]
            pod_labels = workload["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= pod_labels.items()
            name = selector["app.kubernetes.io/component"]
            matching = [s for s in services if s["spec"]["selector"].items() <= pod_labels.items()]
            assert [s["metadata"]["labels"]["app.kubernetes.io/component"] for s in matching] == [
                name
            ]
            (service,) = matching
            assert service["spec"]["ports"][0]["targetPort"] == "metrics"
            assert (
                service["metadata"]["labels"]["gpuledger.io/job"] == pod_labels["gpuledger.io/job"]
            )


def test_scrape_jobs_match_the_mixin_selector() -> None:
    rules = (REPO / "mixin" / "rendered" / "gpuledger.rules.yaml").read_text()
    assert 'job=~"gpuledger.*"' in rules, "the mixin's job selector changed: update this test"
    for service in of_kind(render(), "Service"):
        assert MIXIN_JOB_SELECTOR.fullmatch(service["metadata"]["labels"]["gpuledger.io/job"])


# --- optional features ---------------------------------------------------------------------


def test_optional_objects_are_absent_by_default() -> None:
    kinds = {m["kind"] for m in render()}
    assert not kinds & OPTIONAL_KINDS
    assert kinds == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "DaemonSet",
        "Deployment",
    }


def test_components_can_be_disabled() -> None:
    only_node = {m["kind"] for m in render(sets=["cluster.enabled=false"])}
    assert "Deployment" not in only_node and "DaemonSet" in only_node
    only_cluster = render(sets=["node.enabled=false"])
    assert not of_kind(only_cluster, "DaemonSet")
    assert len(of_kind(only_cluster, "ClusterRole")) == 1


def _monitor_labels_and_relabelings(monitor: Manifest) -> tuple[dict[str, str], list[Any]]:
    spec = monitor["spec"]
    (endpoint,) = spec.get("endpoints") or spec["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True
    assert spec["jobLabel"] == "gpuledger.io/job"
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    labels: dict[str, str] = monitor["metadata"]["labels"]
    relabelings: list[Any] = endpoint["relabelings"]
    return labels, relabelings


def test_service_monitor_when_enabled() -> None:
    manifests = render("kube-prometheus-stack-values.yaml")
    monitor = one(manifests, "ServiceMonitor")
    labels, relabelings = _monitor_labels_and_relabelings(monitor)
    assert labels["release"] == "kube-prometheus-stack"
    # The exporter pod's own namespace/pod/container must not clash with the GPU pods'.
    assert {"action": "labeldrop", "regex": "(namespace|pod|container|service|endpoint)"} in (
        relabelings
    )
    selector = monitor["spec"]["selector"]
    selected = [
        s
        for s in of_kind(manifests, "Service")
        if selector["matchLabels"].items() <= s["metadata"]["labels"].items()
        and s["metadata"]["labels"]["app.kubernetes.io/component"]
        in selector["matchExpressions"][0]["values"]
    ]
    assert len(selected) == 2
    assert not of_kind(manifests, "PodMonitor")


def test_pod_monitor_when_enabled() -> None:
    manifests = render("no-ray-values.yaml")
    monitor = one(manifests, "PodMonitor")
    labels, relabelings = _monitor_labels_and_relabelings(monitor)
    assert labels["release"] == "prometheus"
    assert relabelings[0]["action"] == "labeldrop"
    assert not of_kind(manifests, "ServiceMonitor")


def test_user_relabelings_follow_the_chart_ones() -> None:
    monitor = one(render("full-values.yaml"), "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "observability"
    relabelings = monitor["spec"]["endpoints"][0]["relabelings"]
    assert relabelings[0]["action"] == "labeldrop"
    assert relabelings[1] == {"targetLabel": "cluster", "replacement": "prod-1"}


def test_prometheus_rule_holds_exactly_the_mixin_rules() -> None:
    rule = one(render("kube-prometheus-stack-values.yaml"), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    mixin = yaml.safe_load((REPO / "mixin" / "rendered" / "gpuledger.rules.yaml").read_text())
    assert rule["spec"]["groups"] == mixin["groups"]


def test_prometheus_rule_links_runbooks_where_the_values_say() -> None:
    pattern = "https://gpuledger.example.com/runbooks#%s"
    rule = one(
        render(
            "kube-prometheus-stack-values.yaml",
            sets=[f"prometheusRule.runbookURLPattern={pattern}"],
        ),
        "PrometheusRule",
    )
    mixin = yaml.safe_load((REPO / "mixin" / "rendered" / "gpuledger.rules.yaml").read_text())
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 10
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == pattern % alert["alert"].lower()
    # Only runbook_url changes: every other field is the mixin's.
    for group in mixin["groups"]:
        for r in group["rules"]:
            if "alert" in r:
                r["annotations"]["runbook_url"] = pattern % r["alert"].lower()
    assert rule["spec"]["groups"] == mixin["groups"]


def test_dashboards_are_the_mixin_dashboards_for_the_grafana_sidecar() -> None:
    configmaps = of_kind(render("kube-prometheus-stack-values.yaml"), "ConfigMap")
    sources = sorted((REPO / "mixin" / "rendered" / "dashboards").glob("*.json"))
    assert len(configmaps) == len(sources) > 0
    by_key = {}
    for configmap in configmaps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "GPU"}
        (key,) = configmap["data"]
        by_key[key] = configmap["data"][key]
    for source in sources:
        assert by_key[source.name] == source.read_text()
        json.loads(by_key[source.name])
    assert all(len(c["metadata"]["name"]) <= 63 for c in configmaps)


def test_dashboard_label_is_configurable() -> None:
    configmaps = of_kind(render("full-values.yaml"), "ConfigMap")
    assert configmaps
    for configmap in configmaps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "gpuledger"
        assert configmap["metadata"]["namespace"] == "grafana"


def test_ray_token_is_a_read_only_file_never_an_environment_variable() -> None:
    manifests = render("kube-prometheus-stack-values.yaml")
    for kind in ("DaemonSet", "Deployment"):
        workload = one(manifests, kind)
        env = env_of(workload)
        assert env["GPULEDGER_RAY_ADDRESS"] == "http://llm-head-svc.ml.svc:8265"
        assert env["GPULEDGER_RAY_TOKEN_FILE"] == "/etc/gpuledger/ray/token"
        assert not any(isinstance(v, dict) and "secretKeyRef" in v for v in env.values()), (
            "the token must not be in the environment"
        )
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert volumes["ray-token"]["secret"]["secretName"] == "ray-auth-token"
        mounts = {m["name"]: m for m in container(workload)["volumeMounts"]}
        assert mounts["ray-token"] == {
            "name": "ray-token",
            "mountPath": "/etc/gpuledger/ray",
            "readOnly": True,
        }
    no_ray = render()
    for kind in ("DaemonSet", "Deployment"):
        assert not {"GPULEDGER_RAY_ADDRESS", "GPULEDGER_RAY_TOKEN_FILE"} & set(
            env_of(one(no_ray, kind))
        )


def test_full_scenario_applies_overrides() -> None:
    manifests = render("full-values.yaml")
    daemonset = component(manifests, "DaemonSet", "node")
    c = container(daemonset)
    assert c["image"] == "registry.example.com/ml/gpuledger@sha256:" + "0" * 64
    assert c["args"] == ["serve", "--log-level", "debug"]
    assert {m["metadata"]["namespace"] for m in manifests if "namespace" in m["metadata"]} == {
        "monitoring",
        "observability",
        "grafana",
    }
    (host_volume,) = [v for v in pod_spec(daemonset)["volumes"] if "hostPath" in v]
    assert host_volume["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"
    assert env_of(daemonset)["GPULEDGER_LISTEN"] == ":9500"
    assert env_of(component(manifests, "Deployment", "cluster"))["GPULEDGER_RAY_WORKLOAD"] == (
        "ml/llm"
    )
