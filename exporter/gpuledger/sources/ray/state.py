"""Ray source: the dashboard's HTTP state API, read with gpuledger/net/httpclient.py.

The exporter never imports `ray` (far too heavy for the DaemonSet image); it speaks the
dashboard's JSON instead:

* ``GET /api/v0/nodes``, ``/api/v0/actors``, ``/api/v0/placement_groups`` with ``detail``,
  ``limit``, ``timeout`` and ``filter_keys``/``filter_predicates``/``filter_values``. Each
  answers the envelope ``{"result": bool, "msg": str, "data": {"result": {"total",
  "num_after_truncation", "num_filtered", "result": [rows], "partial_failure_warning",
  "warnings"}}}``; ``result: false`` (with HTTP 400/500) carries Ray's own error text.
* ``GET /api/cluster_status`` for what is *available* per node: the state API only has
  totals. Its ``loadMetricsReport.usageByNode`` maps node -> resource -> [used, total],
  written by the autoscaler monitor every few seconds (so it lags a little), with keys
  camel-cased by the dashboard (``object_store_memory`` -> ``objectStoreMemory``).

Ray 2.60 answers 401 (no token) / 403 (wrong token) from local clusters, where token
auth is on by default; the token goes in ``Authorization: Bearer``.

Row fields differ across releases (2.44 lacks the label/topology fields of 2.60, int64
proto fields such as ``num_restarts`` and the ``stats`` timestamps arrive as JSON
strings): parsing reads only what it needs, accepts the known spellings of each field,
and treats absent fields as unknown rather than failing.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import socket
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import urlencode, urlsplit, urlunsplit

from gpuledger.engines.ray import engine_dp_rank
from gpuledger.identity.rayjobs import driver_node
from gpuledger.identity.raynodes import PodNodes
from gpuledger.identity.urls import safe_url
from gpuledger.model import Snapshots, frozen_map
from gpuledger.model.kubernetes import PODS, PodInfo
from gpuledger.model.ray import (
    GPU,
    RAY_CLUSTER,
    RAY_LOCAL,
    LocalRayNode,
    RayActor,
    RayBundle,
    RayClusterSnapshot,
    RayJob,
    RayNode,
    RayPlacementGroup,
    RaySnapshot,
)
from gpuledger.net.httpclient import HttpClient, HttpError
from gpuledger.sources.base import Source, SourceError

T = TypeVar("T")

SOURCE: Final = "ray"

# Bounded vocabulary for SourceError.reason (a label value).
REASONS: Final[tuple[str, ...]] = (
    "unauthorized",  # 401/403: token auth on and no (or the wrong) token
    "unreachable",  # connection refused, reset, DNS failure
    "timeout",  # connect/read timeout, or the whole reply took past the deadline
    "api_error",  # the envelope said result=false; the message is Ray's msg
    "http_error",  # a non-200 status without a Ray envelope (proxy, 404, bare 500)
    "bad_response",  # not JSON, truncated, or not the shape of a state API reply
    "too_large",  # more bytes, or more JSON values, than `limit` rows can take
    "invalid_address",  # --ray-address is not an http(s) URL
)

DEFAULT_TIMEOUT_SECONDS: Final = 5.0
# The API server refuses limits above RAY_MAX_LIMIT_FROM_API_SERVER (10000 by default).
DEFAULT_LIMIT: Final = 10000
# A state API answer holds at most `limit` rows, so its size follows from the limit. The
# captured rows (tests/fixtures/ray) take 0.5-0.9 KiB and up to 50 JSON separators
# (`,` `:` `{` `[`) each; a row may take about twice that, room for runtime environments,
# labels and placement groups of many bundles. The separators bound what json.loads
# builds: 31 MiB of `{},` is 10 million dicts (850 MiB) from a body within any byte cap.
ROW_BYTES: Final = 2 * 1024
ROW_SEPARATORS: Final = 96
ENVELOPE_BYTES: Final = 64 * 1024
ENVELOPE_SEPARATORS: Final = 4096
# Ray's own error text is kept, but as one bounded line.
MAX_MESSAGE_CHARS: Final = 200
MAX_WARNINGS: Final = 32

PENDING_PG_STATES: Final = frozenset({"PENDING", "RESCHEDULING"})
# vLLM jobs whose actors and placement groups one node agent reads per cycle (two
# requests each): the engines whose EngineCore runs on this node's Ray nodes.
MAX_DRIVEN_JOBS: Final = 16

# Inside a placement group Ray rewrites an actor's resources to the bundle's names:
# `GPU_group_<pg>` (any bundle) and, with a bundle index, also `GPU_group_<i>_<pg>`.
# Both name the same GPUs, so only one family is counted.
_GPU_WILDCARD = re.compile(r"^GPU_group_[0-9a-f]+$")
_GPU_INDEXED = re.compile(r"^GPU_group_\d+_[0-9a-f]+$")
_BUNDLE_INDEX = re.compile(r"^(?:GPU|bundle)_group_(\d+)_[0-9a-f]+$")
_WHITESPACE = re.compile(r"\s+")


# --------------------------------------------------------------------------- snapshots


# --------------------------------------------------------------------------- values


def _int(value: Any) -> int | None:
    """An integer from JSON; int64 proto fields arrive as strings ("12502")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _text(value: Any) -> str | None:
    """A non-empty string, else None: Ray sends "" and null alike for "not set"."""
    if isinstance(value, str) and value:
        return value
    return None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _first(row: Mapping[str, Any], *names: str) -> Any:
    """The first of several spellings of one field that the row has."""
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    return None


