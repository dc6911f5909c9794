"""What every source shares: read-only mappings and how a source fared in a cycle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def frozen_map(items: Mapping[K, V] | None = None) -> Mapping[K, V]:
    """A read-only mapping, so a snapshot cannot be changed after it is taken."""
    return MappingProxyType(dict(items or {}))


# The error_reason of a source this exporter is not configured to read (no Kubernetes, no
# Ray address): reported as state `not_configured`, never as a failure.
NOT_CONFIGURED = "disabled"
SOURCE_STATES = ("up", "down", "not_configured")


@dataclass(frozen=True)
class SourceStatus:
    """How one source fared in one cycle."""

    source: str
    up: bool
    duration_seconds: float
    # Short, bounded vocabulary (a label value): timeout, library_not_found, ...
    error_reason: str | None = None
    # One line a person can act on. Never contains environment values or arguments.
    error_message: str | None = None
    # CPU its threads spent since the previous cycle (sources/base.py CpuMeter).
    cpu_seconds: float = 0.0

    @property
    def state(self) -> str:
        """One of SOURCE_STATES: `down` only for a configured source whose fetch failed."""
        if self.up:
            return "up"
        return "not_configured" if self.error_reason == NOT_CONFIGURED else "down"
