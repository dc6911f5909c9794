"""Identity rule 10: a span is tied to its engine by who sent it (the API server holding
the connection it came over; else the sender's pod and the API server's NSpid, or a
loopback host process's PID), and left untied, with the reason, whenever that does not
name exactly one engine."""

from __future__ import annotations

from typing import Any

from gpuledger.ledger.engines import Engine
from gpuledger.ledger.spans import EngineHistory, engine_history, tie_sender
from gpuledger.model.engines import EngineMetrics
from gpuledger.model.kubernetes import PodInfo, PodsSnapshot
from gpuledger.model.procfs import CgroupIdentity, HeldConnection, ProcessInfo, ProcessSockets
from gpuledger.model.spans import SpanPeer, SpanSender

UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"


def engine(
    pid: int | None, uid: str = UID_A, rank: str = "0", target: str = "10.0.0.1:8000"
) -> Engine:
    return Engine(
        url=f"http://{target}/metrics",
        target=target,
        origin="annotation",
        namespace="llm",
        pod=f"pod-{uid[:1]}",
        pod_uid=uid,
        workload="llama",
        model_name="m",
        engine=rank,
        up=True,
        metrics=EngineMetrics(
            "m", rank, requests_running=4, requests_waiting=9, kv_cache_usage_ratio=0.5
        ),
        config={"max_num_seqs": "4"},
        api_server_pid=pid,
    )


def process(pid: int, nspid: tuple[int, ...], uid: str | None) -> ProcessInfo:
    return ProcessInfo(
        pid=pid,
        ppid=1,
        nspid=nspid,
        title="python3",
        cgroup=CgroupIdentity(uid, None, None, None),
    )


def pod(uid: str, ip: str) -> PodInfo:
    return PodInfo(
        uid=uid,
        namespace="llm",
        name=f"pod-{uid[:1]}",
        node_name="n",
        phase="Running",
        labels={},
        workload="llama",
        pod_ip=ip,
        container_ids={},
        gpu_requests=1,
        pending_reason=None,
        pending_since=None,
        ready=True,
        deletion=False,
    )


PODS = PodsSnapshot((pod(UID_A, "10.0.0.1"), pod(UID_B, "10.0.0.2")), synced=True)


def sender(peer: str, pid: int | None, pod_uid: str = "") -> SpanSender:
    return SpanSender(peer, "vllm", "instance", pid, pod_uid)


def test_the_senders_pod_ip_and_the_api_servers_namespace_pid_name_its_engine() -> None:
    # Two pods' API servers are both PID 1 in their own namespaces.
    procs = {500: process(500, (500, 1), UID_A), 600: process(600, (600, 1), UID_B)}
    engines = [engine(500), engine(600, UID_B, target="10.0.0.2:8000")]
    tie = tie_sender(sender("10.0.0.2", 1), engines, procs, PODS)
    assert (tie.rule, tie.engine) == ("peer_pod", engines[1])


def test_a_collectors_pod_uid_wins_over_the_collectors_own_address() -> None:
    procs = {500: process(500, (500, 1), UID_A), 600: process(600, (600, 1), UID_B)}
    engines = [engine(500), engine(600, UID_B, target="10.0.0.2:8000")]
    tie = tie_sender(sender("10.0.0.9", 1, pod_uid=UID_A), engines, procs, PODS)
    assert (tie.rule, tie.engine) == ("k8s_pod_uid", engines[0])


def test_a_loopback_sender_is_a_host_process_whose_pid_is_its_host_pid() -> None:
    procs = {700: process(700, (700,), None), 500: process(500, (500, 700), UID_A)}
    engines = [engine(700, "", target="127.0.0.1:8000"), engine(500)]
    tie = tie_sender(sender("127.0.0.1", 700), engines, procs, PODS)
    assert (tie.rule, tie.engine) == ("host_pid", engines[0])


def test_what_names_no_single_engine_is_left_untied_with_the_reason() -> None:
    procs = {500: process(500, (500, 1), UID_A), 501: process(501, (501, 2), UID_A)}
    cases = {
        "no process id": (sender("10.0.0.1", None), [engine(500)]),
        "unknown address": (sender("10.9.9.9", 1), [engine(500)]),
        "no such pid": (sender("10.0.0.1", 7), [engine(500), engine(501, target="10.0.0.1:8001")]),
        "dp ranks": (sender("10.0.0.1", 1), [engine(500), engine(500, rank="1")]),
    }
    reasons = {}
    for name, (who, engines) in cases.items():
        tie = tie_sender(who, engines, procs, PODS)
        assert (tie.rule, tie.engine) == ("none", None), name
        reasons[name] = tie.reason
    assert "vllm.process_id" in reasons["no process id"]
    assert "no pod" in reasons["unknown address"]
    assert reasons["no such pid"].startswith("0 API servers")
    assert "data-parallel" in reasons["dp ranks"]


