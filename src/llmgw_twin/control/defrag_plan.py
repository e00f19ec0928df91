"""Planning a defragmentation, pure over the capacity index (`defrag.Defragmenter` carries a
plan out).

`plan_moves` looks for the fewest moves, at most `defrag_max_moves`. For the unplaceable replica,
fabrics are taken in order of its deployment's replicas there, then name; the candidates to move are
the fabric's movable replicas (ready, on nodes heard alive, in no move) with a shard on a node the
target could use. For each number of moves, each fabric's cheapest set is tried first (per node, the
fewest replicas whose leaving frees the room, largest first; the cheapest nodes), then every set of
that size in a fixed order, smallest replicas first, within a budget (`PLAN_TRIES`). A set works
when

1. with its GPUs freed, the unplaceable replica fits (taking freed GPUs before free ones), and
2. every moved replica's new copy fits in what is free now, less what (1) took: the originals
   keep running until their copies are ready, so a move needs room of its own. A copy that does
   not fit yet may wait for a later stage: once an earlier stage's originals stop, their GPUs
   (less the target's) are room for it. A plan has as many stages as that takes.

A copy goes to its own fabric if it can: a replica's fabric was chosen for its deployment's
spread over failure domains. Only when no plan within fabrics exists may up to
`defrag_moves_across_fabrics` copies go to another fabric, each wholly inside one; 0 keeps every
move at home. No replica ever spans two fabrics, moved or not.

A profile with hard topology rules (`topology.TopologyRules`: `nvlink: same_domain`,
`leaves: same`) is planned for and moved under them: the target's nodes, and each ruled copy's,
are chosen inside one group of the rules (one NVLink domain, one leaf, or both), the group whose
choice takes the most freed GPUs, then the tightest, then by name; the cheapest set is sought
per group. `leaves: fewest` is a preference, not a rule: a plan may use any leaves of the fabric.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from llmgw_twin.control.model import FabricId, NodeId, Profile, ReplicaId
from llmgw_twin.control.placement import CapacityIndex, Placement
from llmgw_twin.control.room import Shape
from llmgw_twin.control.topology import NodeTopology, TopologyRules, group_key

PLAN_TRIES = 2_000
"""The most sets of replicas one defragmentation tries one by one (besides each fabric's
cheapest set, which is always tried)."""


@dataclass(frozen=True, slots=True)
class Movable:
    id: ReplicaId
    profile: Profile
    fabric: FabricId
    gpus: tuple[tuple[NodeId, tuple[int, ...]], ...]
    """Where its shards are: node and GPUs per rank."""
    excluded: frozenset[NodeId]
    """Nodes its profile must not go to (quarantined, not heard since a failure)."""
    deployment: Mapping[NodeId, int] = field(default_factory=dict, hash=False, compare=False)
    """Its deployment's replicas per node, itself included (one mapping shared by all of the
    deployment's replicas): its copy goes where no other one runs, if it can."""

    def crowded(self, node: NodeId, home: frozenset[NodeId]) -> bool:
        """True when `node` holds another replica of its deployment."""
        return self.deployment.get(node, 0) > (node in home)


@dataclass(frozen=True, slots=True)
class Move:
    replica: ReplicaId
    to: Placement
    """Where its new copy goes (its own fabric unless the plan moves it across)."""


@dataclass(frozen=True, slots=True)
class DefragPlan:
    fabric: FabricId
    moves: tuple[Move, ...]
    """The first stage: copies that fit in what is free now."""
    target: Placement
    """Where the unplaceable replica fits once every moved one is stopped."""
    stages: int = 1
    """How many stages the whole plan takes: a later stage's copies go where an earlier
    stage's originals were."""


_Free = dict[NodeId, list[int]]
Group = Callable[[NodeId], str] | None
"""The group of the rules a node is in (every node of a choice in one), None: no rule."""


