"""Request spans joined to their engines, and each engine's recent state (docs/design.md,
identity rule 10). Pure.

A span is tied to an engine by who sent it, never by what it says it served. First by
the connection it came over: the API server that holds the sending end of it (procfs'
socket tables, as a target's port names its server) sent it. Else by the PID it names:
`vllm.process_id` is the API server's PID in its own PID namespace, so it is read in
the sender's pod (the Collector's `k8s.pod.uid`, else the pod whose IP is the
connection's peer) against the last `NSpid` entry of that pod's API servers; a sender on
loopback is a host process (no pod), whose one NSpid entry is its host PID. Exactly one
API server must match, holding exactly one engine; anything else is left untied with
the reason, never guessed.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from gpuledger.identity.sockets import sending_end
from gpuledger.ledger.engines import Engine, identity
from gpuledger.model.base import frozen_map
from gpuledger.model.kubernetes import PodsSnapshot
from gpuledger.model.procfs import ProcessInfo, ProcessSockets
from gpuledger.model.spans import (
    EngineRequestSpan,
    LatencyCounts,
    RouterSpan,
    SpanPeer,
    SpanSender,
    SpansSnapshot,
)

# Which rule tied a sender to its engine, in the order they are tried; "none" when none could.
JoinRule = Literal["peer_socket", "k8s_pod_uid", "peer_pod", "host_pid", "none"]
JOIN_RULES: tuple[JoinRule, ...] = get_args(JoinRule)
# Cycles of engine state kept per engine: 15 minutes at the default 10 s interval.
MAX_STATE_SAMPLES = 90


@dataclass(frozen=True)
class EngineSample:
    """One engine's state in one cycle, as its /metrics said (the agent's clock)."""

    at: float  # the ledger's taken_at
    up: bool
    running: float | None
    waiting: float | None
    waiting_by_reason: Mapping[str, float] = field(default_factory=frozen_map)
    kv_cache_usage_ratio: float | None = None
    max_num_seqs: int | None = None


@dataclass(frozen=True)
class EngineHistory:
    engine: tuple[str, ...]  # ledger.engines.identity
    samples: tuple[EngineSample, ...]  # oldest first


@dataclass(frozen=True)
class RequestSender:
    """One sender's requests, and the engine they were tied to (or why not)."""

    sender: SpanSender
    joined_by: JoinRule
    untied_reason: str  # "" when tied
    engine: tuple[str, ...] | None  # ledger.engines.identity of the engine, when tied
    recent: tuple[EngineRequestSpan, ...]
    slowest: tuple[EngineRequestSpan, ...]
    received_total: int
    queue_time: LatencyCounts | None = None
    ttft: LatencyCounts | None = None


@dataclass(frozen=True)
class RequestLedger:
    senders: tuple[RequestSender, ...] = ()
    routers: tuple[RouterSpan, ...] = ()
    refused_total: Mapping[str, int] = field(default_factory=frozen_map)
    stored_bytes: int = 0


def _max_num_seqs(engine: Engine) -> int | None:
    text = engine.config.get("max_num_seqs", "")
    return int(text) if text.isdigit() else None


def engine_history(
    engines: Sequence[Engine], previous: Sequence[EngineHistory], taken_at: float
) -> tuple[EngineHistory, ...]:
    """This cycle's sample appended to each engine's history; engines gone are dropped."""
    before = {h.engine: h.samples for h in previous}
    found = []
    for engine in engines:
        m = engine.metrics
        sample = EngineSample(
            at=taken_at,
            up=engine.up,
            running=m.requests_running if m else None,
            waiting=m.requests_waiting if m else None,
            waiting_by_reason=m.waiting_by_reason if m else frozen_map(),
            kv_cache_usage_ratio=m.kv_cache_usage_ratio if m else None,
            max_num_seqs=_max_num_seqs(engine),
        )
        key = identity(engine)
        samples = (*before.get(key, ()), sample)[-MAX_STATE_SAMPLES:]
        found.append(EngineHistory(key, samples))
    return tuple(found)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class _Tie:
    rule: JoinRule
    reason: str
    engine: Engine | None = None


def _untied(reason: str) -> _Tie:
    return _Tie("none", reason)


