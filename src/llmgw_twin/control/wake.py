"""When the controller core next needs a reconcile, so that the ticks between cost nothing.

A reconcile acts on what changed since the last one and on deadlines. What changes arrives as
an input (`Controller.handle`), and a step that changed anything asks for the next reconcile of
the grid. The deadlines are data: a node's silence turning it suspect, a lifecycle timer (a
start deadline, a degraded replica's grace, a back-off's end), a quarantine's end, a lost node's
forgetting, the store clock's next write. `quiet_until` gives the earliest of them when nothing
is under way; a reconcile before it would change nothing.

It is conservative on purpose: while anything moves, a replica pending, starting or adopting, a
node suspect or paced, a move, drain or rollout under way, the mass-loss guard holding, work left
dirty, it says None, and the core asks for the next reconcile of the grid as it always did. A
missed wake-up would be a wrong answer (a node never found lost); an extra one costs one tick.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw_twin.control.model import ModelName, NodeId, ReplicaId
from llmgw_twin.control.moves import USERS, Moves
from llmgw_twin.control.parts import Liveness
from llmgw_twin.control.replicas import ReplicaTable


@dataclass(frozen=True, slots=True)
class Underway:
    """What may change at any reconcile, whatever the time: while any of it is there, every
    reconcile of the grid runs."""

    pending: Mapping[ReplicaId, None]
    unready: Mapping[ReplicaId, None]
    adopting: set[ReplicaId]
    dirty_replicas: set[ReplicaId]
    dirty_models: set[ModelName]
    dirty_nodes: set[NodeId]
    suspects: int
    paced: set[NodeId]
    guard_held: bool
    moving: bool
    draining: Mapping[NodeId, bool]
    """Cordoned nodes being drained: False until the node is announced empty."""
    rolling: bool

    def any(self) -> bool:
        return bool(
            self.pending
            or self.unready
            or self.adopting
            or self.dirty_replicas
            or self.dirty_models
            or self.dirty_nodes
            or self.suspects
            or self.paced
            or self.guard_held
            or self.moving
            or not all(self.draining.values())
            or self.rolling
        )


def quiet_until(underway: Underway, deadlines: Iterable[int | None]) -> int | None:
    """The earliest deadline when nothing is under way (a reconcile before it changes
    nothing); None when something is, and every reconcile of the grid is needed."""
    if underway.any():
        return None
    return min((d for d in deadlines if d is not None), default=None)


def on_grid_at_or_after(next_due_ms: int, interval_ms: int, at_ms: int) -> int:
    """The first reconcile of the grid at or after `at_ms`, none before `next_due_ms` (the
    reconcile after the last one that ran)."""
    if at_ms <= next_due_ms:
        return next_due_ms
    return next_due_ms + interval_ms * -((next_due_ms - at_ms) // interval_ms)


def underway(
    replicas: ReplicaTable,
    dirty_nodes: set[NodeId],
    live: Liveness,
    paced: set[NodeId],
    moves: Moves,
    draining: Mapping[NodeId, bool],
    rolling: bool,
) -> Underway:
    return Underway(
        pending=replicas.pending,
        unready=replicas.unready,
        adopting=replicas.adopting,
        dirty_replicas=replicas.dirty,
        dirty_models=replicas.dirty_models,
        dirty_nodes=dirty_nodes,
        suspects=live.health.suspect_count,
        paced=paced,
        guard_held=live.guard.held,
        moving=any(moves.busy(user) for user in USERS),
        draining=draining,
        rolling=rolling,
    )
