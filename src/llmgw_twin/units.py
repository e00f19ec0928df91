"""Durations, sizes and shares as files write them, durations as people read them, and the
table of a settings dataclass's keys.

Role: turn `1h30m`, `90s`, `1500ms` into integer milliseconds, `80GiB` into integer MiB and `50%`
or `0.5` into a share, and format milliseconds back (`fmt_ms`) for timelines and error messages.
`setting_keys(cls)` derives the keys a file writes for a frozen settings dataclass (the core's
`Timings`) from its fields, so that the scenario loader and the controller's config file read the
same keys, and a field added to the dataclass is a key in both at once.

Invariants:
- Every result is an exact `int`; no float is ever involved, so virtual time cannot drift.
- Parsing is strict: a duration is one or more `<digits><unit>` parts with units among h, m, s, ms,
  each unit at most once and in that order. The only unit-less duration accepted is `0`. Anything
  else raises `ValueError` whose message says what was wrong and what was expected.
- No number in a duration, size or share has more than `MAX_DIGITS` digits, so parsing never
  meets Python's integer-string limit and every result stays small; more is a `ValueError`.
- `parse_duration(fmt_duration(ms)) == ms` for every `ms >= 0` whose parts fit in `MAX_DIGITS`.
- A setting's key is its field's name without `_ms`; its kind follows from the name (`*_ms`: a
  duration) or else the field's type (`int`: a count, `float`: a share).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping, Sequence
from fractions import Fraction
from typing import Any, Literal

MAX_DIGITS = 18
"""The most digits any number in a file may have (a duration's part, a size, a share, a whole
number): 64-bit range, far below Python's integer-string limit, and above every bound the readers
set on the value."""
MAX_NAME_LEN = 128
"""The longest name (of a node, fabric, profile, model, scenario or fault): the same bound the
service's wire format puts on names."""
MAX_GPUS_PER_NODE = 64
"""A node's GPUs, in a scenario and on the wire alike, so that every fleet the twin runs can run
for real (the service's message sizes are bounded by it)."""
MAX_REPLICA_NODES = 64
"""The nodes one replica spans (a profile's `nodes`), in a scenario and on the wire alike."""

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


def _check_digits(digits: str, what: str, text: str) -> None:
    if len(digits) > MAX_DIGITS:
        raise ValueError(
            f"number too long in {what} '{text}': {len(digits)} digits (at most {MAX_DIGITS})"
        )


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
        _check_digits(digits, "duration", text)
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
    _check_digits(number.replace(".", ""), "size", text)
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


def fmt_offset(ms: int) -> str:
    """An instant from a run's start, or a difference, always signed: `+0.992s`, `-0.992s`."""
    return ("-" if ms < 0 else "+") + fmt_ms(abs(ms))


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


_SHARE = re.compile(r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)(%?)")
_SHARE_HINT = "expected e.g. 0.5 or 50%"


def parse_share(text: str) -> float:
    """`0.5` -> 0.5, `50%` -> 0.5, `12.5%` -> 0.125. Never negative; the range is the caller's."""
    if text == "":
        raise ValueError(f"empty share ({_SHARE_HINT})")
    if text.startswith("-"):
        raise ValueError(f"share '{text}' is negative ({_SHARE_HINT})")
    match = _SHARE.fullmatch(text)
    if match is None:
        raise ValueError(f"cannot read share '{text}' ({_SHARE_HINT})")
    number, percent = match.groups()
    _check_digits(number.replace(".", ""), "share", text)
    value = Fraction(number) / (100 if percent else 1)
    return float(value)


# --- the keys of a settings dataclass --------------------------------------------------------

SettingKind = Literal["duration", "count", "share"]


@dataclasses.dataclass(frozen=True, slots=True)
class SettingKey:
    """One key of a settings file, and the dataclass field it sets."""

    key: str
    """As files write it: the field's name without `_ms`."""
    attr: str
    """The dataclass field."""
    kind: SettingKind
    default: int | float
    minimum: int
    """Durations and counts: 1 when the dataclass refuses 0 on its own, else 0."""


def _kind(field: dataclasses.Field[Any]) -> SettingKind:
    if field.name.endswith("_ms"):
        return "duration"
    type_name = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    if type_name == "int":
        return "count"
    if type_name == "float":
        return "share"
    raise TypeError(f"setting {field.name}: no file syntax for a field of type {type_name!r}")


def setting_keys(cls: type[Any]) -> tuple[SettingKey, ...]:
    """The file keys of the frozen settings dataclass `cls`, in field order. Every field must
    have a default; one whose value 0 the dataclass refuses by itself (its `__post_init__`
    raises `ValueError`, every other field at its default) has minimum 1."""
    out: list[SettingKey] = []
    for field in dataclasses.fields(cls):
        if field.default is dataclasses.MISSING:
            raise TypeError(f"setting {field.name} has no default")
        kind = _kind(field)
        try:
            cls(**{field.name: 0})
            minimum = 0
        except ValueError:
            minimum = 1
        out.append(
            SettingKey(field.name.removesuffix("_ms"), field.name, kind, field.default, minimum)
        )
    return tuple(out)


def _word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])")


def settings_named(message: str, keys: Sequence[SettingKey]) -> list[SettingKey]:
    """The settings a message (the dataclass's `ValueError`) names, by field or by key, in the
    order the message names them."""
    found: list[tuple[int, int, SettingKey]] = []
    for i, k in enumerate(keys):
        hits = [m.start() for n in (k.attr, k.key) if (m := _word(n).search(message))]
        if hits:
            found.append((min(hits), i, k))
    return [k for _, _, k in sorted(found, key=lambda hit: (hit[0], hit[1]))]


def in_file_terms(message: str, keys: Sequence[SettingKey]) -> str:
    """`message` with every field name written as the file's key (`probe_interval_ms` ->
    `probe_interval`)."""
    for k in keys:
        if k.attr != k.key:
            message = _word(k.attr).sub(k.key, message)
    return message


def timings_refusal(
    message: str, keys: Sequence[SettingKey], values: Mapping[str, Any], written: Collection[str]
) -> tuple[str, str | None]:
    """`Timings`' refusal of one value against another, in a file's terms: each duration it names
    followed by its value (`heartbeat_interval (30.000s) must be shorter than ...`), a suspicion
    the file did not set said to be half the loss; and the key the error is at: the first key
    named that the file wrote (`node_lost_after` for the suspicion it set), or None.
    `values`: field -> value as read (the rest are the defaults); `written`: the keys written."""
    named = settings_named(message, keys)
    shown: dict[str, str] = {}
    for k in named:
        if k.kind == "duration":
            value = values.get(k.attr, k.default)
            text = fmt_ms(int(value))
            if k.key == "node_suspect_after" and k.key not in written:
                text += ": not set, half of node_lost_after"
            shown[k.key] = text
    order = [k.key for k in named]
    if "node_suspect_after" in order and "node_suspect_after" not in written:
        order.insert(order.index("node_suspect_after") + 1, "node_lost_after")
    at = next((k for k in order if k in written), None)
    out = in_file_terms(message, keys)
    if shown:
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, shown)) + r")\b")
        out = pattern.sub(lambda m: f"{m[1]} ({shown.pop(m[1])})" if m[1] in shown else m[1], out)
    return out, at
