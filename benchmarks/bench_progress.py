"""Progress of a benchmark on stderr: which size or step is running, and since when.

stdout holds the benchmark's results (the rows docs/performance.md quotes) and nothing else;
these lines go to stderr, so `python benchmarks/x.py > results.txt` still shows where it is,
and `2>/dev/null` silences them. Nothing here runs inside a timed section.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

STARTED = time.monotonic()
NAME = Path(sys.argv[0]).stem or "bench"
LINE_EVERY_S = 10.0
"""Without a terminal on stderr, a loop's progress line this often at most (and at its end)."""


def step(text: str) -> None:
    """One line: what starts now, with the seconds since the benchmark started."""
    print(f"[{NAME} {time.monotonic() - STARTED:7.1f}s] {text}", file=sys.stderr, flush=True)


def steps(items: Iterable[T], total: int, what: str) -> Iterator[T]:
    """`items`, with a tqdm bar on a terminal, else a line at most every `LINE_EVERY_S`."""
    if sys.stderr.isatty():
        from tqdm import tqdm  # type: ignore[import-untyped]

        yield from tqdm(items, total=total, desc=what, file=sys.stderr, leave=False)
        return
    step(f"{what}: 0/{total}")
    shown = time.monotonic()
    for done, item in enumerate(items, 1):
        yield item
        if time.monotonic() - shown >= LINE_EVERY_S or done == total:
            step(f"{what}: {done}/{total}")
            shown = time.monotonic()
