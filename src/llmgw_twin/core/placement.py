"""Fabric-aware placement: a replica's shards go one per node, all in one fabric, never two.

`CapacityIndex` keeps, per fabric, the schedulable nodes bucketed by free GPU count, each bucket
a name-sorted list. Placing a replica that needs `n` nodes with `g` GPUs each walks the buckets
from `g` upwards, so the first `n` nodes found are the tightest fits, ties broken by name; no scan
of the fleet. Among the fabrics that can hold the whole replica, the one with the fewest live
replicas of the same deployment wins (a fabric is a failure domain), then the tightest total fit,
then the name.

Invariants: a GPU index is in at most one of a node's free list, its booked set and its failed
set; only schedulable nodes (registered and alive) appear in the buckets; a node with no free GPU
appears in no bucket.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from llmgw_twin.core.model import EngineName, FabricId, NodeId, NodeInfo, Profile


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
    link_up: bool = True
    """The node's fabric links are up: it may hold a shard of a multi-node replica."""


class CapacityIndex:
    def __init__(self) -> None:
        self._nodes: dict[NodeId, _NodeCapacity] = {}
        # fabric -> free GPU count -> name-sorted nodes
        self._buckets: dict[FabricId, dict[int, list[NodeId]]] = {}
        self._max_gpus: dict[FabricId, int] = {}

    # --- bookkeeping -------------------------------------------------------------------------

    def add_node(self, info: NodeInfo) -> None:
        """Register a node (or re-register it with new facts); it starts unschedulable."""
        old = self._nodes.get(info.node)
        if old is not None:
            self._unindex(old)
        free = [g for g in range(info.gpus) if old is None or g not in old.failed]
        cap = _NodeCapacity(info, free)
        if old is not None:
            cap.failed = set(old.failed)
            cap.booked = {g for g in old.booked if g < info.gpus}
            cap.free = [g for g in free if g not in cap.booked]
        self._nodes[info.node] = cap
        self._buckets.setdefault(info.fabric, {})
        self._max_gpus[info.fabric] = max(self._max_gpus.get(info.fabric, 0), info.gpus)

    def remove_node(self, node: NodeId) -> None:
        cap = self._nodes.pop(node, None)
        if cap is not None:
            self._unindex(cap)

    def has_node(self, node: NodeId) -> bool:
        return node in self._nodes

    def set_schedulable(self, node: NodeId, schedulable: bool) -> None:
        cap = self._nodes[node]
        if cap.schedulable == schedulable:
            return
        if cap.schedulable:
            self._unindex(cap)
        cap.schedulable = schedulable
        if schedulable:
            self._index(cap)

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
        cap.link_up = up
        return True

    def link_up(self, node: NodeId) -> bool:
        cap = self._nodes.get(node)
        return cap is None or cap.link_up

    def free_gpus(self, node: NodeId) -> tuple[int, ...]:
        return tuple(self._nodes[node].free)

    def booked_gpus(self, node: NodeId) -> tuple[int, ...]:
        return tuple(sorted(self._nodes[node].booked))

    def _index(self, cap: _NodeCapacity) -> None:
        if cap.schedulable and cap.free:
            bucket = self._buckets[cap.info.fabric].setdefault(len(cap.free), [])
            bisect.insort(bucket, cap.info.node)

    def _unindex(self, cap: _NodeCapacity) -> None:
        if not (cap.schedulable and cap.free):
            return
        buckets = self._buckets[cap.info.fabric]
        bucket = buckets[len(cap.free)]
        del bucket[bisect.bisect_left(bucket, cap.info.node)]
        if not bucket:
            del buckets[len(cap.free)]

    # --- placement ---------------------------------------------------------------------------

    def _fits_in(
        self, fabric: FabricId, profile: Profile, excluded: frozenset[NodeId]
    ) -> list[NodeId]:
        """The tightest-fitting nodes of `fabric` for one replica, up to `profile.nodes` of them."""
        chosen: list[NodeId] = []
        buckets = self._buckets.get(fabric, {})
        needs_link = profile.nodes > 1
        for free in range(profile.gpus_per_node, self._max_gpus.get(fabric, 0) + 1):
            for node in buckets.get(free, ()):
                cap = self._nodes[node]
                if node in excluded or (needs_link and not cap.link_up):
                    continue
                if EngineName(profile.engine) in cap.info.engines:
                    chosen.append(node)
                    if len(chosen) == profile.nodes:
                        return chosen
        return chosen

    def place(
        self,
        profile: Profile,
        replicas_per_fabric: dict[FabricId, int],
        excluded: frozenset[NodeId] = frozenset(),
    ) -> Placement | Unplaceable:
        """Choose a fabric and nodes for one replica of `profile`, on none of `excluded` (and,
        for a multi-node replica, on no node whose fabric link is down); books nothing."""
        best: tuple[tuple[int, int, str], FabricId, list[NodeId]] | None = None
        shortfall: list[str] = []
        for fabric in sorted(self._buckets):
            nodes = self._fits_in(fabric, profile, excluded)
            if len(nodes) < profile.nodes:
                shortfall.append(f"{fabric} has {len(nodes)}")
                continue
            leftover = sum(len(self._nodes[n].free) - profile.gpus_per_node for n in nodes)
            key = (replicas_per_fabric.get(fabric, 0), leftover, str(fabric))
            if best is None or key < best[0]:
                best = (key, fabric, nodes)
        if best is None:
            where = "; ".join(shortfall) if shortfall else "no fabric has a schedulable node"
            return Unplaceable(
                f"needs {profile.nodes} node(s) with {profile.gpus_per_node} free GPU(s) and "
                f"engine {profile.engine} in one fabric: {where}"
            )
        _, fabric, nodes = best
        gpus = tuple(tuple(self._nodes[n].free[: profile.gpus_per_node]) for n in nodes)
        return Placement(fabric, tuple(nodes), gpus)
