"""The listening TCP sockets of engines' API servers, read from procfs under a deadline.

What ties a scrape target to its own API server (docs/design.md, identity rule 6): the
target's port is a LISTEN socket in the server's network namespace, and the server holds
that socket. For each API server: `ns/net` names its namespace; `fd/*` links name the
sockets it holds; the namespace's `net/tcp` and `net/tcp6` (read once per namespace per
cycle, through the first server in it) give each listening socket's address and port.

Bounded: only API servers are read, at most MAX_FDS descriptors each (a server opens its
listening socket at start, so it has a low number) and MAX_TABLE_LINES lines of a table
(listeners come first: reading stops at the first established-side line), all under one
deadline inside the procfs source's. Reading fds and `ns/net` is the same ptrace read
check as `environ` (SYS_PTRACE); without it a server is `unreadable`, never an error.

While the span receiver has senders (identity rule 10, the peer-socket rule), the tables
are read past the listeners too, up to MAX_TABLE_LINES, for the established connections
the senders' exports came over (`wanted`: each sender's address and port, and the
receiver's port): the API server holding one is the process that sent those spans.
Connections come and go, so while any are wanted every server is read each cycle.

Kept once bound (:class:`BoundSockets`): an API server opens its listening socket once
and holds it until it exits, so a server seen listening is not read again while its PID
names the same process (its start time in `stat` unchanged). A server not listening yet
(vLLM binds its port after the model loads), unreadable or timed out is read every cycle.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping

from gpuledger.engines import is_engine_title
from gpuledger.identity.processes import ancestors
from gpuledger.identity.sockets import (
    line_state,
    lists_listeners,
    local_keys,
    parse_connection,
    parse_link,
    parse_listener,
)
from gpuledger.model.procfs import HeldConnection, ListenSocket, ProcessInfo, ProcessSockets

MAX_FDS = 4096
MAX_TABLE_LINES = 8192
_CHUNK = 64 * 1024
_TABLES = ("tcp", "tcp6")


class _Timeout(Exception):
    pass


class _Table:
    """One network namespace's sockets: listeners, and the wanted connections."""

    def __init__(self) -> None:
        self.listeners: dict[int, ListenSocket] = {}
        self.connections: dict[int, HeldConnection] = {}


def api_servers(procs: Mapping[int, ProcessInfo]) -> set[int]:
    """The nearest ancestor of each engine-retitled process that is not one itself: the
    engines' API servers, the only processes whose sockets are read."""
    found: set[int] = set()
    for info in procs.values():
        if not is_engine_title(info.title):
            continue
        server = next((p for p in ancestors(info, procs) if not is_engine_title(p.title)), None)
        if server is not None:
            found.add(server.pid)
    return found


def read_sockets(root: str, pids: Iterable[int], deadline: float) -> dict[int, ProcessSockets]:
    """Each PID's listening sockets, or why they are unknown; returns by `deadline`."""
    return BoundSockets().read(root, pids, deadline)


