"""Every state machine of the control plane, each one table of legal transitions (as h11's).

Three machines: a replica's lifecycle (controller), a shard's phase on its node (agent), and a
node's health as the controller sees it. Each table maps a state to the states it may move to;
`transition(table, current, new)` returns `new` or raises `IllegalTransition`, so a state is
never assigned by hand: every move is checked against the one table that documents it.

Invariants: terminal states (`reaped`, a shard's `exited`) have no way out; a replacement is a new
replica, never a revived one. `docs/architecture.md` shows these tables as diagrams rendered by
`diagram()`, and a test keeps the doc equal to the tables.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

from llmgw_twin.control.model import NodeState, ReplicaState

S = TypeVar("S", bound=enum.Enum)


class IllegalTransition(RuntimeError):
    """A move the state table does not allow: a bug in the core, never bad input."""


R = ReplicaState
REPLICA: Mapping[ReplicaState, frozenset[ReplicaState]] = {
    R.PENDING: frozenset({R.PLACED, R.REAPED}),
    R.ADOPTING: frozenset({R.STARTING, R.READY, R.FAILED, R.REAPED}),
    R.PLACED: frozenset({R.STARTING, R.FAILED, R.REAPED}),
    R.STARTING: frozenset({R.READY, R.FAILED, R.REAPED}),
    R.READY: frozenset({R.DEGRADED, R.FAILED, R.REAPED}),
    R.DEGRADED: frozenset({R.READY, R.FAILED, R.REAPED}),
    R.FAILED: frozenset({R.REAPED}),
    R.REAPED: frozenset(),
}
"""A replica's lifecycle. `pending` is where a new replica starts and `adopting` where a restored
one does; `failed` lasts only until the reap in the same step."""

REPLICA_INITIAL: frozenset[ReplicaState] = frozenset({R.PENDING, R.ADOPTING})


class Phase(enum.Enum):
    """A shard's phase inside its node agent (finer than the `ShardState` it reports)."""

    WAITING = "waiting"  # accepted; its sidecar waits for a shard of its key to stop
    SIDECAR = "sidecar"  # sidecar starting, or up and its engine waiting for its GPUs
    LAUNCHING = "launching"  # sidecar up, engine asked for
    ENGINE = "engine"  # engine process started
    RUNNING = "running"  # a worker that joined its leader
    SERVING = "serving"  # the leader, answering on its endpoint
    UNRESPONSIVE = "unresponsive"  # alive but failing its probe (a leader's or a worker's)
    EXITED = "exited"  # the engine process ended

    # a member equals itself alone, so the identity's hash serves, at C speed (`Enum`'s own
    # hashes the name in Python, once per table look-up: a twin's fleet start does thousands)
    __hash__ = object.__hash__


P = Phase
SHARD_PHASE: Mapping[Phase, frozenset[Phase]] = {
    P.WAITING: frozenset({P.SIDECAR}),
    P.SIDECAR: frozenset({P.LAUNCHING, P.EXITED}),
    P.LAUNCHING: frozenset({P.ENGINE, P.EXITED}),
    P.ENGINE: frozenset({P.RUNNING, P.SERVING, P.EXITED}),
    P.RUNNING: frozenset({P.SERVING, P.UNRESPONSIVE, P.EXITED}),
    P.SERVING: frozenset({P.UNRESPONSIVE, P.EXITED}),
    P.UNRESPONSIVE: frozenset({P.SERVING, P.RUNNING, P.EXITED}),
    P.EXITED: frozenset(),
}
"""A shard on its node. A waiting shard has no process, so nothing of it can exit: a late exit
notice for an earlier shard of the same key is not this shard's. Leaving the table altogether
(the controller dropped the shard) is a stop, not a phase."""

N = NodeState
NODE_HEALTH: Mapping[NodeState, frozenset[NodeState]] = {
    N.ALIVE: frozenset({N.SUSPECT}),
    N.SUSPECT: frozenset({N.ALIVE, N.LOST}),
    N.LOST: frozenset({N.ALIVE}),
}
"""A node's health: silence moves it alive -> suspect -> lost, any heartbeat back to alive."""


def can_move(table: Mapping[S, frozenset[S]], current: S, new: S) -> bool:
    return new in table[current]


def transition(table: Mapping[S, frozenset[S]], current: S, new: S) -> S:
    """`new`, if the table allows moving there from `current`; otherwise raises."""
    if new not in table[current]:
        allowed = ", ".join(sorted(s.value for s in table[current])) or "nothing (terminal)"
        raise IllegalTransition(
            f"{type(current).__name__} {current.value} -> {new.value} is not a legal move "
            f"(from {current.value}: {allowed})"
        )
    return new


def diagram(table: Mapping[S, frozenset[S]], initial: frozenset[S] = frozenset()) -> str:
    """The table as a Mermaid state diagram, states in declaration order."""
    lines = ["stateDiagram-v2"]
    lines += [f"    [*] --> {s.value}" for s in table if s in initial]
    for state, targets in table.items():
        order = [t for t in table if t in targets]
        lines += [f"    {state.value} --> {t.value}" for t in order]
        if not targets:
            lines.append(f"    {state.value} --> [*]")
    return "\n".join(lines)
