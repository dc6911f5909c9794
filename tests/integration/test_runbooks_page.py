"""Every agent serves the shipped runbooks at /runbooks, with each alert's section at the
anchor that the alerts' runbook_url and the /ledger pages' links name (issue 26, item 6)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from gpuledger.explain.verdict import RUNBOOK_URL_PATTERN
from gpuledger.web.runbooks import github_anchor, runbooks_markdown
from tests.conftest import REPO
from tests.integration.test_server_http import fetch
from tests.mixin.helpers import alerts
from tests.reliability.harness import Node
from tests.reliability.scenarios import churn_node

RUNBOOKS = REPO / "docs" / "runbooks.md"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    made = Node(churn_node(2), tmp_path_factory.mktemp("node"), deadline=2.0)
    made.cycle()
    yield made
    made.close()


def test_the_package_ships_the_runbooks_of_the_repository() -> None:
    # A copy (scripts/render-mixin writes it) so that the wheel and the image carry it.
    assert runbooks_markdown() == RUNBOOKS.read_text()


def test_every_alert_has_its_section_on_the_served_page(node: Node) -> None:
    status, headers, body = fetch(node.base + "/runbooks")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    page = body.decode()
    ids = set(re.findall(r'<h2 id="([^"]+)">', page))
    names = {a["alert"] for a in alerts()}
    assert ids == {name.lower() for name in names}, "one section per alert, and no other"
    for name in names:
        # What the /ledger pages link (relative to the agent) and the alert's anchor.
        href = RUNBOOK_URL_PATTERN % name.lower()
        assert href == f"runbooks#{name.lower()}"
        assert github_anchor(name) == name.lower()
        section = page.split(f'<h2 id="{name.lower()}">', 1)[1].split("<h2 ", 1)[0]
        for part in ("Meaning.", "Layer and team.", "Check first.", "Do not."):
            assert f"<b>{part}</b>" in section, (name, part)


def test_the_landing_page_links_the_runbooks(node: Node) -> None:
    _, _, body = fetch(node.base + "/")
    assert '<a href="runbooks">/runbooks</a>' in body.decode()


def test_the_page_escapes_and_renders_what_the_runbooks_use() -> None:
    from gpuledger.web.runbooks import render_markdown

    page = render_markdown(
        "## GpuLedgerX\n\n**Meaning.** a `<b>` and *this* [link](runbooks.md#gpuledgerx),\n"
        "[other](other.md), [web](https://example.com/?a=1&b=2).\n\n"
        "- one\n  two\n- three\n\n| a | b |\n|---|---|\n| `x` | y |\n\n```sh\na <b\n```\n"
    )
    assert '<h2 id="gpuledgerx">GpuLedgerX</h2>' in page
    assert "<b>Meaning.</b> a <code>&lt;b&gt;</code> and <i>this</i>" in page
    assert '<a href="#gpuledgerx">link</a>' in page
    assert "other," in page and "other.md" not in page
    assert '<a href="https://example.com/?a=1&amp;b=2">web</a>' in page
    assert "<ul><li>one two</li><li>three</li></ul>" in page
    assert "<tr><td><code>x</code></td><td>y</td></tr>" in page
    assert "<pre>a &lt;b</pre>" in page
    assert "<script" not in render_markdown("<script>alert(1)</script>")


def test_every_link_of_the_page_lands() -> None:
    # Anchors of the page itself, the agent's own pages, or the web; a repository file the
    # agent does not serve keeps its text without a link.
    from gpuledger.web.runbooks import runbooks_page

    page = runbooks_page().decode()
    ids = set(re.findall(r' id="([^"]+)"', page))
    for href in re.findall(r'href="([^"]+)"', page):
        if href.startswith("#"):
            assert href[1:] in ids, href
        else:
            assert href in {"./", "ledger"} or href.startswith("https://"), href
