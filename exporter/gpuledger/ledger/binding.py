"""Which vLLM API server a scrape target is (docs/design.md, identity rule 6). Pure.

The target's port is a listening socket of exactly one API server of its pod (or, for
a target in no pod, of the host's processes): that server, bound by `socket`. When no
server's sockets say so (unreadable, past the deadline, or none listens on the port)
the old rule applies: the only API server of the pod or host (`only_api_server`), and
with two or more, none, since they cannot be told apart (`ambiguous`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from gpuledger.identity.sockets import serves, split_endpoint
from gpuledger.model.procfs import ProcessSockets

Binding = Literal["socket", "only_api_server", "ambiguous", "none"]
# How the candidates' sockets were read, all together: `read` when every one was; else
# the worst of `timeout`, `unreadable`, `not_read` (the snapshot has no entry for it).
SocketsRead = Literal["read", "unreadable", "timeout", "not_read"]


@dataclass(frozen=True)
class TargetBinding:
    binding: Binding
    api_server: int | None  # its PID; None when ambiguous or none
    sockets: SocketsRead | None  # None without candidates


def bind_target(
    endpoint: str, servers: Collection[int], sockets: Mapping[int, ProcessSockets]
) -> TargetBinding:
    """The API server among `servers` that serves `endpoint` (host:port), and how."""
    if not servers:
        return TargetBinding("none", None, None)
    read = _summary([sockets[p].state if p in sockets else "not_read" for p in servers])
    where = split_endpoint(endpoint)
    if where is not None:
        listening = sorted(
            p for p in servers if p in sockets and serves(sockets[p].listening, *where)
        )
        if len(listening) == 1:
            return TargetBinding("socket", listening[0], read)
        if listening:  # one port, several holders (an inherited socket): no guess
            return TargetBinding("ambiguous", None, read)
    if len(servers) == 1:
        return TargetBinding("only_api_server", next(iter(servers)), read)
    return TargetBinding("ambiguous", None, read)


def _summary(states: Collection[str]) -> SocketsRead:
    if "timeout" in states:
        return "timeout"
    if "unreadable" in states:
        return "unreadable"
    return "not_read" if "not_read" in states else "read"
