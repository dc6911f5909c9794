"""ledger/binding.py: which API server a target is, and what is said when it is not known."""

from __future__ import annotations

from gpuledger.ledger.binding import TargetBinding, bind_target
from gpuledger.model.procfs import ListenSocket, ProcessSockets


def read(*ports: int, address: str = "0.0.0.0") -> ProcessSockets:
    return ProcessSockets("read", tuple(ListenSocket(address, p) for p in ports), 1)


def test_the_server_listening_on_the_port_is_bound() -> None:
    sockets = {10: read(8000), 20: read(8001)}
    assert bind_target("10.0.0.5:8001", {10, 20}, sockets) == TargetBinding("socket", 20, "read")
    assert bind_target("[::1]:8000", {10, 20}, sockets) == TargetBinding("socket", 10, "read")


def test_the_address_tells_servers_on_one_port_apart() -> None:
    sockets = {10: read(8000, address="127.0.0.2"), 20: read(8000, address="127.0.0.3")}
    assert bind_target("127.0.0.3:8000", {10, 20}, sockets).api_server == 20
    # A name is not resolved: both could be it.
    assert bind_target("engine.local:8000", {10, 20}, sockets).binding == "ambiguous"


def test_a_bound_server_wins_even_when_another_is_unreadable() -> None:
    sockets = {10: read(8000), 20: ProcessSockets("unreadable")}
    assert bind_target("h:8000", {10, 20}, sockets) == TargetBinding("socket", 10, "unreadable")
    assert bind_target("h:9000", {10, 20}, sockets) == TargetBinding(
        "ambiguous", None, "unreadable"
    )


def test_the_old_rule_when_no_socket_says() -> None:
    # Read, but nothing listens on the port (a proxy in front?): the only server.
    assert bind_target("h:9000", {10}, {10: read(8000)}) == TargetBinding(
        "only_api_server", 10, "read"
    )
    assert bind_target("h:8000", {10}, {10: ProcessSockets("timeout")}) == TargetBinding(
        "only_api_server", 10, "timeout"
    )
    # Not in the snapshot at all (a ledger built without sockets).
    assert bind_target("h:8000", {10, 20}, {}) == TargetBinding("ambiguous", None, "not_read")
    assert bind_target("<invalid url>", {10}, {10: read(8000)}).binding == "only_api_server"


def test_no_server_is_none() -> None:
    assert bind_target("h:8000", set(), {}) == TargetBinding("none", None, None)


def test_one_socket_held_by_two_servers_is_ambiguous() -> None:
    sockets = {10: read(8000), 20: read(8000)}  # inherited across a fork
    assert bind_target("h:8000", {10, 20}, sockets) == TargetBinding("ambiguous", None, "read")
