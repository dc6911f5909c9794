"""Hostile names and labels from pods, engines, Ray and the GPU itself are data, never
syntax: escaped in the exposition (promtool accepts it and every value parses back
exactly, text and OpenMetrics), in /ledger.json, and in the /ledger page (no element or
attribute the values try to inject).

Kubernetes restricts pod names and label values, but gpuledger does not rely on it: the
fake API server serves whatever it is given, and vLLM model names, Ray class names and
NVML device names have no such rules at all.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)

from gpuledger.sim.fake_ray import actor_entry, ray_id
from gpuledger.sim.fake_vllm import FakeEngine
from tests.conftest import samples
from tests.reliability.harness import Node, cg, source_up

GPU0 = "GPU-76000000-0000-4000-8000-000000000000"
UID = "76767676-0000-4000-8000-767676767676"
RAY_UID = "76767676-0000-4000-8000-76767676aaaa"
CID, RAY_CID = "6" * 64, "7" * 64

NODE = 'node"<i>x</i>\\'
NAMESPACE = "ns<img src=x onerror=alert(1)>"
POD = "pod\"quoted'<b>"
CONTAINER = 'c\\ "q" <u>'
WORKLOAD = 'wl\\"\n<script>alert(3)</script>'
GPU_NAME = 'H100 <svg onload=alert(2)> "q" \\'
MODEL = 'model"\\\n<svg onload=alert(4)>}{,=x'
CLASS_NAME = 'Cls\n"<script>alert(5)</script>\\'
HOSTILE = {
    "node": NODE,
    "namespace": NAMESPACE,
    "pod": POD,
    "container": CONTAINER,
    "workload": WORKLOAD,
    "model": GPU_NAME,
    "model_name": MODEL,
    "class_name": CLASS_NAME,
}
INJECTED_TAGS = {"script", "img", "svg", "i", "b", "u"}


def doc() -> dict[str, Any]:
    return {
        "node": NODE,
        "gpus": [{"uuid": GPU0, "name": GPU_NAME}],
        "processes": [
            {
                "pid": 10,
                "cgroup": cg(UID, CID),
                "cmdline": ["vllm", "serve", "--served-model-name", "m"],
                "gpu_memory": {GPU0: "1GiB"},
            },
            {"pid": 20, "nspid": [20, 5], "cgroup": cg(RAY_UID, RAY_CID), "cmdline": "ray::W"},
        ],
        "kubernetes": {
            "pods": [
                {
                    "namespace": NAMESPACE,
                    "name": POD,
                    "uid": UID,
                    "labels": {"gpuledger.io/workload": WORKLOAD},
                    "containers": [{"name": CONTAINER, "id": CID, "gpus": 1}],
                },
                {
                    "namespace": NAMESPACE,
                    "name": "ray-0",
                    "uid": RAY_UID,
                    "pod_ip": "10.4.0.2",
                    "labels": {"gpuledger.io/workload": WORKLOAD},
                    "containers": [{"name": "ray", "id": RAY_CID}],
                },
            ]
        },
        "podresources": {
            "allocations": [
                {"namespace": NAMESPACE, "pod": POD, "container": CONTAINER, "devices": [GPU0]}
            ]
        },
        "vllm": [{"pod": f"{NAMESPACE}/{POD}", "engines": [{"model_name": "m", "running": 1}]}],
        "ray": {
            "nodes": [{"name": "w", "pod": f"{NAMESPACE}/ray-0", "gpus": 1}],
            "actors": [{"class_name": "W", "node": "w", "pid": 5}],
        },
    }


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    made = Node(doc(), tmp_path_factory.mktemp("hostile"), deadline=2.0)
    # Values no scenario file may hold (newlines), set on the simulated sources directly.
    made.sim.engines[f"{NAMESPACE}/{POD}"].set_engines([FakeEngine(model_name=MODEL, running=1)])
    assert made.sim.ray is not None
    made.sim.ray.set_actors(
        [actor_entry(CLASS_NAME, node_id=ray_id("node", f"{NODE}/w"), pid=5, num_gpus=1)]
    )
    made.until(
        lambda s: (
            all(
                source_up(s, x) == 1
                for x in ("nvml", "procfs", "podresources", "kubernetes", "vllm", "ray")
            )
            and any(labels.get("model_name") == MODEL for _, labels, _ in s)
            and any(labels.get("class_name") == CLASS_NAME for _, labels, _ in s)
        )
    )
    yield made
    made.close()


def label_values(parsed: list[tuple[str, dict[str, str], float]], key: str) -> set[str]:
    return {labels[key] for _, labels, _ in parsed if key in labels}


def test_exposition_passes_promtool_and_every_value_parses_back(node: Node) -> None:
    status, body, _ = node.get("/metrics")
    assert status == 200
    text = body.decode()
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package prometheus)"
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    parsed = samples(text)
    for key, hostile in HOSTILE.items():
        assert hostile in label_values(parsed, key), (key, sorted(label_values(parsed, key)))
    # No hostile value broke a line or forged a series of its own.
    for line in text.splitlines():
        assert line.startswith(("# HELP gpuledger_", "# TYPE gpuledger_", "gpuledger_")), line


def test_openmetrics_exposition_parses_back(node: Node) -> None:
    request = urllib.request.Request(
        node.base + "/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert "openmetrics" in resp.headers["Content-Type"]
        text = resp.read().decode()
    parsed = [
        (s.name, dict(s.labels), s.value)
        for family in openmetrics_families(text)
        for s in family.samples
    ]
    for key, hostile in HOSTILE.items():
        assert hostile in label_values(parsed, key), key


def test_ledger_json_keeps_values_exactly(node: Node) -> None:
    status, body, _ = node.get("/ledger.json")
    assert status == 200
    document = json.loads(body)
    assert document["node"] == NODE
    assert {p["name"] for p in document["pods"]} >= {POD}
    assert {p["workload"] for p in document["pods"]} == {WORKLOAD}
    assert {e["model_name"] for e in document["engines"]} == {MODEL}
    assert {g["model"] for g in document["gpus"]} == {GPU_NAME}
    assert {a["class_name"] for a in document["ray"]["actors"]} == {CLASS_NAME}


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes.update(name for name, _ in attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_ledger_page_shows_values_as_text(node: Node) -> None:
    status, body, _ = node.get("/ledger")
    assert status == 200
    page = Page()
    page.feed(body.decode())
    assert not page.tags & INJECTED_TAGS, page.tags & INJECTED_TAGS
    assert not {a for a in page.attributes if a.startswith("on")}, page.attributes
    text = "".join(page.text)
    for hostile in (NODE, NAMESPACE, POD, WORKLOAD, GPU_NAME):
        assert hostile in text, hostile


def test_landing_page_escapes_the_node_name(node: Node) -> None:
    status, body, _ = node.get("/")
    assert status == 200
    page = Page()
    page.feed(body.decode())
    assert "i" not in page.tags and NODE in "".join(page.text)


def test_explain_text_carries_no_control_characters(node: Node, tmp_path: Path) -> None:
    escape = "m\x1b]0;owned\x07\x1b[2J\nverdict: serving"
    node.sim.engines[f"{NAMESPACE}/{POD}"].set_engines([FakeEngine(model_name=escape, running=1)])
    node.until(lambda s: any(labels.get("model_name") == escape for _, labels, _ in s))
    saved = tmp_path / "ledger.json"
    saved.write_bytes(node.get("/ledger.json")[1])
    from gpuledger.document.codec import from_json
    from gpuledger.explain.chain import explain, render_text

    document = from_json(json.loads(saved.read_text()))
    text = render_text(explain([document], pod=f"{NAMESPACE}/{POD}"))
    assert "engine vllm m" in text  # the engine line is there, with the name in it
    forged = [c for c in text if not c.isprintable() and c != "\n"]
    assert not forged, f"raw control characters in explain output: {forged!r}"
    verdict_lines = [ln for ln in text.splitlines() if ln.lstrip().startswith("verdict:")]
    assert len(verdict_lines) == 1, "a name forged a line of its own"