def _resources(value: Any) -> Mapping[str, float]:
    if not isinstance(value, Mapping):
        return frozen_map()
    out: dict[str, float] = {}
    for key, raw in value.items():
        number = _float(raw)
        if isinstance(key, str) and number is not None:
            out[key] = number
    return frozen_map(out)


def _labels(value: Any) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        return frozen_map()
    return frozen_map({k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)})


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """Collapse whitespace and cap the length: messages become label-safe single lines."""
    flat = _WHITESPACE.sub(" ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def bundle_index(resources: Mapping[str, float]) -> int | None:
    """The bundle of its placement group an actor runs in: `GPU_group_<i>_<pg>` (or the
    `bundle_group_<i>_<pg>` marker) of its resources; None outside an indexed bundle."""
    for key in resources:
        if found := _BUNDLE_INDEX.match(key):
            return int(found.group(1))
    return None


def gpus_requested(resources: Mapping[str, float]) -> float:
    """Logical GPUs in a resource request, including placement-group-rewritten names."""
    if GPU in resources:
        return resources[GPU]
    wildcard = [v for k, v in resources.items() if _GPU_WILDCARD.match(k)]
    if wildcard:
        return sum(wildcard)
    return sum(v for k, v in resources.items() if _GPU_INDEXED.match(k))


# --------------------------------------------------------------------------- rows


def parse_node(row: Any) -> RayNode | None:
    """One row of /api/v0/nodes; None when it has no node id."""
    if not isinstance(row, Mapping):
        return None
    node_id = _text(_first(row, "node_id", "nodeId"))
    if node_id is None:
        return None
    totals = _resources(_first(row, "resources_total", "resourcesTotal", "resources"))
    is_head = _bool(_first(row, "is_head_node", "is_head", "isHeadNode"))
    if is_head is None:
        # Before is_head_node existed, the head carried this marker resource.
        is_head = "node:__internal_head__" in totals
    return RayNode(
        node_id=node_id,
        node_ip=_text(_first(row, "node_ip", "node_ip_address", "nodeManagerAddress")) or "",
        hostname=_text(_first(row, "node_name", "hostname", "nodeManagerHostname")),
        state=_text(row.get("state")) or "UNKNOWN",
        is_head=is_head,
        resources_total=totals,
        labels=_labels(row.get("labels")),
    )


def parse_actor(row: Any) -> RayActor | None:
    """One row of /api/v0/actors (needs detail=true for resources and placement group)."""
    if not isinstance(row, Mapping):
        return None
    actor_id = _text(_first(row, "actor_id", "actorId"))
    if actor_id is None:
        return None
    pid = _int(row.get("pid"))
    resources = _resources(_first(row, "required_resources", "requiredResources"))
    return RayActor(
        actor_id=actor_id,
        class_name=_text(_first(row, "class_name", "className", "actor_class")) or "",
        state=_text(row.get("state")) or "UNKNOWN",
        # Ray reports 0 until the worker process exists.
        pid=pid if pid is not None and pid > 0 else None,
        node_id=_text(_first(row, "node_id", "nodeId")),
        num_gpus=gpus_requested(resources),
        job_id=_text(_first(row, "job_id", "jobId")),
        placement_group_id=_text(_first(row, "placement_group_id", "placementGroupId")),
        ray_namespace=_text(_first(row, "ray_namespace", "rayNamespace", "namespace")),
        name=_text(row.get("name")),
        bundle_index=bundle_index(resources),
    )


def parse_job(row: Any) -> RayJob | None:
    """One row of /api/v0/jobs (or of the job API's /api/jobs/ list: the same fields);
    None when it has no job id."""
    if not isinstance(row, Mapping):
        return None
    job_id = _text(_first(row, "job_id", "jobId"))
    if job_id is None:
        return None
    driver = row.get("driver_info")
    driver = driver if isinstance(driver, Mapping) else {}
    pid = _int(driver.get("pid"))
    entrypoint = _text(row.get("entrypoint")) or ""
    return RayJob(
        job_id=job_id,
        type=_text(row.get("type")) or "UNKNOWN",
        status=_text(row.get("status")) or "UNKNOWN",
        driver_pid=pid if pid is not None and pid > 0 else None,
        driver_node_ip=_text(_first(driver, "node_ip_address", "nodeIpAddress")),
        driver_node_id=_text(row.get("driver_node_id")),
        # The driver's argv as one string; vLLM's title is padded with empty arguments.
        entrypoint_title=(entrypoint.split(maxsplit=1) or [""])[0],
    )


def _bundle(position: int, raw: Any) -> RayBundle | None:
    if not isinstance(raw, Mapping):
        return None
    bundle_id = raw.get("bundle_id")
    index = _int(bundle_id.get("bundle_index")) if isinstance(bundle_id, Mapping) else None
    resources = _resources(_first(raw, "unit_resources", "unitResources", "resources"))
    return RayBundle(
        index=position if index is None else index,
        gpus=gpus_requested(resources),
        node_id=_text(_first(raw, "node_id", "nodeId")),
    )


def parse_placement_group(row: Any) -> RayPlacementGroup | None:
    """One row of /api/v0/placement_groups (needs detail=true for bundles and stats)."""
    if not isinstance(row, Mapping):
        return None
    pg_id = _text(_first(row, "placement_group_id", "placementGroupId", "pg_id"))
    if pg_id is None:
        return None
    stats = row.get("stats")
    stats = stats if isinstance(stats, Mapping) else {}
    raw_bundles = row.get("bundles")
    bundles = tuple(
        b
        for b in (
            _bundle(i, raw)
            for i, raw in enumerate(raw_bundles if isinstance(raw_bundles, list) else [])
        )
        if b is not None
    )
    created_ns = _int(stats.get("creation_request_received_ns"))
    return RayPlacementGroup(
        pg_id=pg_id,
        name=_text(row.get("name")),
        state=_text(row.get("state")) or "UNKNOWN",
        scheduling_state=_text(_first(stats, "scheduling_state", "schedulingState"))
        or _text(row.get("scheduling_state")),
        strategy=_text(row.get("strategy")),
        bundles=bundles,
        creator_job_id=_text(_first(row, "creator_job_id", "creatorJobId")),
        is_detached=_bool(row.get("is_detached")),
        created_timestamp_seconds=created_ns / 1e9 if created_ns else None,
    )


def list_rows(payload: Any, what: str) -> tuple[list[Any], tuple[str, ...]]:
    """Rows and non-fatal warnings from a state API list envelope.

    Raises SourceError("api_error") for `result: false` and ("bad_response") for any
    other shape.
    """
    body = _envelope_data(payload, what)
    listing = body.get("result")
    if not isinstance(listing, Mapping) or not isinstance(listing.get("result"), list):
        raise SourceError("bad_response", f"Ray {what}: no result list in the reply")
    rows: list[Any] = listing["result"]
    warnings: list[str] = []
    partial = listing.get("partial_failure_warning")
    if isinstance(partial, str) and partial.strip():
        warnings.append(f"{what}: partial failure: {one_line(partial)}")
    extra = listing.get("warnings")
    if isinstance(extra, list):
        warnings.extend(f"{what}: {one_line(w)}" for w in extra if isinstance(w, str) and w)
    total = _int(listing.get("total"))
    after_truncation = _int(listing.get("num_after_truncation"))
    filtered = _int(listing.get("num_filtered"))
    if total is not None and after_truncation is not None and after_truncation < total:
        warnings.append(f"{what}: Ray truncated {total} to {after_truncation} at the source")
    if filtered is not None and filtered > len(rows):
        warnings.append(f"{what}: limit reached, {len(rows)} of {filtered} returned")
    return rows, tuple(warnings)


def _envelope_data(payload: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping) or not isinstance(payload.get("result"), bool):
        raise SourceError("bad_response", f"Ray {what}: not a dashboard reply envelope")
    if payload["result"] is False:
        msg = payload.get("msg")
        text = one_line(msg) if isinstance(msg, str) and msg.strip() else "no message"
        raise SourceError("api_error", f"Ray {what} failed: {text}")
    data = payload.get("data")
    if not isinstance(data, Mapping):
        raise SourceError("bad_response", f"Ray {what}: no data in the reply")
    return data


def _camel(name: str) -> str:
    # The dashboard's to_camel_case, applied to cluster_status keys (resource names too).
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def usage_by_node(
    payload: Any, keys: Collection[str] | None = None
) -> Mapping[str, Mapping[str, tuple[float, float]]]:
    """node key -> camel-cased resource -> (used, total), from /api/cluster_status;
    only for the node keys (ids or IPs) in `keys` when given."""
    data = _envelope_data(payload, "cluster_status")
    status = data.get("clusterStatus")
    report = status.get("loadMetricsReport") if isinstance(status, Mapping) else None
    by_node = report.get("usageByNode") if isinstance(report, Mapping) else None
    if not isinstance(by_node, Mapping):
        return frozen_map()
    out: dict[str, Mapping[str, tuple[float, float]]] = {}
    for key, usage in by_node.items():
        if not isinstance(key, str) or not isinstance(usage, Mapping):
            continue
        if keys is not None and key not in keys:
            continue
        pairs: dict[str, tuple[float, float]] = {}
        for resource, pair in usage.items():
            if isinstance(pair, list) and len(pair) == 2:
                used, total = _float(pair[0]), _float(pair[1])
                if used is not None and total is not None:
                    pairs[resource] = (used, total)
        out[key] = frozen_map(pairs)
    return frozen_map(out)


def with_available(
    node: RayNode, usage: Mapping[str, Mapping[str, tuple[float, float]]]
) -> RayNode:
    """The node with resources_available filled from cluster_status usage, if reported."""
    # Keyed by node id today; older autoscalers keyed it by node IP.
    pairs = usage.get(node.node_id) or usage.get(node.node_ip)
    if pairs is None:
        return node
    available: dict[str, float] = {}
    for name in node.resources_total:
        pair = pairs.get(_camel(name))
        if pair is not None:
            used, total = pair
            available[name] = max(0.0, total - used)
    return RayNode(
        node_id=node.node_id,
        node_ip=node.node_ip,
        hostname=node.hostname,
        state=node.state,
        is_head=node.is_head,
        resources_total=node.resources_total,
        resources_available=frozen_map(available),
        labels=node.labels,
    )


def _parse_all(
    rows: Iterable[Any], parse: Callable[[Any], T | None], what: str
) -> tuple[tuple[T, ...], tuple[str, ...]]:
    parsed: list[T] = []
    skipped = 0
    for row in rows:
        item = parse(row)
        if item is None:
            skipped += 1
        else:
            parsed.append(item)
    warnings = (f"{what}: skipped {skipped} unreadable rows",) if skipped else ()
    return tuple(parsed), warnings


# --------------------------------------------------------------------------- client


def _base_url(address: str) -> str:
    text = address.strip()
    if "://" not in text:
        text = "http://" + text  # `--ray-address head-svc:8265` as people type it
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise SourceError("invalid_address", "--ray-address is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceError(
            "invalid_address", "--ray-address must be an http(s) URL of the Ray dashboard"
        )
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


_NOT_JSON: Final = object()
# Parsed rows and the warnings about them.
_Parsed = tuple[tuple[T, ...], tuple[str, ...]]
# Listings whose parse is kept (RayStateClient._memo): a cycle's queries with room to spare.
MAX_MEMO: Final = 64


class JsonReader:
    """Keeps a JSON answer as it arrives (HttpClient.get's `consume`), and stops reading as
    soon as it has more bytes or separators than allowed (for the state API: what `limit`
    rows take), so json.loads only ever sees a body whose objects are bounded."""

    def __init__(self, max_bytes: int, max_separators: int) -> None:
        # Pieces, joined once the answer is complete and within bounds: a refused answer
        # never takes one large block (growing one in place copies it, and a freed large
        # block can stay with the allocator), so hostile answers cost no lasting memory.
        self.pieces: list[bytes] = []
        self.size = 0
        self.max_bytes = max_bytes
        self.max_separators = max_separators
        self.separators = 0
        self.ascii = True
        self.failure: str | None = None

    def __call__(self, chunk: bytes) -> bool:
        self.pieces.append(chunk)
        self.size += len(chunk)
        # Every JSON value but a container's first follows a `,` or `:`; the first follows
        # its `{` or `[`. Separators inside strings only make the count high.
        self.separators += sum(map(chunk.count, (b",", b":", b"{", b"[")))
        # Ray's dashboard escapes every non-ASCII character (json.dumps); a body that has
        # some decodes to up to four bytes a character, so it gets a quarter of the cap.
        self.ascii = self.ascii and chunk.isascii()
        limit = self.max_bytes if self.ascii else self.max_bytes // 4
        if self.separators > self.max_separators or self.size > limit:
            self.failure = "too_large"
            self.pieces = []
            return False
        return True

    def body(self) -> bytes:
        body = b"".join(self.pieces)
        self.pieces = []
        return body


@dataclass
class Driven:
    """What fetch_driven read: the jobs' actors and groups, warnings, the jobs not read."""

    actors: list[RayActor] = field(default_factory=list)
    groups: list[RayPlacementGroup] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)


