"""The JSON Schema of /ledger.json, generated from the types of v1.py (docs/ledger.schema.json;
scripts/render-ledger-schema writes it, tests/unit/test_ledger_document.py checks it is
current). Required is what `from_json` requires; unknown keys are allowed, as it allows them."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from collections.abc import Mapping
from typing import Any

from gpuledger.document.codec import fields_of, has_default, optional_arg
from gpuledger.document.v1 import SCHEMA, LedgerDocument

_SCALARS = {str: "string", bool: "boolean", int: "integer", float: "number"}


def _type(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    inner = optional_arg(tp)
    if inner is not None:
        if inner in _SCALARS:
            return {"type": [_SCALARS[inner], "null"]}
        return {"anyOf": [_type(inner, defs), {"type": "null"}]}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        return {"type": "array", "items": _type(args[0], defs)}
    if origin is Mapping:
        return {"type": "object", "additionalProperties": _type(args[1], defs)}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        _define(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _object(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    fields = fields_of(cls)
    out: dict[str, Any] = {"type": "object"}
    doc = inspect.getdoc(cls)
    if doc and cls.__doc__:  # its own docstring, not the dataclass signature
        out["description"] = " ".join(doc.split("\n\n")[0].split())
    out["properties"] = {f.name: _type(tp, defs) for f, tp in fields}
    out["required"] = [f.name for f, _ in fields if not has_default(f)]
    return out


def _define(cls: type, defs: dict[str, Any]) -> None:
    if cls.__name__ not in defs:
        defs[cls.__name__] = {}  # reserved first: a type met again refers to it
        defs[cls.__name__] = _object(cls, defs)


def json_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    root = _object(LedgerDocument, defs)
    root["properties"]["schema"] = {"const": SCHEMA}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gpuledger /ledger.json",
        **root,
        "$defs": dict(sorted(defs.items())),
    }


def rendered() -> str:
    """docs/ledger.schema.json's text."""
    return json.dumps(json_schema(), indent=2) + "\n"
