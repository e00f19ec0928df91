"""A level per node that faults raise for a while, written to a file in the node's root: what
`pace.py` (a straggler's pace) and `late.py` (late heartbeats) put there for the node's
processes to read.

Each fault raises the node's level for its window; overlapping windows leave it at the highest
under way, and at `rest` once the last has ended. Each change adds a line `SINCE_NS LEVEL` (on
`CLOCK_BOOTTIME`, rendered by `render`), oldest first, so a reader finds the level in force at
any instant it knows, even one before it read the file.

Invariant: the file is replaced whole (a temporary file renamed over it), so a reader never
sees half of one; a window under a higher one writes nothing.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Generic, TypeVar

from llmgw_twin.control.model import NodeId

L = TypeVar("L", int, Fraction)

Render = Callable[[Sequence[tuple[int, L]]], str]


class NodeLevels(Generic[L]):
    """The windows under way on the nodes of one run, and each node's file."""

    def __init__(
        self,
        nodes_dir: Path,
        pending: list[asyncio.TimerHandle],
        file_name: str,
        rest: L,
        render: Render[L],
    ) -> None:
        self.nodes_dir = nodes_dir
        """Where the nodes' roots are (`nodes_dir / node`, `cluster.py`)."""
        self.pending = pending
        """The run's timers, which `RealFaults.cancel` ends with the run."""
        self.file_name = file_name
        self.rest: L = rest
        self._render: Render[L] = render
        self._under_way: dict[NodeId, list[L]] = {}
        self._changes: dict[NodeId, list[tuple[int, L]]] = {}

    def during(self, node: NodeId, level: L, for_ms: int) -> None:
        """The node's level is at least `level` for `for_ms`, from now."""
        self.begin(node, level)
        loop = asyncio.get_running_loop()
        self.pending.append(loop.call_later(for_ms / 1000, self.end, node, level))

    def begin(self, node: NodeId, level: L) -> None:
        self._under_way.setdefault(node, []).append(level)
        self._write(node)

    def end(self, node: NodeId, level: L) -> None:
        self._under_way[node].remove(level)
        self._write(node)

    def now(self, node: NodeId) -> L:
        """The node's level now: the highest of the windows under way (`rest`: none)."""
        return max(self._under_way.get(node, ()), default=self.rest)

    def _write(self, node: NodeId) -> None:
        changes = self._changes.setdefault(node, [])
        level = self.now(node)
        if level == (changes[-1][1] if changes else self.rest):
            return  # a higher one still under way, or one as high
        changes.append((time.clock_gettime_ns(time.CLOCK_BOOTTIME), level))
        path = self.nodes_dir / node / self.file_name
        tmp = path.with_name(f"{path.name}.tmp")
        tmp.write_text(self._render(changes), encoding="ascii")
        os.replace(tmp, path)
