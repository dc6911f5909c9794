"""Helpers of the chart tests: a real helm (scripts/get-helm), rendering, manifest lookups.

Every tool is required: a missing helm or kubernetes-validate fails the tests, never skips
them (CI must notice when the chart stopped being checked).
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "gpuledger"
CI_DIR = CHART / "ci"
SCENARIOS = sorted(p.name for p in CI_DIR.glob("*-values.yaml"))
HELM_MAJORS = ("3", "4")
RELEASE = "gl"
NAMESPACE = "gpu-monitoring"

Manifest = dict[str, Any]


@functools.cache
def helm_binary(major: str) -> str:
    """Path of a real helm of this major, fetched once into .cache/helm by scripts/get-helm."""
    result = subprocess.run(
        [str(REPO / "scripts" / "get-helm"), major],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"scripts/get-helm {major} failed (helm is required):\n{result.stderr}")
    return result.stdout.strip().splitlines()[-1]


def run_helm(major: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [helm_binary(major), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def values_args(values_files: Iterable[str] = (), sets: Iterable[str] = ()) -> list[str]:
    args: list[str] = []
    for name in values_files:
        args += ["-f", str(CI_DIR / name) if "/" not in name else name]
    for item in sets:
        args += ["--set", item]
    return args


@functools.cache
def _render_text(
    major: str, values_files: tuple[str, ...], sets: tuple[str, ...], kube_version: str
) -> str:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    if kube_version:
        args += ["--kube-version", kube_version]
    return run_helm(major, *args, *values_args(values_files, sets)).stdout


def render(
    *values_files: str, sets: Iterable[str] = (), major: str = "3", kube_version: str = ""
) -> list[Manifest]:
    """`helm template` of the chart: every non-empty document, parsed."""
    text = _render_text(major, tuple(values_files), tuple(sets), kube_version)
    return [doc for doc in yaml.safe_load_all(text) if doc]


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = of_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def component(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    found = [
        m
        for m in of_kind(manifests, kind)
        if m["metadata"]["labels"].get("app.kubernetes.io/component") == name
    ]
    assert len(found) == 1, f"expected one {kind} of component {name}, found {len(found)}"
    return found[0]


def pod_spec(workload: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Manifest) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


def env_of(workload: Manifest) -> dict[str, Any]:
    """name -> value (a string) or the valueFrom object."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(workload)["env"]}
