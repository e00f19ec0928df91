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

Invariants: the file is replaced whole (a temporary file renamed over it); overlapping slowdowns
of one node leave it at the slowest under way, and at 1 once the last has ended; only the sim
engine reads a pace, so real mode refuses a slowdown when a profile runs another
(`refusals.py`).
"""

from __future__ import annotations

import asyncio
import os
from fractions import Fraction
from pathlib import Path

from llmgw_twin.control.model import NodeId
from llmgw_twin.programs.sim_pace import ONE, boottime_ns, format_changes
from llmgw_twin.twin.scenario.model import Scenario, SlowNode
from llmgw_twin.twin.scenario.topo_actions import NvlinkDegraded

PACE_FILE = "llmgw-sim-pace"
"""The pace file's name in a node's root."""


def slows(scenario: Scenario) -> bool:
    """Whether the file slows a node down (its agents then get a pace file each)."""
    return any(isinstance(f.action, (SlowNode, NvlinkDegraded)) for f in scenario.faults)


def pace_path(root: Path) -> Path:
    return root / PACE_FILE


class NodePaces:
    """The slowdowns under way on the nodes of one run, and their pace files."""

    def __init__(self, nodes_dir: Path, pending: list[asyncio.TimerHandle]) -> None:
        self.nodes_dir = nodes_dir
        """Where the nodes' roots are (`nodes_dir / node`, `cluster.py`)."""
        self.pending = pending
        """The run's timers, which `RealFaults.cancel` ends with the run."""
        self._under_way: dict[NodeId, list[Fraction]] = {}
        self._changes: dict[NodeId, list[tuple[int, Fraction]]] = {}

    def slow(self, node: NodeId, factor: Fraction, for_ms: int) -> None:
        """The node runs `factor` times slower for `for_ms`, from now."""
        self.begin(node, factor)
        loop = asyncio.get_running_loop()
        self.pending.append(loop.call_later(for_ms / 1000, self.end, node, factor))

    def begin(self, node: NodeId, factor: Fraction) -> None:
        self._under_way.setdefault(node, []).append(factor)
        self._write(node)

    def end(self, node: NodeId, factor: Fraction) -> None:
        self._under_way[node].remove(factor)
        self._write(node)

    def pace(self, node: NodeId) -> Fraction:
        """The node's pace now: the slowest of the slowdowns under way (1: none)."""
        return max(self._under_way.get(node, ()), default=ONE)

    def _write(self, node: NodeId) -> None:
        changes = self._changes.setdefault(node, [])
        pace = self.pace(node)
        if pace == (changes[-1][1] if changes else ONE):
            return  # a slower one still under way, or one as slow
        changes.append((boottime_ns(), pace))
        path = pace_path(self.nodes_dir / node)
        tmp = path.with_name(f"{path.name}.tmp")
        tmp.write_text(format_changes(changes), encoding="ascii")
        os.replace(tmp, path)
