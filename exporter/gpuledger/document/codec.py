"""The one place that reads /ledger.json's keys: `from_json` (strict on types, tolerant of
unknown keys and of fields older documents lack) and `to_json`, by walking the types of
v1.py: field names are keys, field order is key order."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from gpuledger.document.v1 import SCHEMA, LedgerDocument
from gpuledger.model.base import frozen_map

T = TypeVar("T")


class DocumentError(ValueError):
    """Not a ledger document this version reads; the message names the offending path."""


_FIELDS: dict[type, tuple[tuple[dataclasses.Field[Any], Any], ...]] = {}


def fields_of(cls: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    """Each field of a document type with its resolved type hint (resolved once)."""
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = _FIELDS[cls] = tuple((f, hints[f.name]) for f in dataclasses.fields(cls))
    return found


def has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def optional_arg(tp: Any) -> Any | None:
    """X for `X | None`, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1 and len(typing.get_args(tp)) == 2:
            return rest[0]
    return None


def _fail(path: str, expected: str, value: object) -> DocumentError:
    return DocumentError(f"{path or 'document'}: expected {expected}, got {type(value).__name__}")


_SCALARS: dict[type, tuple[type, ...]] = {
    str: (str,),
    bool: (bool,),
    int: (int,),
    float: (int, float),  # JSON does not tell 1 from 1.0
}


def _decode(tp: Any, value: object, path: str) -> Any:
    inner = optional_arg(tp)
    if inner is not None:
        return None if value is None else _decode(inner, value, path)
    if tp in _SCALARS:
        if not isinstance(value, _SCALARS[tp]) or (tp is not bool and isinstance(value, bool)):
            raise _fail(path, tp.__name__, value)
        return value
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        if not isinstance(value, list):
            raise _fail(path, "array", value)
        return tuple(_decode(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, dict):
            raise _fail(path, "object", value)
        return frozen_map({str(k): _decode(args[1], v, f"{path}.{k}") for k, v in value.items()})
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _decode_object(tp, value, path)
    raise TypeError(f"{path}: no decoder for {tp!r}")  # a type v1.py should not use


def _decode_object(cls: type[T], value: object, path: str) -> T:
    if not isinstance(value, dict):
        raise _fail(path, "object", value)
    kwargs: dict[str, Any] = {}
    for f, tp in fields_of(cls):
        where = f"{path}.{f.name}" if path else f.name
        if f.name in value:
            kwargs[f.name] = _decode(tp, value[f.name], where)
        elif not has_default(f):
            raise DocumentError(f"{where}: missing")
    return cls(**kwargs)


def from_json(obj: object) -> LedgerDocument:
    """A parsed /ledger.json (json.loads' result) as a LedgerDocument; DocumentError when it
    is not a v1 document or a value has the wrong type."""
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
        raise DocumentError(f"not a {SCHEMA} document")
    return _decode_object(LedgerDocument, obj, "")


# JSON's own values, returned as they are; checked first, since most values are these.
_JSON_VALUES = frozenset({str, int, float, bool, type(None)})
# Per type: its field names when it is a dataclass, else None (resolved once: to_json runs
# over every value of a 10,000-row document each cycle).
_NAMES: dict[type, tuple[str, ...] | None] = {}


def _names(cls: type) -> tuple[str, ...] | None:
    names = _NAMES.get(cls, ())
    if names == ():
        dataclass = dataclasses.is_dataclass(cls)
        names = _NAMES[cls] = tuple(f.name for f, _ in fields_of(cls)) if dataclass else None
    return names


def to_json(value: Any) -> Any:
    """A document (or any part of one) as JSON-ready dicts and lists, keys in field order."""
    cls = type(value)
    if cls in _JSON_VALUES:
        return value
    names = _names(cls)
    if names is not None:
        return {name: to_json(getattr(value, name)) for name in names}
    if isinstance(value, tuple):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    return value


def decode(cls: type[T], obj: object) -> T:
    """Any document type (or a type built on them, explain/result.py) from its JSON."""
    return _decode_object(cls, obj, "")