def test_two_host_network_pods_on_one_ip_are_told_apart_by_the_namespace_pid() -> None:
    shared = PodsSnapshot((pod(UID_A, "192.168.1.5"), pod(UID_B, "192.168.1.5")), synced=True)
    procs = {500: process(500, (500, 1), UID_A), 600: process(600, (600, 8), UID_B)}
    engines = [engine(500), engine(600, UID_B, target="192.168.1.5:8001")]
    tie = tie_sender(sender("192.168.1.5", 8), engines, procs, shared)
    assert tie.engine == engines[1]
    both_one = {500: process(500, (500, 1), UID_A), 600: process(600, (600, 1), UID_B)}
    tie = tie_sender(sender("192.168.1.5", 1), engines, both_one, shared)
    assert tie.engine is None and tie.reason.startswith("2 API servers")


# A hostNetwork engine exporting to the agent on loopback: its API server is PID 1 in its
# own PID namespace (not a host process), so no PID rule can name it; its socket can.
HOSTNET_PROCS = {
    900: process(900, (900, 1), UID_A),
    950: process(950, (950, 1), UID_B),
}
CONNECTION = SpanPeer("127.0.0.1", 41234, 4317)
HELD = HeldConnection("127.0.0.1", 41234, 4317)


def sockets(**held: tuple[HeldConnection, ...]) -> dict[int, ProcessSockets]:
    return {int(pid[1:]): ProcessSockets("read", (), 1, conns) for pid, conns in held.items()}


def tie_on_loopback(
    engines: list[Engine],
    pid: int | None = 1,
    held: dict[int, ProcessSockets] | None = None,
    peer: SpanPeer = CONNECTION,
) -> Any:
    """A hostNetwork sender's tie, its connection held by API server 950 unless `held`."""
    owned = sockets(p950=(HELD,)) if held is None else held
    return tie_sender(
        sender(peer.address, pid), engines, HOSTNET_PROCS, PODS, connection=peer, sockets=owned
    )


def test_the_api_server_holding_the_senders_connection_sent_its_spans() -> None:
    engines = [engine(900, target="127.0.0.1:8000"), engine(950, UID_B, target="127.0.0.1:8001")]
    tie = tie_on_loopback(engines, held=sockets(p900=(), p950=(HELD,)))
    assert (tie.rule, tie.engine) == ("peer_socket", engines[1])
    # Without the socket, the loopback rule finds no host process with PID 1.
    tie = tie_sender(sender("127.0.0.1", 1), engines, HOSTNET_PROCS, PODS)
    assert (tie.rule, tie.engine) == ("none", None)
    # The socket needs no vllm.process_id (an engine version or Collector without it).
    assert tie_on_loopback(engines, pid=None).engine == engines[1]


def test_a_socket_that_contradicts_the_spans_pid_ties_nothing() -> None:
    engines = [engine(950, UID_B, target="127.0.0.1:8001")]
    tie = tie_on_loopback(engines, pid=7)
    assert (tie.rule, tie.engine) == ("none", None)
    assert "vllm.process_id 7" in tie.reason and "API server 950" in tie.reason


def test_a_connection_no_one_or_several_hold_leaves_it_to_the_other_rules() -> None:
    procs = {500: process(500, (500, 1), UID_A), 600: process(600, (600, 1), UID_B)}
    engines = [engine(500), engine(600, UID_B, target="10.0.0.2:8000")]
    peer = SpanPeer("10.0.0.2", 5000, 4317)
    end = HeldConnection("10.0.0.2", 5000, 4317)
    for held in (sockets(), sockets(p500=(end,), p600=(end,))):  # gone; inherited over a fork
        tie = tie_sender(sender("10.0.0.2", 1), engines, procs, PODS, connection=peer, sockets=held)
        assert (tie.rule, tie.engine) == ("peer_pod", engines[1])
    # Same address and port to another receiver port: another connection.
    other = sockets(p500=(HeldConnection("10.0.0.2", 5000, 9402),))
    tie = tie_sender(sender("10.0.0.2", 1), engines, procs, PODS, connection=peer, sockets=other)
    assert tie.rule == "peer_pod"


def test_an_ipv4_mapped_peer_is_matched_as_procfs_lists_it() -> None:
    engines = [engine(950, UID_B, target="127.0.0.1:8001")]
    mapped = SpanPeer("::ffff:127.0.0.1", 41234, 4317)
    assert tie_on_loopback(engines, peer=mapped).rule == "peer_socket"


def test_a_socket_held_by_a_data_parallel_server_names_no_single_engine() -> None:
    engines = [engine(950, UID_B, target="127.0.0.1:8001"), engine(950, UID_B, rank="1")]
    tie = tie_on_loopback(engines)
    assert tie.engine is None and tie.reason.startswith("2 engines share API server 950")


def test_the_state_history_keeps_the_last_samples_of_engines_still_there() -> None:
    first = engine(500)
    history: tuple[EngineHistory, ...] = ()
    for at in range(200):
        history = engine_history([first], history, float(at))
    (only,) = history
    assert len(only.samples) == 90
    assert only.samples[-1].at == 199.0 and only.samples[0].at == 110.0
    assert only.samples[-1].max_num_seqs == 4 and only.samples[-1].waiting == 9
    assert engine_history([], history, 200.0) == ()
