"""/runbooks: the shipped runbooks (docs/runbooks.md), served by every agent.

The alerts' runbook_url and the runbook links of `gpuledger explain` and the /ledger pages
point at `runbooks#<alert name in lower case>` (stages.json's runbookURLPattern): this page,
whose every heading carries the anchor GitHub would give it. The Markdown is package data
(gpuledger/web/runbooks.md, a copy of docs/runbooks.md written by scripts/render-mixin) and
is rendered here by a small converter for the subset the runbooks use: headings,
paragraphs, lists, tables, fenced code, `code`, **bold**, *emphasis* and links. Standard
library only.
"""

from __future__ import annotations

import functools
import html
import re
from importlib import resources

STYLE = """
body{font-family:system-ui,sans-serif;max-width:60em;margin:1em auto;padding:0 1em;line-height:1.45}
code,pre{font-family:ui-monospace,monospace;background:#f4f4f4}
pre{padding:.5em;overflow-x:auto} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}
h2{border-top:1px solid #ddd;padding-top:.6em}
"""


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces
    to hyphens (the alerts' runbook_url uses the alert name in lower case)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_EM = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")


def _href(target: str) -> str:
    # A link into the runbooks themselves stays on this page; other repository files have
    # no address here, so their text is kept without a link.
    if target.startswith("#"):
        return target
    if target.startswith("runbooks.md#"):
        return target.removeprefix("runbooks.md")
    if re.match(r"https?://", target):
        return target
    return ""


def _inline(text: str) -> str:
    """Inline Markdown to HTML; code spans first, so nothing inside them is interpreted."""
    parts = _CODE.split(text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        escaped = html.escape(part, quote=False)
        escaped = _BOLD.sub(r"<b>\1</b>", escaped)
        escaped = _EM.sub(r"<i>\1</i>", escaped)
        out.append(escaped)
    joined = "".join(out)

    def link(m: re.Match[str]) -> str:
        href = _href(html.unescape(m.group(2)))
        if not href:
            return m.group(1)
        return f'<a href="{html.escape(href)}">{m.group(1)}</a>'

    return _LINK.sub(link, joined)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


_ITEM = re.compile(r"(- |\d+\. )")
_BLOCK_START = re.compile(r"(#{1,6} |```|\||- |\d+\. |---$)")


def _code(lines: list[str], i: int, out: list[str]) -> int:
    end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), len(lines))
    out.append("<pre>" + html.escape("\n".join(lines[i + 1 : end])) + "</pre>")
    return end + 1


def _table(lines: list[str], i: int, out: list[str]) -> int:
    rows = []
    while i < len(lines) and lines[i].startswith("|"):
        rows.append(_cells(lines[i]))
        i += 1
    head, *body = [r for r in rows if not all(set(c) <= {"-", ":"} for c in r)]
    out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>")
    out.extend("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
    out.append("</table>")
    return i


def _list(lines: list[str], i: int, out: list[str]) -> int:
    tag = "ul" if lines[i].startswith("- ") else "ol"
    items: list[str] = []
    while i < len(lines) and (_ITEM.match(lines[i]) or (items and lines[i].startswith("  "))):
        if _ITEM.match(lines[i]):
            items.append(_ITEM.sub("", lines[i], count=1))
        else:
            items[-1] += " " + lines[i].strip()
        i += 1
    out.append(f"<{tag}>" + "".join(f"<li>{_inline(t)}</li>" for t in items) + f"</{tag}>")
    return i


def _paragraph(lines: list[str], i: int, out: list[str]) -> int:
    words = []
    while i < len(lines) and lines[i].strip() and not _BLOCK_START.match(lines[i]):
        words.append(lines[i].strip())
        i += 1
    out.append("<p>" + _inline(" ".join(words)) + "</p>")
    return i


def render_markdown(text: str) -> str:
    """The body HTML of a runbooks-style Markdown document."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = re.match(r"(#{1,6}) (.+)$", line)
        if not line.strip():
            i += 1
        elif heading:
            level, title = len(heading.group(1)), heading.group(2)
            out.append(f'<h{level} id="{github_anchor(title)}">{_inline(title)}</h{level}>')
            i += 1
        elif line.strip() == "---":
            out.append("<hr>")
            i += 1
        elif line.startswith("```"):
            i = _code(lines, i, out)
        elif line.startswith("|"):
            i = _table(lines, i, out)
        elif _ITEM.match(line):
            i = _list(lines, i, out)
        else:
            i = _paragraph(lines, i, out)
    return "\n".join(out)


def runbooks_markdown() -> str:
    """The runbooks this package ships (a copy of docs/runbooks.md)."""
    return resources.files("gpuledger.web").joinpath("runbooks.md").read_text(encoding="utf-8")


@functools.cache
def runbooks_page() -> bytes:
    """The /runbooks page, rendered once per process."""
    body = render_markdown(runbooks_markdown())
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>gpuledger runbooks</title><style>{STYLE}</style></head>\n"
        f'<body><p><a href="./">gpuledger</a> &middot; <a href="ledger">/ledger</a></p>\n'
        f"{body}\n</body></html>\n"
    ).encode()
