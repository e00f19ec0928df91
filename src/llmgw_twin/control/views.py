"""The controller core's read-only views: what shells, the router and the twin's checkers may
read of its state (node health and facts, replicas, assignments, capacity, quarantines, moves,
drains, the rollout). `Controller` is built on them; nothing here changes anything.
"""

from __future__ import annotations

from llmgw_twin.control.assignments import Assignments
from llmgw_twin.control.defrag import Defragmenter
from llmgw_twin.control.drain import Drainer
from llmgw_twin.control.failures import FailureBook
from llmgw_twin.control.model import (
    Deployment,
    ModelName,
    NodeId,
    NodeInfo,
    NodeState,
    Profile,
    ProfileName,
    ReplicaId,
    ReplicaState,
    ShardSpec,
    Timings,
)
from llmgw_twin.control.moves import Moves
from llmgw_twin.control.nodes import NodeRegistry
from llmgw_twin.control.outbox import Outbox
from llmgw_twin.control.placement import CapacityIndex
from llmgw_twin.control.replicas import ReplicaRecord, ReplicaTable
from llmgw_twin.control.rollout import Rollout


class ControllerViews:
    """The read-only half of `controller.Controller`: the parts it reads are the controller's."""

    timings: Timings
    _fleet: NodeRegistry
    _replicas: ReplicaTable
    _assignments: Assignments
    _capacity: CapacityIndex
    _failures: FailureBook
    _defrag: Defragmenter
    _moves: Moves
    _drain: Drainer
    _rollout: Rollout
    _out: Outbox
    _deployments: dict[ModelName, Deployment]
    _profiles: dict[ProfileName, Profile]
    _due_ms: int | None

    @property
    def reconcile_due_ms(self) -> int | None:
        """When the next reconcile is due (None before `start`)."""
        return self._due_ms

    def node_state(self, node: NodeId) -> NodeState | None:
        return self._fleet.health.state(node)

    def node_info(self, node: NodeId) -> NodeInfo | None:
        return self._fleet.infos.get(node)

    def nodes(self) -> list[NodeId]:
        return sorted(self._fleet.infos)

    def replica(self, rid: ReplicaId) -> ReplicaRecord | None:
        return self._replicas.get(rid)

    def replicas(self) -> list[ReplicaRecord]:
        return self._replicas.sorted()

    def live_replicas(self, model: ModelName) -> list[ReplicaRecord]:
        return self._replicas.live(model)

    def ready_replicas(self, model: ModelName) -> list[ReplicaRecord]:
        """Ready and routable: a replica with a shard on a silent node is not capacity (but
        under a mass-loss hold, which keeps its routes)."""
        return [
            r
            for r in self.live_replicas(model)
            if r.state is ReplicaState.READY and not r.unroutable
        ]

    def assigned(self, node: NodeId) -> tuple[ShardSpec, ...]:
        return self._assignments.of(node)

    def replicas_on(self, node: NodeId) -> list[ReplicaId]:
        return self._assignments.replicas_on(node)

    def deployments(self) -> list[Deployment]:
        return [self._deployments[m] for m in sorted(self._deployments)]

    def held(self) -> bool:
        """The mass-loss guard holds: the controller takes the fleet's silence for its own."""
        return self._fleet.guard.held

    def loss_accepted(self) -> bool:
        """The last mass-loss hold ran past its bound: the silence is taken as the fleet's."""
        return self._fleet.guard.accepted

    def paced(self) -> list[NodeId]:
        """Nodes silent past the lost window that the eviction pace keeps (`node.loss_paced`)."""
        return sorted(self._fleet.paced)

    def failed_gpus(self, node: NodeId) -> tuple[int, ...]:
        return self._capacity.failed_gpus(node)

    def booked_gpus(self, node: NodeId) -> tuple[int, ...]:
        """GPUs of `node` held by a replica, or for one a defragmentation is making room for."""
        return self._capacity.booked_gpus(node) if self._capacity.has_node(node) else ()

    def quarantines(self) -> list[tuple[NodeId, ProfileName, int, str]]:
        rows = self._failures.quarantines
        return [(q.node, q.profile, q.until_ms, q.reason) for _, q in sorted(rows.items())]

    def link_up(self, node: NodeId) -> bool:
        return self._capacity.link_up(node)

    def moves(self) -> dict[ReplicaId, ReplicaId]:
        """Defragmentation moves in flight: new copy -> the replica it replaces."""
        return self._defrag.in_flight()

    def held_gpus(self) -> dict[NodeId, tuple[int, ...]]:
        """GPUs a defragmentation holds for the replica it makes room for, per node."""
        return self._moves.held

    @property
    def drains(self) -> Drainer:
        """Cordoned and draining nodes, and the drain moves in flight (read-only by convention)."""
        return self._drain

    @property
    def rollout(self) -> Rollout:
        """The models being rolled to a changed profile, and their moves (read-only by
        convention)."""
        return self._rollout

    @property
    def capacity(self) -> CapacityIndex:
        """Free, booked and failed GPUs per node (read-only by convention: `explain` reads it)."""
        return self._capacity

    def pending_ids(self) -> list[ReplicaId]:
        return list(self._replicas.pending)

    def now_ms(self) -> int:
        """The time of the last event or tick the core handled."""
        return self._out.now_ms

    def heard(self, node: NodeId) -> bool:
        """Heard from since this controller started."""
        return node in self._fleet.heard_nodes

    def excluded(self, profile: Profile) -> frozenset[NodeId]:
        """Nodes a new replica of `profile` must not use now (quarantined, or not heard since
        a failure)."""
        return self._failures.excluded(profile.name)

    def profile(self, name: ProfileName) -> Profile | None:
        return self._profiles.get(name)
