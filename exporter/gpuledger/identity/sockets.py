"""TCP sockets from procfs text: the listening ones and which of them serves a target,
and the established ones a span receiver's senders hold. Pure.

Formats (Documentation/networking/proc_net_tcp.rst, proc(5)):

* `/proc/<pid>/net/tcp` and `tcp6` are the socket tables of that process's network
  namespace: a header, then one line per socket, `sl local_address rem_address st
  tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode …`. The kernel lists all
  listening sockets first, then the established ones.
* An address is `<IP>:<PORT>` in hex: the IP as the kernel's 32-bit words (one for IPv4,
  four for IPv6), each printed in the host's byte order; the port as a number.
* `st` is the TCP state in hex: `0A` LISTEN, `03` SYN_RECV, `01` ESTABLISHED.
* `readlink /proc/<pid>/fd/<n>` of a socket reads `socket:[<inode>]`, and
  `readlink /proc/<pid>/ns/net` reads `net:[<inode>]`.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Iterable
from typing import Literal

from gpuledger.model.procfs import HeldConnection, ListenSocket
from gpuledger.model.spans import SpanPeer

LISTEN = "0A"
ESTABLISHED = "01"
# Before Linux 4.4 a listener's pending connections were listed right after it: a
# table still lists listeners while it shows these.
SYN_RECV = "03"
_LINK = re.compile(r"^([a-z]+):\[(\d+)\]$")
_ANY = frozenset({"0.0.0.0", "::"})


def parse_address(text: str, byteorder: str = sys.byteorder) -> tuple[str, int] | None:
    """`0100007F:1F90` -> ("127.0.0.1", 8000) on a little-endian host; None if malformed.
    An IPv4-mapped IPv6 address is given as its IPv4 address."""
    ip_hex, sep, port_hex = text.partition(":")
    if not sep or len(ip_hex) not in (8, 32) or not 1 <= len(port_hex) <= 4:
        return None
    order: Literal["little", "big"] = "little" if byteorder == "little" else "big"
    try:
        raw = b"".join(
            int(ip_hex[i : i + 8], 16).to_bytes(4, order) for i in range(0, len(ip_hex), 8)
        )
        port = int(port_hex, 16)
    except ValueError:
        return None
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), port


def line_state(line: str) -> str | None:
    """The `st` field of a table line; None for the header or a malformed line."""
    fields = line.split(None, 4)
    if len(fields) < 4 or not fields[0].endswith(":"):
        return None
    return fields[3]


def parse_listener(line: str, byteorder: str = sys.byteorder) -> tuple[int, ListenSocket] | None:
    """(inode, socket) of a LISTEN line; None for any other line."""
    fields = line.split()
    if len(fields) < 10 or not fields[0].endswith(":") or fields[3] != LISTEN:
        return None
    address = parse_address(fields[1], byteorder)
    if address is None or not fields[9].isdigit():
        return None
    return int(fields[9]), ListenSocket(*address)


def parse_connection(
    line: str, byteorder: str = sys.byteorder
) -> tuple[int, HeldConnection] | None:
    """(inode, connection) of an ESTABLISHED line; None for any other line."""
    fields = line.split()
    if len(fields) < 10 or not fields[0].endswith(":") or fields[3] != ESTABLISHED:
        return None
    local = parse_address(fields[1], byteorder)
    remote = parse_address(fields[2], byteorder)
    if local is None or remote is None or not fields[9].isdigit():
        return None
    return int(fields[9]), HeldConnection(*local, remote[1])


def sending_end(peer: SpanPeer | None) -> HeldConnection | None:
    """The socket the sender of an export holds, as procfs lists it: the peer's address
    (normalised) and port, to the receiver's port; None when the address is no IP."""
    address = normal_ip(peer.address) if peer is not None else None
    if peer is None or address is None:
        return None
    return HeldConnection(address, peer.port, peer.receiver_port)


def local_keys(end: HeldConnection, byteorder: str = sys.byteorder) -> frozenset[bytes]:
    """The `local_address` fields a table line of `end`'s socket can have (tcp: IPv4;
    tcp6: IPv6, or an IPv4 address mapped into it): a line is parsed only when its field
    is one of these, which keeps reading a busy server's table cheap."""
    order: Literal["little", "big"] = "little" if byteorder == "little" else "big"
    ip = ipaddress.ip_address(end.address)
    packed = [ip.packed] if ip.version == 6 else [ip.packed, b"\0" * 10 + b"\xff\xff" + ip.packed]
    keys = set()
    for raw in packed:
        words = "".join(
            f"{int.from_bytes(raw[i : i + 4], order):08X}" for i in range(0, len(raw), 4)
        )
        keys.add(f"{words}:{end.port:04X}".encode())
    return frozenset(keys)


def lists_listeners(state: str | None) -> bool:
    """Whether the table may still list listeners after a line in `state` (the header
    too): once it shows an established-side socket, no listener follows."""
    return state is None or state in (LISTEN, SYN_RECV)


def parse_link(text: str, kind: str) -> int | None:
    """The inode of a `<kind>:[<inode>]` link (`socket`, `net`); None for anything else."""
    match = _LINK.match(text)
    if match is None or match.group(1) != kind:
        return None
    return int(match.group(2))


def normal_ip(host: str) -> str | None:
    """An IP address as procfs gives it (an IPv4-mapped IPv6 one as IPv4, brackets
    dropped); None for a name."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None  # a name: its address is not ours to resolve
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def split_endpoint(endpoint: str) -> tuple[str, int] | None:
    """`host:port[/path]` (EngineTarget.endpoint) -> (host, port); None without a port."""
    address = endpoint.split("/", 1)[0]
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or (host.count(":") and not host.startswith("[")):
        return None
    return host.strip("[]"), int(port)


def serves(sockets: Iterable[ListenSocket], host: str, port: int) -> bool:
    """Whether one of `sockets` accepts connections to host:port: the same port, on any
    address or on the host's own. A host name is not resolved: the port alone decides."""
    ip = normal_ip(host)
    return any(
        s.port == port and (s.address in _ANY or ip is None or s.address == ip) for s in sockets
    )
