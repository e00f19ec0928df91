"""The greedy placer this project had before whole-set placement, kept as the benchmarks'
baseline (`benchmarks/placement.py`): one replica at a time in creation order, the fabric with
the fewest replicas of the deployment, then the tightest fit, then the name; inside it, the
tightest nodes by name. Bookkeeping only as far as the benchmark needs it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from llmgw_twin.control.model import EngineName, FabricId, NodeId, NodeInfo, Profile
from llmgw_twin.control.placement import Placement, Unplaceable


@dataclass(slots=True)
class _NodeCapacity:
    info: NodeInfo
    free: list[int]
    booked: set[int] = field(default_factory=set)


class GreedyIndex:
    def __init__(self) -> None:
        self._nodes: dict[NodeId, _NodeCapacity] = {}
        self._buckets: dict[FabricId, dict[int, list[NodeId]]] = {}
        self._max_gpus: dict[FabricId, int] = {}

    def add_node(self, info: NodeInfo) -> None:
        cap = _NodeCapacity(info, list(range(info.gpus)))
        self._nodes[info.node] = cap
        self._buckets.setdefault(info.fabric, {})
        self._max_gpus[info.fabric] = max(self._max_gpus.get(info.fabric, 0), info.gpus)
        self._index(cap)

    def book(self, node: NodeId, gpus: tuple[int, ...]) -> None:
        cap = self._nodes[node]
        self._unindex(cap)
        cap.booked.update(gpus)
        cap.free = [g for g in cap.free if g not in cap.booked]
        self._index(cap)

    def _index(self, cap: _NodeCapacity) -> None:
        if cap.free:
            bucket = self._buckets[cap.info.fabric].setdefault(len(cap.free), [])
            bisect.insort(bucket, cap.info.node)

    def _unindex(self, cap: _NodeCapacity) -> None:
        if not cap.free:
            return
        buckets = self._buckets[cap.info.fabric]
        bucket = buckets[len(cap.free)]
        del bucket[bisect.bisect_left(bucket, cap.info.node)]
        if not bucket:
            del buckets[len(cap.free)]

    def _fits_in(self, fabric: FabricId, profile: Profile) -> list[NodeId]:
        chosen: list[NodeId] = []
        buckets = self._buckets.get(fabric, {})
        for free in range(profile.gpus_per_node, self._max_gpus.get(fabric, 0) + 1):
            for node in buckets.get(free, ()):
                if EngineName(profile.engine) in self._nodes[node].info.engines:
                    chosen.append(node)
                    if len(chosen) == profile.nodes:
                        return chosen
        return chosen

    def place(
        self, profile: Profile, replicas_per_fabric: dict[FabricId, int]
    ) -> Placement | Unplaceable:
        best: tuple[tuple[int, int, str], FabricId, list[NodeId]] | None = None
        for fabric in sorted(self._buckets):
            nodes = self._fits_in(fabric, profile)
            if len(nodes) < profile.nodes:
                continue
            leftover = sum(len(self._nodes[n].free) - profile.gpus_per_node for n in nodes)
            key = (replicas_per_fabric.get(fabric, 0), leftover, str(fabric))
            if best is None or key < best[0]:
                best = (key, fabric, nodes)
        if best is None:
            return Unplaceable("no fabric holds it")
        _, fabric, nodes = best
        gpus = tuple(tuple(self._nodes[n].free[: profile.gpus_per_node]) for n in nodes)
        return Placement(fabric, tuple(nodes), gpus)
