"""Fabric-aware placement: a replica's shards go one per node, all in one fabric, never two.

`CapacityIndex` keeps, per fabric, the schedulable nodes bucketed by free GPU count, each bucket
a name-sorted list, and a histogram of free counts per fabric and engine (separately for nodes
whose fabric link is up). Placing one replica of `n` nodes x `g` GPUs:

1. Every fabric's fit is read from its histogram (cached per fabric version): whether `n`
   eligible nodes have `g` free GPUs, and the free GPUs the tightest such nodes would leave.
2. Fabrics are ranked by the room the placement would take from what is still pending
   (`room.Demand`: only judged where it matters), then by the live replicas of the same
   deployment already there (a fabric is a failure domain), then the tightest fit, then the
   name.
3. Inside the chosen fabric, nodes are taken one at a time: least room lost, then fewest
   replicas of the same deployment on the node, then the tightest fit, then the name.

Invariants: a GPU index is in at most one of a node's free list, its booked set and its failed
set; only schedulable nodes (registered, alive, not cordoned) appear in the buckets and
histograms; a node
with no free GPU appears in neither.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw_twin.core.fits import FitRanking
from llmgw_twin.core.model import EngineName, FabricId, NodeId, NodeInfo, Profile
from llmgw_twin.core.room import Demand, Shape, capacity_of

REASON_FABRICS = 6
"""An unplaceable reason names at most this many fabrics (the closest to fitting): its text
must not grow, or change, with the size of the fleet."""

_Key = tuple[FabricId, EngineName, bool]


@dataclass(frozen=True, slots=True)
class Placement:
    fabric: FabricId
    nodes: tuple[NodeId, ...]  # by rank: nodes[0] runs the leader
    gpus: tuple[tuple[int, ...], ...]  # GPU indices per rank


@dataclass(frozen=True, slots=True)
class Unplaceable:
    reason: str


@dataclass(slots=True)
class _NodeCapacity:
    info: NodeInfo
    free: list[int]  # sorted GPU indices
    booked: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    schedulable: bool = False
    cordoned: bool = False
    """The operator took the node out of placement (`cordon`): it keeps what it runs."""
    link_up: bool = True
    """The node's fabric links are up: it may hold a shard of a multi-node replica."""


