"""Sockets from /proc: the table parser on real lines, fd links, namespaces; the
listening ones (identity rule 6) and the established ones a span sender holds (rule 10)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from gpuledger.identity.cgroup import NO_IDENTITY
from gpuledger.identity.sockets import (
    parse_address,
    parse_connection,
    parse_link,
    parse_listener,
    serves,
    split_endpoint,
)
from gpuledger.model.procfs import HeldConnection, ListenSocket, ProcessInfo, ProcessSockets
from gpuledger.sources.procfs import sockets as procfs_sockets
from gpuledger.sources.procfs.sockets import BoundSockets, api_servers, read_sockets

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "procfs"


def _listeners(text: str) -> dict[int, ListenSocket]:
    # The fixture was captured on x86_64: little-endian words, whatever runs the test.
    found = (parse_listener(line, "little") for line in text.splitlines())
    return dict(f for f in found if f is not None)


def test_real_table_lines_give_each_listener_its_address_and_port() -> None:
    expected = json.loads((FIXTURES / "expected.json").read_text())
    found = _listeners((FIXTURES / "tcp").read_text())
    found.update(_listeners((FIXTURES / "tcp6").read_text()))
    # ::ffff:127.0.0.1 on an IPv6 socket is said as the IPv4 address it maps.
    want = {
        e["inode"]: ListenSocket(e["address"].removeprefix("::ffff:"), e["port"])
        for e in expected
        if e["listening"]
    }
    assert found == want
    # Established and TIME_WAIT lines (inode 0) are no listeners.
    assert not {e["inode"] for e in expected if not e["listening"]} & set(found)


def test_real_established_lines_give_both_ends_and_skip_time_wait() -> None:
    # The capture's loopback connection: the client end (inode 1324649, port 47266) and
    # the accepted end (1324650) of the listener on 48293; TIME_WAIT (inode 0) is none.
    lines = (FIXTURES / "tcp").read_text().splitlines()
    found = dict(c for c in (parse_connection(line, "little") for line in lines) if c)
    assert found == {
        1324649: HeldConnection("127.0.0.1", 47266, 48293),
        1324650: HeldConnection("127.0.0.1", 48293, 47266),
    }


def test_live_connection_is_found_held_by_this_process() -> None:
    """Connect to a listener here and find the client's end the way the procfs source
    looks for a span sender's: by its address, its port and the far end's port."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    try:
        here, there = client.getsockname(), listener.getsockname()
        end = HeldConnection("127.0.0.1", here[1], there[1])
        other = HeldConnection("127.0.0.1", here[1] + 1, there[1])
        pid = os.getpid()
        got = BoundSockets().read("/proc", [pid], time.monotonic() + 5, frozenset({end, other}))
        assert got[pid].state == "read"
        assert got[pid].connections == (end,)
        assert ListenSocket("127.0.0.1", there[1]) in got[pid].listening
    finally:
        for s in (accepted, client, listener):
            s.close()


def test_live_ipv4_mapped_connection_in_tcp6_is_found_as_its_ipv4_end() -> None:
    """An IPv6 socket connected to ::ffff:127.0.0.1 is listed in tcp6 in the mapped form;
    the receiver names its peer 127.0.0.1 (gRPC's `ipv6:[::ffff:127.0.0.1]:…` normalised)."""
    listener = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    client = socket.socket(socket.AF_INET6)
    try:
        client.connect(("::ffff:127.0.0.1", listener.getsockname()[1]))
        accepted, _ = listener.accept()
        end = HeldConnection("127.0.0.1", client.getsockname()[1], listener.getsockname()[1])
        pid = os.getpid()
        got = BoundSockets().read("/proc", [pid], time.monotonic() + 5, frozenset({end}))
        assert got[pid].connections == (end,)
        accepted.close()
    finally:
        client.close()
        listener.close()


def test_live_table_and_fd_links_of_this_process() -> None:
    """Listen here, then find the sockets the way the source does: this process's
    namespace, its fd links, its own /proc/<pid>/net tables."""
    v4 = socket.socket(socket.AF_INET)
    v6 = socket.socket(socket.AF_INET6)
    try:
        v4.bind(("127.0.0.1", 0))
        v4.listen(1)
        v6.bind(("::", 0))
        v6.listen(1)
        pid = os.getpid()
        got = read_sockets("/proc", [pid], time.monotonic() + 5)[pid]
        assert got.state == "read"
        assert got.netns == parse_link(os.readlink(f"/proc/{pid}/ns/net"), "net")
        assert ListenSocket("127.0.0.1", v4.getsockname()[1]) in got.listening
        assert ListenSocket("::", v6.getsockname()[1]) in got.listening
    finally:
        v4.close()
        v6.close()


