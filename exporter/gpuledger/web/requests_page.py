"""/ledger's request parts: each engine's slowest recent requests (a table on the node
page), and `/ledger?request=ID`, one request explained as `explain --request` prints it,
from this node's document alone. Every value escaped."""

from __future__ import annotations

import html
from urllib.parse import parse_qs, quote

from gpuledger.document.v1 import LedgerDocument
from gpuledger.explain.chain import ExplainError
from gpuledger.explain.requests import explain_by_request, render_request_text

SLOWEST_SHOWN = 5


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} s"


def slowest_section(doc: LedgerDocument) -> str:
    """The table of each sender's slowest requests; "" while the receiver is off."""
    if not doc.spans.receiving:
        return ""
    rows = []
    for sender in doc.spans.senders:
        engine = (
            f"{sender.model_name} ({sender.target}, rank {sender.engine})"
            if sender.joined_by != "none"
            else f"not tied: {sender.untied_reason}"
        )
        for r in sender.slowest[:SLOWEST_SHOWN]:
            link = f"ledger?request={quote(r.request_id, safe='')}"
            rows.append(
                f'<tr><td><a href="{_e(link)}">{_e(r.request_id)}</a></td><td>{_e(engine)}</td>'
                f"<td>{_seconds(r.queue_seconds)}</td><td>{_seconds(r.ttft_seconds)}</td>"
                f"<td>{_seconds(r.e2e_seconds)}</td></tr>"
            )
    body = "".join(rows) or "<tr><td colspan=5 class=muted>no request spans received yet</td></tr>"
    return (
        "<h2>Slowest recent requests</h2>"
        '<table id="requests"><thead><tr><th>request</th><th>engine</th><th>queued</th>'
        "<th>first token</th><th>total</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def requested(query: str) -> str | None:
    """The request id of `?request=ID`, if the query names one."""
    values = parse_qs(query).get("request")
    return values[0] if values else None


def request_page(doc: LedgerDocument, request_id: str) -> tuple[int, str]:
    try:
        text = render_request_text(explain_by_request([doc], request_id))
        status = 200
    except ExplainError as exc:
        text, status = str(exc), 404
    return status, (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>gpuledger request {_e(request_id)}</title></head><body>"
        f'<p><a href="ledger">back to the ledger</a></p><pre id="request">{_e(text)}</pre>'
        "</body></html>"
    )
