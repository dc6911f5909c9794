"""The one HTTP client of gpuledger's reads: vLLM engines, the Ray dashboard, explain.

Every request has one wall-clock deadline from connect to last byte. A socket timeout
alone is not one: it restarts on every byte, so a peer trickling its headers a byte a
second would hold a read forever. Here each socket operation waits at most the time
left, and a watchdog thread shuts the socket down when the deadline passes, which wakes
any read in progress. Bodies are read in chunks up to a byte cap (decompressed size for
gzip), so an oversized answer is refused without being held in memory; a caller that can
read a body piece by piece gets the pieces as they arrive instead (`get(consume=...)`).

Failures raise HttpError with a reason from REASONS (or `http_<status>` from callers);
messages carry the safe URL and never a body, a header value or a query string.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from gpuledger import __version__
from gpuledger.identity.urls import safe_url

CHUNK = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})

REASONS: tuple[str, ...] = (
    "invalid_url",  # not an http(s) URL with a host
    "refused",  # nothing listens on the port
    "unreachable",  # reset, DNS failure, no route, closed before answering
    "timeout",  # the deadline passed, whatever the peer was doing
    "tls_error",  # handshake or certificate verification failed
    "truncated",  # the body ended before its declared length
    "too_large",  # the body (decompressed) exceeded the cap
    "garbage",  # not HTTP, or a body that does not decode
    "too_many_redirects",
)


class HttpError(Exception):
    """A read that failed; `reason` is a bounded label value, `message` one safe line."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Response:
    status: int
    # Lower-cased names; only what callers read (content-type), never logged.
    headers: Mapping[str, str]
    body: bytes


