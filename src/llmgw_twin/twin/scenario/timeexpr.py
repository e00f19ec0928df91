"""Time expressions in scenario files, and their resolution to integer milliseconds.

Role: read `start`, `end`, a fault id, each optionally followed by `+DURATION` or `-DURATION`, or
a bare duration (counted from start); then resolve them, faults that refer to other faults
included, to milliseconds from the start of the run.

Invariants:
- Parsing is unambiguous even though names may contain `-`: an expression that is exactly an
  anchor is that anchor; otherwise the rightmost `+`/`-` whose left side is a known anchor and
  whose right side is a duration splits it. Fault ids that read as durations (`2m`) or as
  `start`/`end` are refused where they are defined, so a bare duration never means an id.
- Resolution is order-independent and deterministic: forward references work, a cycle is
  reported with its members in reference order, and nothing iterates a set.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from llmgw_twin import units
from llmgw_twin.twin.scenario.yamlnodes import NAME_RE, preview

START = "start"
END = "end"

_SYNTAX = (
    "expected start, end or a fault id, optionally followed by +DURATION or -DURATION, "
    "or a duration from the start such as 2m"
)


@dataclass(frozen=True, slots=True)
class TimeExpr:
    anchor: str
    """`start`, `end` or a fault id."""
    offset_ms: int
    text: str
    """The expression as written, for messages and renderings."""


class TimeCycle(ValueError):
    """Faults whose `at` refer to each other in a loop; `members` are indices, in loop order."""

    def __init__(self, members: Sequence[int]) -> None:
        super().__init__(f"time references form a cycle: {list(members)}")
        self.members = tuple(members)


def is_duration(text: str) -> bool:
    try:
        units.parse_duration(text)
    except ValueError:
        return False
    return True


def parse_time(text: str, fault_ids: Collection[str]) -> TimeExpr:
    """Read one time expression; `fault_ids` are the ids it may refer to. Raises ValueError."""

    def is_anchor(word: str) -> bool:
        return word in (START, END) or word in fault_ids

    if is_anchor(text):
        return TimeExpr(text, 0, text)
    if is_duration(text):
        return TimeExpr(START, units.parse_duration(text), text)
    offset_error: ValueError | None = None
    for pos in range(len(text) - 1, 0, -1):
        sign = text[pos]
        if sign not in "+-" or not is_anchor(text[:pos]):
            continue
        try:
            offset = units.parse_duration(text[pos + 1 :])
        except ValueError as err:
            offset_error = offset_error or err
            continue
        return TimeExpr(text[:pos], offset if sign == "+" else -offset, text)
    if offset_error is not None:
        raise ValueError(f"bad offset in time '{text}': {offset_error}")
    unknown = _unknown_anchor(text)
    known = preview(sorted(fault_ids)) if fault_ids else "none defined"
    if unknown == text and text[:1].isdigit():
        # `5` or `5min`: most likely a bad duration, though ids may start with a digit too.
        try:
            units.parse_duration(text)
        except ValueError as err:
            raise ValueError(
                f"cannot read time '{text}': {err}; nor is it a fault id (fault ids: {known})"
            ) from None
    if unknown is not None:
        raise ValueError(
            f"unknown fault id '{unknown}' in time '{text}' "
            f"(expected start, end or a fault id; fault ids: {known})"
        )
    raise ValueError(f"cannot read time '{text}' ({_SYNTAX})")


def _unknown_anchor(text: str) -> str | None:
    """The word that was meant as an anchor, when the rest of `text` reads fine."""
    for pos in range(len(text) - 1, 0, -1):
        if text[pos] in "+-" and NAME_RE.fullmatch(text[:pos]) and is_duration(text[pos + 1 :]):
            return text[:pos]
    return text if NAME_RE.fullmatch(text) else None


def resolve_times(
    exprs: Sequence[TimeExpr], index_of: Mapping[str, int], duration_ms: int
) -> list[int]:
    """Milliseconds for each expression; `index_of` maps a fault id to its own expression."""
    done: dict[int, int] = {}
    for first in range(len(exprs)):
        if first in done:
            continue
        stack = [first]
        on_stack = {first}  # membership only; the order lives in `stack`
        while stack:
            current = stack[-1]
            anchor = exprs[current].anchor
            if anchor in index_of:
                target = index_of[anchor]
                if target not in done:
                    if target in on_stack:
                        raise TimeCycle(stack[stack.index(target) :])
                    stack.append(target)
                    on_stack.add(target)
                    continue
                base = done[target]
            else:
                base = duration_ms if anchor == END else 0
            done[current] = base + exprs[current].offset_ms
            on_stack.discard(stack.pop())
    return [done[i] for i in range(len(exprs))]


def resolve_time(expr: TimeExpr, fault_at_ms: Mapping[str, int], duration_ms: int) -> int:
    """One expression whose anchor, if a fault id, is already resolved in `fault_at_ms`."""
    if expr.anchor == START:
        return expr.offset_ms
    if expr.anchor == END:
        return duration_ms + expr.offset_ms
    return fault_at_ms[expr.anchor] + expr.offset_ms
