"""Each InferencePool's endpoint picker (EPP): what it holds, from its `/metrics`.

The picker's metric names (tests/fixtures/gateway/README.md, read at llm-d-router v0.10.0
and GIE v1.5.0): llm-d-router since v0.9.0 emits `llm_d_epp_*` and, for one deprecation
cycle, the GIE v1.x names (`inference_pool_*`, `inference_extension_*`) beside them; a GIE
v1.x picker (or llm-d-inference-scheduler v0.8.0) emits only the old ones. Both are read,
the new first when its marker is seen. One picker serves one pool: only samples labelled
with the pool's name count (`name` on the pool gauges, `inference_pool` on flow control's).

Every read has one deadline from connect to last byte for all pickers of the cycle, a byte
cap, a cap on kept lines and on samples; lines are filtered as they arrive (the engines'
ExpositionReader), so the body is never held. Only a configured picker token
(`--gateway-picker-token-file`) is sent, as a bearer token, and never through a redirect.
"""

from __future__ import annotations

import codecs
import concurrent.futures
import functools
import logging
import math
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from gpuledger.identity.urls import safe_url
from gpuledger.model import Snapshots
from gpuledger.model.gateway import (
    INFERENCE_POOLS,
    PICKERS,
    InferencePool,
    PickerReading,
    PickersSnapshot,
)
from gpuledger.net.httpclient import HttpClient, HttpError
from gpuledger.sources.base import Source
from gpuledger.sources.engines.exposition import (
    ExpositionError,
    ExpositionReader,
    MarkerLines,
    _samples,
)

