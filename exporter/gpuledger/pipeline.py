"""One collection cycle: run the sources under their deadlines, join them, publish.

Sources run in a fixed order because procfs needs the PIDs NVML reported; each has its
own deadline, so the worst case for a cycle is the sum of the deadlines, and a scrape
never waits on any of it (it renders the last published ledger).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

from gpuledger.collector import Published
from gpuledger.ledger import Ledger, build_ledger
from gpuledger.model import NvmlSnapshot, ProcSnapshot, SourceStatus
from gpuledger.sources import nvml, procfs
from gpuledger.sources.base import SourceRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineConfig:
    node: str
    mode: str = "node"
    proc_root: str = "/proc"
    nvml_library: str | None = None
    source_deadline_seconds: float = 5.0


class Pipeline:
    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self._nvml = nvml.NvmlSource(config.nvml_library)
        self._procfs = procfs.ProcfsSource(config.proc_root)
        deadline = config.source_deadline_seconds
        self._nvml_runner: SourceRunner[NvmlSnapshot] = SourceRunner(nvml.SOURCE, deadline)
        self._procfs_runner: SourceRunner[ProcSnapshot] = SourceRunner(procfs.SOURCE, deadline)
        self._errors: Counter[tuple[str, str]] = Counter()
        self._last_success: dict[str, float] = {}
        self._last_reason: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def cycle(self) -> Published:
        """Take one coherent snapshot of every source and join it."""
        started = time.time()
        nvml_snap, nvml_status = self._nvml_runner.run(self._nvml.fetch)
        pids = [p.pid for g in nvml_snap.gpus for p in g.processes] if nvml_snap else []
        proc_snap, proc_status = self._procfs_runner.run(lambda: self._procfs.fetch(pids))
        statuses = (nvml_status, proc_status)
        ledger = build_ledger(
            node=self.config.node,
            mode=self.config.mode,
            taken_at=time.time(),
            nvml=nvml_snap,
            procs=proc_snap,
            sources=statuses,
        )
        self._account(statuses, started)
        return self.published(ledger)

    def _account(self, statuses: tuple[SourceStatus, ...], when: float) -> None:
        with self._lock:
            for status in statuses:
                if status.up:
                    self._last_success[status.source] = when
                else:
                    self._errors[(status.source, status.error_reason or "unknown")] += 1
                # Log transitions only: a source down for hours must not flood the log.
                reason = None if status.up else status.error_reason
                if self._last_reason.get(status.source, "") != reason:
                    if status.up:
                        log.info("source %s is up", status.source)
                    else:
                        log.warning(
                            "source %s is down (%s): %s",
                            status.source,
                            reason,
                            status.error_message,
                        )
                    self._last_reason[status.source] = reason

    def published(self, ledger: Ledger) -> Published:
        with self._lock:
            return Published(
                ledger=ledger,
                errors_total=dict(self._errors),
                last_success=dict(self._last_success),
            )

    def close(self) -> None:
        self._nvml_runner.close()
        self._procfs_runner.close()
        self._nvml.close()