@pytest.mark.parametrize(
    ("text", "order", "want"),
    [
        ("0100007F:1F40", "little", ("127.0.0.1", 8000)),
        ("7F000001:1F40", "big", ("127.0.0.1", 8000)),
        ("00000000:0050", "little", ("0.0.0.0", 80)),
        ("00000000000000000000000001000000:1F41", "little", ("::1", 8001)),
        ("0000000000000000FFFF00000100007F:1F40", "little", ("127.0.0.1", 8000)),
        ("B80D0120000000000000000001000000:01BB", "little", ("2001:db8::1", 443)),
        ("0100007F", "little", None),
        ("0100007:1F40", "little", None),
        ("0100007G:1F40", "little", None),
        ("0100007F:", "little", None),
    ],
)
def test_parse_address(text: str, order: str, want: tuple[str, int] | None) -> None:
    assert parse_address(text, order) == want


def test_parse_link() -> None:
    assert parse_link("socket:[1324243]", "socket") == 1324243
    assert parse_link("net:[4026531840]", "net") == 4026531840
    assert parse_link("pipe:[12]", "socket") is None
    assert parse_link("/dev/null", "socket") is None
    assert parse_link("socket:[12]x", "socket") is None


@pytest.mark.parametrize(
    ("endpoint", "want"),
    [
        ("10.0.0.5:8000", ("10.0.0.5", 8000)),
        ("[::1]:8001", ("::1", 8001)),
        ("engine.local:80/v1/metrics", ("engine.local", 80)),
        ("<invalid url>", None),
        ("10.0.0.5", None),
    ],
)
def test_split_endpoint(endpoint: str, want: tuple[str, int] | None) -> None:
    assert split_endpoint(endpoint) == want


def test_serves_by_port_and_address() -> None:
    anywhere = [ListenSocket("0.0.0.0", 8000)]
    assert serves(anywhere, "10.0.0.5", 8000)
    assert not serves(anywhere, "10.0.0.5", 8001)
    only = [ListenSocket("127.0.0.2", 8000)]
    assert serves(only, "127.0.0.2", 8000)
    assert not serves(only, "127.0.0.3", 8000)
    assert serves(only, "engine.local", 8000)  # a name is not resolved: the port decides
    assert serves([ListenSocket("::", 8000)], "::1", 8000)
    assert serves([ListenSocket("::1", 8000)], "::1", 8000)
    assert serves([ListenSocket("127.0.0.1", 8000)], "::ffff:127.0.0.1", 8000)


def _proc(pid: int, ppid: int, title: str) -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=ppid, nspid=(pid,), title=title, cgroup=NO_IDENTITY)


def test_api_servers_are_the_nearest_plain_ancestors() -> None:
    procs = {
        p.pid: p
        for p in (
            _proc(1, 0, "systemd"),
            _proc(10, 1, "vllm"),
            _proc(11, 10, "VLLM::EngineCore"),
            _proc(12, 11, "VLLM::Worker_TP0"),
            _proc(20, 1, "python3"),
            _proc(21, 20, "VLLM::EngineCore_DP0"),
            _proc(30, 1, "python3"),  # no vLLM child: not read
            _proc(40, 99, "VLLM::EngineCore"),  # parent unknown: no server
        )
    }
    assert api_servers(procs) == {10, 20}


# ------------------------------------------------------------------ a synthetic root


def _table(lines: list[str]) -> str:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
    return "\n".join([header, *lines]) + "\n"


def _line(n: int, local: str, state: str, inode: int) -> str:
    return (
        f"{n:4d}: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000"
        f"     0        0 {inode} 1 0000000000000000 100 0 0 10 0"
    )


def _root(tmp_path: Path, pid: int, netns: int, held: list[int], tcp: str) -> None:
    base = tmp_path / str(pid)
    (base / "fd").mkdir(parents=True)
    (base / "ns").mkdir()
    (base / "net").mkdir()
    os.symlink(f"net:[{netns}]", base / "ns" / "net")
    os.symlink("/dev/null", base / "fd" / "0")
    for i, inode in enumerate(held, start=3):
        os.symlink(f"socket:[{inode}]", base / "fd" / str(i))
    (base / "net" / "tcp").write_text(tcp)


