"""The pace of disruption: how many replicas the controller may take down in a window, for the
fleet and for each fabric.

Three things take a running replica down without the replica having failed on its own: a node
declared lost for its silence (every replica on it fails), a drain move and a defragmentation
move (the original is retired once its copy serves). Each spends from one budget, counted in
replicas over a sliding window of `eviction_window`: at most `eviction_budget` in the fleet and
`eviction_fabric_budget` in any one fabric. A silent node whose loss would overspend is kept (its
replicas out of routing, still counted toward their deployments, not replaced) until the budget
has room, or until it answers; a move that would overspend waits. A budget of 0 switches its
limit off.

A node holding more replicas than a budget could ever allow is not kept forever: it goes alone,
once the window has nothing else in it (`fits` caps each cost at the budget).

Invariant: within any window of `eviction_window`, the costs spent add up to at most the budget,
except for one such oversized spend alone in its window.
"""

from __future__ import annotations

from collections import deque

from llmgw_twin.control.model import FabricId, Timings


class EvictionPace:
    def __init__(self, timings: Timings) -> None:
        self._window = timings.eviction_window_ms
        self._fleet_budget = timings.eviction_budget
        self._fabric_budget = timings.eviction_fabric_budget
        self._spent: deque[tuple[int, FabricId, int]] = deque()
        """(when, fabric, replicas) of every spend in the current window, oldest first."""
        self._fleet = 0
        self._fabric: dict[FabricId, int] = {}

    def _expire(self, now_ms: int) -> None:
        spent = self._spent
        while spent and now_ms - spent[0][0] >= self._window:
            _, fabric, cost = spent.popleft()
            self._fleet -= cost
            left = self._fabric[fabric] - cost
            if left:
                self._fabric[fabric] = left
            else:
                del self._fabric[fabric]

    def fits(self, costs: dict[FabricId, int], now_ms: int) -> bool:
        """Whether taking down `costs` replicas (per fabric) now stays within both budgets."""
        self._expire(now_ms)
        total = sum(costs.values())
        if total == 0:
            return True
        fleet_budget, fabric_budget = self._fleet_budget, self._fabric_budget
        if fleet_budget > 0 and self._fleet + min(total, fleet_budget) > fleet_budget:
            return False
        if fabric_budget > 0:
            for fabric, cost in costs.items():
                if self._fabric.get(fabric, 0) + min(cost, fabric_budget) > fabric_budget:
                    return False
        return True

    def spend(self, costs: dict[FabricId, int], now_ms: int) -> None:
        for fabric, cost in sorted(costs.items()):
            if cost <= 0:
                continue
            self._spent.append((now_ms, fabric, cost))
            self._fleet += cost
            self._fabric[fabric] = self._fabric.get(fabric, 0) + cost

    def take(self, costs: dict[FabricId, int], now_ms: int) -> bool:
        """Spend `costs` if they fit; returns whether they did."""
        if not self.fits(costs, now_ms):
            return False
        self.spend(costs, now_ms)
        return True

    def spent(self, now_ms: int) -> int:
        """Replicas taken down in the fleet within the window ending now."""
        self._expire(now_ms)
        return self._fleet
