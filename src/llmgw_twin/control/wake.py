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

from collections.abc import Callable, Collection, Iterable, Mapping

from llmgw_twin.control.model import ModelName, NodeId
from llmgw_twin.control.moves import USERS, Moves
from llmgw_twin.control.parts import Liveness
from llmgw_twin.control.replicas import ReplicaTable


def quiet_until(busy: bool, deadlines: Iterable[int | None]) -> int | None:
    """The earliest deadline when nothing is under way (`underway`: a reconcile before it
    changes nothing); None when something is, and every reconcile of the grid is needed."""
    if busy:
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
    rolling: Callable[[], Collection[ModelName]],
) -> bool:
    """Whether anything is under way that may change at any reconcile, whatever the time: a
    replica pending, not ready or adopting, work left dirty, a node suspect or paced, the
    mass-loss guard holding, a move, a drain (a cordoned node not yet announced empty) or a
    rollout. While it is, every reconcile of the grid runs. (Asked at every reconcile: the
    cheapest questions first, and the first yes ends it.)"""
    return bool(
        replicas.pending
        or replicas.unready
        or replicas.adopting
        or replicas.dirty
        or replicas.dirty_models
        or dirty_nodes
        or live.health.suspect_count
        or paced
        or live.guard.held
        or any(moves.busy(user) for user in USERS)
        or not all(draining.values())
        or rolling()
    )
