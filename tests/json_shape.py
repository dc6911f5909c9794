"""Comparing the shape of JSON documents: the fake Ray dashboard against the real one."""

from __future__ import annotations

from typing import Any


def same_shape(got: Any, want: Any, where: str = "$") -> None:
    """Same keys and JSON types; null matches any type (an unset field in one of them)."""
    if got is None or want is None:
        return
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        # Sets: Ray's own resource maps come in varying order from one reply to the next.
        assert set(got) == set(want), f"{where}: keys differ"
        for key in want:
            same_shape(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list), where
        if got and want:
            same_shape(got[0], want[0], f"{where}[0]")
    else:
        assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