class BoundSockets:
    """Reads API servers' listening sockets, keeping each bound server's from one cycle
    to the next (see the module docstring)."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[int, ProcessSockets]] = {}  # pid -> (start time, ...)

    def read(
        self,
        root: str,
        pids: Iterable[int],
        deadline: float,
        wanted: frozenset[HeldConnection] = frozenset(),
    ) -> dict[int, ProcessSockets]:
        """Each PID's listening sockets and which of the `wanted` connections it holds, or
        why they are unknown; returns by `deadline`. Servers no longer asked for are
        forgotten."""
        tables: dict[int, _Table | None] = {}
        found: dict[int, ProcessSockets] = {}
        kept: dict[int, tuple[int, ProcessSockets]] = {}
        for pid in sorted(pids):
            start = _start_time(root, pid)
            before = self._kept.get(pid)
            if not wanted and start is not None and before is not None and before[0] == start:
                found[pid], kept[pid] = before[1], before
                continue
            try:
                found[pid] = _process_sockets(root, pid, tables, deadline, wanted)
            except _Timeout:
                found[pid] = ProcessSockets("timeout")
            if start is not None and found[pid].state == "read" and found[pid].listening:
                kept[pid] = (start, found[pid])
        self._kept = kept
        return found


def _start_time(root: str, pid: int) -> int | None:
    """The process's start time (clock ticks since boot, `stat` field 22): with the PID,
    what names one process across cycles. None when it cannot be read."""
    try:
        with open(f"{root}/{pid}/stat", "rb") as f:
            fields = f.read(4096).rpartition(b")")[2].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _process_sockets(
    root: str,
    pid: int,
    tables: dict[int, _Table | None],
    deadline: float,
    wanted: frozenset[HeldConnection],
) -> ProcessSockets:
    _check(deadline)
    netns = _link(f"{root}/{pid}/ns/net", "net")
    held = _socket_inodes(f"{root}/{pid}/fd", deadline)
    if netns is None or held is None:
        return ProcessSockets("unreadable", netns=netns)
    if netns not in tables:
        tables[netns] = _sockets(f"{root}/{pid}/net", deadline, wanted)
    table = tables[netns]
    if table is None:
        return ProcessSockets("unreadable", netns=netns)
    listening = sorted({table.listeners[i] for i in held if i in table.listeners})
    connected = sorted({table.connections[i] for i in held if i in table.connections})
    return ProcessSockets("read", tuple(listening), netns, tuple(connected))


def _check(deadline: float) -> None:
    if time.monotonic() >= deadline:
        raise _Timeout


def _link(path: str, kind: str) -> int | None:
    try:
        return parse_link(os.readlink(path), kind)
    except OSError:  # no permission (no SYS_PTRACE), or the process is gone
        return None


def _socket_inodes(fd_dir: str, deadline: float) -> set[int] | None:
    """Inodes of the sockets among a process's first MAX_FDS descriptors; None when its
    fd directory cannot be read."""
    inodes: set[int] = set()
    try:
        with os.scandir(fd_dir) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_FDS:
                    break
                if count % 256 == 0:
                    _check(deadline)
                inode = _link(entry.path, "socket")
                if inode is not None:
                    inodes.add(inode)
    except OSError:
        return None
    return inodes


def _sockets(net_dir: str, deadline: float, wanted: frozenset[HeldConnection]) -> _Table | None:
    """One namespace's listeners and wanted connections, by inode, from its tcp and
    tcp6; None when neither table can be read."""
    found = _Table()
    read_any = False
    for name in _TABLES:
        read_any |= _read_table(f"{net_dir}/{name}", found, deadline, wanted)
    return found if read_any else None


def _read_table(
    path: str, found: _Table, deadline: float, wanted: frozenset[HeldConnection]
) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # tcp6 is absent on a kernel without IPv6
        return False
    try:
        _scan(fd, found, deadline, wanted)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _scan(fd: int, found: _Table, deadline: float, wanted: frozenset[HeldConnection]) -> None:
    """Listeners from the table open on `fd`, line by line as it is read, until the
    first established-side line (with `wanted`: on, for those connections) or
    MAX_TABLE_LINES."""
    keys = frozenset().union(*(local_keys(end) for end in wanted))
    listing = True
    pending = b""
    lines = 0
    while lines < MAX_TABLE_LINES:
        _check(deadline)
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            return
        *complete, pending = (pending + chunk).split(b"\n")
        for raw in complete[: MAX_TABLE_LINES - lines]:
            line = raw.decode("ascii", errors="replace") if listing else ""
            if listing and lists_listeners(line_state(line)):
                parsed = parse_listener(line)
                if parsed is not None:
                    found.listeners[parsed[0]] = parsed[1]
                continue
            listing = False
            if not keys:
                return
            # Most lines are other connections: only a wanted local end is parsed.
            fields = raw.split(None, 2)
            if len(fields) > 1 and fields[1] in keys:
                connection = parse_connection(raw.decode("ascii", errors="replace"))
                if connection is not None and connection[1] in wanted:
                    found.connections[connection[0]] = connection[1]
        lines += len(complete)