def grouping(rules: TopologyRules, topology_of: Callable[[NodeId], NodeTopology | None]) -> Group:
    """How `rules` group nodes (`topology.group_key`); None without a hard rule."""
    if rules.nvlink != "same_domain" and rules.leaves != "same":
        return None
    return lambda n: group_key(n, topology_of(n), rules)


def _pick(
    shape: Shape,
    free: _Free,
    nodes: Sequence[NodeId],
    ok: Callable[[NodeId], bool],
    prefer: dict[NodeId, set[int]] | None = None,
    crowded: Callable[[NodeId], bool] = lambda n: False,
    home: frozenset[NodeId] = frozenset(),
    group: Group = None,
) -> list[tuple[NodeId, tuple[int, ...]]] | None:
    """Nodes and GPUs for one replica in `free`: those offering the most `prefer`red GPUs (taken
    before the others), then the tightest; among equals, not a moved replica's own (`home`),
    then not one holding another replica of its deployment (`crowded`), then by name. Under a
    `group`ing, all in one group: the one whose choice ranks best, then by name."""
    want = prefer or {}
    fits = [n for n in nodes if len(free[n]) >= shape.gpus and ok(n)]
    if len(fits) < shape.nodes:
        return None

    def key(n: NodeId) -> tuple[int, int, bool, bool, str]:
        preferred = min(len(want.get(n, set()).intersection(free[n])), shape.gpus)
        return (-preferred, len(free[n]), n in home, crowded(n), n)

    if group is None:
        chosen = sorted(fits, key=key)[: shape.nodes]
    else:
        groups: dict[str, list[NodeId]] = {}
        for n in fits:
            groups.setdefault(group(n), []).append(n)
        best: tuple[tuple[int, int, str], list[NodeId]] | None = None
        for name, members in groups.items():
            if len(members) < shape.nodes:
                continue
            picked = sorted(members, key=key)[: shape.nodes]
            keys = [key(n) for n in picked]
            rank = (sum(k[0] for k in keys), sum(k[1] for k in keys), name)
            if best is None or rank < best[0]:
                best = (rank, picked)
        if best is None:
            return None
        chosen = best[1]
    out = []
    for n in chosen:
        mine = want.get(n, set())
        order = sorted(free[n], key=lambda g: (g not in mine, g))
        out.append((n, tuple(sorted(order[: shape.gpus]))))
    return out


def _without(free: _Free, taken: Sequence[tuple[NodeId, tuple[int, ...]]]) -> None:
    for node, gpus in taken:
        free[node] = [g for g in free[node] if g not in gpus]


def plan_moves(
    index: CapacityIndex,
    target: Profile,
    target_excluded: frozenset[NodeId],
    movable: Sequence[Movable],
    max_moves: int,
    fabric_order: Sequence[FabricId],
    across: int = 0,
    tries: list[int] | None = None,
) -> DefragPlan | None:
    """The fewest moves (at most `max_moves`) that let one replica of `target` fit; None if no
    such set is found within the budget. Moves within their fabric are tried first; then, if
    `across` > 0, sets in which up to `across` copies go to another fabric (each wholly in
    one). `tries` counts sets tried across calls."""
    group = grouping(target.topology, index.topology_of)
    planner = _Planner(index, Shape.of(target), target_excluded, tries or [0], group)
    by_fabric: dict[FabricId, list[Movable]] = {}
    for m in sorted(movable, key=lambda m: (Shape.of(m.profile).size, m.id)):
        by_fabric.setdefault(m.fabric, []).append(m)
    useful = {
        fabric: found
        for fabric in fabric_order
        if (found := planner.useful(fabric, by_fabric.get(fabric, [])))
    }
    cheapest = {fabric: planner.cheapest(fabric, found) for fabric, found in useful.items()}
    for leave in (0, across) if across > 0 else (0,):
        for k in range(1, max_moves + 1):
            # first the cheapest set of each fabric, then every set of k, within the budget
            for fabric in fabric_order:
                combo = cheapest.get(fabric)
                if combo is not None and len(combo) == k:
                    plan = planner.attempt(fabric, combo, fabric_order, leave)
                    if plan is not None:
                        return plan
            for fabric in fabric_order:
                for combo in combinations(useful.get(fabric, ()), k):
                    if planner.tries[0] >= PLAN_TRIES:
                        break
                    planner.tries[0] += 1
                    plan = planner.attempt(fabric, combo, fabric_order, leave)
                    if plan is not None:
                        return plan
    return None


