"""vLLM's view: scrape targets, and what each engine reported in one cycle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from gpuledger.model.base import frozen_map
from gpuledger.model.bundle import Key

Origin = Literal["static", "annotation", "prometheus_annotation"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
DEFAULT_PATH = "/metrics"


def endpoint_of(url: str) -> str:
    """What tells scrape targets apart (the `target` label): `host:port`, plus the path
    when it is not /metrics. No scheme, userinfo or query: an address, never a secret."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return "<invalid url>"
    if ":" in host:
        host = f"[{host}]"
    address = f"{host}:{port}" if port is not None else host
    return address if parts.path in ("", DEFAULT_PATH) else address + parts.path


@dataclass(frozen=True)
class EngineMetrics:
    """What one vLLM engine (one data-parallel rank of one served model) reports."""

    model_name: str
    # Data-parallel rank, the `engine` label; engines that predate it are "0".
    engine: str
    requests_running: float | None = None
    requests_waiting: float | None = None
    # From vllm:num_requests_waiting_by_reason (0.20+): capacity / deferred; empty before.
    waiting_by_reason: Mapping[str, float] = field(default_factory=frozen_map)
    kv_cache_usage_ratio: float | None = None
    preemptions_total: float | None = None
    # Only CACHE_CONFIG_LABELS, as strings exactly as exposed.
    cache_config: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class EngineTarget:
    """One `/metrics` endpoint to scrape, with the identity the caller already knows."""

    url: str
    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""
    workload: str = ""
    origin: Origin = "static"

    @property
    def endpoint(self) -> str:
        return endpoint_of(self.url)


@dataclass(frozen=True)
class EngineScrape:
    """How one target fared in one cycle; `engines` is empty unless `up`."""

    target: EngineTarget
    up: bool
    error_reason: str | None
    error_message: str | None
    engines: tuple[EngineMetrics, ...]
    duration_seconds: float


@dataclass(frozen=True)
class VllmSnapshot:
    """One scrape per target, in the order the targets were given."""

    scrapes: tuple[EngineScrape, ...] = ()


# This source's snapshot in a cycle's Snapshots.
VLLM: Key[VllmSnapshot] = Key("vllm")