def test_one_table_per_namespace(tmp_path: Path) -> None:
    # Little-endian words, as this machine writes them: the parser reads sys.byteorder.
    port = 0x1F40
    local = f"{int.from_bytes(bytes([127, 0, 0, 1]), 'little'):08X}:{port:04X}"
    tcp = _table([_line(0, local, "0A", 501), _line(1, local, "0A", 502)])
    _root(tmp_path, 10, 4026532001, [501, 777], tcp)
    # The second server shares the namespace: its own table file is never opened.
    _root(tmp_path, 20, 4026532001, [502], "garbage that would fail\n")
    got = read_sockets(str(tmp_path), [10, 20], time.monotonic() + 5)
    assert got[10] == ProcessSockets("read", (ListenSocket("127.0.0.1", 8000),), 4026532001)
    assert got[20] == ProcessSockets("read", (ListenSocket("127.0.0.1", 8000),), 4026532001)


def test_reading_stops_at_the_first_established_line(tmp_path: Path) -> None:
    local = "00000000:1F40"
    tcp = _table(
        [
            _line(0, local, "0A", 501),
            _line(1, local, "03", 0),  # SYN_RECV, as old kernels list after a listener
            _line(2, "00000000:1F41", "0A", 502),
            _line(3, local, "01", 503),
            _line(4, "00000000:1F42", "0A", 504),  # never listed after established
        ]
    )
    _root(tmp_path, 10, 1, [501, 502, 504], tcp)
    got = read_sockets(str(tmp_path), [10], time.monotonic() + 5)[10]
    assert [s.port for s in got.listening] == [0x1F40, 0x1F41]


def _connection_line(n: int, local: str, remote: str, inode: int) -> str:
    return _line(n, local, "01", inode).replace("00000000:0000", remote, 1)


def hex_end(ip: tuple[int, int, int, int], port: int) -> str:
    """An IPv4 end as this machine's kernel writes it (the parser reads sys.byteorder)."""
    return f"{int.from_bytes(bytes(ip), sys.byteorder):08X}:{port:04X}"


def test_wanted_connections_are_read_past_the_listeners(tmp_path: Path) -> None:
    sender = hex_end((10, 0, 0, 5), 41234)
    tcp = _table(
        [
            _line(0, "00000000:1F40", "0A", 501),
            _connection_line(1, sender, hex_end((10, 0, 0, 1), 4317), 601),  # to the receiver
            _connection_line(2, sender, hex_end((10, 0, 0, 1), 9000), 602),  # same end, elsewhere
            _connection_line(3, hex_end((10, 0, 0, 5), 8000), hex_end((10, 0, 0, 9), 5555), 603),
        ]
    )
    _root(tmp_path, 10, 1, [501, 601, 603], tcp)
    wanted = frozenset({HeldConnection("10.0.0.5", 41234, 4317)})
    got = BoundSockets().read(str(tmp_path), [10], time.monotonic() + 5, wanted)[10]
    assert got.listening == (ListenSocket("0.0.0.0", 0x1F40),)
    assert got.connections == (HeldConnection("10.0.0.5", 41234, 4317),)
    # Not held by the server (inode 602 is another process's): not its connection.
    _root(tmp_path, 20, 1, [602], tcp)
    assert (
        BoundSockets().read(str(tmp_path), [20], time.monotonic() + 5, wanted)[20].connections == ()
    )


def test_while_connections_are_wanted_a_bound_server_is_read_again(tmp_path: Path) -> None:
    tcp = _table([_line(0, "00000000:1F40", "0A", 501)])
    _root(tmp_path, 10, 1, [501], tcp)
    _start(tmp_path, 10, 4242)
    bound = BoundSockets()
    assert bound.read(str(tmp_path), [10], time.monotonic() + 5)[10].listening
    end = HeldConnection("127.0.0.1", 41234, 4317)
    line = _connection_line(1, hex_end((127, 0, 0, 1), 41234), hex_end((127, 0, 0, 1), 4317), 601)
    (tmp_path / "10" / "net" / "tcp").write_text(tcp + line + "\n")
    os.symlink("socket:[601]", tmp_path / "10" / "fd" / "9")
    got = bound.read(str(tmp_path), [10], time.monotonic() + 5, frozenset({end}))[10]
    assert got.connections == (end,)


def test_a_huge_or_slow_table_of_connections_is_cut_at_its_cap_and_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy server's table past the listeners: the wanted end sits after the cap.
    monkeypatch.setattr(procfs_sockets, "MAX_TABLE_LINES", 50)
    far = hex_end((10, 0, 0, 1), 4317)
    lines = [_line(0, "00000000:1F40", "0A", 501)]
    lines += [
        _connection_line(i, hex_end((10, 0, 0, 5), 30000 + i), far, 600 + i) for i in range(1, 100)
    ]
    _root(tmp_path, 10, 1, [501, 699], _table(lines))
    wanted = frozenset({HeldConnection("10.0.0.5", 30099, 4317)})
    got = BoundSockets().read(str(tmp_path), [10], time.monotonic() + 5, wanted)[10]
    assert got.state == "read" and got.connections == ()  # past the cap: not read
    assert got.listening == (ListenSocket("0.0.0.0", 0x1F40),)
    # Past the deadline the server is `timeout`, whatever the table holds.
    late = BoundSockets().read(str(tmp_path), [10], time.monotonic() - 1, wanted)
    assert late == {10: ProcessSockets("timeout")}


