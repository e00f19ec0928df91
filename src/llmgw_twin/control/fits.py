"""Per replica shape, the fabrics that can hold one replica now, ranked by the free GPUs the
tightest fit would leave, then by name: placement's answer when room is not scarce, kept up to
date from the fabrics that changed since it was last read instead of recomputed over the fleet.

Invariant: after `ranked()`, the list holds exactly the fabrics whose fit (as `fit` gives it)
has at least `shape.nodes` eligible nodes, each once, in (leftover, name) order.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

from llmgw_twin.control.model import FabricId
from llmgw_twin.control.room import Shape

Fit = Callable[[FabricId, Shape], tuple[int, int, tuple[int, ...]]]
"""fabric, shape -> (eligible nodes, free GPUs the tightest fit leaves, their free counts)."""


class FitRanking:
    def __init__(self, shape: Shape, fit: Fit, fabrics: Iterable[FabricId]) -> None:
        self._shape = shape
        self._fit = fit
        self._dirty: set[FabricId] = set(fabrics)
        self._keys: dict[FabricId, tuple[int, FabricId]] = {}
        self._sorted: list[tuple[int, FabricId]] = []

    def touch(self, fabric: FabricId) -> None:
        """Something in `fabric` changed: judge it again at the next read."""
        self._dirty.add(fabric)

    def ranked(self) -> list[tuple[int, FabricId]]:
        """(leftover, fabric) for every fabric that can hold one replica, tightest first."""
        for fabric in self._dirty:
            old = self._keys.pop(fabric, None)
            if old is not None:
                del self._sorted[bisect.bisect_left(self._sorted, old)]
            count, leftover, _ = self._fit(fabric, self._shape)
            if count >= self._shape.nodes:
                key = (leftover, fabric)
                bisect.insort(self._sorted, key)
                self._keys[fabric] = key
        self._dirty.clear()
        return self._sorted