class CapacityIndex:
    def __init__(self) -> None:
        self._nodes: dict[NodeId, _NodeCapacity] = {}
        # fabric -> free GPU count -> name-sorted nodes
        self._buckets: dict[FabricId, dict[int, list[NodeId]]] = {}
        self._fabrics: list[FabricId] = []  # sorted
        self._members: dict[FabricId, set[NodeId]] = {}
        # (fabric, engine, linked only) -> free GPU count -> nodes
        self._hist: dict[_Key, dict[int, int]] = {}
        self._version: dict[FabricId, int] = {}
        self._caps: dict[tuple[FabricId, Shape], tuple[int, int]] = {}
        self._fits: dict[tuple[FabricId, Shape], tuple[int, int, int, tuple[int, ...]]] = {}
        self._rankings: dict[Shape, FitRanking] = {}
        self._cordoned: set[NodeId] = set()  # kept across a node's forgetting and return

    # --- bookkeeping -------------------------------------------------------------------------

    def add_node(self, info: NodeInfo) -> None:
        """Register a node (or re-register it with new facts); it starts unschedulable."""
        old = self._nodes.get(info.node)
        if old is not None:
            self._unindex(old)
        free = [g for g in range(info.gpus) if old is None or g not in old.failed]
        cap = _NodeCapacity(info, free, cordoned=info.node in self._cordoned)
        if old is not None:
            cap.failed = {g for g in old.failed if g < info.gpus}
            cap.booked = {g for g in old.booked if g < info.gpus}
            cap.free = [g for g in free if g not in cap.booked]
            cap.link_up = old.link_up
            self._members[old.info.fabric].discard(info.node)
        self._nodes[info.node] = cap
        self._members.setdefault(info.fabric, set()).add(info.node)
        if info.fabric not in self._buckets:
            self._buckets[info.fabric] = {}
            bisect.insort(self._fabrics, info.fabric)
            self._version[info.fabric] = 0
            for ranking in self._rankings.values():
                ranking.touch(info.fabric)

    def remove_node(self, node: NodeId) -> None:
        cap = self._nodes.pop(node, None)
        if cap is not None:
            self._unindex(cap)
            self._members[cap.info.fabric].discard(node)

    def has_node(self, node: NodeId) -> bool:
        return node in self._nodes

    def set_schedulable(self, node: NodeId, schedulable: bool) -> None:
        cap = self._nodes[node]
        if cap.schedulable == schedulable:
            return
        self._unindex(cap)
        cap.schedulable = schedulable
        self._index(cap)

    def set_cordoned(self, node: NodeId, cordoned: bool) -> bool:
        """Take a node out of placement, or put it back; returns whether that is news. A node
        not registered (yet, or any more) is cordoned when it comes."""
        if (node in self._cordoned) == cordoned:
            return False
        if cordoned:
            self._cordoned.add(node)
        else:
            self._cordoned.discard(node)
        cap = self._nodes.get(node)
        if cap is not None:
            self._unindex(cap)
            cap.cordoned = cordoned
            self._index(cap)
        return True

    def cordoned(self) -> frozenset[NodeId]:
        return frozenset(self._cordoned)

    def book(self, node: NodeId, gpus: tuple[int, ...]) -> None:
        cap = self._nodes[node]
        for g in gpus:
            if g in cap.booked or g in cap.failed or g >= cap.info.gpus:
                raise ValueError(f"GPU {g} of {node} is not free")
        self._unindex(cap)
        cap.booked.update(gpus)
        cap.free = [g for g in cap.free if g not in cap.booked]
        self._index(cap)

    def release(self, node: NodeId, gpus: tuple[int, ...]) -> None:
        cap = self._nodes.get(node)
        if cap is None:
            return
        self._unindex(cap)
        for g in gpus:
            if g in cap.booked:
                cap.booked.discard(g)
                if g not in cap.failed:
                    bisect.insort(cap.free, g)
        self._index(cap)

    def fail_gpu(self, node: NodeId, gpu: int) -> bool:
        """A failed GPU is never offered again (its booking, if any, is released by the caller).
        Returns whether this is news."""
        cap = self._nodes[node]
        if gpu in cap.failed or not 0 <= gpu < cap.info.gpus:
            return False
        self._unindex(cap)
        cap.failed.add(gpu)
        cap.free = [g for g in cap.free if g != gpu]
        self._index(cap)
        return True

    def clear_failed_gpu(self, node: NodeId, gpu: int) -> bool:
        """An operator cleared a failed GPU: it is offered again. Returns whether it was failed."""
        cap = self._nodes.get(node)
        if cap is None or gpu not in cap.failed:
            return False
        self._unindex(cap)
        cap.failed.discard(gpu)
        if gpu not in cap.booked and gpu < cap.info.gpus:
            bisect.insort(cap.free, gpu)
        self._index(cap)
        return True

    def failed_gpus(self, node: NodeId) -> tuple[int, ...]:
        cap = self._nodes.get(node)
        return tuple(sorted(cap.failed)) if cap is not None else ()

    def set_link_up(self, node: NodeId, up: bool) -> bool:
        """Record the node's fabric link state; returns whether it changed."""
        cap = self._nodes[node]
        if cap.link_up == up:
            return False
        self._unindex(cap)
        cap.link_up = up
        self._index(cap)
        return True

    def link_up(self, node: NodeId) -> bool:
        cap = self._nodes.get(node)
        return cap is None or cap.link_up

    def free_gpus(self, node: NodeId) -> tuple[int, ...]:
        return tuple(self._nodes[node].free)

    def booked_gpus(self, node: NodeId) -> tuple[int, ...]:
        return tuple(sorted(self._nodes[node].booked))

    def _index(self, cap: _NodeCapacity) -> None:
        if cap.schedulable and not cap.cordoned and cap.free:
            fabric, free = cap.info.fabric, len(cap.free)
            bisect.insort(self._buckets[fabric].setdefault(free, []), cap.info.node)
            self._count(cap, free, +1)

    def _unindex(self, cap: _NodeCapacity) -> None:
        if not (cap.schedulable and not cap.cordoned and cap.free):
            return
        fabric, free = cap.info.fabric, len(cap.free)
        buckets = self._buckets[fabric]
        bucket = buckets[free]
        del bucket[bisect.bisect_left(bucket, cap.info.node)]
        if not bucket:
            del buckets[free]
        self._count(cap, free, -1)

    def _count(self, cap: _NodeCapacity, free: int, delta: int) -> None:
        fabric = cap.info.fabric
        self._version[fabric] += 1
        for ranking in self._rankings.values():
            ranking.touch(fabric)
        for engine in cap.info.engines:
            for linked in (False, True) if cap.link_up else (False,):
                hist = self._hist.setdefault((fabric, engine, linked), {})
                left = hist.get(free, 0) + delta
                if left:
                    hist[free] = left
                else:
                    del hist[free]

    # --- views for planning ------------------------------------------------------------------

    def fabrics(self) -> Sequence[FabricId]:
        return self._fabrics

    def hist(self, fabric: FabricId, shape: Shape) -> Mapping[int, int]:
        """Free GPU count -> how many schedulable nodes of `fabric` that can run `shape` have it."""
        return self._hist.get((fabric, shape.engine, shape.linked), {})

    def cap(self, fabric: FabricId, shape: Shape) -> int:
        """How many replicas of `shape` fit in `fabric`'s free GPUs now."""
        version = self._version.get(fabric, 0)
        cached = self._caps.get((fabric, shape))
        if cached is not None and cached[0] == version:
            return cached[1]
        value = capacity_of(self.hist(fabric, shape), shape.nodes, shape.gpus)
        self._caps[fabric, shape] = (version, value)
        return value

    def nodes_of(self, fabric: FabricId) -> list[NodeId]:
        """The schedulable (and not cordoned) nodes of `fabric`, by name."""
        members = self._members.get(fabric, ())
        return sorted(n for n in members if (c := self._nodes[n]).schedulable and not c.cordoned)

    def fabric_of(self, node: NodeId) -> FabricId | None:
        cap = self._nodes.get(node)
        return cap.info.fabric if cap is not None else None

    def can_run(self, node: NodeId, shape: Shape) -> bool:
        """Schedulable, onboarded with the engine, linked if the shape needs it (free GPUs
        aside)."""
        cap = self._nodes.get(node)
        return (
            cap is not None
            and cap.schedulable
            and not cap.cordoned
            and shape.engine in cap.info.engines
            and (cap.link_up or not shape.linked)
        )

    # --- placement ---------------------------------------------------------------------------

    def _fit(self, fabric: FabricId, shape: Shape) -> tuple[int, int, tuple[int, ...]]:
        """From the histogram: how many eligible nodes have `shape.gpus` free, the free GPUs the
        tightest `shape.nodes` of them would keep, and their free counts (tightest first)."""
        version = self._version[fabric]
        cached = self._fits.get((fabric, shape))
        if cached is not None and cached[0] == version:
            return cached[1], cached[2], cached[3]
        hist = self.hist(fabric, shape)
        values = sorted(v for v in hist if v >= shape.gpus)
        count = sum(hist[v] for v in values)
        tightest: list[int] = []
        for v in values:
            tightest.extend([v] * min(hist[v], shape.nodes - len(tightest)))
            if len(tightest) == shape.nodes:
                break
        leftover = sum(v - shape.gpus for v in tightest)
        self._fits[fabric, shape] = (version, count, leftover, tuple(tightest))
        return count, leftover, tuple(tightest)

    def _eligible_count(
        self, fabric: FabricId, shape: Shape, excluded: frozenset[NodeId]
    ) -> tuple[int, int, tuple[int, ...]]:
        """`_fit` for a fabric holding excluded nodes: counted node by node."""
        frees = sorted(
            free
            for n in self.nodes_of(fabric)
            if n not in excluded
            and self.can_run(n, shape)
            and (free := len(self._nodes[n].free)) >= shape.gpus
        )
        tightest = tuple(frees[: shape.nodes])
        return len(frees), sum(v - shape.gpus for v in tightest), tightest

    def place(
        self,
        profile: Profile,
        replicas_per_fabric: Mapping[FabricId, int],
        excluded: frozenset[NodeId] = frozenset(),
        per_node: Mapping[NodeId, int] | None = None,
        demand: Demand | None = None,
    ) -> Placement | Unplaceable:
        """Choose a fabric and nodes for one replica of `profile`, on none of `excluded` (and,
        for a multi-node replica, on no node whose fabric link is down); books nothing.
        `replicas_per_fabric` and `per_node` count the deployment's live replicas (for spread);
        `demand` is what the pass still has to place after this one (for room)."""
        shape = Shape.of(profile)
        spread = per_node or {}
        if not excluded and (demand is None or demand.slack()):
            # room is not scarce: no choice loses any, and the ranking answers at once
            fast = self._best_ranked(shape, replicas_per_fabric)
            if fast is not None:
                nodes = self._choose(fast, shape, excluded, spread, None)
                if nodes is not None:
                    return self._placement(fast, nodes, shape)
        touched = {f for n in excluded if (f := self.fabric_of(n)) is not None}
        ranked: list[tuple[int, int, int, FabricId]] = []
        short: list[tuple[int, FabricId]] = []
        for fabric in self._fabrics:
            if fabric in touched:
                count, leftover, tightest = self._eligible_count(fabric, shape, excluded)
            else:
                count, leftover, tightest = self._fit(fabric, shape)
            if count < shape.nodes:
                short.append((count, fabric))
                continue
            loss = 0
            if demand is not None and demand.tight(fabric):
                changes = [(v, v - shape.gpus) for v in tightest]
                loss = demand.loss(fabric, shape.engine, changes)
            ranked.append((loss, replicas_per_fabric.get(fabric, 0), leftover, fabric))
        ranked.sort()
        for *_, fabric in ranked:
            nodes = self._choose(fabric, shape, excluded, spread, demand)
            if nodes is not None:
                return self._placement(fabric, nodes, shape)
        return Unplaceable(_reason(profile, short))

    def _placement(self, fabric: FabricId, nodes: list[NodeId], shape: Shape) -> Placement:
        """The chosen nodes, each giving its lowest free GPUs."""
        gpus = tuple(tuple(self._nodes[n].free[: shape.gpus]) for n in nodes)
        return Placement(fabric, tuple(nodes), gpus)

    def _best_ranked(
        self, shape: Shape, replicas_per_fabric: Mapping[FabricId, int]
    ) -> FabricId | None:
        """The fabric `place` would rank first when no choice loses room: fewest replicas of the
        deployment, then the tightest fit, then the name."""
        ranking = self._rankings.get(shape)
        if ranking is None:
            ranking = self._rankings[shape] = FitRanking(shape, self._fit, self._fabrics)
        best: tuple[int, int, FabricId] | None = None
        for leftover, fabric in ranking.ranked():
            same = replicas_per_fabric.get(fabric, 0)
            if same == 0:
                return fabric  # nothing ranks before it
            if best is None or (same, leftover, fabric) < best:
                best = (same, leftover, fabric)
        return best[2] if best is not None else None

    def _choose(
        self,
        fabric: FabricId,
        shape: Shape,
        excluded: frozenset[NodeId],
        spread: Mapping[NodeId, int],
        demand: Demand | None,
    ) -> list[NodeId] | None:
        """The nodes of `fabric` for one replica, one at a time (see the module's text)."""
        buckets = self._buckets[fabric]
        values = sorted(v for v in buckets if v >= shape.gpus)
        tight = demand is not None and demand.tight(fabric)
        chosen: list[NodeId] = []
        changes: list[tuple[int, int]] = []
        for _ in range(shape.nodes):
            best: tuple[int, int, int, NodeId] | None = None
            for v in values:
                node, same = self._first_in(buckets.get(v, ()), shape, excluded, chosen, spread)
                if node is None:
                    continue
                loss = 0
                if tight and demand is not None:
                    loss = demand.loss(fabric, shape.engine, [*changes, (v, v - shape.gpus)])
                key = (loss, same, v, node)
                if best is None or key < best:
                    best = key
            if best is None:
                return None
            chosen.append(best[3])
            changes.append((best[2], best[2] - shape.gpus))
        return chosen

    def _first_in(
        self,
        bucket: Sequence[NodeId],
        shape: Shape,
        excluded: frozenset[NodeId],
        chosen: list[NodeId],
        spread: Mapping[NodeId, int],
    ) -> tuple[NodeId | None, int]:
        """The first eligible node of a bucket holding the fewest replicas of the deployment."""
        best: NodeId | None = None
        fewest = 0
        for node in bucket:
            if node in excluded or node in chosen or not self.can_run(node, shape):
                continue
            same = spread.get(node, 0)
            if same == 0:
                return node, 0
            if best is None or same < fewest:
                best, fewest = node, same
        return best, fewest


def _reason(profile: Profile, short: list[tuple[int, FabricId]]) -> str:
    need = (
        f"needs {profile.nodes} node(s) with {profile.gpus_per_node} free GPU(s) and "
        f"engine {profile.engine} in one fabric"
    )
    if not short:
        return f"{need}: no fabric has a schedulable node"
    closest = sorted(short, key=lambda s: (-s[0], s[1]))[:REASON_FABRICS]
    where = "; ".join(
        f"{fabric} has {count}" for count, fabric in sorted(closest, key=lambda s: s[1])
    )
    more = len(short) - len(closest)
    if more:
        where += f"; {more} more fabric(s) have fewer"
    return f"{need}: {where}"