__all__ = ["NAMINGS", "PickerSource", "read_exposition"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# A picker's wanted series: a handful of pool gauges, one queue per endpoint, one flow
# control queue per (fairness id, priority, model), model names capped at 1,000 upstream.
MAX_SAMPLES = 4096
MAX_WANTED_CHARS = MAX_SAMPLES * 1024
MAX_ENDPOINTS = 1024
MAX_WORKERS = 8
_PIECE = 64 * 1024


@dataclass(frozen=True)
class Naming:
    """One generation of the picker's metric names."""

    name: str  # PickerReading.names
    marker: str  # the prefix every wanted family shares
    queue: str
    queue_bytes: str
    ready: str
    average_queue: str
    average_kv: str
    saturation: str
    endpoint_queue: str
    endpoint_label: str

    @property
    def wanted(self) -> tuple[str, ...]:
        return (
            self.queue,
            self.queue_bytes,
            self.ready,
            self.average_queue,
            self.average_kv,
            self.saturation,
            self.endpoint_queue,
        )


NAMINGS = (
    Naming(
        "llm_d_epp",
        "llm_d_epp_",
        queue="llm_d_epp_flow_control_queue_size",
        queue_bytes="llm_d_epp_flow_control_queue_bytes",
        ready="llm_d_epp_ready_endpoints",
        average_queue="llm_d_epp_average_queue_size",
        average_kv="llm_d_epp_average_kv_cache_utilization",
        saturation="llm_d_epp_flow_control_pool_saturation",
        endpoint_queue="llm_d_epp_per_endpoint_queue_size",
        endpoint_label="model_server_endpoint",
    ),
    Naming(
        "legacy",
        "inference_",
        queue="inference_extension_flow_control_queue_size",
        queue_bytes="inference_extension_flow_control_queue_bytes",
        ready="inference_pool_ready_pods",
        average_queue="inference_pool_average_queue_size",
        average_kv="inference_pool_average_kv_cache_utilization",
        saturation="inference_extension_flow_control_pool_saturation",
        endpoint_queue="inference_pool_per_pod_queue_size",
        endpoint_label="model_server_pod",
    ),
)


@dataclass(frozen=True)
class _Read:
    """What one naming's families said of one pool."""

    queued: float | None = None
    queued_bytes: float | None = None
    ready: float | None = None
    average_queue: float | None = None
    average_kv: float | None = None
    saturation: float | None = None
    endpoints: Mapping[str, float] | None = None


def _pool_of(labels: Mapping[str, str]) -> str | None:
    return labels.get("name", labels.get("inference_pool"))


def _fold(samples: Iterator[tuple[str, Mapping[str, str], float]], n: Naming, pool: str) -> _Read:
    """The pool's samples of one naming: flow control's queues summed over fairness ids,
    priorities and models; the pool gauges as they are; the queue of each endpoint."""
    summed = {n.queue: "queued", n.queue_bytes: "queued_bytes"}
    single = {n.ready: "ready", n.average_queue: "average_queue", n.average_kv: "average_kv"}
    values: dict[str, float] = {}
    endpoints: dict[str, float] = {}
    for name, labels, value in samples:
        if _pool_of(labels) != pool or math.isnan(value):  # another pool's, or no value
            continue
        if name in summed:
            values[summed[name]] = values.get(summed[name], 0.0) + value
        elif name in single:
            values[single[name]] = value
        elif name == n.saturation:
            # After v0.10.0 a `stage` label (prefill, decode, effective): the effective one.
            if labels.get("stage") in (None, "effective") or "saturation" not in values:
                values["saturation"] = value
        elif name == n.endpoint_queue and len(endpoints) < MAX_ENDPOINTS:
            endpoint = labels.get(n.endpoint_label, "")
            endpoints.update({endpoint: value} if endpoint else {})
    return _Read(**values, endpoints=endpoints)


class _Body:
    """A picker's answer read as it arrives (HttpClient.get's `consume`): each naming's
    wanted lines kept, its marker watched; stops at the first malformed line."""

    def __init__(self) -> None:
        self.readers = [
            ExpositionReader(n.wanted, n.marker, MAX_WANTED_CHARS, MAX_SAMPLES) for n in NAMINGS
        ]
        self.markers = [MarkerLines((n.marker,)) for n in NAMINGS]
        self.error: str | None = None
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode

    def __call__(self, chunk: bytes) -> bool:
        self._take(self._decode(chunk))
        return self.error is None

    def end(self) -> None:
        if self.error is None:
            self._take(self._decode(b"", final=True))

    def _take(self, text: str) -> None:
        try:
            for reader, marker in zip(self.readers, self.markers, strict=True):
                marker.feed(text)
                reader.feed(text)
        except ExpositionError as exc:
            self.error = str(exc)


def read_exposition(text: str, pool: str) -> PickerReading:
    """A picker's exposition (a whole text) as a reading of `pool`; for tests and tools."""
    body = _Body()
    for at in range(0, len(text), _PIECE):
        body(text[at : at + _PIECE].encode())
    body.end()
    return _reading(body, "", pool, "")


def _reading(body: _Body, namespace: str, pool: str, url: str) -> PickerReading:
    failed = functools.partial(PickerReading, namespace, pool, url, False)
    if body.error is not None:
        return failed(error_reason="garbage", error_message=f"{url}: {body.error}")
    chosen = next((i for i, m in enumerate(body.markers) if m.seen), None)
    if chosen is None:
        markers = " or ".join(n.marker for n in NAMINGS)
        return failed(error_reason="not_a_picker", error_message=f"{url}: no {markers} series")
    naming = NAMINGS[chosen]
    try:
        read = _fold(_samples(body.readers[chosen].relevant()), naming, pool)
    except ExpositionError as exc:
        return failed(error_reason="garbage", error_message=f"{url}: {exc}")
    return PickerReading(
        namespace,
        pool,
        url,
        True,
        names=naming.name,
        queued_requests=read.queued,
        queued_bytes=read.queued_bytes,
        ready_endpoints=read.ready,
        average_queue_size=read.average_queue,
        average_kv_cache_utilization=read.average_kv,
        saturation=read.saturation,
        endpoint_queues=read.endpoints or {},
    )


class PickerSource(Source[PickersSnapshot]):
    """The picker of every pool that has one, read concurrently under one deadline. One
    picker failing is that picker's reading, never the source's."""

    key = PICKERS
    needs = (INFERENCE_POOLS,)

    def __init__(
        self,
        *,
        timeout_seconds: float = 3.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        token: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        if timeout_seconds <= 0 or max_body_bytes <= 0:
            raise ValueError("timeout_seconds and max_body_bytes must be > 0")
        self.timeout_seconds = timeout_seconds
        self.max_body_bytes = max_body_bytes
        self._token = token
        self._tls = ssl.create_default_context(cafile=ca_file)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def __repr__(self) -> str:  # never the token
        return f"PickerSource(timeout_seconds={self.timeout_seconds})"

    def fetch(self, inputs: Snapshots) -> PickersSnapshot:
        pools = inputs.get(INFERENCE_POOLS)
        targets = [p for p in (pools.pools if pools else ()) if p.picker_metrics_url]
        if not targets:
            return PickersSnapshot(())
        deadline = time.monotonic() + self.timeout_seconds
        executor = self._pool()
        futures = [
            executor.submit(self.cpu.run, functools.partial(self.read_one, p, deadline))
            for p in targets
        ]
        done, _ = concurrent.futures.wait(futures, timeout=self.timeout_seconds + 0.5)
        late = f"no complete answer within {self.timeout_seconds:g}s"
        return PickersSnapshot(
            tuple(
                f.result() if f in done else self._failed(p, "timeout", late)
                for f, p in zip(futures, targets, strict=True)
            )
        )

    def read_one(self, pool: InferencePool, deadline: float) -> PickerReading:
        """One picker's reading; never raises."""
        started = time.monotonic()
        url = pool.picker_metrics_url or ""
        if started >= deadline:
            return self._failed(pool, "timeout", "no time left in the cycle")
        headers = {"Accept": "text/plain;version=0.0.4;q=1.0, */*;q=0.1"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        client = HttpClient(
            deadline_seconds=max(0.001, deadline - started),
            max_body_bytes=self.max_body_bytes,
            headers=headers,
            tls_context=self._tls,
            max_redirects=0,  # the token goes to the picker named only
        )
        body = _Body()
        try:
            response = client.get(url, consume=body)
        except HttpError as exc:
            return self._failed(pool, exc.reason, exc.message, prefixed=True)
        except Exception as exc:  # a bug: contained to this picker, type only
            log.warning(
                "Picker read of %s failed unexpectedly: %s", safe_url(url), type(exc).__name__
            )
            return self._failed(pool, "internal_error", type(exc).__name__)
        if response.status != 200:
            code = response.status if 100 <= response.status <= 599 else 0
            return self._failed(pool, f"http_{code}", f"HTTP status {code}")
        body.end()
        reading = _reading(body, pool.namespace, pool.name, safe_url(url))
        return replace(reading, duration_seconds=time.monotonic() - started)

    def _failed(
        self, pool: InferencePool, reason: str, message: str, *, prefixed: bool = False
    ) -> PickerReading:
        url = safe_url(pool.picker_metrics_url or "")
        return PickerReading(
            pool.namespace,
            pool.name,
            url,
            False,
            error_reason=reason,
            error_message=message if prefixed else f"{url}: {message}",
        )

    def item_errors(self, snapshot: PickersSnapshot) -> Iterable[str]:
        return [r.error_reason or "unknown" for r in snapshot.readings if not r.up]

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=MAX_WORKERS, thread_name_prefix="picker-read"
            )
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
