"""docs/metrics.md's family tables and docs/scaling.md's budget tables, rendered from the
declarations in export/families.py (scripts/render-metrics-docs). Each table sits between
`<!-- families:<section> -->` or `<!-- budget:<mode> -->` and `<!-- /families -->` or
`<!-- /budget -->`; the prose around it is the page's own."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from gpuledger.export.families import (
    ENGINE_LABELS,
    FAMILIES,
    GPUS,
    MIG,
    FamilySpec,
    Mode,
)

_METRICS_HEAD = (
    "| metric | type | labels beyond node | stability | meaning |",
    "|---|---|---|---|---|",
)
_BUDGET_HEAD = (
    "| family | bound | what bounds it | worst case |",
    "|---|---|---|---|",
)
# The MIG table's rows beyond gpuledger_mig_device_info: every family keyed by gpu_uuid.
_MIG_NVML = (
    "The MIG device's NVML state and memory (its GPU instance's share). There is no "
    "`gpuledger_gpu_utilization_ratio` for a MIG device, nor for a GPU in MIG mode: NVML "
    "answers `NOT_SUPPORTED`, and none is invented."
)
_MIG_OTHERS = (
    "Per MIG device: a process is counted on the MIG device NVML lists it on, never again on "
    "its GPU. PodResources device ids (MIG UUIDs under the device plugin's `single` "
    "strategy, resource `nvidia.com/gpu`, and its `mixed` strategy, "
    "`nvidia.com/mig-<profile>`; `<gpu>:<mig>` under its index strategy) and "
    "`NVIDIA_VISIBLE_DEVICES`/`CUDA_VISIBLE_DEVICES` (MIG UUIDs, `<gpu>:<mig>`, the legacy "
    "`MIG-GPU-<uuid>/<gi>/<ci>`) resolve to the MIG UUID, so allocated-unused and "
    "unallocated-use are judged per MIG device."
)


def _labels(spec: FamilySpec) -> str:
    labels = list(spec.labels)
    if tuple(labels[: len(ENGINE_LABELS)]) == ENGINE_LABELS:
        labels[: len(ENGINE_LABELS)] = ["engine labels"]
    return ", ".join(labels) or "—"


def _names(specs: Iterable[FamilySpec]) -> str:
    return ", ".join(f"`{s.name}`" for s in specs)


def family_rows(section: str, families: Iterable[FamilySpec] = FAMILIES) -> list[str]:
    """docs/metrics.md's table for one section."""
    specs = list(families)
    rows = [
        f"| `{s.name}` | {s.kind} | {_labels(s)} | {s.stability} | {s.meaning} |"
        for s in specs
        if s.section == section
    ]
    if section == MIG:
        nvml = [s for s in specs if s.device and s.section == GPUS]
        others = [s for s in specs if s.device and s.section != GPUS]
        rows.append(
            f"| {_names(nvml)} | gauge | gpu_uuid, parent_gpu_uuid | experimental | {_MIG_NVML} |"
        )
        rows.append(
            f"| {_names(others)} | gauge | as in their tables, plus parent_gpu_uuid "
            f"| as in their tables | {_MIG_OTHERS} |"
        )
    return [*_METRICS_HEAD, *rows]


def budget_rows(mode: Mode, families: Iterable[FamilySpec] = FAMILIES) -> list[str]:
    """docs/scaling.md's budget table for one mode, with its total."""
    rows = [(s.name, b) for s in families for b in s.budget if b.mode == mode]
    lines = [f"| `{name}` | {b.bound} | {b.bounded_by} | {b.worst:,} |" for name, b in rows]
    total = sum(b.worst for _, b in rows)
    return [*_BUDGET_HEAD, *lines, f"| **total** | | | **{total:,}** |"]


def _fill(text: str, kind: str, render: Callable[[str], list[str]]) -> str:
    pattern = re.compile(rf"(<!-- {kind}:(\w+) -->\n)(.*?)(<!-- /{kind} -->)", re.S)

    def table(found: re.Match[str]) -> str:
        return found[1] + "\n".join(render(found[2])) + "\n" + found[4]

    return pattern.sub(table, text)


def metrics_md(text: str) -> str:
    """docs/metrics.md with every `families:` table rendered."""
    return _fill(text, "families", family_rows)


def scaling_md(text: str) -> str:
    """docs/scaling.md with every `budget:` table rendered."""
    return _fill(text, "budget", lambda mode: budget_rows(_mode(mode)))


def _mode(name: str) -> Mode:
    if name == "node":
        return "node"
    if name == "cluster":
        return "cluster"
    raise ValueError(f"no mode {name!r}")