class RayStateClient:
    """Reads Ray's state API. Every failure is a SourceError; nothing else escapes.

    One client per `--ray-address`, used from one thread at a time (the source
    runner's). `timeout_seconds` is each request's deadline from connect to last byte
    (gpuledger/net/httpclient.py); fetch_cluster makes four.
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        limit: int = DEFAULT_LIMIT,
        max_response_bytes: int | None = None,
    ) -> None:
        self.base_url = _base_url(address)
        self.timeout_seconds = timeout_seconds
        self.limit = limit
        if max_response_bytes is None:
            max_response_bytes = ENVELOPE_BYTES + limit * ROW_BYTES
        self.max_response_bytes = max_response_bytes
        self.max_separators = ENVELOPE_SEPARATORS + limit * ROW_SEPARATORS
        self._headers = {"Accept": "application/json"}
        # The file may end in a newline; the token itself never reaches a log or message.
        secret = (token or "").strip()
        if secret:
            self._headers["Authorization"] = f"Bearer {secret}"
        # No redirects: the token must never be replayed to another host.
        self._http = HttpClient(
            deadline_seconds=timeout_seconds,
            max_body_bytes=max_response_bytes,
            headers=self._headers,
            max_redirects=0,
        )
        # (path, query) -> (digest of the last 200 answer's bytes, its rows parsed): most
        # answers (nodes, a node's actors, jobs, a job's placement groups) are the same
        # bytes from cycle to cycle, and the same bytes parse the same. A digest, not the
        # body, so what is kept stays small; bounded to the queries of about one cycle.
        self._memo: dict[tuple[str, str], tuple[bytes, _Parsed[Any]]] = {}

    def __repr__(self) -> str:
        return f"RayStateClient({safe_url(self.base_url)!r})"

    def close(self) -> None:
        """Nothing held between requests: each opens and closes its own connection."""

    # ---- public fetches

    def fetch_nodes(self) -> tuple[RayNode, ...]:
        return self._nodes()[0]

    def fetch_actors(
        self, node_id: str | None = None, state: str | None = None
    ) -> tuple[RayActor, ...]:
        filters: list[tuple[str, str, str]] = []
        if node_id is not None:
            filters.append(("node_id", "=", node_id))
        if state is not None:
            filters.append(("state", "=", state))
        return self._actors(filters)[0]

    def fetch_placement_groups(self) -> tuple[RayPlacementGroup, ...]:
        return self._placement_groups([])[0]

    def fetch_local(self, select: Callable[[tuple[RayNode, ...]], Sequence[str]]) -> RaySnapshot:
        """Node mode: all nodes once, then the live actors of only the nodes `select` picks
        from them (the Ray nodes that run on this machine). Only the picked nodes get their
        availability filled in: the others are not this node's to report."""
        nodes, warnings = self._nodes()
        picked = list(dict.fromkeys(select(nodes)))
        wanted = set(picked)
        keys = {k for n in nodes if n.node_id in wanted for k in (n.node_id, n.node_ip) if k}
        usage, usage_warnings = self._usage(keys)
        if usage is not None and picked:
            nodes = tuple(with_available(n, usage) if n.node_id in wanted else n for n in nodes)
        actors: list[RayActor] = []
        actor_warnings: list[str] = []
        for node_id in picked:
            found, more = self._actors([("state", "!=", "DEAD"), ("node_id", "=", node_id)])
            actors.extend(found)
            actor_warnings.extend(more)
        jobs, job_warnings = self._running_jobs()
        all_warnings = (*warnings, *usage_warnings, *actor_warnings, *job_warnings)
        return RaySnapshot(
            nodes=nodes, actors=tuple(actors), warnings=all_warnings[:MAX_WARNINGS], jobs=jobs
        )

    def fetch_driven(self, job_ids: Sequence[str]) -> Driven:
        """Node mode: the live actors (on every node) and placement groups of these jobs,
        the vLLM engines whose EngineCore drives them from here; at most MAX_DRIVEN_JOBS.
        A failed read is a warning and an unread job: the rest of the Ray view stands."""
        driven = Driven()
        if len(job_ids) > MAX_DRIVEN_JOBS:
            driven.warnings.append(
                f"jobs: {len(job_ids)} vLLM jobs driven here, read {MAX_DRIVEN_JOBS}"
            )
            driven.unread.extend(job_ids[MAX_DRIVEN_JOBS:])
        for job_id in job_ids[:MAX_DRIVEN_JOBS]:
            try:
                found, more = self._actors([("job_id", "=", job_id), ("state", "!=", "DEAD")])
                made, most = self._placement_groups(
                    [("creator_job_id", "=", job_id), ("state", "!=", "REMOVED")]
                )
            except SourceError as exc:
                if exc.reason == "unauthorized":
                    raise
                driven.warnings.append(f"job {job_id}: {exc.message}")
                driven.unread.append(job_id)
                continue
            driven.actors.extend(found)
            driven.groups.extend(made)
            driven.warnings.extend((*more, *most))
        return driven

    def fetch_cluster(
        self, node_id: str | None = None, placement_groups: bool = True
    ) -> RaySnapshot:
        """Nodes (with availability), live actors and live placement groups.

        DEAD actors and REMOVED placement groups are filtered out by the server: they
        hold nothing and pile up in long-lived clusters. `node_id` restricts actors to
        one Ray node (node mode); `placement_groups=False` skips them (node mode too).
        """
        nodes, warnings = self._nodes()
        usage, usage_warnings = self._usage()
        if usage is not None:
            nodes = tuple(with_available(n, usage) for n in nodes)
        actor_filters = [("state", "!=", "DEAD")]
        if node_id is not None:
            actor_filters.append(("node_id", "=", node_id))
        actors, actor_warnings = self._actors(actor_filters)
        groups: tuple[RayPlacementGroup, ...] = ()
        group_warnings: tuple[str, ...] = ()
        if placement_groups:
            groups, group_warnings = self._placement_groups([("state", "!=", "REMOVED")])
        all_warnings = (*warnings, *usage_warnings, *actor_warnings, *group_warnings)
        return RaySnapshot(
            nodes=nodes,
            actors=actors,
            placement_groups=groups,
            warnings=all_warnings[:MAX_WARNINGS],
        )

    # ---- per kind

    def _nodes(self) -> _Parsed[RayNode]:
        # Nodes need no detail: detail only adds start/end times.
        return self._parsed("/api/v0/nodes", self._list_params([]), "nodes", parse_node)

    def _parsed(
        self, path: str, params: list[tuple[str, str]], what: str, parse: Callable[[Any], T | None]
    ) -> _Parsed[T]:
        """The rows of one listing, parsed; again only when its bytes changed."""
        body, status, where = self._get_body(path, params)
        key = (path, urlencode(params))
        digest = hashlib.blake2b(body, digest_size=16).digest()
        memo = self._memo.get(key)
        if memo is not None and status == 200 and memo[0] == digest:
            return memo[1]
        rows, warnings = self._rows(self._decode(body, status, where), what)
        items, skipped = _parse_all(rows, parse, what)
        result = (items, warnings + skipped)
        if status == 200:
            if len(self._memo) >= MAX_MEMO and key not in self._memo:
                self._memo.clear()  # e.g. jobs come and go: start over rather than grow
            self._memo[key] = (digest, result)
        return result

    def _actors(
        self, filters: Sequence[tuple[str, str, str]]
    ) -> tuple[tuple[RayActor, ...], tuple[str, ...]]:
        # detail=true: required_resources and placement_group_id are detail-only columns.
        return self._parsed(
            "/api/v0/actors", self._list_params(filters, detail=True), "actors", parse_actor
        )

    def _placement_groups(
        self, filters: Sequence[tuple[str, str, str]]
    ) -> tuple[tuple[RayPlacementGroup, ...], tuple[str, ...]]:
        # detail=true: bundles and stats (scheduling_state) are detail-only columns.
        params = self._list_params(filters, detail=True)
        return self._parsed(
            "/api/v0/placement_groups", params, "placement_groups", parse_placement_group
        )

    def _running_jobs(self) -> tuple[tuple[RayJob, ...] | None, tuple[str, ...]]:
        """RUNNING jobs (the filter is applied by Ray, finished ones pile up), or None with
        a warning: which engine drives which workers is then unknown, nothing else."""
        params = self._list_params([("status", "=", "RUNNING")])
        try:
            return self._parsed("/api/v0/jobs", params, "jobs", parse_job)
        except SourceError as exc:
            if exc.reason == "unauthorized":
                raise
            return None, (f"jobs: {exc.message}",)

    def _rows(self, payload: Any, what: str) -> tuple[list[Any], tuple[str, ...]]:
        rows, warnings = list_rows(payload, what)
        if len(rows) > self.limit:  # the server ignored the limit: its rows are not bounded
            raise SourceError(
                "too_large", f"Ray {what}: {len(rows)} rows, more than the limit {self.limit}"
            )
        return rows, warnings

    def _usage(
        self, keys: Collection[str] | None = None
    ) -> tuple[Mapping[str, Mapping[str, tuple[float, float]]] | None, tuple[str, ...]]:
        """Per-node usage, or None with a warning: availability is optional."""
        try:
            return usage_by_node(self._get("/api/cluster_status", []), keys), ()
        except SourceError as exc:
            if exc.reason == "unauthorized":
                raise
            return None, (f"cluster_status: {exc.message}",)

    def _list_params(
        self, filters: Sequence[tuple[str, str, str]], detail: bool = False
    ) -> list[tuple[str, str]]:
        params = [
            ("limit", str(self.limit)),
            # The server's own deadline for its GCS/raylet queries, in whole seconds.
            ("timeout", str(max(1, math.ceil(self.timeout_seconds)))),
        ]
        if detail:
            params.append(("detail", "true"))
        for key, predicate, value in filters:
            params += [
                ("filter_keys", key),
                ("filter_predicates", predicate),
                ("filter_values", value),
            ]
        return params

    # ---- HTTP

    def _get(self, path: str, params: list[tuple[str, str]]) -> Any:
        return self._decode(*self._get_body(path, params))

    def _get_body(self, path: str, params: list[tuple[str, str]]) -> tuple[bytes, int, str]:
        """The raw answer: (body, HTTP status, the URL fit for messages)."""
        url = self.base_url + path
        where = safe_url(url)
        reader = JsonReader(self.max_response_bytes, self.max_separators)
        target = f"{url}?{urlencode(params)}" if params else url
        try:
            response = self._http.get(target, consume=reader)
        except HttpError as exc:
            failure: str | None = exc.reason  # raised below, without the HttpError as context
        else:
            failure = reader.failure
        if failure is not None:
            raise self._transport_error(failure, where)
        if response.status in (401, 403):
            raise self._unauthorized(response.status, where)
        return reader.body(), response.status, where

    def _decode(self, body: bytes, status: int, where: str) -> Any:
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            payload = _NOT_JSON
        if payload is _NOT_JSON:
            if status != 200:
                raise SourceError("http_error", f"HTTP {status} from {where}")
            raise SourceError("bad_response", f"{where} did not answer JSON")
        if status != 200 and not (isinstance(payload, Mapping) and payload.get("result") is False):
            raise SourceError("http_error", f"HTTP {status} from {where}")
        return payload

    def _too_large(self, where: str) -> SourceError:
        mib = self.max_response_bytes / (1024 * 1024)
        return SourceError(
            "too_large",
            f"{where} answered more than {mib:.3g} MiB or {self.max_separators} JSON values "
            f"(what {self.limit} rows take)",
        )

    def _unauthorized(self, status: int, where: str) -> SourceError:
        if "Authorization" in self._headers:
            return SourceError(
                "unauthorized",
                f"{where} rejected the token (HTTP {status}): --ray-token-file does not hold "
                "this Ray cluster's auth token",
            )
        return SourceError(
            "unauthorized",
            f"{where} requires a token (HTTP {status}): Ray 2.60 enables token auth by "
            "default; pass the cluster's token with --ray-token-file, or run the cluster "
            "with RAY_AUTH_MODE=disabled",
        )

    def _transport_error(self, reason: str, where: str) -> SourceError:
        if reason == "timeout":
            return SourceError(
                "timeout", f"no complete answer from {where} within {self.timeout_seconds:g}s"
            )
        if reason == "too_large":
            return self._too_large(where)
        if reason in ("truncated", "garbage"):
            return SourceError("bad_response", f"{where} sent a truncated or undecodable body")
        if reason == "invalid_url":
            return SourceError("invalid_address", f"invalid Ray dashboard URL {where}")
        detail = "connection refused" if reason == "refused" else reason.replace("_", " ")
        return SourceError("unreachable", f"cannot reach the Ray dashboard at {where}: {detail}")


