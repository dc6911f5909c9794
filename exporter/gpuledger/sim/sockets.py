"""The synthetic /proc's sockets: each engine API server listens on its target's port.

For every `engines` entry of a scenario, its API server (`api_server`, else the only one in
its pod, or among the host's processes for a static target) gets what the procfs source
reads (sources/procfs/sockets.py), in the kernel's formats (identity/sockets.py):
`ns/net` -> `net:[<inode>]`, one per pod and one for the host; `fd/3…` ->
`socket:[<inode>]`; and `net/tcp`, `net/tcp6` listing every listening socket of its
namespace. An entry with `socket: unreadable` gets none of them, as when the agent lacks
SYS_PTRACE.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from gpuledger.engines import is_engine_title
from gpuledger.identity.cgroup import parse_cgroup_file
from gpuledger.sim.scenario import Scenario, SimEngineServer, SimProcess


class Listening(Protocol):
    """A fake engine server, as far as its sockets go."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


HOST_NETNS = 4026531840  # the inode Linux gives the initial network namespace
_FIRST_INODE = 700_000
_HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
    "   uid  timeout inode"
)
_DIRS = ("fd", "ns", "net")

Listener = tuple[str, int, int]  # address, port, socket inode


def _pod_uid(proc: SimProcess) -> str:
    return parse_cgroup_file(proc.cgroup).pod_uid or ""


def _api_servers(processes: Mapping[int, SimProcess], pod_uid: str) -> list[int]:
    """The nearest ancestor of each engine-retitled process of the pod (or host) that
    is not one itself."""
    found: set[int] = set()
    for proc in processes.values():
        if _pod_uid(proc) != pod_uid or not is_engine_title(proc.cmdline[0]):
            continue
        current: SimProcess | None = proc
        for _ in range(64):
            current = processes.get(current.ppid) if current is not None else None
            if current is None or not is_engine_title(current.cmdline[0]):
                break
        if current is not None:
            found.add(current.pid)
    return sorted(found)


def _server_of(
    sim: SimEngineServer, state: Scenario, processes: Mapping[int, SimProcess]
) -> int | None:
    if sim.api_server is not None:
        return sim.api_server if sim.api_server in processes else None
    pods = {p.key: p.uid for p in state.pods or ()}
    candidates = _api_servers(processes, pods.get(sim.pod, "") if sim.pod else "")
    return candidates[0] if len(candidates) == 1 else None


def listening(
    state: Scenario, servers: Mapping[str, Listening]
) -> tuple[dict[int, list[Listener]], set[int]]:
    """API server PID -> the sockets it listens on, and the PIDs whose sockets are
    unreadable."""
    processes = {p.pid: p for p in state.processes}
    found: dict[int, list[Listener]] = defaultdict(list)
    hidden: set[int] = set()
    for i, sim in enumerate(state.engines):
        pid = _server_of(sim, state, processes)
        server = servers.get(sim.key)
        if pid is None or server is None:
            continue
        found[pid].append((server.host, server.port, _FIRST_INODE + i))
        if sim.socket == "unreadable":
            hidden.add(pid)
    return dict(found), hidden


def write_sockets(root: Path, state: Scenario, servers: Mapping[str, Listening]) -> None:
    """Give the synthetic proc root's API servers their sockets (and take them from
    every other process)."""
    by_pid, hidden = listening(state, servers)
    processes = {p.pid: p for p in state.processes}
    uids = sorted({_pod_uid(p) for p in processes.values()} - {""})
    netns = {uid: HOST_NETNS + 1 + i for i, uid in enumerate(uids)} | {"": HOST_NETNS}
    tables: dict[int, list[Listener]] = defaultdict(list)
    for pid, sockets in by_pid.items():
        tables[netns[_pod_uid(processes[pid])]].extend(sockets)
    for pid in processes:
        base = root / str(pid)
        if pid not in by_pid or pid in hidden:
            if (base / "ns").exists():  # one stat for each process that never had them
                for name in _DIRS:
                    shutil.rmtree(base / name, ignore_errors=True)
            continue
        ns = netns[_pod_uid(processes[pid])]
        _write_links(base, ns, [inode for _, _, inode in by_pid[pid]])
        for name, family in (("tcp", 4), ("tcp6", 6)):
            _replace(base / "net" / name, _table(tables[ns], family))


def _write_links(base: Path, netns: int, inodes: list[int]) -> None:
    (base / "ns").mkdir(parents=True, exist_ok=True)
    _symlink(base / "ns" / "net", f"net:[{netns}]")
    fd = base / "fd"
    fd.mkdir(exist_ok=True)
    wanted = {str(i): "/dev/null" for i in range(3)}
    wanted.update({str(3 + i): f"socket:[{inode}]" for i, inode in enumerate(inodes)})
    for entry in os.listdir(fd):
        if entry not in wanted:
            os.unlink(fd / entry)
    for name, target in wanted.items():
        _symlink(fd / name, target)


def _symlink(path: Path, target: str) -> None:
    if path.is_symlink() and os.readlink(path) == target:
        return
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.unlink(missing_ok=True)
    os.symlink(target, temporary)
    os.replace(temporary, path)


def _replace(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _hex_address(address: str, port: int) -> str:
    """The kernel's form: each 32-bit word of the address in this host's byte order."""
    packed = ipaddress.ip_address(address).packed
    words = (packed[i : i + 4] for i in range(0, len(packed), 4))
    text = "".join(f"{int.from_bytes(w, sys.byteorder):08X}" for w in words)
    return f"{text}:{port:04X}"


def _table(sockets: list[Listener], family: int) -> str:
    rows = [_HEADER]
    kept = [s for s in sockets if ipaddress.ip_address(s[0]).version == family]
    for n, (address, port, inode) in enumerate(sorted(kept, key=lambda s: s[2])):
        remote = _hex_address("0.0.0.0" if family == 4 else "::", 0)
        rows.append(
            f"{n:4d}: {_hex_address(address, port)} {remote} 0A 00000000:00000000 "
            f"00:00000000 00000000     0        0 {inode} 1 0000000000000000 100 0 0 10 0"
        )
    return "\n".join(rows) + "\n"
