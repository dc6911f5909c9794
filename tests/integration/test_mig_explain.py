"""`gpuledger explain` and the /ledger page on a MIG node: pod -> container -> MIG device
(its GPU, GPU instance, profile), and MIG devices listed under their GPU."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpuledger.explain.chain import explain, render_text
from gpuledger.sim.harness import settled_document
from gpuledger.sim.scenario import parse_scenario
from gpuledger.web.node_page import render_page
from tests.integration.test_mig_attribution import GPU_A, GPU_B, GPU_PLAIN, MIGS, mig_node

SIMULATED = "SIMULATED: mig-node served by gpuledger demo or simulate, not real hardware\n"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    doc = mig_node("mixed")
    doc["processes"][0]["gpu_memory"] = {}  # p1 holds its MIG device and never opens it
    return settled_document(parse_scenario(doc, "mig.yaml"))


def test_explain_names_the_mig_device_its_gpu_instance_and_profile(
    document: dict[str, Any],
) -> None:
    for i, (mig, parent, _, profile, gi) in enumerate(MIGS):
        text = render_text(explain([document], pod=f"mig/p{i + 1}"))
        assert f"container c{i + 1}" in text
        wanted = f"ordinal 0 -> {mig} ({parent} instance {gi}, {profile})  host index "
        assert wanted in text, text
        assert text.index(f"pod mig/p{i + 1}") < text.index(f"container c{i + 1}")
        assert text.index(f"container c{i + 1}") < text.index(wanted)
    # The disagreement names the MIG device the same way.
    text = render_text(explain([document], pod="mig/p1"))
    mig, parent, _, profile, gi = MIGS[0]
    assert f"allocated unused: mig/p1 container c1 and GPU {mig} ({parent} instance {gi}" in text


def test_explain_by_mig_device_and_by_its_gpu(document: dict[str, Any]) -> None:
    mig, parent, _, profile, gi = MIGS[3]
    text = render_text(explain([document], gpu=mig[:14])).removeprefix(SIMULATED)
    assert text.startswith(f"MIG device {mig} ({parent} instance {gi}, {profile})  index 1 ")
    assert "workload mig/p4" in text and "workload mig/p5" not in text
    # A GPU in MIG mode: every workload on one of its MIG devices.
    text = render_text(explain([document], gpu=GPU_B)).removeprefix(SIMULATED)
    assert text.startswith(f"GPU {GPU_B}  index 1 ")
    assert re.findall(r"^workload (\S+)", text, re.M) == ["mig/p4", "mig/p5"]


def test_the_page_lists_mig_devices_under_their_gpu(document: dict[str, Any]) -> None:
    page = render_page(document)
    order = [GPU_A, *(m[0] for m in MIGS if m[1] == GPU_A), GPU_B]
    order += [*(m[0] for m in MIGS if m[1] == GPU_B), GPU_PLAIN]
    at = [page.index(f"<code>{u}</code>") for u in order]
    assert at == sorted(at), "MIG devices are not right under their GPU"
    for mig, parent, index, profile, gi in MIGS:
        row = re.search(rf"<tr class=mig><td>([^<]*)</td><td><code>{mig}</code>.*?</tr>", page)
        assert row is not None, mig
        gpu_index = 0 if parent == GPU_A else 1
        assert row.group(1) == f"{gpu_index}:{index}"
        assert f"MIG {profile} (GI {gi} · CI 0)" in row.group(0)
    p2 = re.search(rf"<td><code>{MIGS[1][0]}</code>.*?</tr>", page)
    assert p2 is not None and "mig/p2" in p2.group(0)
    p1 = re.search(rf"<td><code>{MIGS[0][0]}</code>.*?</tr>", page)
    assert p1 is not None and "allocated unused: mig/p1" in p1.group(0)
