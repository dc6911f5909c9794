"""The HTTP client's one deadline, byte cap and error classification (gpuledger/net/httpclient.py).

The servers here are raw sockets on loopback so that they can misbehave at the byte level:
trickle the status line, the headers or the body, lie about lengths, or inflate a bomb.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpuledger.net.httpclient import HttpClient, HttpError, _classify, safe_url

Behaviour = Callable[[socket.socket], None]


class RawServer:
    """Accepts connections and hands each to `behaviour` in its own thread."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            with contextlib.suppress(OSError):  # the client hung up after its deadline
                self.behaviour(conn)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], RawServer]]:
    made: list[RawServer] = []

    def start(behaviour: Behaviour) -> RawServer:
        made.append(RawServer(behaviour))
        return made[-1]

    yield start
    for server in made:
        server.close()


def trickle(data: bytes, pause: float = 0.05) -> Behaviour:
    def send(conn: socket.socket) -> None:
        for byte in data:
            conn.sendall(bytes([byte]))
            time.sleep(pause)  # the peer's deliberate slowness, not synchronisation

    return send


def answer(body: bytes, *headers: str) -> Behaviour:
    def send(conn: socket.socket) -> None:
        head = "".join(f"{h}\r\n" for h in headers)
        conn.sendall(f"HTTP/1.1 200 OK\r\n{head}\r\n".encode() + body)

    return send


def get(url: str, deadline: float = 0.5, cap: int = 1024 * 1024) -> bytes:
    return HttpClient(deadline_seconds=deadline, max_body_bytes=cap).get(url).body


def failure(url: str, **options: float) -> HttpError:
    with pytest.raises(HttpError) as caught:
        get(url, **options)  # type: ignore[arg-type]
    return caught.value


def test_a_plain_answer_is_read_whole(serve: Callable[[Behaviour], RawServer]) -> None:
    server = serve(answer(b"vllm:x 1\n", "Content-Length: 9"))
    assert get(server.url) == b"vllm:x 1\n"


@pytest.mark.parametrize(
    "what",
    [
        b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 400 + b"\r\n\r\n",  # headers
        b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n" + b"b" * 400,  # body
        b"H" * 400,  # the status line itself
    ],
    ids=["headers", "body", "status_line"],
)
def test_a_peer_trickling_bytes_is_cut_at_the_deadline(
    serve: Callable[[Behaviour], RawServer], what: bytes
) -> None:
    # One byte every 50 ms would reset a per-read timeout of 0.5 s forever.
    server = serve(trickle(what))
    started = time.monotonic()
    error = failure(server.url, deadline=0.5)
    elapsed = time.monotonic() - started
    assert error.reason == "timeout"
    assert elapsed < 5, f"held for {elapsed:.1f}s past a 0.5 s deadline"


def test_an_oversized_body_is_refused_by_its_declared_length(
    serve: Callable[[Behaviour], RawServer],
) -> None:
    server = serve(answer(b"x" * 100, "Content-Length: 999999999"))
    assert failure(server.url, cap=1000).reason == "too_large"


def test_an_oversized_body_without_length_is_refused_while_reading(
    serve: Callable[[Behaviour], RawServer],
) -> None:
    server = serve(answer(b"x" * 200_000, "Connection: close"))
    assert failure(server.url, cap=10_000).reason == "too_large"


def test_a_gzip_bomb_is_refused_by_its_inflated_size(
    serve: Callable[[Behaviour], RawServer],
) -> None:
    bomb = gzip.compress(b"\0" * 50_000_000)  # ~50 KB on the wire
    server = serve(answer(bomb, "Content-Encoding: gzip", f"Content-Length: {len(bomb)}"))
    error = failure(server.url, cap=1024 * 1024, deadline=5.0)
    assert error.reason == "too_large"


def test_gzip_is_inflated(serve: Callable[[Behaviour], RawServer]) -> None:
    body = gzip.compress(b"vllm:x 1\n")
    server = serve(answer(body, "Content-Encoding: gzip", f"Content-Length: {len(body)}"))
    assert get(server.url) == b"vllm:x 1\n"


def test_a_consumer_gets_the_inflated_pieces_and_no_body(
    serve: Callable[[Behaviour], RawServer],
) -> None:
    text = b"vllm:x 1\n" * 50_000
    body = gzip.compress(text)
    server = serve(answer(body, "Content-Encoding: gzip", f"Content-Length: {len(body)}"))
    pieces: list[bytes] = []
    client = HttpClient(deadline_seconds=5.0, max_body_bytes=1024 * 1024)
    response = client.get(server.url, consume=lambda piece: pieces.append(piece) is None)
    assert response.body == b"" and response.status == 200
    assert b"".join(pieces) == text and len(pieces) > 1


