"""Late heartbeats done for real: `delay_heartbeats` holds a node's heartbeats back, as the twin
models it (`twin/world/heartbeats.py`): each heartbeat the node sends during the window arrives
`by` late, in the order sent, none dropped; the agent's own reports of a change are not held.

Each node of a file with late heartbeats has a lateness file in its sysfs-shaped root
(`late_path`), named in its agent's config (`late_heartbeats_file`); the agent reads it at each
heartbeat it sends (`service/agent/late.py`). A window's start and end each add a line, the
node's lateness from that instant (the longest of the windows under way, 0 once the last has
ended), on `CLOCK_BOOTTIME`:

    SINCE_NS DELAY_MS

Invariants: as `levels.py` keeps each node's file (replaced whole; overlapping windows leave it
at the longest under way, and at 0 once the last has ended).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from llmgw_twin.realmode.levels import NodeLevels
from llmgw_twin.twin.scenario.model import DelayHeartbeats, Scenario

LATE_FILE = "llmgw-late-heartbeats"
"""The lateness file's name in a node's root."""


def delays(scenario: Scenario) -> bool:
    """Whether the file holds some node's heartbeats back (its agents then get a file each)."""
    return any(isinstance(f.action, DelayHeartbeats) for f in scenario.faults)


def late_path(root: Path) -> Path:
    return root / LATE_FILE


def node_lateness(nodes_dir: Path, pending: list[asyncio.TimerHandle]) -> NodeLevels[int]:
    """The windows of late heartbeats under way on the nodes of one run
    (`during(node, by_ms, for_ms)`), and their lateness files."""
    return NodeLevels(nodes_dir, pending, LATE_FILE, 0, _render)


def _render(changes: Sequence[tuple[int, int]]) -> str:
    return "".join(f"{since_ns} {delay_ms}\n" for since_ns, delay_ms in changes)
