"""Which ready replica serves a request.

The router keeps its own table of routable replicas per model, fed by the controller's event
stream alone, the way a router process beside the controller would follow it: an event of
`JOINS` with a leader `endpoint` adds the replica (`replica.ready`, `replica.adopted` of a
serving replica, `replica.recovered` and `replica.routable`); one of `LEAVES` removes it
(`replica.failed`, `replica.reaped`, `replica.degraded`, `replica.unroutable`). It picks round-robin
over the table in replica-id order, so the choice is deterministic.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from llmgw_twin.core.model import ModelName, ReplicaId, TraceEvent

JOINS = frozenset({"replica.ready", "replica.adopted", "replica.recovered", "replica.routable"})
LEAVES = frozenset({"replica.failed", "replica.reaped", "replica.degraded", "replica.unroutable"})


@dataclass(frozen=True, slots=True)
class Route:
    replica: ReplicaId
    endpoint: str


class Router:
    def __init__(self) -> None:
        self._table: dict[ModelName, dict[ReplicaId, str]] = {}
        self._order: dict[ModelName, list[ReplicaId]] = {}  # sorted ids: O(log n) upkeep
        self._next: dict[ModelName, int] = {}

    def follow(self, event: TraceEvent) -> None:
        """Apply one controller event."""
        model, replica = event.get("model"), event.get("replica")
        endpoint = event.get("endpoint")
        if not isinstance(model, str) or not isinstance(replica, str):
            return
        routes = self._table.setdefault(ModelName(model), {})
        order = self._order.setdefault(ModelName(model), [])
        rid = ReplicaId(replica)
        if event.kind in JOINS and isinstance(endpoint, str):
            if rid not in routes:
                bisect.insort(order, rid)
            routes[rid] = endpoint
        elif event.kind in LEAVES and rid in routes:
            del routes[rid]
            del order[bisect.bisect_left(order, rid)]

    def routes(self, model: ModelName) -> list[Route]:
        table = self._table.get(model, {})
        return [Route(r, table[r]) for r in self._order.get(model, [])]

    def pick(self, model: ModelName) -> Route | None:
        """The next replica for a request to `model`, or None when none is routable."""
        order = self._order.get(model)
        if not order:
            return None
        i = self._next.get(model, 0) % len(order)
        self._next[model] = i + 1
        return Route(order[i], self._table[model][order[i]])
