"""What the controller core's parts share, built once by the controller and handed to each part
when it is built.

`Books` is the shared state, each book owning its own: the capacity index, the replica table,
the node assignments, the failure book, the outbox, and the desired state (profiles and
deployments, written only by the operator's events). `Liveness` is what every part may ask of a
node's health: the heartbeat tracker, the mass-loss guard and the nodes heard since this
controller started; the node registry changes it, the others only read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw_twin.control.assignments import Assignments
from llmgw_twin.control.failures import FailureBook
from llmgw_twin.control.guard import MassLossGuard
from llmgw_twin.control.health import HealthTracker
from llmgw_twin.control.model import (
    Deployment,
    ModelName,
    NodeId,
    NodeState,
    Profile,
    ProfileName,
    ReplicaState,
    Timings,
)
from llmgw_twin.control.outbox import Outbox
from llmgw_twin.control.pace import EvictionPace
from llmgw_twin.control.placement import CapacityIndex
from llmgw_twin.control.replicas import ReplicaRecord, ReplicaTable


@dataclass(frozen=True, slots=True)
class Books:
    timings: Timings
    capacity: CapacityIndex = field(default_factory=CapacityIndex)
    replicas: ReplicaTable = field(default_factory=ReplicaTable)
    assignments: Assignments = field(default_factory=Assignments)
    out: Outbox = field(default_factory=Outbox)
    profiles: dict[ProfileName, Profile] = field(default_factory=dict)
    deployments: dict[ModelName, Deployment] = field(default_factory=dict)
    failures: FailureBook = field(init=False)
    pace: EvictionPace = field(init=False)
    """The budget of replicas taken down for silence or by moves (`control/pace.py`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "failures", FailureBook(self.timings))
        object.__setattr__(self, "pace", EvictionPace(self.timings))
        self.capacity.stability.half_life_ms = self.timings.node_history_half_life_ms


class Liveness:
    def __init__(self, timings: Timings) -> None:
        self.health = HealthTracker(timings)
        self.guard = MassLossGuard(timings)
        self.heard: set[NodeId] = set()
        """Nodes heard from since this controller started: only these are placed on."""

    def node_ok(self, node: NodeId) -> bool:
        """Alive and heard since this controller started."""
        return node in self.heard and self.health.state(node) is NodeState.ALIVE

    def counts(self, rec: ReplicaRecord) -> bool:
        """Whether a live replica counts toward its deployment's desired count: a restored one
        still waiting on a node counts, as a ready one on a suspect node does, until the node
        is declared lost (on the silence clock the store kept): a restart is no reason to
        replace what a controller that never restarted would keep."""
        if rec.state is not ReplicaState.ADOPTING or self.guard.held:
            return True
        return not any(self.health.state(n) is NodeState.LOST for n in rec.nodes)