class _Watchdog:
    """One daemon thread that shuts down sockets whose request ran past its deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, http.client.HTTPConnection]] = []
        self._live: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, conn: http.client.HTTPConnection) -> int:
        with self._cond:
            token = next(self._ids)
            heapq.heappush(self._heap, (deadline, token, conn))
            self._live.add(token)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-deadline", daemon=True)
                self._thread.start()
            self._cond.notify()
            return token

    def disarm(self, token: int) -> None:
        with self._cond:
            self._live.discard(token)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, token, conn = self._heap[0]
                wait = deadline - time.monotonic()
                if token in self._live and wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                expired = token in self._live
                self._live.discard(token)
            if expired:
                _shut(conn)


def _shut(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed: nothing left to wake
            sock.shutdown(socket.SHUT_RDWR)


_WATCHDOG = _Watchdog()


class HttpClient:
    """GET with one deadline and a body cap. Thread-safe; one connection per request.

    No keep-alive: at a 10 s interval servers have dropped idle connections anyway
    (uvicorn after 5 s), and a fresh connection cannot carry a previous peer's state.
    Proxies from the environment are ignored: pod IPs must not go through one.
    """

    def __init__(
        self,
        *,
        deadline_seconds: float,
        max_body_bytes: int,
        headers: Mapping[str, str] | None = None,
        tls_context: ssl.SSLContext | None = None,
        max_redirects: int = 3,
    ) -> None:
        if deadline_seconds <= 0 or max_body_bytes <= 0:
            raise ValueError("deadline_seconds and max_body_bytes must be > 0")
        self.deadline_seconds = deadline_seconds
        self.max_body_bytes = max_body_bytes
        self.headers = {"User-Agent": f"gpuledger/{__version__}", **(headers or {})}
        self.tls_context = tls_context or ssl.create_default_context()
        self.max_redirects = max_redirects

    def get(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        consume: Callable[[bytes], bool] | None = None,
    ) -> Response:
        """The final answer (any status but a redirect), its body complete and capped.

        With `consume`, the body is not kept: each piece (inflated) goes to `consume` as it
        arrives, under the same deadline and cap, and reading stops when it returns False.
        The answer's `body` is then empty. `consume` must not raise: it keeps its own
        verdict (an exception here would read as a transport failure).
        """
        deadline = time.monotonic() + self.deadline_seconds
        for _ in range(self.max_redirects + 1):
            response, location = self._once(url, headers or {}, deadline, consume)
            if location is None or self.max_redirects == 0:
                return response
            url = location
        raise HttpError(
            "too_many_redirects", f"{safe_url(url)}: more than {self.max_redirects} redirects"
        )

    def _once(
        self,
        url: str,
        headers: Mapping[str, str],
        deadline: float,
        consume: Callable[[bytes], bool] | None,
    ) -> tuple[Response, str | None]:
        conn, target = self._connection(url, deadline)
        token = _WATCHDOG.arm(deadline, conn)
        # The failure is raised after the except clauses: raised inside one, it would
        # carry the caught exception as its context, and with it the frames holding the
        # body read so far, for as long as anything keeps the failure.
        try:
            conn.request("GET", target, headers={**self.headers, **headers})
            raw = conn.getresponse()
            if raw.status in _REDIRECTS and raw.getheader("Location"):
                return Response(raw.status, {}, b""), urljoin(url, raw.getheader("Location", ""))
            body = self._body(raw, deadline, consume)
            names = {k.lower(): v for k, v in raw.getheaders() if k.lower() == "content-type"}
            return Response(raw.status, names, body), None
        except HttpError as exc:
            reason, message = exc.reason, exc.message
        except Exception as exc:
            reason, message = _classify(exc), ""
        finally:
            _WATCHDOG.disarm(token)
            conn.close()
        if time.monotonic() >= deadline and reason != "too_large":
            # The watchdog's shutdown reads as an early EOF or a reset: it was the deadline.
            reason, message = "timeout", ""
        raise HttpError(reason, f"{safe_url(url)}: {message or self._describe(reason)}")

    def _connection(self, url: str, deadline: float) -> tuple[http.client.HTTPConnection, str]:
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError:
            host = None
        if host is None or parts.scheme not in ("http", "https"):
            raise HttpError("invalid_url", f"{safe_url(url)}: not a valid http(s) URL")
        timeout = max(0.001, deadline - time.monotonic())
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if parts.scheme == "https":
            return (
                http.client.HTTPSConnection(host, port, timeout=timeout, context=self.tls_context),
                target,
            )
        return http.client.HTTPConnection(host, port, timeout=timeout), target

    def _body(
        self,
        raw: http.client.HTTPResponse,
        deadline: float,
        consume: Callable[[bytes], bool] | None,
    ) -> bytes:
        declared = raw.getheader("Content-Length", "")
        encoding = (raw.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise HttpError("garbage", f"unsupported Content-Encoding {encoding[:20]!r}")
        if encoding == "identity" and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise self._too_large()
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
        chunks: list[bytes] = []
        take = consume or _keep(chunks)
        size = 0
        while True:
            if time.monotonic() >= deadline:
                raise HttpError("timeout", f"body not complete within {self.deadline_seconds:g}s")
            chunk = raw.read1(CHUNK) if hasattr(raw, "read1") else raw.read(CHUNK)
            if not chunk:
                break
            # Inflated a CHUNK at a time: a small gzip can expand 1000x, and the cap is
            # checked before any more of it is made.
            for piece in _inflated(inflate, chunk) if inflate is not None else (chunk,):
                size += len(piece)
                if size > self.max_body_bytes:
                    raise self._too_large()
                if not take(piece):
                    return b""  # the reader has what it needs: the rest is never read
        # read1 ends quietly at EOF: a declared length not reached is a cut-off body.
        if raw.length or (inflate is not None and not inflate.eof):
            raise HttpError("truncated", "connection closed before the whole body arrived")
        return b"".join(chunks)

    def _too_large(self) -> HttpError:
        return HttpError("too_large", f"body larger than {_size(self.max_body_bytes)}")

    def _describe(self, reason: str) -> str:
        if reason == "timeout":
            return f"no complete answer within {self.deadline_seconds:g}s"
        return _MESSAGES.get(reason, reason)


_MESSAGES = {
    "refused": "connection refused (not listening yet, or wrong port)",
    "unreachable": "connection failed (reset, DNS or routing)",
    "tls_error": "TLS handshake or certificate verification failed",
    "truncated": "connection closed before the whole body arrived",
    "garbage": "not an HTTP answer, or a body that does not decode",
}


def _inflated(inflate: zlib._Decompress, data: bytes) -> Iterator[bytes]:
    """What `data` inflates to, in pieces of at most CHUNK bytes."""
    while True:
        piece = inflate.decompress(data, CHUNK)
        data = inflate.unconsumed_tail
        if piece:
            yield piece
        if not data or not piece:
            return


def _keep(chunks: list[bytes]) -> Callable[[bytes], bool]:
    def take(chunk: bytes) -> bool:
        chunks.append(chunk)
        return True

    return take


def _size(n: int) -> str:
    mib = n / (1024 * 1024)
    return f"{mib:g} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"


def _classify(exc: BaseException) -> str:
    """The reason for a transport failure. Only types are read, never text."""
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ssl.SSLError | ssl.CertificateError):
        return "tls_error"
    if isinstance(exc, http.client.IncompleteRead):
        return "truncated"
    if isinstance(exc, zlib.error):
        return "garbage"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "unreachable"
    if isinstance(exc, http.client.HTTPException):
        return "garbage"  # a bad status line, a header line too long, too many headers
    return "unreachable"