# --------------------------------------------------------------------------- pure helpers


# --------------------------------------------------------------------------- sources


def local_ray_nodes(
    nodes: Sequence[RayNode], pods: Sequence[PodInfo] | None
) -> list[tuple[RayNode, PodInfo | None]]:
    """The Ray nodes that run here: pods on this node (by IP, else name), or, outside
    Kubernetes, the node with this host's name (or the only node)."""
    if pods is not None:
        index = PodNodes(nodes)
        found: list[tuple[RayNode, PodInfo | None]] = []
        for pod in pods:
            if pod.phase == "Running" and pod.pod_ip:
                match = index.of(pod.pod_ip, pod.name)
                if match is not None:
                    found.append((match, pod))
        return found
    alive = [n for n in nodes if n.state == "ALIVE"]
    here = socket.gethostname()
    mine = [n for n in alive if n.hostname == here]
    return [(n, None) for n in (mine or (alive if len(alive) == 1 else []))]


def driven_jobs(snapshot: RaySnapshot, node_ids: Collection[str]) -> dict[str, str]:
    """Job id -> Ray node id, for the RUNNING vLLM EngineCore jobs whose driver runs on
    one of these Ray nodes."""
    found: dict[str, str] = {}
    for job in snapshot.jobs or ():
        if engine_dp_rank(job) is None:
            continue
        node = driver_node(job, snapshot.nodes)
        if node is not None and node.node_id in node_ids:
            found[job.job_id] = node.node_id
    return found


