"""Walking a process's parents in one snapshot. Pure.

PIDs are reused: between two procfs reads a parent may exit and its PID go to a child of
the reader's own process, so a snapshot can hold a PPid cycle. Every walk goes through here,
bounded by a seen set and a depth.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from gpuledger.model.procfs import ProcessInfo

MAX_DEPTH = 64


def ancestors(info: ProcessInfo, procs: Mapping[int, ProcessInfo]) -> Iterator[ProcessInfo]:
    """The parents of `info` present in `procs`, nearest first; stops at a cycle."""
    seen = {info.pid}
    current = info
    for _ in range(MAX_DEPTH):
        parent = procs.get(current.ppid) if current.ppid is not None else None
        if parent is None or parent.pid in seen:
            return
        seen.add(parent.pid)
        yield parent
        current = parent
