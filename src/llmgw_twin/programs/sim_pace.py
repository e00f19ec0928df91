"""A node's pace, as the sim engine reads it: how many times slower its engines run.

The pace file (`--pace-file`; real mode's `slow_node` and `nvlink_degraded` write it,
`realmode/pace.py`) holds the node's changes of pace, one a line, oldest first:

    SINCE_NS FACTOR

`SINCE_NS` on `CLOCK_BOOTTIME` (the clock the kernel counts a process's start on, so an engine
finds the pace in force when its process started, however long its Python start-up took before
it could read the file), `FACTOR` an exact fraction of at least 1 (`3`, `5/2`). Before the first
line, and without a file, the pace is 1.

Invariants:
- The writer replaces the file whole (a temporary file renamed over it), so a reader never sees
  half of one, and a new version is a new inode.
- `now()` costs one `os.stat`; the file is read again only when that shows a new version. A
  missing, unreadable or malformed file reads as pace 1 (a malformed one is logged once per
  version): a straggler is a fault put on the node from outside, never the engine's error.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from fractions import Fraction

ONE = Fraction(1)
MAX_FACTOR = Fraction(100)
"""As the scenario format bounds a slowdown (`twin/scenario/shapes.MAX_SLOW_FACTOR`)."""

Changes = tuple[tuple[int, Fraction], ...]

log = logging.getLogger("llmgw_twin.sim_engine")


def boottime_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def format_changes(changes: Sequence[tuple[int, Fraction]]) -> str:
    return "".join(f"{since_ns} {factor}\n" for since_ns, factor in changes)


def parse_changes(text: str) -> Changes:
    """The changes a pace file lists; ValueError for a line that is not one."""
    out: list[tuple[int, Fraction]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        since, factor_text = line.split()
        factor = Fraction(factor_text)
        if not ONE <= factor <= MAX_FACTOR:
            raise ValueError(f"a pace must be from 1 to {MAX_FACTOR}, got {factor_text}")
        out.append((int(since), factor))
    return tuple(out)


def factor_at(changes: Changes, t_ns: int) -> Fraction:
    """The pace in force at `t_ns`: the last change made by then."""
    factor = ONE
    for since_ns, value in changes:
        if since_ns > t_ns:
            break
        factor = value
    return factor


class PaceFile:
    """One node's pace file, read as it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._version: tuple[int, int, int] | None = None
        self._changes: Changes = ()

    def changes(self) -> Changes:
        try:
            st = os.stat(self.path)
        except OSError:
            self._version, self._changes = None, ()
            return ()
        version = (st.st_ino, st.st_mtime_ns, st.st_size)
        if version != self._version:
            self._version = version
            try:
                with open(self.path, encoding="ascii") as f:
                    self._changes = parse_changes(f.read())
            except (OSError, ValueError) as e:
                log.warning("pace file %s unreadable, pace 1: %s", self.path, e)
                self._changes = ()
        return self._changes

    def now(self) -> Fraction:
        """The pace now: the latest change's (each is written at its instant)."""
        changes = self.changes()
        return changes[-1][1] if changes else ONE

    def at(self, t_ns: int) -> Fraction:
        """The pace in force at `t_ns` (`CLOCK_BOOTTIME`)."""
        return factor_at(self.changes(), t_ns)


def slowed_ms(ms: int, factor: Fraction) -> int:
    """`ms` of an engine's work at pace `factor`, rounded up, as the twin's node counts it."""
    exact = ms * factor
    return -(-exact.numerator // exact.denominator)
