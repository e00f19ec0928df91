"""One codec for the core's records: JSON-shaped data in and out, for the store and the wire.

The core's frozen dataclasses are the only definition of a record's fields. msgspec reads those
definitions (field names, types, defaults, `NewType` ids, `StrEnum` states, nested records), so
adding a field to `ShardSpec` is one edit: the store's rows and the HTTP bodies follow. msgspec
rather than pydantic (which the service's own HTTP models use): it loads in a few milliseconds and
needs no schema built per record type, where pydantic cost a twin run a third of its start
(`docs/performance.md`, "Start-up").

Invariants:
- `decode(cls, encode(x)) == x` for every record (tested on random records).
- Decoding is strict about types (an id is a string, a count an integer, never `"8"`); a field
  missing from old data takes the dataclass default, so a row written before a field existed
  still loads (that is how the store's older rows stay readable).
- `dumps` is canonical: sorted keys, no spaces, so the same record is always the same bytes.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

__all__ = ["CodecError", "decode", "dumps", "encode", "loads"]

_JSON_DATA = msgspec.json.Decoder()


class CodecError(ValueError):
    """Data that does not decode to the record asked for; the message names the bad field."""


def encode(record: object) -> Any:
    """The record as JSON-shaped data: dicts, lists, strings, numbers, booleans, None."""
    # through JSON text and back, so that sequences come out as lists, as JSON has them
    return _JSON_DATA.decode(msgspec.json.encode(record))


def decode(cls: type[T], data: Any) -> T:
    """`data` (as `encode` or `json.loads` made it) as a `cls` record."""
    try:
        # strict: arrays become tuples, but "8" is not 8
        out: T = msgspec.convert(data, cls, strict=True, str_keys=True)
    except msgspec.ValidationError as err:
        raise CodecError(describe(err)) from err
    return out


def dumps(record: object) -> str:
    """Canonical JSON text of a record: keys and fields in sorted order, no spaces, UTF-8 as
    is (one pass of msgspec's encoder, where a detour through Python objects and the standard
    library's encoder cost a twin's fleet start a twentieth)."""
    return msgspec.json.encode(record, order="sorted").decode()


def loads(cls: type[T], text: str | bytes) -> T:
    try:
        out: T = msgspec.json.decode(text, type=cls, strict=True)
    except msgspec.ValidationError as err:
        raise CodecError(describe(err)) from err
    except msgspec.DecodeError as err:
        raise CodecError(f"record: invalid JSON ({err})") from err
    return out


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")


def describe(err: msgspec.ValidationError) -> str:
    """The bad field and what is wrong with it: `spec.gpus.0: Expected `int`, got `str``, or
    `fabric: required field missing`."""
    found = _AT.match(str(err))
    if found is None:  # pragma: no cover - msgspec's messages all match
        return str(err)
    msg, path = found["msg"], found["path"] or ""
    parts = [x for x in re.split(r"[.\[\]]", path) if x]
    if (missing := _MISSING.match(msg)) is not None:
        parts.append(missing["field"])
        msg = "required field missing"
    return f"{'.'.join(parts) or 'record'}: {msg}"
