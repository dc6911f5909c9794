"""/ledger.json and /ledger read the document built once per snapshot, on its first request:
two requests of one snapshot build it once, a snapshot nobody reads builds nothing, a new
snapshot answers with its own document."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from itertools import count

import pytest

from gpuledger.document.v1 import LedgerDocument
from gpuledger.export.published import Published
from gpuledger.ledger import build_ledger
from gpuledger.model import Snapshots
from gpuledger.web import server
from gpuledger.web.server import Exporter, serve


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Exporter, str, list[float]]]:
    """An exporter whose every cycle takes a new snapshot, served; and the snapshots whose
    documents were built (by `taken_at`)."""
    builds: list[float] = []
    real = server.ledger_document

    def counted(published: Published) -> LedgerDocument:
        builds.append(published.ledger.taken_at)
        return real(published)

    monkeypatch.setattr(server, "ledger_document", counted)
    clock = count(1)

    def cycle() -> Published:
        ledger = build_ledger(Snapshots({}), node="n1", mode="node", taken_at=float(next(clock)))
        return Published(ledger)

    exporter = Exporter(cycle, interval_seconds=60)
    httpd = serve(exporter, "127.0.0.1:0", "n1", "node")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield exporter, f"http://127.0.0.1:{httpd.server_address[1]}", builds
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_one_snapshot_one_document(built: tuple[Exporter, str, list[float]]) -> None:
    exporter, url, builds = built
    exporter.run_once()
    first = _get(f"{url}/ledger.json")
    assert _get(f"{url}/ledger.json") == first
    assert b'id="node">n1<' in _get(f"{url}/ledger")
    assert builds == [1.0]  # built once for the snapshot, never per request
    assert json.loads(first)["taken_at"] == 1.0


def test_a_new_snapshot_gets_a_new_document(built: tuple[Exporter, str, list[float]]) -> None:
    exporter, url, builds = built
    exporter.run_once()
    _get(f"{url}/ledger.json")
    exporter.run_once()
    assert json.loads(_get(f"{url}/ledger.json"))["taken_at"] == 2.0
    assert builds == [1.0, 2.0]


def test_a_snapshot_nobody_reads_builds_no_document(
    built: tuple[Exporter, str, list[float]],
) -> None:
    exporter, url, builds = built
    for _ in range(3):
        exporter.run_once()
    assert builds == []
    assert json.loads(_get(f"{url}/ledger.json"))["taken_at"] == 3.0
    assert builds == [3.0]