def tie_sender(
    sender: SpanSender,
    engines: Sequence[Engine],
    procs: Mapping[int, ProcessInfo],
    pods: PodsSnapshot | None,
    *,
    connection: SpanPeer | None = None,
    sockets: Mapping[int, ProcessSockets] | None = None,
) -> _Tie:
    """The engine that sent these spans, by the rules above, or why none can be named."""
    owner = _socket_owner(connection, sockets or {})
    if owner is not None:
        return _tie_by_socket(sender, owner, engines, procs)
    if sender.process_id is None:
        return _untied("the spans' resource has no vllm.process_id")
    rule: JoinRule
    if sender.pod_uid:
        rule, pod_uids = "k8s_pod_uid", {sender.pod_uid}
    else:
        address = sender.pod_ip or sender.peer
        by_ip = _pods_by_ip(pods)
        if address in by_ip:
            rule, pod_uids = "peer_pod", by_ip[address]
        elif _is_loopback(address):
            rule, pod_uids = "host_pid", {""}
        else:
            return _untied("no pod on this node has the sender's address")
    servers: dict[int, list[Engine]] = defaultdict(list)
    for engine in engines:
        if engine.api_server_pid is not None:
            servers[engine.api_server_pid].append(engine)
    matched = [
        pid
        for pid in servers
        if (info := procs.get(pid)) is not None
        and (info.cgroup.pod_uid or "") in pod_uids
        and info.nspid
        and info.nspid[-1] == sender.process_id
        and (rule != "host_pid" or len(info.nspid) == 1)
    ]
    if len(matched) != 1:
        where = "the sender's pod" if rule != "host_pid" else "this host"
        return _untied(
            f"{len(matched)} API servers in {where} have PID {sender.process_id} in their namespace"
        )
    found = servers[matched[0]]
    if len(found) != 1:
        return _untied(f"{len(found)} engines (data-parallel ranks) share its API server")
    return _Tie(rule, "", found[0])


def _socket_owner(connection: SpanPeer | None, sockets: Mapping[int, ProcessSockets]) -> int | None:
    """The one API server holding the sending end of `connection`; None when none does
    (gone: an HTTP exporter's connection ends with its export) or several do (a socket
    inherited over a fork names no one process): the other rules decide then."""
    end = sending_end(connection)
    if end is None:
        return None
    owners = [pid for pid, held in sockets.items() if end in held.connections]
    return owners[0] if len(owners) == 1 else None


def _tie_by_socket(
    sender: SpanSender, owner: int, engines: Sequence[Engine], procs: Mapping[int, ProcessInfo]
) -> _Tie:
    found = [e for e in engines if e.api_server_pid == owner]
    if len(found) != 1:
        return _untied(
            f"{len(found)} engines share API server {owner}, which holds the sender's connection"
        )
    info = procs.get(owner)
    own_pid = info.nspid[-1] if info is not None and info.nspid else None
    if sender.process_id is not None and own_pid is not None and own_pid != sender.process_id:
        return _untied(
            f"the sender's connection is held by API server {owner} (PID {own_pid} in its "
            f"namespace), but the spans name vllm.process_id {sender.process_id}"
        )
    return _Tie("peer_socket", "", found[0])


def _pods_by_ip(pods: PodsSnapshot | None) -> dict[str, set[str]]:
    by_ip: dict[str, set[str]] = defaultdict(set)
    for pod in pods.pods if pods is not None else ():
        if pod.pod_ip:
            by_ip[pod.pod_ip].add(pod.uid)
    return by_ip


def build_requests(
    snapshot: SpansSnapshot | None,
    engines: Sequence[Engine],
    procs: Mapping[int, ProcessInfo],
    pods: PodsSnapshot | None,
    sockets: Mapping[int, ProcessSockets] | None = None,
) -> RequestLedger | None:
    if snapshot is None:
        return None
    senders = []
    for held in snapshot.senders:
        tie = tie_sender(
            held.sender, engines, procs, pods, connection=held.connection, sockets=sockets
        )
        senders.append(
            RequestSender(
                sender=held.sender,
                joined_by=tie.rule,
                untied_reason=tie.reason,
                engine=identity(tie.engine) if tie.engine is not None else None,
                recent=held.recent,
                slowest=held.slowest,
                received_total=held.received_total,
                queue_time=held.queue_time,
                ttft=held.ttft,
            )
        )
    return RequestLedger(
        senders=tuple(senders),
        routers=snapshot.routers,
        refused_total=snapshot.refused_total,
        stored_bytes=snapshot.stored_bytes,
    )
