"""URLs as they may appear in labels, messages and pages: no userinfo, no query."""

from __future__ import annotations

from urllib.parse import urlsplit


def safe_url(url: str) -> str:
    """The URL for messages: scheme, host, port and path only (no userinfo, query)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<invalid url>"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else "<invalid url>"
