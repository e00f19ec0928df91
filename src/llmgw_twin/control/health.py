"""Heartbeat bookkeeping: alive -> suspect -> lost, and back to alive on a heartbeat.

A heartbeat is O(1): the tracker keeps the alive nodes and the suspect nodes each in an
insertion-ordered dict ordered by last heartbeat (a heartbeat moves its node to the end), so the
nodes whose silence crossed a threshold are always at the front. `expire(now)` pops from the
front only, so it costs O(nodes that change state), never a scan of the fleet.

Nodes whose silence crosses a threshold in the same pass change in order of last heartbeat, ties
broken by name: the order of two heartbeats heard in the same millisecond never shows.

A shell that accounts for a node's quiet heartbeats in bulk (the twin) may set the node aside
(`coast`): it counts as alive and never expires, since its heartbeats keep coming; `land` puts it
back with the time it was last heard, and it expires by that time.

Invariant: a node is in exactly one of `_alive`, `_landed`, `_coasting`, `_suspect`, `_lost`;
within `_alive` and `_suspect` the last-seen times are non-decreasing front to back.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from llmgw_twin.control import states
from llmgw_twin.control.model import NodeId, NodeState, Timings


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
        self._coasting: dict[NodeId, int] = {}
        """Alive nodes whose heartbeats a shell accounts for in bulk: node -> last seen when set
        aside (stale until landed)."""
        self._landed: dict[NodeId, int] = {}
        """Alive nodes handed back by `land`, not heard since: node -> last seen."""
        self._landed_heap: list[tuple[int, NodeId]] = []
        """(last seen, node) of landed nodes; an entry no longer in `_landed` is stale."""

    def state(self, node: NodeId) -> NodeState | None:
        if node in self._alive or node in self._coasting or node in self._landed:
            return NodeState.ALIVE
        if node in self._suspect:
            return NodeState.SUSPECT
        if node in self._lost:
            return NodeState.LOST
        return None

    def last_seen_ms(self, node: NodeId) -> int | None:
        """When the node was last heard (for a coasting node: when it was set aside)."""
        for book in (self._alive, self._landed, self._coasting, self._suspect, self._lost):
            if node in book:
                return book[node]
        return None

    def known(self) -> list[NodeId]:
        return sorted([*self._alive, *self._landed, *self._coasting, *self._suspect, *self._lost])

    def seen(self, node: NodeId, now_ms: int) -> HealthChange | None:
        """Record a heartbeat; returns the change when the node was not alive before."""
        before = self.state(node)
        self._alive.pop(node, None)
        self._landed.pop(node, None)
        self._coasting.pop(node, None)
        self._suspect.pop(node, None)
        self._lost.pop(node, None)
        self._alive[node] = now_ms
        if before is NodeState.ALIVE:
            return None
        return _change(node, before, NodeState.ALIVE)

    def heard_alive(self, node: NodeId, now_ms: int) -> bool:
        """A heartbeat from a node alive before: recorded, True. Otherwise nothing, False."""
        if node in self._alive:
            del self._alive[node]
        elif self._landed.pop(node, None) is None:
            return False
        self._alive[node] = now_ms
        return True

    def coast(self, node: NodeId) -> None:
        """Set an alive node aside: its heartbeats are accounted for elsewhere until `land`."""
        if node in self._landed:
            self._coasting[node] = self._landed.pop(node)
        else:
            self._coasting[node] = self._alive.pop(node)

    def land(self, node: NodeId, last_seen_ms: int) -> None:
        """Put a coasting node back, last heard at `last_seen_ms` (at most now). Nodes heard
        since are already at the back of `_alive`, so it waits in `_landed` (and its heap, by
        last-seen time) until it is heard again or its silence crosses a threshold."""
        del self._coasting[node]
        self._landed[node] = last_seen_ms
        heapq.heappush(self._landed_heap, (last_seen_ms, node))

    def coasting(self) -> list[NodeId]:
        return sorted(self._coasting)

    @property
    def alive_count(self) -> int:
        return len(self._alive) + len(self._landed) + len(self._coasting)

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
        moved: list[tuple[int, NodeId]] = []
        while self._alive:
            node, seen = next(iter(self._alive.items()))
            if now_ms - seen < self._suspect_after:
                break
            del self._alive[node]
            moved.append((seen, node))
        heap = self._landed_heap
        while heap and now_ms - heap[0][0] >= self._suspect_after:
            seen, node = heapq.heappop(heap)
            if self._landed.get(node) == seen:
                del self._landed[node]
                moved.append((seen, node))
        moved.sort()  # by last heartbeat, ties by name
        for seen, node in moved:
            self._suspect[node] = seen
        return [_change(node, NodeState.ALIVE, NodeState.SUSPECT) for _, node in moved]

    def expire_lost(self, now_ms: int) -> list[HealthChange]:
        """Suspect nodes silent for `node_lost_after` are lost."""
        moved: list[tuple[int, NodeId]] = []
        while self._suspect:
            node, seen = next(iter(self._suspect.items()))
            if now_ms - seen < self._lost_after:
                break
            del self._suspect[node]
            moved.append((seen, node))
        moved.sort()  # by last heartbeat, ties by name
        for seen, node in moved:
            self._lost[node] = seen
        return [_change(node, NodeState.SUSPECT, NodeState.LOST) for _, node in moved]

    def overdue(self, now_ms: int) -> list[NodeId]:
        """Suspect nodes silent for `node_lost_after` or longer, oldest silence first: due to be
        declared lost (`declare_lost`), which the eviction pace may defer (from the front of the
        suspect book only: O(overdue nodes))."""
        out: list[tuple[int, NodeId]] = []
        for node, seen in self._suspect.items():
            if now_ms - seen < self._lost_after:
                break
            out.append((seen, node))
        out.sort()  # by last heartbeat, ties by name
        return [node for _, node in out]

    def declare_lost(self, node: NodeId) -> HealthChange:
        """An overdue suspect node is declared lost."""
        seen = self._suspect.pop(node)
        self._lost[node] = seen
        return _change(node, NodeState.SUSPECT, NodeState.LOST)

    def nth_silence(self, n: int) -> int | None:
        """The last heartbeat of the suspect node silent `n`-th longest (0: the longest), or
        None when fewer are suspect."""
        if n >= len(self._suspect):
            return None
        for i, seen in enumerate(self._suspect.values()):
            if i == n:
                return seen
        return None  # pragma: no cover (n < len)

    def next_deadline_ms(self) -> int | None:
        """The earliest time at which `expire` would change something."""
        deadlines: list[int] = []
        if self._alive:
            deadlines.append(next(iter(self._alive.values())) + self._suspect_after)
        if self._landed:
            deadlines.append(min(self._landed.values()) + self._suspect_after)
        if self._suspect:
            deadlines.append(next(iter(self._suspect.values())) + self._lost_after)
        return min(deadlines) if deadlines else None

    def first_lost_seen_ms(self) -> int | None:
        """The earliest last heartbeat of a lost node (when the first may be forgotten)."""
        return min(self._lost.values(), default=None)

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
        for book in (self._alive, self._landed, self._suspect):
            for node, seen in book.items():
                book[node] = min(seen + lag_ms, now_ms)
        if self._landed:  # their heap entries moved with them: a sorted list is a heap
            self._landed_heap = sorted((seen, node) for node, seen in self._landed.items())

    def forget(self, node: NodeId) -> None:
        self._alive.pop(node, None)
        self._landed.pop(node, None)
        self._coasting.pop(node, None)
        self._suspect.pop(node, None)
        self._lost.pop(node, None)
