"""The bundle of snapshots one cycle produced, read by later sources and by the join."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

from gpuledger.model.base import SourceStatus

T = TypeVar("T")


class Key(Generic[T]):
    """Names one kind of snapshot and its type. `name` is the source's `source` label.

    Keys compare by identity: two keys may share a name (node and cluster mode Ray
    produce different snapshots under one label) without being confused.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Key({self.name!r})"


class Snapshots:
    """What the sources of one cycle produced, by key, and how each of them fared.

    A source that failed, timed out or is not configured has no snapshot: `get` gives
    None and its status says why.
    """

    __slots__ = ("_statuses", "_values")

    def __init__(
        self,
        values: Mapping[Key[Any], object] | None = None,
        statuses: Sequence[SourceStatus] = (),
    ) -> None:
        self._values: dict[Key[Any], object] = dict(values or {})
        self._statuses = tuple(statuses)

    def get(self, key: Key[T]) -> T | None:
        return cast("T | None", self._values.get(key))

    @property
    def statuses(self) -> tuple[SourceStatus, ...]:
        return self._statuses

    def status(self, name: str) -> SourceStatus | None:
        return next((s for s in self._statuses if s.source == name), None)

    def adding(self, key: Key[T], value: T | None, status: SourceStatus) -> Snapshots:
        """A new bundle with one more source's result."""
        values = dict(self._values)
        if value is not None:
            values[key] = value
        return Snapshots(values, (*self._statuses, status))
