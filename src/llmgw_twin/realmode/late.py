"""Late heartbeats done for real: `delay_heartbeats` holds a node's heartbeats back, as the twin
models it (`twin/world/heartbeats.py`): each heartbeat the node sends during the window arrives
`by` late, in the order sent, none dropped; the agent's own reports of a change are not held.

Each node of a file with late heartbeats has a lateness file in its sysfs-shaped root
(`late_path`), named in its agent's config (`late_heartbeats_file`); the agent reads it at each
heartbeat it sends (`service/agent/late.py`). A window's start and end each add a line, the
node's lateness from that instant (the longest of the windows under way, 0 once the last has
ended), on `CLOCK_BOOTTIME`:

    SINCE_NS DELAY_MS

Invariants: the file is replaced whole (a temporary file renamed over it); overlapping windows
of one node leave it at the longest under way, and at 0 once the last has ended.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from llmgw_twin.control.model import NodeId
from llmgw_twin.twin.scenario.model import DelayHeartbeats, Scenario

LATE_FILE = "llmgw-late-heartbeats"
"""The lateness file's name in a node's root."""


def delays(scenario: Scenario) -> bool:
    """Whether the file holds some node's heartbeats back (its agents then get a file each)."""
    return any(isinstance(f.action, DelayHeartbeats) for f in scenario.faults)


def late_path(root: Path) -> Path:
    return root / LATE_FILE


class NodeLateness:
    """The windows of late heartbeats under way on the nodes of one run, and their files."""

    def __init__(self, nodes_dir: Path, pending: list[asyncio.TimerHandle]) -> None:
        self.nodes_dir = nodes_dir
        """Where the nodes' roots are (`nodes_dir / node`, `cluster.py`)."""
        self.pending = pending
        """The run's timers, which `RealFaults.cancel` ends with the run."""
        self._under_way: dict[NodeId, list[int]] = {}
        self._changes: dict[NodeId, list[tuple[int, int]]] = {}

    def delay(self, nodes: tuple[NodeId, ...], by_ms: int, for_ms: int) -> None:
        """The heartbeats `nodes` send from now, for `for_ms`, arrive `by_ms` late."""
        for node in nodes:
            self._under_way.setdefault(node, []).append(by_ms)
            self._write(node)
        loop = asyncio.get_running_loop()
        self.pending.append(loop.call_later(for_ms / 1000, self._end, nodes, by_ms))

    def _end(self, nodes: tuple[NodeId, ...], by_ms: int) -> None:
        for node in nodes:
            self._under_way[node].remove(by_ms)
            self._write(node)

    def lateness(self, node: NodeId) -> int:
        """The node's lateness now: the longest of the windows under way (0: none)."""
        return max(self._under_way.get(node, ()), default=0)

    def _write(self, node: NodeId) -> None:
        changes = self._changes.setdefault(node, [])
        late = self.lateness(node)
        if late == (changes[-1][1] if changes else 0):
            return  # a longer window still under way, or one as long
        changes.append((time.clock_gettime_ns(time.CLOCK_BOOTTIME), late))
        path = late_path(self.nodes_dir / node)
        tmp = path.with_name(f"{path.name}.tmp")
        tmp.write_text("".join(f"{since} {ms}\n" for since, ms in changes), encoding="ascii")
        os.replace(tmp, path)
