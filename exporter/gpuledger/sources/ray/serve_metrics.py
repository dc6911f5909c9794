"""Ray Serve's queues from a Ray node's metrics endpoint (its `metricsExportPort`).

That endpoint exposes every `ray_*` series of every worker on the node, mostly histogram
buckets; the ledger reads three gauges of it (the capture in
tests/fixtures/ray/ray-2.60-serve/ shows them under load):

* ``ray_serve_deployment_queued_queries{application, deployment, handle, actor_id}``:
  requests a router (the HTTP proxy, or a deployment handle in another replica) holds
  because no replica has taken them yet;
* ``ray_serve_num_ongoing_requests_at_replicas{...same}``: what the router has assigned
  to replicas and not seen finish;
* ``ray_serve_replica_processing_queries{application, deployment, replica}``: what each
  replica process runs now.

Lines are filtered as vLLM's are (gpuledger/sources/engines/exposition.py), by the same
reader: every other line is only shape-checked, the few wanted lines go through
prometheus_client's parser, each bounded in length, and at most MAX_SERIES wanted series
are read. `MetricsBody` reads an answer as it arrives: the body is never held.
"""

from __future__ import annotations

import codecs
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from gpuledger.model.serve import ServeReplicaLoad, ServeRouterQueue
from gpuledger.sources.engines.exposition import ExpositionError, ExpositionReader, _samples

QUEUED = "ray_serve_deployment_queued_queries"
AT_REPLICAS = "ray_serve_num_ongoing_requests_at_replicas"
PROCESSING = "ray_serve_replica_processing_queries"
_WANTED = (QUEUED, AT_REPLICAS, PROCESSING)
# Routers x deployments plus replicas on one Ray node: a node with hundreds of replicas
# and handles stays far below; more is a hostile or broken endpoint.
MAX_SERIES = 4096
# Their lines run to ~250 characters (four labels); 1 KiB each bounds what is kept.
MAX_WANTED_CHARS = MAX_SERIES * 1024
_PIECE = 64 * 1024


def _reader() -> ExpositionReader:
    return ExpositionReader(_WANTED, "ray_serve_", MAX_WANTED_CHARS, MAX_SERIES)


def relevant_lines(text: str) -> str:
    """The lines of the three families, at most MAX_SERIES samples of them."""
    reader = _reader()
    for at in range(0, len(text), _PIECE):
        reader.feed(text[at : at + _PIECE])
    return reader.relevant()


class MetricsBody:
    """A node's metrics answer read as it arrives (HttpClient.get's `consume`): decoded and
    filtered piece by piece, stopped at the first line that is not an exposition line."""

    def __init__(self) -> None:
        self.reader = _reader()
        self.error: str | None = None  # said without quoting the body
        self._decode = codecs.getincrementaldecoder("utf-8")().decode

    def __call__(self, chunk: bytes) -> bool:
        self._take(chunk)
        return self.error is None

    def parsed(self) -> tuple[tuple[ServeRouterQueue, ...], tuple[ServeReplicaLoad, ...]]:
        """Once the answer is complete. Raises ExpositionError for one that is not a
        bounded exposition."""
        if self.error is None:
            self._take(b"", final=True)
        if self.error is not None:
            raise ExpositionError(self.error)
        return _fold(_samples(self.reader.relevant()))

    def _take(self, chunk: bytes, final: bool = False) -> None:
        try:
            self.reader.feed(self._decode(chunk, final))
        except UnicodeDecodeError:
            self.error = "not UTF-8"
        except ExpositionError as exc:
            self.error = str(exc)


def parse_serve_metrics(
    text: str,
) -> tuple[tuple[ServeRouterQueue, ...], tuple[ServeReplicaLoad, ...]]:
    """The routers' queues per deployment (summed over the node's handles) and each
    replica's ongoing requests. Raises ExpositionError for text that is not an exposition."""
    return _fold(_samples(relevant_lines(text)))


def _fold(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
) -> tuple[tuple[ServeRouterQueue, ...], tuple[ServeReplicaLoad, ...]]:
    queued: dict[tuple[str, str], float] = defaultdict(float)
    at_replicas: dict[tuple[str, str], float] = {}
    ongoing: dict[tuple[str, str, str], float] = {}
    for name, labels, value in samples:
        if not math.isfinite(value):
            continue  # NaN/Inf: unknown, not a number to add
        key = (labels.get("application", ""), labels.get("deployment", ""))
        if not key[1]:
            continue
        if name == QUEUED:
            queued[key] += value
        elif name == AT_REPLICAS:
            at_replicas[key] = at_replicas.get(key, 0.0) + value
        elif name == PROCESSING and labels.get("replica"):
            ongoing[(*key, labels["replica"])] = value
    routers = tuple(
        ServeRouterQueue(app, dep, queued.get((app, dep), 0.0), at_replicas.get((app, dep)))
        for app, dep in sorted(set(queued) | set(at_replicas))
    )
    replicas = tuple(ServeReplicaLoad(*key, value) for key, value in sorted(ongoing.items()))
    return routers, replicas