def test_table_lines_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procfs_sockets, "MAX_TABLE_LINES", 3)
    tcp = _table([_line(i, f"00000000:{0x1F40 + i:04X}", "0A", 500 + i) for i in range(6)])
    _root(tmp_path, 10, 1, [500 + i for i in range(6)], tcp)
    got = read_sockets(str(tmp_path), [10], time.monotonic() + 5)[10]
    assert [s.port for s in got.listening] == [0x1F40, 0x1F41]  # header + 2 lines


def test_unreadable_and_missing_are_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tcp = _table([_line(0, "00000000:1F40", "0A", 501)])
    _root(tmp_path, 10, 1, [501], tcp)
    _root(tmp_path, 20, 2, [501], tcp)
    real = os.readlink

    def denied(path: str | os.PathLike[str]) -> str:
        if str(path).startswith(f"{tmp_path}/10/"):
            raise PermissionError(13, "Permission denied")  # no SYS_PTRACE
        return real(path)

    monkeypatch.setattr(procfs_sockets.os, "readlink", denied)
    got = read_sockets(str(tmp_path), [10, 20, 30], time.monotonic() + 5)
    assert got[10].state == "unreadable"
    assert got[20] == ProcessSockets("read", (ListenSocket("0.0.0.0", 8000),), 2)
    assert got[30].state == "unreadable"  # gone


def test_past_the_deadline_every_server_is_timeout(tmp_path: Path) -> None:
    _root(tmp_path, 10, 1, [501], _table([_line(0, "00000000:1F40", "0A", 501)]))
    got = read_sockets(str(tmp_path), [10], time.monotonic() - 1)
    assert got == {10: ProcessSockets("timeout")}


def test_fd_scan_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procfs_sockets, "MAX_FDS", 2)
    _root(tmp_path, 10, 1, [501, 502, 503], _table([_line(0, "00000000:1F40", "0A", 503)]))
    got = read_sockets(str(tmp_path), [10], time.monotonic() + 5)[10]
    assert got.state == "read"
    assert len(os.listdir(tmp_path / "10" / "fd")) == 4
    assert got.listening in ((), (ListenSocket("0.0.0.0", 0x1F40),))


def _start(tmp_path: Path, pid: int, start: int) -> None:
    fields = " ".join(["0"] * 17)
    (tmp_path / str(pid) / "stat").write_text(f"{pid} (vllm) S 1 {fields} {start}\n")


def test_a_bound_server_is_not_read_again_while_it_is_the_same_process(tmp_path: Path) -> None:
    tcp = _table([_line(0, "00000000:1F40", "0A", 501)])
    _root(tmp_path, 10, 1, [501], tcp)
    _start(tmp_path, 10, 4242)
    bound = BoundSockets()
    first = bound.read(str(tmp_path), [10], time.monotonic() + 5)[10]
    (tmp_path / "10" / "net" / "tcp").write_text("")  # a re-read would find no listener
    assert bound.read(str(tmp_path), [10], time.monotonic() + 5)[10] == first
    _start(tmp_path, 10, 4343)  # the PID names another process now: read again
    assert bound.read(str(tmp_path), [10], time.monotonic() + 5)[10].listening == ()


def test_a_server_not_listening_yet_is_read_every_cycle(tmp_path: Path) -> None:
    _root(tmp_path, 10, 1, [501], _table([]))
    _start(tmp_path, 10, 4242)
    bound = BoundSockets()
    assert bound.read(str(tmp_path), [10], time.monotonic() + 5)[10].listening == ()
    (tmp_path / "10" / "net" / "tcp").write_text(_table([_line(0, "00000000:1F40", "0A", 501)]))
    assert [
        s.port for s in bound.read(str(tmp_path), [10], time.monotonic() + 5)[10].listening
    ] == [0x1F40]


def test_without_a_start_time_nothing_is_kept(tmp_path: Path) -> None:
    _root(tmp_path, 10, 1, [501], _table([_line(0, "00000000:1F40", "0A", 501)]))
    bound = BoundSockets()
    assert bound.read(str(tmp_path), [10], time.monotonic() + 5)[10].listening
    (tmp_path / "10" / "net" / "tcp").write_text("")
    assert bound.read(str(tmp_path), [10], time.monotonic() + 5)[10].listening == ()
