"""What a scrape renders: the latest ledger plus the exporter's running counters.

Its own module so that the document (document.py) and the server read it without the
collector (Prometheus families) in between.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuledger.ledger import Ledger


@dataclass(frozen=True)
class Published:
    """The latest ledger plus the exporter's running counters."""

    ledger: Ledger
    errors_total: Mapping[tuple[str, str], int] = field(default_factory=dict)
    last_success: Mapping[str, float] = field(default_factory=dict)
    # From PipelineConfig.simulated: the data comes from gpuledger's simulator.
    simulated: bool = False
    # Metric family -> series a cap kept out, summed over snapshots (dropped_series).
    dropped_total: Mapping[str, int] = field(default_factory=dict)
    # Source -> CPU seconds its threads have spent since start (sources/base.py CpuMeter).
    cpu_seconds_total: Mapping[str, float] = field(default_factory=dict)
