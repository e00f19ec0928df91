"""One codec for the core's records: JSON-shaped data in and out, for the store and the wire.

The core's frozen dataclasses are the only definition of a record's fields. pydantic's
`TypeAdapter` reads those definitions (field names, types, defaults, `NewType` ids, `StrEnum`
states, nested records), so adding a field to `ShardSpec` is one edit: the store's rows and the
HTTP bodies follow.

Invariants:
- `decode(cls, encode(x)) == x` for every record (tested on random records).
- Decoding is strict about types (an id is a string, a count an integer, never `"8"`); a field
  missing from old data takes the dataclass default, so a row written before a field existed
  still loads (that is how the store's older rows stay readable).
- `dumps` is canonical: sorted keys, no spaces, so the same record is always the same bytes.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")

__all__ = ["CodecError", "decode", "dumps", "encode", "loads"]


class CodecError(ValueError):
    """Data that does not decode to the record asked for; the message names each bad field."""


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def encode(record: object) -> Any:
    """The record as JSON-shaped data: dicts, lists, strings, numbers, booleans, None."""
    return _adapter(type(record)).dump_python(record, mode="json")


def decode(cls: type[T], data: Any) -> T:
    """`data` (as `encode` or `json.loads` made it) as a `cls` record."""
    try:
        # strict JSON-mode validation: arrays become tuples, but "8" is not 8
        out: T = _adapter(cls).validate_json(json.dumps(data), strict=True)
    except ValidationError as err:
        raise CodecError(describe(err)) from err
    return out


def dumps(record: object) -> str:
    """Canonical JSON text of a record."""
    return json.dumps(encode(record), sort_keys=True, separators=(",", ":"))


def loads(cls: type[T], text: str | bytes) -> T:
    try:
        out: T = _adapter(cls).validate_json(text, strict=True)
    except ValidationError as err:
        raise CodecError(describe(err)) from err
    return out


def describe(err: ValidationError) -> str:
    """One clause per bad field: `spec.gpus.0: Input should be a valid integer`."""
    return "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or 'record'}: {e['msg']}" for e in err.errors()
    )
