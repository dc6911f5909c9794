"""Hostile HTTP peers for the reliability tests.

`HostileServer` is a raw-socket HTTP server on 127.0.0.1 that answers every request as
its current behaviour says: relay to the real (simulated) server behind it (healthy),
trickle its status line and headers a byte a second, or send a huge, gzip-bombed or
pathological body. Bodies are made on the fly (`Stream`), so a 50 MB answer does not sit
in the test process's memory, whose growth the tests measure.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

MIB = 1024 * 1024
_PIECE = 64 * 1024


@dataclass(frozen=True)
class Stream:
    """A body made while it is sent: `head`, `unit` repeated to `size` bytes, `tail`."""

    unit: bytes
    size: int
    head: bytes = b""
    tail: bytes = b""

    def __len__(self) -> int:
        return len(self.head) + self.size // len(self.unit) * len(self.unit) + len(self.tail)

    def pieces(self) -> Iterator[bytes]:
        yield self.head
        block = self.unit * max(1, _PIECE // len(self.unit))
        left = self.size // len(self.unit) * len(self.unit)
        while left > 0:
            yield block[:left]
            left -= len(block)
        yield self.tail


@functools.lru_cache(maxsize=4)
def gzip_bomb(unit: bytes, size: int) -> bytes:
    """`unit` repeated to `size` bytes, gzipped a MiB at a time (never held inflated)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = unit * (MIB // len(unit))
    parts = [packer.compress(block) for _ in range(size // len(block))]
    return b"".join([*parts, packer.flush()])


@dataclass(frozen=True)
class Relay:
    """Healthy: forward the request's path to `upstream` and answer what it answers."""

    upstream: str


@dataclass(frozen=True)
class Answer:
    body: bytes | Stream
    status: int = 200
    declare_length: bool = True
    gzipped: bool = False
    content_type: str = "text/plain"


@dataclass(frozen=True)
class TrickleHead:
    """The status line and headers, one byte every `pause` seconds; never a body."""

    pause: float = 1.0


Behaviour = Relay | Answer | TrickleHead


class HostileServer:
    """Answers every GET as `behaviour` says, or as the route whose path prefix matches
    says; one thread per connection."""

    def __init__(self, behaviour: Behaviour, routes: dict[str, Behaviour] | None = None) -> None:
        self.behaviour = behaviour
        self.routes = routes or {}
        self.requests = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        threading.Thread(target=self._accept, name="hostile-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the client gave up: the point
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            self.requests += 1
            path = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else "/"
            routed = [b for prefix, b in self.routes.items() if path.startswith(prefix)]
            self._behave(conn, routed[0] if routed else self.behaviour, path)

    def _behave(self, conn: socket.socket, behaviour: Behaviour, path: str) -> None:
        if isinstance(behaviour, Relay):
            status, body, kind = fetch(behaviour.upstream + path)
            conn.sendall(_head(status, kind, len(body)) + body)
        elif isinstance(behaviour, TrickleHead):
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Pad: " + b"a" * 4096
            for byte in head:
                if self._stop.wait(behaviour.pause):
                    return
                conn.sendall(bytes([byte]))
        else:
            self._answer(conn, behaviour)

    def _answer(self, conn: socket.socket, answer: Answer) -> None:
        body = answer.body
        length = len(body) if answer.declare_length else None
        conn.sendall(_head(answer.status, answer.content_type, length, answer.gzipped))
        pieces = body.pieces() if isinstance(body, Stream) else _split(body)
        for piece in pieces:
            if self._stop.is_set():
                return
            conn.sendall(piece)


def _split(body: bytes) -> Iterator[bytes]:
    view = memoryview(body)
    for at in range(0, len(body), _PIECE):
        yield bytes(view[at : at + _PIECE])


def _head(status: int, kind: str, length: int | None, gzipped: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"Content-Type: {kind}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if gzipped:
        lines.append("Content-Encoding: gzip")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def fetch(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def base_of(url: str) -> str:
    """scheme://host:port of a URL."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
