"""procfs' view: host processes, their pod identity and whitelisted settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuledger.identity.cgroup import NO_IDENTITY, CgroupIdentity
from gpuledger.model.base import frozen_map
from gpuledger.model.bundle import Key


@dataclass(frozen=True)
class ProcessInfo:
    """What procfs tells about one host process. Only whitelisted environment names are kept."""

    pid: int
    ppid: int | None
    # NSpid from /proc/<pid>/status: host PID first, innermost namespace PID last.
    nspid: tuple[int, ...]
    # Process title: first word of argv[0] (vLLM and Ray rename their processes there).
    title: str
    cgroup: CgroupIdentity = NO_IDENTITY
    environ: Mapping[str, str] = field(default_factory=frozen_map)
    # Only the whitelisted `--flag value` pairs of the command line (see procfs.ALLOWED_FLAGS).
    flags: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True)
class ProcSnapshot:
    processes: Mapping[int, ProcessInfo]


# This source's snapshot in a cycle's Snapshots.
PROCESSES: Key[ProcSnapshot] = Key("procfs")
