"""The /ledger HTML page: this node's ledger at a glance. Self-contained (air-gapped),
every value escaped (label values come from pods and engines, which anyone may name)."""

from __future__ import annotations

import html
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from gpuledger.explain import verdicts
from gpuledger.verdict import workload_verdict

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1b1f24}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;width:100%} th,td{border:1px solid #d0d7de;padding:4px 8px;
text-align:left;vertical-align:top} th{background:#f3f4f6} code{font-size:12px}
.bad{color:#b42318;font-weight:600} .ok{color:#067647} .muted{color:#667085}
.stage{font-weight:600} .next{min-width:16em} a.runbook{white-space:nowrap}
"""


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def _gpu_rows(doc: Mapping[str, Any]) -> list[str]:
    allocated: dict[str, list[str]] = defaultdict(list)
    used: dict[str, list[str]] = defaultdict(list)
    for c in doc.get("containers", []):
        who = f"{c['namespace']}/{c['pod']}" if c["pod"] else f"pod {c['pod_uid'][:8]}"
        for a in c["allocations"]:
            allocated[a["gpu_uuid"]].append(who)
        for u in c["usage"]:
            used[u["gpu_uuid"]].append(f"{who} ({_gib(u['memory_used_bytes'])})")
    issues: dict[str, list[str]] = defaultdict(list)
    for d in doc.get("discrepancies", []):
        kind = d["kind"].replace("_", " ")
        issues[d["gpu_uuid"]].append(f"{kind}: {d['namespace']}/{d['pod']}")
    rows = []
    for g in doc.get("gpus", []):
        state = (
            '<span class="ok">up</span>'
            if g["up"]
            else (f'<span class="bad">down ({_e(g["error_reason"])})</span>')
        )
        host = g.get("unattributed_memory_bytes")
        util = g["utilization_ratio"]
        none = "<span class=muted>none</span>"
        holders = "<br>".join(map(_e, allocated[g["uuid"]])) or none
        users = "<br>".join(map(_e, used[g["uuid"]])) or none
        if host:
            users += f"<br>host processes: {_gib(host)}"
        rows.append(
            "<tr>"
            f"<td>{_e(g['index'])}</td><td><code>{_e(g['uuid'])}</code></td>"
            f"<td>{_e(g['model'])}</td><td>{state}</td>"
            f"<td>{_gib(g['memory_used_bytes'])} / {_gib(g['memory_total_bytes'])}</td>"
            f"<td>{'' if util is None else f'{util * 100:.0f}%'}</td>"
            f"<td>{holders}</td><td>{users}</td>"
            f"<td class=bad>{'<br>'.join(map(_e, issues[g['uuid']]))}</td>"
            "</tr>"
        )
    return rows


def _workload_rows(doc: Mapping[str, Any]) -> list[str]:
    groups: dict[tuple[str, str], dict[str, list[Any]]] = defaultdict(
        lambda: {"pods": [], "engines": [], "pending": []}
    )
    for pod in doc.get("pods", []):
        groups[(pod["namespace"], pod["workload"])]["pods"].append(pod)
    for engine in doc.get("engines", []):
        groups[(engine["namespace"], engine["workload"])]["engines"].append(engine)
    for pending in doc.get("pending", []):
        groups[(pending["namespace"], pending["workload"])]["pending"].append(pending)
    # The verdicts `gpuledger explain` gives on this document (Ray work the cluster view
    # cannot place included); an engine no workload owns is judged on its own.
    judged = verdicts([doc])
    rows = []
    for (ns, name), g in sorted(groups.items()):
        verdict = judged.get((ns, name)) or workload_verdict(g["pending"], g["pods"], g["engines"])
        waiting = sum(e.get("requests_waiting") or 0 for e in g["engines"] if e["up"])
        running = sum(e.get("requests_running") or 0 for e in g["engines"] if e["up"])
        kv = [
            e["kv_cache_usage_ratio"]
            for e in g["engines"]
            if e["up"] and e["kv_cache_usage_ratio"] is not None
        ]
        reason = f" ({_e(verdict.reason)})" if verdict.reason else ""
        step = verdict.next_step
        rows.append(
            "<tr>"
            f"<td>{_e(ns)}/{_e(name)}</td>"
            f"<td>{'<br>'.join(_e(p['name']) for p in g['pods'] + g['pending'])}</td>"
            f"<td class=stage>{_e(verdict.stage)}{reason}</td>"
            f"<td>{len([e for e in g['engines'] if e['up']])}/{len(g['engines'])}</td>"
            f"<td>{waiting:g}</td><td>{running:g}</td>"
            f"<td>{f'{max(kv) * 100:.0f}%' if kv else ''}</td>"
            f"<td>{'<br>'.join(map(_e, verdict.evidence))}</td>"
            f"<td class=next>{_e(step.text)}{_runbook_link(step.runbook_url)}</td>"
            "</tr>"
        )
    return rows


def _runbook_link(url: str | None) -> str:
    return f' <a class=runbook href="{_e(url)}">runbook</a>' if url else ""


def _source(status: Mapping[str, Any]) -> str:
    if status["up"]:
        return f'<span class="ok">{_e(status["source"])}</span>'
    if status["reason"] == "disabled":
        return f'<span class="muted">{_e(status["source"])} (not configured)</span>'
    return f'<span class="bad">{_e(status["source"])} ({_e(status["reason"])})</span>'


def render_page(doc: Mapping[str, Any]) -> str:
    sources = " ".join(
        f'<span class="{"ok" if s["up"] else "bad"}">{_e(s["source"])}'
        f"{'' if s['up'] else ' (' + _e(s['reason']) + ')'}</span>"
        for s in doc.get("sources", [])
    )
    taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc.get("taken_at", 0)))
    gpu_rows = "".join(_gpu_rows(doc)) or "<tr><td colspan=9 class=muted>no GPUs</td></tr>"
    workload_rows = "".join(_workload_rows(doc)) or (
        "<tr><td colspan=9 class=muted>no GPU workloads</td></tr>"
    )
    unknowns = "".join(f"<li>{_e(u)}</li>" for u in doc.get("unknowns", []))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuledger ledger: {_e(doc.get("node"))}</title>
<style>{STYLE}</style></head><body>
<h1>GPU ledger of node <span id="node">{_e(doc.get("node"))}</span></h1>
<p class=muted>mode {_e(doc.get("mode"))}, snapshot {_e(taken)}, gpuledger {_e(doc.get("version"))}.
Sources: {sources}. <a href="ledger.json">ledger.json</a> · <a href="metrics">metrics</a></p>
{f"<p class=bad>Not known this cycle:</p><ul>{unknowns}</ul>" if unknowns else ""}
<h2>GPUs</h2>
<table id="gpus"><thead><tr><th>#</th><th>UUID</th><th>model</th><th>NVML</th><th>memory</th>
<th>util</th><th>allocated to</th><th>used by</th><th>disagreement</th></tr></thead>
<tbody>{gpu_rows}</tbody></table>
<h2>Workloads</h2>
<table id="workloads"><thead><tr><th>workload</th><th>pods</th><th>where requests wait</th>
<th>engines up</th><th>waiting</th><th>running</th><th>max KV</th><th>evidence</th>
<th>what to do next</th></tr></thead>
<tbody>{workload_rows}</tbody></table>
</body></html>
"""
