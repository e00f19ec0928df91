"""Heartbeat bookkeeping: alive -> suspect -> lost, and back to alive on a heartbeat.

A heartbeat is O(1): the tracker keeps the alive nodes and the suspect nodes each in an
insertion-ordered dict ordered by last heartbeat (a heartbeat moves its node to the end), so the
nodes whose silence crossed a threshold are always at the front. `expire(now)` pops from the
front only, so it costs O(nodes that change state), never a scan of the fleet.

Invariant: a node is in exactly one of `_alive`, `_suspect`, `_lost`; within `_alive` and
`_suspect` the last-seen times are non-decreasing front to back.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw_twin.core import states
from llmgw_twin.core.model import NodeId, NodeState, Timings


@dataclass(frozen=True, slots=True)
class HealthChange:
    node: NodeId
    before: NodeState | None  # None: first time seen
    after: NodeState


def _change(node: NodeId, before: NodeState | None, after: NodeState) -> HealthChange:
    """A health change, checked against `states.NODE_HEALTH` (a first sighting is no move)."""
    if before is not None:
        states.transition(states.NODE_HEALTH, before, after)
    return HealthChange(node, before, after)


class HealthTracker:
    def __init__(self, timings: Timings) -> None:
        self._suspect_after = timings.node_suspect_after_ms
        self._lost_after = timings.node_lost_after_ms
        self._alive: dict[NodeId, int] = {}
        self._suspect: dict[NodeId, int] = {}
        self._lost: dict[NodeId, int] = {}

    def state(self, node: NodeId) -> NodeState | None:
        if node in self._alive:
            return NodeState.ALIVE
        if node in self._suspect:
            return NodeState.SUSPECT
        if node in self._lost:
            return NodeState.LOST
        return None

    def last_seen_ms(self, node: NodeId) -> int | None:
        for book in (self._alive, self._suspect, self._lost):
            if node in book:
                return book[node]
        return None

    def known(self) -> list[NodeId]:
        return sorted([*self._alive, *self._suspect, *self._lost])

    def seen(self, node: NodeId, now_ms: int) -> HealthChange | None:
        """Record a heartbeat; returns the change when the node was not alive before."""
        before = self.state(node)
        self._alive.pop(node, None)
        self._suspect.pop(node, None)
        self._lost.pop(node, None)
        self._alive[node] = now_ms
        if before is NodeState.ALIVE:
            return None
        return _change(node, before, NodeState.ALIVE)

    @property
    def alive_count(self) -> int:
        return len(self._alive)

    @property
    def suspect_count(self) -> int:
        return len(self._suspect)

    def suspects(self) -> list[NodeId]:
        return sorted(self._suspect)

    def restore(self, node: NodeId, last_seen_ms: int, lost: bool) -> None:
        """A restarted controller's node, last heard at `last_seen_ms`: call in order of that
        time (ties by name), so the books stay ordered. `lost`: it was declared lost before
        the restart (restored so without a second announcement)."""
        if lost:
            self._lost[node] = last_seen_ms
        else:
            self._alive[node] = last_seen_ms

    def restart_silence(self, now_ms: int) -> list[NodeId]:
        """Count every suspect node's silence from `now_ms` (the end of a mass-loss hold)."""
        nodes = sorted(self._suspect)
        self._suspect = dict.fromkeys(nodes, now_ms)
        return nodes

    def expire(self, now_ms: int) -> list[HealthChange]:
        """Move every node whose silence crossed a threshold; alive may go straight to lost."""
        return self.expire_suspect(now_ms) + self.expire_lost(now_ms)

    def expire_suspect(self, now_ms: int) -> list[HealthChange]:
        """Alive nodes silent for `node_suspect_after` turn suspect."""
        changes: list[HealthChange] = []
        while self._alive:
            node, seen = next(iter(self._alive.items()))
            if now_ms - seen < self._suspect_after:
                break
            del self._alive[node]
            self._suspect[node] = seen
            changes.append(_change(node, NodeState.ALIVE, NodeState.SUSPECT))
        return changes

    def expire_lost(self, now_ms: int) -> list[HealthChange]:
        """Suspect nodes silent for `node_lost_after` are lost."""
        changes: list[HealthChange] = []
        while self._suspect:
            node, seen = next(iter(self._suspect.items()))
            if now_ms - seen < self._lost_after:
                break
            del self._suspect[node]
            self._lost[node] = seen
            changes.append(_change(node, NodeState.SUSPECT, NodeState.LOST))
        return changes

    def next_deadline_ms(self) -> int | None:
        """The earliest time at which `expire` would change something."""
        deadlines: list[int] = []
        if self._alive:
            deadlines.append(next(iter(self._alive.values())) + self._suspect_after)
        if self._suspect:
            deadlines.append(next(iter(self._suspect.values())) + self._lost_after)
        return min(deadlines) if deadlines else None

    def lost_since(self, now_ms: int, silent_for_ms: int) -> list[NodeId]:
        """Lost nodes last heard `silent_for_ms` or more ago, oldest first (from the front of
        the lost book only, which is in the order nodes were lost)."""
        out: list[NodeId] = []
        for node, seen in self._lost.items():
            if now_ms - seen < silent_for_ms:
                break
            out.append(node)
        return out

    def forgive(self, lag_ms: int, now_ms: int) -> None:
        """The controller itself fell `lag_ms` behind: that long of every alive or suspect
        node's silence was the controller's, not the node's. Each last-seen moves later by
        `lag_ms` (never past `now_ms`), so the order of the books holds. O(nodes), once per
        episode of lag."""
        for book in (self._alive, self._suspect):
            for node, seen in book.items():
                book[node] = min(seen + lag_ms, now_ms)

    def forget(self, node: NodeId) -> None:
        self._alive.pop(node, None)
        self._suspect.pop(node, None)
        self._lost.pop(node, None)
