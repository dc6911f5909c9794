"""docs/alertmanager-example.yaml is valid and routes every alert by its layer."""

from __future__ import annotations

import pytest

from tests.mixin.helpers import ALERTMANAGER_EXAMPLE, alerts, run, tool

# Where each layer goes; critical exporter alerts page.
RECEIVERS = {
    "placement": "gpu-capacity",
    "startup": "serving-platform",
    "engine": "inference-engine",
    "routing": "traffic",
    "ledger": "gpu-platform",
    "exporter": "observability",
}


def _expected_receiver(labels: dict[str, str]) -> str:
    if labels["layer"] == "exporter" and labels["severity"] == "critical":
        return "observability-page"
    return RECEIVERS[labels["layer"]]


def test_amtool_check_config() -> None:
    result = run([tool("amtool"), "check-config", str(ALERTMANAGER_EXAMPLE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_layers_go_to_different_receivers() -> None:
    assert len(set(RECEIVERS.values())) == len(RECEIVERS)


@pytest.mark.parametrize("alert", alerts(), ids=lambda a: a["alert"])
def test_amtool_routes_every_alert_by_layer(alert: dict) -> None:
    labels = {"alertname": alert["alert"], **alert["labels"], "namespace": "ml", "workload": "chat"}
    expected = _expected_receiver(alert["labels"])
    result = run(
        [
            tool("amtool"),
            "config",
            "routes",
            "test",
            f"--config.file={ALERTMANAGER_EXAMPLE}",
            f"--verify.receivers={expected}",
            *(f"{k}={v}" for k, v in labels.items()),
        ]
    )
    assert result.returncode == 0, (
        f"{alert['alert']} -> {result.stdout.strip()} (expected {expected})"
    )


def test_other_alerts_do_not_reach_the_gpuledger_receivers() -> None:
    result = run(
        [
            tool("amtool"),
            "config",
            "routes",
            "test",
            f"--config.file={ALERTMANAGER_EXAMPLE}",
            "--verify.receivers=default",
            "alertname=KubePodCrashLooping",
            "layer=engine",
            "severity=warning",
        ]
    )
    assert result.returncode == 0, result.stdout + result.stderr
