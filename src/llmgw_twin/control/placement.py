"""Fabric-aware placement: a replica's shards go one per node, all in one fabric, never two.

`CapacityIndex` places on its capacity book (`capacity.py`: per fabric, the schedulable nodes
bucketed by free GPU count, each bucket a name-sorted list, and a histogram of free counts per
fabric and engine, separately for nodes whose fabric link is up). Placing one replica of `n`
nodes x `g` GPUs:

1. Every fabric's fit is read from its histogram (cached per fabric version): whether `n`
   eligible nodes have `g` free GPUs, and the free GPUs the tightest such nodes would leave.
2. Fabrics are ranked by the room the placement would take from what is still pending
   (`room.Demand`: only judged where it matters), then by the live replicas of the same
   deployment already there (a fabric is a failure domain), then the tightest fit, then the
   name.
3. Inside the chosen fabric, nodes are taken one at a time: least room lost, then fewest
   replicas of the same deployment on the node, then the tightest fit, then the least recent
   instability (`stability.py`: losses, reboots, unheard spells, decaying), then the name.
   The fabric ranking does not read instability: it only breaks ties between nodes.

A profile with topology rules (an NVLink domain, one leaf, the fewest leaves) is placed by
`topoplace.place_by_topology` instead; a profile without is placed exactly as above.

Invariant: a placement's nodes are all in its fabric, each can run the profile's engine (linked
to the fabric when the replica spans nodes) and has the GPUs it is given free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import filterfalse

from llmgw_twin.control.capacity import CapacityBook
from llmgw_twin.control.fits import FitRanking
from llmgw_twin.control.model import FabricId, NodeId, Profile
from llmgw_twin.control.room import Demand, Shape
from llmgw_twin.control.topoplace import GroupCache, place_by_topology

REASON_FABRICS = 6
"""An unplaceable reason names at most this many fabrics (the closest to fitting): its text
must not grow, or change, with the size of the fleet."""


@dataclass(frozen=True, slots=True)
class Placement:
    fabric: FabricId
    nodes: tuple[NodeId, ...]  # by rank: nodes[0] runs the leader
    gpus: tuple[tuple[int, ...], ...]  # GPU indices per rank


@dataclass(frozen=True, slots=True)
class Unplaceable:
    reason: str


class CapacityIndex(CapacityBook):
    """The capacity book, and one fabric-aware placement on it (the module's text)."""

    def __init__(self) -> None:
        super().__init__()
        self._groups = GroupCache()
        """The eligible groups of each fabric for ruled profiles (`topoplace.py`)."""

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
        only: FabricId | None = None,
    ) -> Placement | Unplaceable:
        """Choose a fabric and nodes for one replica of `profile`, on none of `excluded` (and,
        for a multi-node replica, on no node whose fabric link is down); books nothing.
        `replicas_per_fabric` and `per_node` count the deployment's live replicas (for spread; a
        node holding none is absent from `per_node`, not counted 0);
        `demand` is what the pass still has to place after this one (for room); `only`: in that
        fabric alone (a role group's, `groups.py`)."""
        shape = Shape.of(profile)
        spread = per_node or {}
        if profile.topology.constrained:
            found = place_by_topology(
                self, profile, replicas_per_fabric, excluded, spread, demand, self._groups, only
            )
            if isinstance(found, str):
                return Unplaceable(found)
            return self._placement(found[0], found[1], shape)
        if not excluded and only is None and (demand is None or demand.slack()):
            # room is not scarce: no choice loses any, and the ranking answers at once
            fast = self._best_ranked(shape, replicas_per_fabric)
            if fast is not None:
                nodes = self._choose(fast, shape, excluded, spread, None)
                if nodes is not None:
                    return self._placement(fast, nodes, shape)
        touched = {f for n in excluded if (f := self.fabric_of(n)) is not None}
        ranked: list[tuple[int, int, int, FabricId]] = []
        short: list[tuple[int, FabricId]] = []
        for fabric in self._fabrics if only is None else [f for f in self._fabrics if f == only]:
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
            best: tuple[int, int, int, float, NodeId] | None = None
            for v in values:
                found = self._first_in(buckets.get(v, ()), shape, excluded, chosen, spread)
                if found is None:
                    continue
                same, risk, node = found
                loss = 0
                if tight and demand is not None:
                    loss = demand.loss(fabric, shape.engine, [*changes, (v, v - shape.gpus)])
                key = (loss, same, v, risk, node)
                if best is None or key < best:
                    best = key
            if best is None:
                return None
            chosen.append(best[4])
            changes.append((best[2], best[2] - shape.gpus))
        return chosen

    def _first_in(
        self,
        bucket: Sequence[NodeId],
        shape: Shape,
        excluded: frozenset[NodeId],
        chosen: list[NodeId],
        spread: Mapping[NodeId, int],
    ) -> tuple[int, float, NodeId] | None:
        """The eligible node of a bucket holding the fewest replicas of the deployment, then
        the least unstable (`stability.py`), then the first by name: (replicas of the deployment
        on it, instability, node). `spread` counts at least one a node it names.

        The nodes holding none come first, picked out at C speed (a deployment on most nodes
        leaves few), and the first of them with no instability is the answer. When every
        eligible node holds some, the bucket is scanned in name order, where a later node wins
        only on fewer replicas or less instability: one holding one and no instability ends it."""
        risk = self.stability.risk
        best: tuple[int, float, NodeId] | None = None
        for node in filterfalse(spread.__contains__, bucket):
            if node in excluded or node in chosen or not self.can_run(node, shape):
                continue
            unstable = risk.get(node, 0.0)
            if unstable == 0.0:
                return (0, 0.0, node)
            if best is None or unstable < best[1]:
                best = (0, unstable, node)
        if best is not None:
            return best
        for node in bucket:
            same = spread.get(node, 0)
            if same == 0 or node in excluded or node in chosen:
                continue  # (one holding none is not eligible: seen above)
            if best is not None and (same > best[0] or (same == best[0] and best[1] == 0.0)):
                continue  # (instability is never below 0.0)
            if not self.can_run(node, shape):
                continue
            unstable = risk.get(node, 0.0)
            if best is None or (same, unstable) < best[:2]:
                if same == 1 and unstable == 0.0:
                    return (1, 0.0, node)
                best = (same, unstable, node)
        return best


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
