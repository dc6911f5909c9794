"""Bounded reads of Kubernetes API lists and objects, on the pod informer's client path.

Every page is bounded in bytes and in time (one deadline for the whole read, from the
first connect to the last byte), pages and rows in number; each item is reduced as soon as
its page is parsed, so a read holds one page and the rows kept. `resourceVersion=0` serves
lists from the API server's watch cache, not etcd. Used by the DRA and InferencePool
sources (sources/kubernetes/dra.py, pools.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpuledger.net import kubeapi
from gpuledger.net.bounded import BodyTimedOut, BodyTooLarge, read_bounded
from gpuledger.sources.base import SourceError

__all__ = ["MAX_PAGES", "ListReader", "obj", "objs"]

MAX_PAGES = 100
T = TypeVar("T")


def obj(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def objs(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


class ListReader:
    """Bounded GETs through one API client (`host` names it in messages)."""

    def __init__(self, client: Any, host: str, page_size: int, max_page_bytes: int) -> None:
        self.client = client
        self.host = host
        self.page_size = page_size
        self.max_page_bytes = max_page_bytes

    def collect(
        self,
        path: str,
        deadline: float,
        reduce: Callable[[Mapping[str, Any]], list[T]],
        cap: int,
        what: str,
        **selectors: str | None,
    ) -> list[T]:
        """Every page of the list at `path`, each item reduced as it is parsed, at most
        `cap` rows. `selectors`: field_selector, label_selector."""
        rows: list[T] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            items, token = self._page(path, token, deadline, selectors)
            for item in items:
                rows.extend(reduce(item))
                if len(rows) > cap:
                    raise SourceError(
                        "too_large", f"the Kubernetes API {self.host} lists over {cap} {what}"
                    )
            if token is None:
                return rows
        raise SourceError("bad_response", f"the Kubernetes API {self.host} kept sending list pages")

    def get(self, path: str, deadline: float) -> Mapping[str, Any]:
        """One object (GET `path`), bounded as a page is."""
        body = self._read(path, deadline, {})
        if not isinstance(body, Mapping):
            raise SourceError("bad_response", f"the Kubernetes API {self.host} sent no object")
        return body

    def _page(
        self, path: str, token: str | None, deadline: float, selectors: Mapping[str, str | None]
    ) -> tuple[list[Mapping[str, Any]], str | None]:
        params: dict[str, Any] = {"limit": self.page_size, **selectors}
        params.update({"_continue": token} if token else {"resource_version": "0"})
        body = self._read(path, deadline, params)
        items = body.get("items") if isinstance(body, Mapping) else None
        if not isinstance(items, list):
            raise SourceError("bad_response", f"the Kubernetes API {self.host} sent no list")
        raw = obj(obj(body).get("metadata")).get("continue")
        return objs(items), raw if isinstance(raw, str) and raw else None

    def _read(self, path: str, deadline: float, params: Mapping[str, Any]) -> object:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SourceError("timeout", f"the Kubernetes API {self.host} did not answer in time")
        response = kubeapi.list_objects(self.client, path, _request_timeout=(left, left), **params)
        try:
            return json.loads(read_bounded(response, self.max_page_bytes, deadline))
        except BodyTooLarge:
            raise SourceError(
                "too_large", f"the Kubernetes API {self.host} sent a page too large"
            ) from None
        except BodyTimedOut:
            raise SourceError(
                "timeout", f"the Kubernetes API {self.host} did not answer in time"
            ) from None
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            raise SourceError(
                "bad_response", f"the Kubernetes API {self.host} sent no JSON"
            ) from None
        finally:
            response.release_conn()
