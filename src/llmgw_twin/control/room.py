"""How much room a fabric leaves for the replicas still waiting: gang shapes, their capacity in
a fabric, and the loss a placement would cause to what is pending.

A replica's shape is its engine, its node count and its GPUs per node (`Shape`). A fabric's free
capacity for one shape follows from a histogram of its eligible nodes' free GPU counts alone:
`capacity_of(hist, n, g)` is the most replicas of `n` nodes x `g` GPUs those nodes hold at once,
one shard per node (each node with `v` free GPUs offers `v // g` slots, and a replica needs `n`
of them on distinct nodes). Free counts are small integers, so this costs a few operations
whatever the fabric's size.

`Demand` is one placement pass's view of what is still pending. Placing a replica in a fabric
changes that fabric's histogram; the loss is how many GPUs' worth of still-pending replicas the
whole fleet could then no longer hold. It is only worked out for a fabric when the rest of the
fleet alone could not hold the demand for some shape (`tight`): with room to spare everywhere,
every choice loses nothing and costs nothing to judge.

Invariants: once refreshed, `Demand.total[s]` is the sum over fabrics of their capacity for
`s`; between refreshes a lower bound of it stands in, so `slack` may only err towards judging
losses (never towards missing one); losses are never negative.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from llmgw_twin.control.model import EngineName, FabricId, Profile


class Shape(NamedTuple):
    """A replica's shape as placement weighs it: a named tuple, made for every replica a pass
    considers and a key of the fabric rankings (built, hashed and compared at C speed)."""

    engine: EngineName
    nodes: int
    gpus: int

    @classmethod
    def of(cls, profile: Profile) -> Shape:
        return cls(EngineName(profile.engine), profile.nodes, profile.gpus_per_node)

    @property
    def linked(self) -> bool:
        """A multi-node replica needs every node's fabric link up."""
        return self.nodes > 1

    @property
    def size(self) -> int:
        return self.nodes * self.gpus


def capacity_of(hist: Mapping[int, int], nodes: int, gpus: int) -> int:
    """The most replicas of `nodes` x `gpus` that nodes with these free counts hold at once."""
    slots = [(free // gpus, count) for free, count in hist.items() if free >= gpus and count > 0]
    total = sum(s * c for s, c in slots)
    if nodes == 1:
        return total
    lo, hi = 0, total // nodes
    while lo < hi:  # the largest k with sum(c * min(s, k)) >= k * nodes
        mid = (lo + hi + 1) // 2
        if sum(c * min(s, mid) for s, c in slots) >= mid * nodes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def apply_changes(hist: Mapping[int, int], changes: Sequence[tuple[int, int]]) -> dict[int, int]:
    """The histogram after nodes went from `before` to `after` free GPUs (0: out of it)."""
    out = dict(hist)
    for before, after in changes:
        if out.get(before, 0) <= 0:
            continue  # not one of these nodes (another engine's, or an unlinked one)
        out[before] -= 1
        if after > 0:
            out[after] = out.get(after, 0) + 1
    return out


class CapacityView(Protocol):
    def fabrics(self) -> Sequence[FabricId]: ...

    def hist(self, fabric: FabricId, shape: Shape) -> Mapping[int, int]: ...

    def cap(self, fabric: FabricId, shape: Shape) -> int: ...


class Demand:
    """What one placement pass still has to place, and the fleet's room for it."""

    def __init__(self, view: CapacityView, shapes: Iterable[Shape]) -> None:
        self._view = view
        self.remaining: Counter[Shape] = Counter(shapes)
        self.total: dict[Shape, int] = {}
        self._caps: dict[tuple[FabricId, Shape], int] = {}
        self._most: dict[Shape, int] = {}
        for shape in self.remaining:
            self.total[shape] = 0
            self._most[shape] = 0
            for fabric in view.fabrics():
                c = view.cap(fabric, shape)
                self._caps[fabric, shape] = c
                self.total[shape] += c
                self._most[shape] = max(self._most[shape], c)
        self._lower = dict(self.total)
        """A lower bound of `total`, kept without recomputing any fabric (see `placed`)."""
        self._dirty: set[FabricId] = set()

    def take(self, shape: Shape) -> None:
        """The pass is placing one replica of `shape` now: it is no longer what waits."""
        self.remaining[shape] -= 1

    def placed(self, fabric: FabricId, booked: Shape) -> None:
        """A replica of `booked` was booked in `fabric`. Its capacities are recomputed only when
        needed; meanwhile each shape's total is bounded below: a node that gives up `g` GPUs
        loses at most ceil(g / s.gpus) slots for shape `s`, and a replica needs one at least."""
        self._dirty.add(fabric)
        for shape in self._lower:
            self._lower[shape] -= booked.nodes * -(-booked.gpus // shape.gpus)

    def _refresh(self) -> None:
        for fabric in self._dirty:
            for shape in self.total:
                new = self._view.cap(fabric, shape)
                old = self._caps.get((fabric, shape), 0)
                self._caps[fabric, shape] = new
                self.total[shape] += new - old
        self._dirty.clear()
        self._lower = dict(self.total)

    def _slack(self, total: Mapping[Shape, int]) -> bool:
        return all(
            want <= 0 or total[shape] - self._most[shape] >= want
            for shape, want in self.remaining.items()
        )

    def slack(self) -> bool:
        """No fabric is tight: the rest of the fleet holds every pending shape whichever fabric
        is taken from (capacities only shrink during a pass, so the first largest one bounds
        them all)."""
        if self._slack(self._lower):
            return True
        self._refresh()
        return self._slack(self.total)

    def tight(self, fabric: FabricId) -> bool:
        """Whether some pending shape needs this fabric's room (the rest cannot hold it)."""
        if self._dirty:
            self._refresh()
        for shape, want in self.remaining.items():
            if want > 0 and self.total[shape] - self._caps.get((fabric, shape), 0) < want:
                return True
        return False

    def loss(self, fabric: FabricId, engine: EngineName, changes: Sequence[tuple[int, int]]) -> int:
        """GPUs' worth of pending replicas the fleet could no longer hold if nodes of `fabric`
        (with `engine`) went from `before` to `after` free GPUs."""
        if self._dirty:
            self._refresh()
        lost = 0
        for shape, want in self.remaining.items():
            if want <= 0 or shape.engine != engine:
                continue
            here = self._caps.get((fabric, shape), 0)
            others = self.total[shape] - here
            if others >= want:
                continue
            after = capacity_of(
                apply_changes(self._view.hist(fabric, shape), changes), shape.nodes, shape.gpus
            )
            lost += shape.size * (min(want, others + here) - min(want, others + after))
        return max(lost, 0)
