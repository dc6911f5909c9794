"""Reading an HTTP body bounded in size and in total time.

Every client here (vLLM, Ray, the Kubernetes informer's list pages, `explain`) reads its
answers through this. A socket read timeout alone does not bound an answer: a server
dripping a byte at a time resets it forever. `read1` returns whatever one socket read
brings, so the deadline is checked while a server trickles; it decodes gzip with a bounded
output per call, so the size cap applies to decoded bytes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

CHUNK = 64 * 1024


class BodyTooLarge(Exception):
    """The decoded body passed the size cap."""


class BodyTimedOut(Exception):
    """The body was not complete by the deadline."""


def _chunks(raw: Any) -> Iterator[bytes]:
    read1 = getattr(raw, "read1", None)  # urllib3 >= 2.3
    if read1 is not None:
        while chunk := read1(CHUNK, decode_content=True):
            yield chunk
    else:
        yield from raw.stream(8 * 1024, decode_content=True)


def read_bounded(raw: Any, max_bytes: int, deadline: float) -> bytes:
    """The whole body of `raw` (a urllib3 response, e.g. requests' `response.raw`).

    Raises BodyTooLarge past `max_bytes` and BodyTimedOut past `deadline` (monotonic
    seconds); urllib3's own errors (a cut connection, a read timeout) pass through.
    """
    chunks: list[bytes] = []
    size = 0
    for chunk in _chunks(raw):
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge
        if time.monotonic() > deadline:
            raise BodyTimedOut
        chunks.append(chunk)
    return b"".join(chunks)
