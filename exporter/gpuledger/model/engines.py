"""The engines' view: scrape targets, and what each engine reported in one cycle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from gpuledger.model.base import frozen_map
from gpuledger.model.bundle import Key
from gpuledger.model.serverinfo import ServerInfo

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
    """What one engine (one data-parallel rank of one served model) reports."""

    model_name: str
    # Data-parallel rank, the `engine` label; engines that predate it are "0".
    engine: str
    requests_running: float | None = None
    requests_waiting: float | None = None
    # By the engine's own reason (vLLM 0.20+: capacity / deferred); empty without one.
    waiting_by_reason: Mapping[str, float] = field(default_factory=frozen_map)
    kv_cache_usage_ratio: float | None = None
    preemptions_total: float | None = None
    # Only the kind's cache_config_labels, as strings exactly as exposed.
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
    # The engine kind its annotation names; "" until its body says (static, prometheus.io).
    kind: str = ""

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
    # The kind that answered (or the target's, when it did not); "" when unknown.
    kind: str = ""
    # The kind's server info (ServerInfo), when it has such an endpoint and it answered;
    # else why not (a REASONS value of the engine source), None when not asked.
    server_info: ServerInfo | None = None
    server_info_error: str | None = None


# EngineScrape.error_reason of a prometheus.io candidate whose body shows no engine
# kind's series: dropped, not reported. The value predates other kinds and is kept, as
# users' queries on the source error reasons may name it.
NOT_AN_ENGINE = "not_vllm"


@dataclass(frozen=True)
class EnginesSnapshot:
    """One scrape per target, in the order the targets were given."""

    scrapes: tuple[EngineScrape, ...] = ()


# This source's snapshot in a cycle's Snapshots. "vllm" is the `source` label value
# users see (gpuledger_source_up{source="vllm"}), kept from before other kinds.
ENGINES: Key[EnginesSnapshot] = Key("vllm")