def _freed(moved: Sequence[Movable]) -> dict[NodeId, set[int]]:
    out: dict[NodeId, set[int]] = {}
    for m in moved:
        for node, gpus in m.gpus:
            out.setdefault(node, set()).update(gpus)
    return out


class _Planner:
    """Scratch copies of fabrics' free GPUs, and the tries of one plan."""

    def __init__(
        self,
        index: CapacityIndex,
        shape: Shape,
        excluded: frozenset[NodeId],
        tries: list[int],
        group: Group = None,
    ) -> None:
        self.index = index
        self.shape = shape
        self.excluded = excluded
        self.tries = tries
        self.group = group
        self._fabrics: dict[FabricId, tuple[list[NodeId], _Free]] = {}

    def fabric(self, fabric: FabricId) -> tuple[list[NodeId], _Free]:
        if fabric not in self._fabrics:
            nodes = self.index.nodes_of(fabric)
            self._fabrics[fabric] = (nodes, {n: list(self.index.free_gpus(n)) for n in nodes})
        return self._fabrics[fabric]

    def fits_target(self, node: NodeId) -> bool:
        return node not in self.excluded and self.index.can_run(node, self.shape)

    def useful(self, fabric: FabricId, movable: list[Movable]) -> list[Movable]:
        """The movable replicas of `fabric` on a node the target could use, if moving every one
        of them would make room (else none: no set of them can)."""
        nodes, free = self.fabric(fabric)
        found = [m for m in movable if any(n in free and self.fits_target(n) for n, _ in m.gpus)]
        every = _freed(found)
        after = {n: sorted(set(free[n]) | every.get(n, set())) for n in nodes}
        if not found or _pick(self.shape, after, nodes, self.fits_target, group=self.group) is None:
            return []
        return found

    def cheapest(self, fabric: FabricId, useful: list[Movable]) -> tuple[Movable, ...] | None:
        """The fewest replicas whose leaving frees enough nodes of `fabric` for the target:
        per node, the fewest to evict (largest first), and the cheapest nodes."""
        nodes, free = self.fabric(fabric)
        on: dict[NodeId, list[tuple[int, Movable]]] = {}
        for m in useful:
            for n, gpus in m.gpus:
                on.setdefault(n, []).append((len(gpus), m))
        costs: list[tuple[int, NodeId, list[Movable]]] = []
        for n in nodes:
            if not self.fits_target(n):
                continue
            have, evict = len(free[n]), []
            for size, m in sorted(on.get(n, []), key=lambda e: (-e[0], e[1].id)):
                if have >= self.shape.gpus:
                    break
                evict.append(m)
                have += size
            if have >= self.shape.gpus:
                costs.append((len(evict), n, evict))
        # the cheapest nodes, all in one group of the rules (the cheapest group, then by name)
        by_group: dict[str, list[tuple[int, NodeId, list[Movable]]]] = {}
        for cost in costs:
            by_group.setdefault("" if self.group is None else self.group(cost[1]), []).append(cost)
        best: tuple[tuple[int, str], list[tuple[int, NodeId, list[Movable]]]] | None = None
        for name, found in by_group.items():
            if len(found) < self.shape.nodes:
                continue
            picked = sorted(found, key=lambda c: (c[0], c[1]))[: self.shape.nodes]
            rank = (sum(c[0] for c in picked), name)
            if best is None or rank < best[0]:
                best = (rank, picked)
        if best is None:
            return None
        chosen: dict[ReplicaId, Movable] = {}
        for _, _, evict in best[1]:
            chosen.update((m.id, m) for m in evict)
        return tuple(chosen[r] for r in sorted(chosen)) or None

    def attempt(
        self,
        fabric: FabricId,
        combo: Sequence[Movable],
        fabric_order: Sequence[FabricId],
        leave: int,
    ) -> DefragPlan | None:
        nodes, free = self.fabric(fabric)
        freed = _freed(combo)
        after = {n: sorted(set(free[n]) | freed.get(n, set())) for n in nodes}
        target = _pick(self.shape, after, nodes, self.fits_target, prefer=freed, group=self.group)
        if target is None:
            return None
        by_size = sorted(combo, key=lambda m: (-Shape.of(m.profile).size, m.id))
        for order in (by_size, by_size[::-1]) if len(combo) > 1 else (by_size,):
            plan = self._stages(fabric, free, target, order, fabric_order, leave)
            if plan is not None:
                return plan
        return None

    def _stages(
        self,
        fabric: FabricId,
        free: _Free,
        target: list[tuple[NodeId, tuple[int, ...]]],
        waiting: list[Movable],
        fabric_order: Sequence[FabricId],
        leave: int,
    ) -> DefragPlan | None:
        """The copies of `waiting`, in that order, stage by stage (see the module's text)."""
        # what is free now, less what the target will take of it, per fabric touched
        scratch = {fabric: {n: list(g) for n, g in free.items()}}
        _without(scratch[fabric], target)
        reserved = {n: set(g) for n, g in target}
        stages: list[tuple[Move, ...]] = []
        while waiting:
            stage: list[Move] = []
            moved: list[Movable] = []
            still: list[Movable] = []
            for m in waiting:
                placed = self._place_copy(m, fabric, fabric_order, leave, scratch)
                if placed is None:
                    still.append(m)
                    continue
                leave -= placed.fabric != fabric
                stage.append(Move(m.id, placed))
                moved.append(m)
            if not stage:
                return None
            stages.append(tuple(stage))
            # once this stage's copies are ready its originals stop: their GPUs come free,
            # less those the target is to take
            home = scratch[fabric]
            for m in moved:
                for node, gpus in m.gpus:
                    if node not in home:
                        continue  # a cordoned node: what its shard frees takes no placement
                    kept = reserved.get(node, set())
                    home[node] = sorted({*home[node], *(g for g in gpus if g not in kept)})
            waiting = still
        return DefragPlan(fabric, stages[0], _placement(fabric, target), len(stages))

    def _place_copy(
        self,
        m: Movable,
        fabric: FabricId,
        fabric_order: Sequence[FabricId],
        leave: int,
        scratch: dict[FabricId, _Free],
    ) -> Placement | None:
        """Where `m`'s copy fits in `scratch` (its own fabric first, then, while `leave` allows,
        the others in order), booked there."""
        for where in [fabric, *(f for f in fabric_order if f != fabric and leave > 0)]:
            if where not in scratch:
                there, free_there = self.fabric(where)
                scratch[where] = {n: list(free_there[n]) for n in there}
            got = self._copy_fits(m, where, scratch[where])
            if got is not None:
                _without(scratch[where], got)
                return _placement(where, got)
        return None

    def _copy_fits(
        self, m: Movable, fabric: FabricId, free: _Free
    ) -> list[tuple[NodeId, tuple[int, ...]]] | None:
        own = Shape.of(m.profile)
        nodes, _ = self.fabric(fabric)

        def fits(n: NodeId) -> bool:
            return n not in m.excluded and self.index.can_run(n, own)

        home = frozenset(n for n, _ in m.gpus)
        group = grouping(m.profile.topology, self.index.topology_of)
        return _pick(
            own, free, nodes, fits, crowded=lambda n: m.crowded(n, home), home=home, group=group
        )


def _placement(fabric: FabricId, got: Sequence[tuple[NodeId, tuple[int, ...]]]) -> Placement:
    return Placement(fabric, tuple(n for n, _ in got), tuple(g for _, g in got))
