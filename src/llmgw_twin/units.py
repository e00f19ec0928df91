"""Durations and sizes as scenario files write them, and durations as people read them.

Role: turn `1h30m`, `90s`, `1500ms` into integer milliseconds and `80GiB` into integer MiB, and
format milliseconds back (`fmt_ms`) for timelines and error messages.

Invariants:
- Every result is an exact `int`; no float is ever involved, so virtual time cannot drift.
- Parsing is strict: a duration is one or more `<digits><unit>` parts with units among h, m, s, ms,
  each unit at most once and in that order. The only unit-less duration accepted is `0`. Anything
  else raises `ValueError` whose message says what was wrong and what was expected.
- `parse_duration(fmt_duration(ms)) == ms` for every `ms >= 0`.
"""

from __future__ import annotations

import re
from fractions import Fraction

_DURATION_UNITS: tuple[tuple[str, int], ...] = (
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
)
_DURATION_ORDER = tuple(unit for unit, _ in _DURATION_UNITS)
_DURATION_MS = dict(_DURATION_UNITS)
_DURATION_PART = re.compile(r"([0-9]+)([A-Za-z]*)")
_DURATION_HINT = "expected e.g. 1500ms, 90s, 2m or 1h30m"

_SIZE_MIB: dict[str, Fraction] = {
    "KiB": Fraction(1, 1024),
    "MiB": Fraction(1),
    "GiB": Fraction(1024),
    "TiB": Fraction(1024 * 1024),
}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)")
_SIZE_HINT = "expected e.g. 512MiB or 80GiB (units KiB, MiB, GiB, TiB)"


def parse_duration(text: str) -> int:
    """`1h30m15s500ms` -> 5_415_500. Units h, m, s, ms, each once, largest first."""
    if text == "":
        raise ValueError(f"empty duration ({_DURATION_HINT})")
    if text.startswith("-"):
        raise ValueError(f"duration '{text}' is negative ({_DURATION_HINT})")
    if text == "0":
        return 0  # zero is the same in every unit
    total = 0
    last = -1
    pos = 0
    while pos < len(text):
        part = _DURATION_PART.match(text, pos)
        if part is None:
            raise ValueError(
                f"unexpected {text[pos]!r} in duration '{text}' "
                f"(whole numbers only, {_DURATION_HINT})"
            )
        digits, unit = part.groups()
        if unit == "" and part.end() < len(text):
            raise ValueError(
                f"unexpected {text[part.end()]!r} in duration '{text}' "
                f"(whole numbers only, {_DURATION_HINT})"
            )
        if unit == "":
            raise ValueError(f"number without a unit in duration '{text}' ({_DURATION_HINT})")
        if unit not in _DURATION_MS:
            raise ValueError(f"unknown unit '{unit}' in duration '{text}' (expected h, m, s or ms)")
        rank = _DURATION_ORDER.index(unit)
        if rank == last:
            raise ValueError(f"unit '{unit}' repeated in duration '{text}'")
        if rank < last:
            raise ValueError(
                f"unit '{unit}' out of order in duration '{text}' (write h, m, s, ms in that order)"
            )
        last = rank
        total += int(digits) * _DURATION_MS[unit]
        pos = part.end()
    return total


def parse_size_mib(text: str) -> int:
    """`80GiB` -> 81920, `512MiB` -> 512. The result must be a whole number of MiB."""
    if text == "":
        raise ValueError(f"empty size ({_SIZE_HINT})")
    if text.startswith("-"):
        raise ValueError(f"size '{text}' is negative ({_SIZE_HINT})")
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"cannot read size '{text}' ({_SIZE_HINT})")
    number, unit = match.groups()
    if unit == "":
        raise ValueError(f"number without a unit in size '{text}' ({_SIZE_HINT})")
    if unit not in _SIZE_MIB:
        raise ValueError(
            f"unknown unit '{unit}' in size '{text}' (expected KiB, MiB, GiB or TiB; "
            "sizes are binary, so write GiB rather than GB)"
        )
    mib = Fraction(number) * _SIZE_MIB[unit]
    if mib.denominator != 1:
        raise ValueError(f"size '{text}' is not a whole number of MiB")
    return mib.numerator


def fmt_ms(ms: int) -> str:
    """Milliseconds for people: `0.000s`, `59.250s`, `2m05.500s`, `1h02m03.000s`."""
    sign = "-" if ms < 0 else ""
    hours, rest = divmod(abs(ms), 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1_000)
    if hours:
        return f"{sign}{hours}h{minutes:02d}m{seconds:02d}.{millis:03d}s"
    if minutes:
        return f"{sign}{minutes}m{seconds:02d}.{millis:03d}s"
    return f"{sign}{seconds}.{millis:03d}s"


def fmt_duration(ms: int) -> str:
    """Milliseconds in the file syntax, shortest form: `1h30m`, `90500ms` -> `1m30s500ms`, `0s`."""
    if ms < 0:
        raise ValueError(f"a duration cannot be negative: {ms}")
    if ms == 0:
        return "0s"
    parts: list[str] = []
    rest = ms
    for unit, size in _DURATION_UNITS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
