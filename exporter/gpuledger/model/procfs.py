"""procfs' view: host processes, their pod identity and whitelisted settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuledger.model.base import frozen_map
from gpuledger.model.bundle import Key


@dataclass(frozen=True)
class CgroupIdentity:
    """Who a process belongs to, as far as its cgroup path tells."""

    pod_uid: str | None  # lowercase; dashed UUID, or 32 hex for static pods
    container_id: str | None  # bare 64-hex id, runtime prefix removed
    runtime: str | None  # "containerd" | "cri-o" | "docker" | None
    qos: str | None  # "guaranteed" | "burstable" | "besteffort" | None
    # A process in no pod: the systemd service unit it runs in (`vllm-a.service`), the
    # stable name of a bare-host workload (docs/design.md, identity rule 7); else None.
    unit: str | None = None


NO_IDENTITY = CgroupIdentity(None, None, None, None)


@dataclass(frozen=True)
class ProcessInfo:
    """What procfs tells about one host process. Only whitelisted environment names are kept."""

    pid: int
    ppid: int | None
    # NSpid from /proc/<pid>/status: host PID first, innermost namespace PID last.
    nspid: tuple[int, ...]
    # Process title: first word of argv[0] (engines and Ray rename their processes there).
    title: str
    cgroup: CgroupIdentity = NO_IDENTITY
    environ: Mapping[str, str] = field(default_factory=frozen_map)
    # Only the whitelisted `--flag value` pairs of the command line (see procfs.ALLOWED_FLAGS).
    flags: Mapping[str, str] = field(default_factory=frozen_map)


@dataclass(frozen=True, order=True)
class ListenSocket:
    """A TCP socket in LISTEN state: its local address ("0.0.0.0" or "::" for any
    address; an IPv4-mapped IPv6 address as IPv4) and port."""

    address: str
    port: int


@dataclass(frozen=True, order=True)
class HeldConnection:
    """An established TCP connection a process holds: its own end's address and port,
    and the far end's port (a span receiver's: only those are looked for)."""

    address: str
    port: int
    remote_port: int


# How an API server's listening sockets were read: its fds and its network namespace's
# tables were read; a read was refused or failed (no SYS_PTRACE, process gone); the
# procfs source's socket deadline passed first.
SocketState = Literal["read", "unreadable", "timeout"]


@dataclass(frozen=True)
class ProcessSockets:
    """The listening TCP sockets one engine API server holds (docs/design.md, identity
    rule 6): what ties a scrape target's port to that process."""

    state: SocketState
    listening: tuple[ListenSocket, ...] = ()
    netns: int | None = None  # inode of its network namespace (/proc/<pid>/ns/net)
    # The connections to the span receiver it holds, of those the receiver's senders
    # came over (identity rule 10's peer-socket rule); only looked for while spans arrive.
    connections: tuple[HeldConnection, ...] = ()


@dataclass(frozen=True)
class ProcSnapshot:
    processes: Mapping[int, ProcessInfo]
    # Engine API server PID -> its listening sockets. Only API servers (the nearest
    # ancestor of an engine-retitled process that is not one) are read; others are absent.
    sockets: Mapping[int, ProcessSockets] = field(default_factory=frozen_map)


# This source's snapshot in a cycle's Snapshots.
PROCESSES: Key[ProcSnapshot] = Key("procfs")
