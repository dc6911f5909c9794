"""Scrape latency of a real `/metrics` endpoint, timed by a separate client process.

The client runs in its own process (as Prometheus does), so its CPU never competes with
the exporter's for the GIL; each scrape is a fresh connection, as the server closes it.

    from benchmarks.scrape_latency import Scraper
    with Scraper(port, count=500) as scraper:
        ...  # whatever the exporter should be doing meanwhile
    scraper.seconds  # one duration per scrape
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from types import TracebackType

CLIENT = """
import http.client, json, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
out = []
for _ in range(count):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    r = c.getresponse()
    body = r.read()
    c.close()
    out.append(time.perf_counter() - t0)
    assert r.status == 200 and body.endswith(b"\\n"), r.status
print(json.dumps(out))
"""


class Scraper:
    """`count` sequential scrapes of 127.0.0.1:`port`, from the moment the block starts."""

    def __init__(self, port: int, count: int) -> None:
        self._args = [sys.executable, "-c", CLIENT, str(port), str(count)]
        self._process: subprocess.Popen[str] | None = None
        self.seconds: list[float] = []

    def __enter__(self) -> Scraper:
        self._process = subprocess.Popen(self._args, stdout=subprocess.PIPE, text=True)
        return self

    def done(self) -> bool:
        return self._process is not None and self._process.poll() is not None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._process is not None
        out, _ = self._process.communicate(timeout=300)
        if self._process.returncode != 0:
            raise RuntimeError(f"scrape client failed ({self._process.returncode})")
        self.seconds = json.loads(out)


def p99(seconds: list[float]) -> float:
    """The 99th percentile (inclusive method: never past the largest sample)."""
    return statistics.quantiles(seconds, n=100, method="inclusive")[98]
