"""Stragglers done for real: `slow_node` and `nvlink_degraded` set a node's pace, as the twin
models them (`twin/world/shapes.py`, `topo_faults.py`): an engine started on the node meanwhile
loads in `factor` times its load time, and a request a replica with a shard there accepts
meanwhile takes `factor` times as long; its heartbeats arrive as ever.

Each node of a file with a slowdown has a pace file in its sysfs-shaped root (`pace_path`), named
in its agent's config (`sim_pace_file`), which hands it to its sim engines (`--pace-file`): they
read it as `programs/sim_pace.py` says. A slowdown's start and end each add a line to it, the
node's pace from that instant (the slowest of those under way), on `CLOCK_BOOTTIME`, so an
engine whose Python start-up straddles an instant still finds the pace in force when its process
started.

Invariants: as `levels.py` keeps each node's file (replaced whole; overlapping slowdowns leave it
at the slowest under way, and at 1 once the last has ended); only the sim engine reads a pace,
so real mode refuses a slowdown when a profile runs another (`refusals.py`).
"""

from __future__ import annotations

import asyncio
from fractions import Fraction
from pathlib import Path

from llmgw_twin.programs.sim_pace import ONE, format_changes
from llmgw_twin.realmode.levels import NodeLevels
from llmgw_twin.twin.scenario.model import Scenario, SlowNode
from llmgw_twin.twin.scenario.topo_actions import NvlinkDegraded

PACE_FILE = "llmgw-sim-pace"
"""The pace file's name in a node's root."""


def slows(scenario: Scenario) -> bool:
    """Whether the file slows a node down (its agents then get a pace file each)."""
    return any(isinstance(f.action, (SlowNode, NvlinkDegraded)) for f in scenario.faults)


def pace_path(root: Path) -> Path:
    return root / PACE_FILE


def node_paces(nodes_dir: Path, pending: list[asyncio.TimerHandle]) -> NodeLevels[Fraction]:
    """The slowdowns under way on the nodes of one run (`during(node, factor, for_ms)`), and
    their pace files."""
    return NodeLevels(nodes_dir, pending, PACE_FILE, ONE, format_changes)