class RayLocalSource(Source[tuple[LocalRayNode, ...]]):
    """Node mode: the Ray nodes on this node, each with its own actors."""

    key = RAY_LOCAL
    needs = (PODS,)

    def __init__(self, client: RayStateClient) -> None:
        self.client = client

    def fetch(self, inputs: Snapshots) -> tuple[LocalRayNode, ...]:
        pods_snapshot = inputs.get(PODS)
        pods = pods_snapshot.pods if pods_snapshot is not None else None
        chosen: list[tuple[RayNode, PodInfo | None]] = []

        def select(nodes: tuple[RayNode, ...]) -> list[str]:
            chosen.extend(local_ray_nodes(nodes, pods))
            return [node.node_id for node, _ in chosen]

        snapshot = self.client.fetch_local(select)
        # The snapshot's copies of the chosen nodes carry their availability.
        by_id = {node.node_id: node for node in snapshot.nodes}
        actors_by_node: dict[str | None, list[RayActor]] = {}
        for actor in snapshot.actors:
            actors_by_node.setdefault(actor.node_id, []).append(actor)
        driven = driven_jobs(snapshot, [node.node_id for node, _ in chosen])
        read = self.client.fetch_driven(sorted(driven))
        warnings = (*snapshot.warnings, *read.warnings)[:MAX_WARNINGS]

        def here(job_id: str | None, node_id: str) -> bool:
            return driven.get(job_id or "") == node_id

        return tuple(
            LocalRayNode(
                RaySnapshot(
                    nodes=snapshot.nodes,
                    actors=tuple(actors_by_node.get(node.node_id, ())),
                    warnings=warnings,
                    jobs=snapshot.jobs,
                ),
                by_id.get(node.node_id, node),
                pod,
                driven_actors=tuple(a for a in read.actors if here(a.job_id, node.node_id)),
                driven_groups=tuple(g for g in read.groups if here(g.creator_job_id, node.node_id)),
                driven_unread=tuple(j for j in read.unread if here(j, node.node_id)),
            )
            for node, pod in chosen
        )

    def close(self) -> None:
        self.client.close()


class RayClusterSource(Source[RayClusterSnapshot]):
    """Cluster mode: every node, live actor and placement group of the Ray cluster."""

    key = RAY_CLUSTER

    def __init__(self, client: RayStateClient, namespace: str, workload: str) -> None:
        self.client = client
        self.namespace = namespace
        self.workload = workload

    def fetch(self, inputs: Snapshots) -> RayClusterSnapshot:
        return RayClusterSnapshot(self.client.fetch_cluster(), self.namespace, self.workload)

    def close(self) -> None:
        self.client.close()
