"""The capacity book placement reads: per node its free, booked and failed GPUs, whether it is
schedulable (registered and alive), cordoned, and linked to its fabric; per fabric the nodes
bucketed by free GPU count and a histogram of free counts per engine (separately for nodes whose
fabric link is up), each kept up to date as GPUs are booked, released or fail.

Invariants: a GPU index is in at most one of a node's free list, its booked set and its failed
set; only schedulable nodes (registered, alive, not cordoned) appear in the buckets and
histograms; a node with no free GPU appears in neither.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw_twin.control.fits import FitRanking
from llmgw_twin.control.model import EngineName, FabricId, NodeId, NodeInfo
from llmgw_twin.control.room import Shape, capacity_of
from llmgw_twin.control.stability import Stability
from llmgw_twin.control.topology import NodeTopology

_Key = tuple[FabricId, EngineName, bool]


@dataclass(slots=True)
class NodeCapacity:
    info: NodeInfo
    free: list[int]  # sorted GPU indices
    booked: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    schedulable: bool = False
    cordoned: bool = False
    """The operator took the node out of placement (`cordon`): it keeps what it runs."""
    link_up: bool = True
    """The node's fabric links are up: it may hold a shard of a multi-node replica."""


class CapacityBook:
    """Per fabric, the schedulable nodes bucketed by free GPU count, the histograms of free
    counts per fabric and engine, and each node's free, booked and failed GPUs; `CapacityIndex`
    (placement.py) places on it."""

    def __init__(self) -> None:
        self._nodes: dict[NodeId, NodeCapacity] = {}
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
        self.stability = Stability()
        """Each node's recent instability: placement's last tie-breaker before the name."""

    # --- bookkeeping -------------------------------------------------------------------------

    def add_node(self, info: NodeInfo) -> None:
        """Register a node (or re-register it with new facts); it starts unschedulable."""
        old = self._nodes.get(info.node)
        if old is not None:
            self._unindex(old)
        free = [g for g in range(info.gpus) if old is None or g not in old.failed]
        cap = NodeCapacity(info, free, cordoned=info.node in self._cordoned)
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
        self.stability.forget(node)
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

    def _index(self, cap: NodeCapacity) -> None:
        if cap.schedulable and not cap.cordoned and cap.free:
            fabric, free = cap.info.fabric, len(cap.free)
            bisect.insort(self._buckets[fabric].setdefault(free, []), cap.info.node)
            self._count(cap, free, +1)

    def _unindex(self, cap: NodeCapacity) -> None:
        if not (cap.schedulable and not cap.cordoned and cap.free):
            return
        fabric, free = cap.info.fabric, len(cap.free)
        buckets = self._buckets[fabric]
        bucket = buckets[free]
        del bucket[bisect.bisect_left(bucket, cap.info.node)]
        if not bucket:
            del buckets[free]
        self._count(cap, free, -1)

    def _count(self, cap: NodeCapacity, free: int, delta: int) -> None:
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

    def topology_of(self, node: NodeId) -> NodeTopology | None:
        """Where the node sits below its fabric and beside it, as it registered."""
        cap = self._nodes.get(node)
        return cap.info.topology if cap is not None else None

    def version_of(self, fabric: FabricId) -> int:
        """Bumped whenever a node of `fabric` enters, leaves or changes in the buckets."""
        return self._version.get(fabric, 0)

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
