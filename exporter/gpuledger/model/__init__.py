"""Typed, frozen snapshots, a module per domain: what each source saw in one cycle.

Sources produce these and nothing else; the ledger (`gpuledger/ledger/`) consumes them
and does no I/O. Every snapshot kind has a `Key` naming it in the cycle's `Snapshots`.
"""

from gpuledger.model.base import NOT_CONFIGURED, SOURCE_STATES, SourceStatus, frozen_map
from gpuledger.model.bundle import Key, Snapshots

__all__ = ["NOT_CONFIGURED", "SOURCE_STATES", "Key", "Snapshots", "SourceStatus", "frozen_map"]