def test_a_consumer_that_has_enough_stops_the_read(
    serve: Callable[[Behaviour], RawServer],
) -> None:
    # The read ends with the first piece; the rest is never read.
    server = serve(answer(b"x" * 10_000_000))
    seen: list[int] = []

    def enough(piece: bytes) -> bool:
        seen.append(len(piece))
        return False

    started = time.monotonic()
    client = HttpClient(deadline_seconds=5.0, max_body_bytes=64 * 1024 * 1024)
    assert client.get(server.url, consume=enough).body == b""
    assert len(seen) == 1 and time.monotonic() - started < 2


def test_a_consumer_is_held_to_the_cap(serve: Callable[[Behaviour], RawServer]) -> None:
    server = serve(answer(b"x" * 200_000, "Connection: close"))
    taken: list[int] = []
    client = HttpClient(deadline_seconds=5.0, max_body_bytes=10_000)
    with pytest.raises(HttpError) as caught:
        client.get(server.url, consume=lambda piece: taken.append(len(piece)) is None)
    assert caught.value.reason == "too_large" and sum(taken) <= 10_000


def test_a_failed_read_keeps_nothing_of_the_body(
    serve: Callable[[Behaviour], RawServer],
) -> None:
    """The error raised is not chained to the read's own: that one's traceback holds the
    frames with the chunks read so far, for as long as the error is kept (a future)."""
    server = serve(answer(b"x" * 300_000, "Connection: close"))
    error = failure(server.url, cap=100_000)
    assert error.reason == "too_large"
    assert error.__context__ is None and error.__cause__ is None


def test_a_body_shorter_than_declared_is_truncated(
    serve: Callable[[Behaviour], RawServer],
) -> None:
    server = serve(answer(b"short", "Content-Length: 100"))
    assert failure(server.url).reason == "truncated"


def test_not_http_is_garbage(serve: Callable[[Behaviour], RawServer]) -> None:
    server = serve(lambda conn: conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n"))
    assert failure(server.url).reason == "garbage"


def test_refused_and_invalid_urls() -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]
    assert failure(f"http://127.0.0.1:{port}/metrics").reason == "refused"
    assert failure("ftp://127.0.0.1/metrics").reason == "invalid_url"
    assert failure("http://[::1/metrics").reason == "invalid_url"


def test_redirects_are_followed_up_to_the_limit(serve: Callable[[Behaviour], RawServer]) -> None:
    target = serve(answer(b"ok", "Content-Length: 2"))
    hop = serve(
        lambda c: c.sendall(f"HTTP/1.1 302 Found\r\nLocation: {target.url}\r\n\r\n".encode())
    )
    assert get(hop.url) == b"ok"
    loop: list[RawServer] = []
    loop.append(
        serve(lambda c: c.sendall(f"HTTP/1.1 302 F\r\nLocation: {loop[0].url}\r\n\r\n".encode()))
    )
    assert failure(loop[0].url).reason == "too_many_redirects"


def test_without_redirects_the_redirect_itself_is_the_answer(
    serve: Callable[[Behaviour], RawServer],
) -> None:
    hop = serve(lambda c: c.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\n\r\n"))
    client = HttpClient(deadline_seconds=1, max_body_bytes=100, max_redirects=0)
    assert client.get(hop.url).status == 302


def test_messages_name_the_safe_url_only(serve: Callable[[Behaviour], RawServer]) -> None:
    server = serve(answer(b"x" * 5000, "Connection: close"))
    secret = server.url.replace("http://", "http://user:hunter2@") + "?token=hunter2"
    error = failure(secret, cap=100)
    assert "hunter2" not in error.message
    assert safe_url(secret) in error.message


def test_classification_reads_types_only() -> None:
    assert _classify(ConnectionRefusedError()) == "refused"
    assert _classify(TimeoutError()) == "timeout"
    assert _classify(ssl.SSLCertVerificationError()) == "tls_error"
    assert _classify(http.client.IncompleteRead(b"")) == "truncated"
    assert _classify(http.client.RemoteDisconnected()) == "unreachable"
    assert _classify(http.client.LineTooLong("header")) == "garbage"
    assert _classify(socket.gaierror()) == "unreachable"
