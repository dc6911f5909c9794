"""cluster.prometheus: the chart points the cluster view's fleet page at Prometheus (serve's
--prometheus-* flags through their variables), its token and CA as mounted files, and is
off by default (the cluster page reads every agent)."""

from __future__ import annotations

import posixpath

from tests.helm.chart import component, container, env_of, pod_spec, render


def test_off_by_default_the_cluster_view_gets_no_prometheus() -> None:
    view = component(render(), "Deployment", "cluster")
    assert not [k for k in env_of(view) if k.startswith("GPULEDGER_PROMETHEUS")]


def test_the_fleet_scenario_passes_the_url_token_and_ca_as_files() -> None:
    manifests = render("fleet-values.yaml")
    view = component(manifests, "Deployment", "cluster")
    env = env_of(view)
    assert env["GPULEDGER_PROMETHEUS_URL"] == "https://prometheus-operated.monitoring:9090"
    assert env["GPULEDGER_PROMETHEUS_SERVER_NAME"] == "prometheus-operated.monitoring.svc"
    assert env["GPULEDGER_PROMETHEUS_SELECTOR"] == 'cluster="prod"'
    mounts = {m["name"]: m for m in container(view)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(view)["volumes"]}
    for variable, volume, secret in (
        (
            "GPULEDGER_PROMETHEUS_BEARER_TOKEN_FILE",
            "prometheus-token",
            "gpuledger-prometheus-token",
        ),
        ("GPULEDGER_PROMETHEUS_CA_FILE", "prometheus-ca", "prometheus-ca"),
    ):
        # The variable names a file inside the Secret's read-only mount: never its value.
        path = env[variable]
        assert posixpath.dirname(path) == mounts[volume]["mountPath"]
        assert mounts[volume]["readOnly"] is True
        assert volumes[volume]["secret"]["secretName"] == secret
        assert posixpath.basename(path) in {i["path"] for i in volumes[volume]["secret"]["items"]}
    # Only the cluster view reads Prometheus.
    node = component(manifests, "DaemonSet", "node")
    assert not [k for k in env_of(node) if k.startswith("GPULEDGER_PROMETHEUS")]
