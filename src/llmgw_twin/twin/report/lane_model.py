"""The parts a run's lanes are made of: segments, marks and lanes, and how long each fault lasts.

Role: the data `lanes.py` fills while it reads a run's trace and `html.py` draws: a `Seg` is a
state over virtual time (a node's health, a replica's state, a shard, a fault's span), a `Mark`
an instant, a `Lane` the rows of one node, replica or the controller. `fault_id` names a fault
as the page shows it, `_fault_for` says how long its span lasts (0: an instant). `lanes.py`
re-exports the public names here.

Invariants: plain values, no I/O; every fault action the scenario model knows has a length here
(`assert_never` makes a new action a type error until it is given one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import assert_never

from llmgw_twin.twin.scenario.model import (
    AddNode,
    ClockSkew,
    Cordon,
    CrashNode,
    CutFabricLink,
    DelayHeartbeats,
    DeleteDeployment,
    FabricDown,
    FailGpu,
    Fault,
    HangEngine,
    KillController,
    KillEngine,
    KillNode,
    Partition,
    PartitionController,
    RestartAgent,
    RestartController,
    RestartNode,
    SetProfile,
    SetReplicas,
    SlowNode,
    StallController,
    StoreDown,
)
from llmgw_twin.twin.scenario.topo_actions import (
    LeafDown,
    NvlinkDegraded,
    NvlinkDomainDown,
    SpineDown,
)


@dataclass(slots=True)
class Seg:
    """A state from `start_ms` to `end_ms`; a shard's `ready_ms` splits it into loading and up."""

    state: str
    start_ms: int
    end_ms: int
    label: str = ""
    tip: str = ""
    attrs: dict[str, str] = field(default_factory=dict)
    ready_ms: int | None = None


@dataclass(slots=True)
class Mark:
    t_ms: int
    kind: str
    tip: str
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Lane:
    key: str
    title: str
    subtitle: str
    rows: dict[str, list[Seg]]
    marks: list[Mark] = field(default_factory=list)
    spans: list[Seg] = field(default_factory=list)
    """Fault spans over the whole lane (a node powered off, a partition, a controller outage)."""


@dataclass(slots=True)
class _Open:
    state: str
    since: int
    tip: str = ""


def fault_id(fault: Fault, index: int) -> str:
    """A fault's id, or `#n` (its place in the file's fault list, from 1) when it has none."""
    return fault.id if fault.id is not None else f"#{index + 1}"


def _fault_for(fault: Fault) -> int:
    match fault.action:
        case Partition(for_ms=ms) | FabricDown(for_ms=ms):
            return ms
        case CutFabricLink(for_ms=ms) | SlowNode(for_ms=ms) | DelayHeartbeats(for_ms=ms):
            return ms
        case LeafDown(for_ms=ms) | SpineDown(for_ms=ms) | NvlinkDegraded(for_ms=ms):
            return ms
        case NvlinkDomainDown(for_ms=ms):
            return ms or 0
        case RestartController(down_for_ms=ms):
            return ms
        case StallController(for_ms=ms) | PartitionController(for_ms=ms) | StoreDown(for_ms=ms):
            return ms
        case (
            KillNode()
            | CrashNode()
            | RestartNode()
            | KillEngine()
            | HangEngine()
            | RestartAgent()
            | FailGpu()
            | SetReplicas()
            | SetProfile()
            | Cordon()
            | DeleteDeployment()
            | KillController()
            | ClockSkew()
            | AddNode()
        ):
            return 0  # an instant, or (an agent's restart) not drawn as a span
        case _:
            assert_never(fault.action)
