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

Lines are filtered as vLLM's are (gpuledger/sources/vllm_metrics.py): every other line is
only shape-checked, the few wanted lines go through prometheus_client's parser, each
bounded in length, and at most MAX_SERIES wanted series are read.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from gpuledger.model.serve import ServeReplicaLoad, ServeRouterQueue
from gpuledger.sources.vllm_metrics import (
    _SAMPLE_SHAPE,
    MAX_LINE_CHARS,
    ExpositionError,
    _samples,
)

QUEUED = "ray_serve_deployment_queued_queries"
AT_REPLICAS = "ray_serve_num_ongoing_requests_at_replicas"
PROCESSING = "ray_serve_replica_processing_queries"
_WANTED = (QUEUED, AT_REPLICAS, PROCESSING)
_COMMENTS = tuple(f"# {kind} {name}" for kind in ("HELP", "TYPE") for name in _WANTED)
# Routers x deployments plus replicas on one Ray node: a node with hundreds of replicas
# and handles stays far below; more is a hostile or broken endpoint.
MAX_SERIES = 4096


def _wanted(line: str) -> bool:
    """Whether a line is one of the three families; raises ExpositionError for any other
    line that is not shaped like an exposition line (an error page must not pass for a
    node without Serve)."""
    stripped = line.strip()
    if not stripped:
        return False
    if stripped.startswith("#"):
        return stripped.startswith(_COMMENTS)
    if stripped.startswith(_WANTED):
        if len(stripped) > MAX_LINE_CHARS:
            raise ExpositionError(f"a ray_serve_ line longer than {MAX_LINE_CHARS} characters")
        return True
    if _SAMPLE_SHAPE.fullmatch(stripped) is None:
        raise ExpositionError("not a Prometheus text exposition (malformed line)")
    return False


def relevant_lines(text: str) -> str:
    """The lines of the three families, at most MAX_SERIES samples of them."""
    kept = [line for line in text.split("\n") if _wanted(line)]
    if sum(1 for line in kept if not line.lstrip().startswith("#")) > MAX_SERIES:
        raise ExpositionError(f"more than {MAX_SERIES} ray_serve_ queue series")
    return "\n".join(kept) + "\n"


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
