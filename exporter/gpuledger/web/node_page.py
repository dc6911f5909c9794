"""The /ledger HTML page: this node's ledger at a glance. Self-contained (air-gapped),
every value escaped (label values come from pods and engines, which anyone may name)."""

from __future__ import annotations

import html
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuledger.document.v1 import (
    EngineDoc,
    GpuDoc,
    LedgerDocument,
    MigDeviceDoc,
    PendingDoc,
    PodDoc,
    SourceDoc,
)
from gpuledger.explain.chain import source_state, verdicts
from gpuledger.explain.verdict import workload_verdict
from gpuledger.web.requests_page import slowest_section

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1f24}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;width:100%} th,td{border:1px solid #d0d7de;padding:4px 8px;
text-align:left;vertical-align:top} th{background:#f3f4f6} code{font-size:12px}
.bad{color:#b42318;font-weight:600} .ok{color:#067647} .muted{color:#667085}
.stage{font-weight:600} .next{min-width:16em} a.runbook{white-space:nowrap}
tr.mig td:first-child{padding-left:1.6em} tr.mig td{background:#f9fafb}
"""


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


ORDINAL_TITLE = "the GPU's number inside this container: 0 is the first GPU it was given"
CUDA_TITLE = (
    "what the container's processes call this GPU: cuda:N after their own "
    "CUDA_VISIBLE_DEVICES, which can differ from the container ordinal"
)
NUMBERING_NOTE = (
    "# is the host index (nvidia-smi on the node). An ordinal numbers a container's GPUs; "
    "cuda:N is a process's own number for the GPU after its CUDA_VISIBLE_DEVICES, so cuda:1 "
    "can be ordinal 0. The UUID names the GPU."
)


def _cuda_numbers(doc: LedgerDocument) -> dict[tuple[str, str, str], set[int]]:
    """(pod_uid, container, GPU UUID) -> the cuda:N the container's processes call it."""
    found: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    for p in doc.processes:
        container, devices = p.container, p.cuda_devices or ()
        for g in p.gpu_memory if container is not None else ():
            if container is not None and g.gpu_uuid in devices:
                key = (container.pod_uid, container.container, g.gpu_uuid)
                found[key].add(devices.index(g.gpu_uuid))
    return found


def _host_processes(doc: LedgerDocument) -> dict[str, list[str]]:
    """GPU UUID -> the processes in no pod that hold memory on it, as HTML."""
    found: dict[str, list[str]] = defaultdict(list)
    for p in doc.processes:
        for g in p.gpu_memory if p.container is None else ():
            title = p.title or "?"
            found[g.gpu_uuid].append(_e(f"host process {p.pid} {title} ({_gib(g.used_bytes)})"))
    return found


def _tag(text: str, title: str) -> str:
    return f' <span class=muted title="{_e(title)}">{_e(text)}</span>'


def _holders(
    doc: LedgerDocument,
) -> tuple[dict[str, list[str]], dict[str, list[str]], bool]:
    """GPU UUID -> who it is allocated to, and who uses it (HTML), each with the container
    ordinal or the processes' cuda:N; and whether both numberings appear."""
    allocated: dict[str, list[str]] = defaultdict(list)
    used: dict[str, list[str]] = defaultdict(list)
    cuda = _cuda_numbers(doc)
    shown: set[str] = set()
    for c in doc.containers:
        who = _e(f"{c.namespace}/{c.pod}" if c.pod else f"pod {c.pod_uid[:8]}")
        ordinals = {d.gpu_uuid: d.local_index for d in c.devices}
        for a in c.allocations:
            n = ordinals.get(a.gpu_uuid)
            shown |= {"ordinal"} if n is not None else set()
            ordinal = "" if n is None else _tag(f"ordinal {n}", ORDINAL_TITLE)
            allocated[a.gpu_uuid].append(who + ordinal)
        for u in c.usage:
            numbers = sorted(cuda.get((c.pod_uid, c.container, u.gpu_uuid), ()))
            shown |= {"cuda"} if numbers else set()
            called = ", ".join(f"cuda:{n}" for n in numbers)
            called = _tag(f"as {called}", CUDA_TITLE) if called else ""
            used[u.gpu_uuid].append(f"{who}{called} ({_gib(u.memory_used_bytes)})")
    return allocated, used, shown == {"ordinal", "cuda"}


def _gpu_rows(doc: LedgerDocument) -> tuple[list[str], bool]:
    """The GPU table's rows, and whether they show both numberings (then the note applies)."""
    allocated, used, both = _holders(doc)
    hosts = _host_processes(doc)
    issues: dict[str, list[str]] = defaultdict(list)
    for d in doc.discrepancies:
        kind = d.kind.replace("_", " ")
        issues[d.gpu_uuid].append(f"{kind}: {d.namespace}/{d.pod}")
    rows = []
    who = _Who(allocated, used, hosts, issues)
    for g in doc.gpus:
        rows.append(_gpu_row(g, _e(g.index), _e(g.model), who))
        # Its MIG devices right under it, numbered <gpu>:<mig> as the toolkit names them.
        for m in g.mig_devices:
            number = f"{_e(g.index)}:{_e(m.index)}"
            rows.append(_gpu_row(m, number, _mig_shape(m), who, mig=True))
    return rows, both


class _Who(NamedTuple):
    """By device UUID (a GPU's or a MIG device's), as HTML: who holds it, who uses it,
    which host processes hold memory there, and what the ledgers disagree on."""

    allocated: dict[str, list[str]]
    used: dict[str, list[str]]
    hosts: dict[str, list[str]]
    issues: dict[str, list[str]]


MIG_TITLE = "a MIG device of the GPU above: GPU instance (GI), compute instance (CI), profile"


def _mig_shape(mig: MigDeviceDoc) -> str:
    ids = f"GI {_e(mig.gpu_instance_id)} · CI {_e(mig.compute_instance_id)}"
    return f'<span title="{_e(MIG_TITLE)}">MIG {_e(mig.profile)} ({ids})</span>'


def _gpu_row(
    g: GpuDoc | MigDeviceDoc, number: str, model: str, who: _Who, *, mig: bool = False
) -> str:
    """One row of the GPU table: a GPU, or (`mig`) one of its MIG devices."""
    allocated, used, hosts, issues = who
    state = (
        '<span class="ok">up</span>'
        if g.up
        else (f'<span class="bad">down ({_e(g.error_reason)})</span>')
    )
    host = g.unattributed_memory_bytes
    if host and not hosts[g.uuid]:  # NVML counts it outside every pod, unnamed
        hosts[g.uuid].append(f"host processes: {_gib(host)}")
    # None for a MIG device, nor in MIG mode.
    util = g.utilization_ratio if isinstance(g, GpuDoc) else None
    none = "<span class=muted>none</span>"
    holders = "<br>".join(allocated[g.uuid]) or none
    users = "<br>".join(used[g.uuid] + hosts[g.uuid]) or none
    return (
        f"<tr{' class=mig' if mig else ''}>"
        f"<td>{number}</td><td><code>{_e(g.uuid)}</code></td>"
        f"<td>{model}</td><td>{state}</td>"
        f"<td>{_gib(g.memory_used_bytes)} / {_gib(g.memory_total_bytes)}</td>"
        f"<td>{'' if util is None else f'{util * 100:.0f}%'}</td>"
        f"<td>{holders}</td><td>{users}</td>"
        f"<td class=bad>{'<br>'.join(map(_e, issues[g.uuid]))}</td>"
        "</tr>"
    )


@dataclass
class _Group:
    pods: list[PodDoc] = field(default_factory=list)
    engines: list[EngineDoc] = field(default_factory=list)
    pending: list[PendingDoc] = field(default_factory=list)


def _pod_names(g: _Group) -> list[str]:
    return [p.name for p in g.pods] + [p.name for p in g.pending]


def _workload_rows(doc: LedgerDocument) -> list[str]:
    groups: dict[tuple[str, str], _Group] = defaultdict(_Group)
    for pod in doc.pods:
        groups[(pod.namespace, pod.workload)].pods.append(pod)
    for engine in doc.engines:
        groups[(engine.namespace, engine.workload)].engines.append(engine)
    for pending in doc.pending:
        groups[(pending.namespace, pending.workload)].pending.append(pending)
    # The verdicts `gpuledger explain` gives on this document (Ray work the cluster view
    # cannot place included); an engine no workload owns is judged on its own.
    judged = verdicts([doc])
    rows = []
    for (ns, name), g in sorted(groups.items()):
        verdict = judged.get((ns, name)) or workload_verdict(g.pending, g.pods, g.engines)
        up = [e for e in g.engines if e.up]
        waiting = sum(e.requests_waiting or 0 for e in up)
        running = sum(e.requests_running or 0 for e in up)
        kv = [e.kv_cache_usage_ratio for e in up if e.kv_cache_usage_ratio is not None]
        reason = f" ({_e(verdict.reason)})" if verdict.reason else ""
        step = verdict.next_step
        rows.append(
            "<tr>"
            # A bare host's workload has no namespace (identity rule 7): its name alone.
            f"<td>{_e(ns) + '/' if ns else ''}{_e(name)}</td>"
            f"<td>{'<br>'.join(_e(name) for name in _pod_names(g))}</td>"
            f"<td class=stage>{_e(verdict.stage)}{reason}</td>"
            f"<td>{len(up)}/{len(g.engines)}"
            f"{_binding_note(g.engines)}</td>"
            f"<td>{waiting:g}</td><td>{running:g}</td>"
            f"<td>{f'{max(kv) * 100:.0f}%' if kv else ''}</td>"
            f"<td>{'<br>'.join(map(_e, verdict.evidence))}</td>"
            f"<td class=next>{_e(step.text)}{_runbook_link(step.runbook_url)}</td>"
            "</tr>"
        )
    return rows


def _binding_note(engines: Sequence[EngineDoc]) -> str:
    """Engines whose processes could not be told apart from a sibling's (their API
    servers' sockets unread): their GPUs, flags and parallelism are not joined."""
    lost = [e for e in engines if e.process_binding == "ambiguous"]
    if not lost:
        return ""
    why = {e.sockets for e in lost} - {"read", None}
    reason = f" (sockets {', '.join(sorted(map(str, why)))})" if why else ""
    return (
        f'<br><span class=bad data-binding="ambiguous">{len(lost)} not joined to '
        f"processes: several API servers here{_e(reason)}</span>"
    )


def _runbook_link(url: str | None) -> str:
    return f' <a class=runbook href="{_e(url)}">runbook</a>' if url else ""


def _source(status: SourceDoc) -> str:
    """A source as up (green), down with its reason (red), or not configured (grey: this
    exporter was not set up to read it, which is no failure)."""
    state = source_state(status)
    name = _e(status.source)
    attrs = f'data-source="{name}" data-state="{_e(state)}"'
    if state == "up":
        return f'<span class="ok" {attrs}>{name}</span>'
    if state == "not_configured":
        return (
            f'<span class="muted" {attrs} title="this exporter is not configured to read it">'
            f"{name} (not configured)</span>"
        )
    return f'<span class="bad" {attrs}>{name} (down: {_e(status.reason)})</span>'


# Inline, so that every page (the index too, which has no style sheet) shows it alike.
SIMULATED_STYLE = (
    "background:#fef0c7;border:2px solid #dc6803;color:#7a2e0e;padding:.5em .8em;"
    "font-weight:600;margin:0 0 1em"
)


def simulated_banner(nodes: Iterable[str]) -> str:
    """A banner no one can miss when any node's document comes from gpuledger's simulator
    (`nodes`: those nodes)."""
    nodes = list(nodes)
    if not nodes:
        return ""
    return (
        f'<p id="simulated" style="{SIMULATED_STYLE}">SIMULATED DATA: node '
        f"{_e(', '.join(nodes))} is served by <code>gpuledger demo</code> or "
        "<code>gpuledger simulate</code>; its GPUs, pods and engines are not real hardware.</p>"
    )


def render_page(doc: LedgerDocument) -> str:
    sources = " ".join(_source(s) for s in doc.sources)
    taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc.taken_at))
    rows, both_numberings = _gpu_rows(doc)
    gpu_rows = "".join(rows) or "<tr><td colspan=9 class=muted>no GPUs</td></tr>"
    numbering = f'<p class=muted id="numbering">{_e(NUMBERING_NOTE)}</p>' if both_numberings else ""
    workload_rows = "".join(_workload_rows(doc)) or (
        "<tr><td colspan=9 class=muted>no GPU workloads</td></tr>"
    )
    unknowns = "".join(f"<li>{_e(u)}</li>" for u in doc.unknowns)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuledger ledger: {_e(doc.node)}</title>
<style>{STYLE}</style></head><body>
{simulated_banner([doc.node] if doc.simulated else [])}
<h1>GPU ledger of node <span id="node">{_e(doc.node)}</span></h1>
<p class=muted>mode {_e(doc.mode)}, snapshot {_e(taken)}, gpuledger {_e(doc.version)}.
Sources: {sources}. <a href="ledger.json">ledger.json</a> · <a href="metrics">metrics</a></p>
{f"<p class=bad>Not known this cycle:</p><ul>{unknowns}</ul>" if unknowns else ""}
<h2>GPUs</h2>
<table id="gpus"><thead><tr><th>#</th><th>UUID</th><th>model</th><th>NVML</th><th>memory</th>
<th>util</th><th>allocated to</th><th>used by</th><th>disagreement</th></tr></thead>
<tbody>{gpu_rows}</tbody></table>
{numbering}
<h2>Workloads</h2>
<table id="workloads"><thead><tr><th>workload</th><th>pods</th><th>where requests wait</th>
<th>engines up</th><th>waiting</th><th>running</th><th>max KV</th><th>evidence</th>
<th>what to do next</th></tr></thead>
<tbody>{workload_rows}</tbody></table>
{slowest_section(doc)}
</body></html>
"""
