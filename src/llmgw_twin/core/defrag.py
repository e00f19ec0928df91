"""Defragmentation: when a pending replica fits nowhere, but would fit in a fabric if a few of
that fabric's running replicas sat elsewhere, move them there, make-before-break.

Planning (`plan_moves`, pure over the capacity index) looks for the fewest moves, at most
`defrag_max_moves`. For the unplaceable replica, fabrics are taken in order of its deployment's
replicas there, then name; the candidates to move are the fabric's movable replicas (ready, on
nodes heard alive, in no move) with a shard on a node the target could use. For each number of
moves, each fabric's cheapest set is tried first (per node, the fewest replicas whose leaving
frees the room, largest first; the cheapest nodes), then every set of that size in a fixed
order, smallest replicas first, within a budget (`PLAN_TRIES`). A set works when

1. with its GPUs freed, the unplaceable replica fits (taking freed GPUs before free ones), and
2. every moved replica's new copy fits in what is free now, less what (1) took: the originals
   keep running until their copies are ready, so a move needs room of its own. A copy that does
   not fit yet may wait for a later stage: once an earlier stage's originals stop, their GPUs
   (less the target's) are room for it. A plan has as many stages as that takes.

A copy goes to its own fabric if it can: a replica's fabric was chosen for its deployment's
spread over failure domains. Only when no plan within fabrics exists may up to
`defrag_moves_across_fabrics` copies go to another fabric, each wholly inside one; 0 keeps every
move at home. No replica ever spans two fabrics, moved or not.

Execution (`Defragmenter`): the first stage's moves start; each creates a new replica of the same
model (a copy, which does not count toward the deployment while its original lives), bound
where the plan says (`replica.moving`). When a copy is ready, its original is reaped in the same
step (`replica.moved`), so the deployment never has fewer ready replicas than before, and the
freed room is placed in that step too. A copy that fails aborts its move and the original stays;
an original that fails first leaves its copy as its replacement; an original scaled down takes
its copy with it (each `replica.move_aborted`). One defragmentation at a time; the next starts
no sooner than `defrag_interval` after the last one began, except the next stage of the plan
under way (a plan found then with no more stages than were left); none while the mass-loss guard
holds. After a search that found nothing, the next waits for a change (capacity, a pending
replica, a replica ready) and at least a heartbeat interval. A controller restart forgets moves
in flight: copy and original are both adopted, and the deployment's surplus is scaled down as
usual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

from llmgw_twin.core.lifecycle import Lifecycle
from llmgw_twin.core.model import FabricId, NodeId, Profile, ReplicaId, ReplicaState
from llmgw_twin.core.passes import gang_order
from llmgw_twin.core.placement import CapacityIndex, Placement
from llmgw_twin.core.replicas import ReplicaRecord
from llmgw_twin.core.room import Shape

PLAN_TRIES = 2_000
"""The most sets of replicas one defragmentation tries one by one (besides each fabric's
cheapest set, which is always tried)."""

TARGETS_TRIED = 8
"""The most unplaceable replicas (of distinct shapes) one defragmentation tries to make room for."""


@dataclass(frozen=True, slots=True)
class Movable:
    id: ReplicaId
    profile: Profile
    fabric: FabricId
    gpus: tuple[tuple[NodeId, tuple[int, ...]], ...]
    """Where its shards are: node and GPUs per rank."""
    excluded: frozenset[NodeId]
    """Nodes its profile must not go to (quarantined, not heard since a failure)."""
    crowded: frozenset[NodeId] = frozenset()
    """Nodes holding another replica of its deployment: its copy goes elsewhere if it can."""


@dataclass(frozen=True, slots=True)
class Move:
    replica: ReplicaId
    to: Placement
    """Where its new copy goes (in the replica's own fabric)."""


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


def _pick(
    shape: Shape,
    free: _Free,
    nodes: Sequence[NodeId],
    ok: Callable[[NodeId], bool],
    prefer: dict[NodeId, set[int]] | None = None,
    crowded: frozenset[NodeId] = frozenset(),
    home: frozenset[NodeId] = frozenset(),
) -> list[tuple[NodeId, tuple[int, ...]]] | None:
    """Nodes and GPUs for one replica in `free`: those offering the most `prefer`red GPUs (taken
    before the others), then the tightest; among equals, not a moved replica's own (`home`),
    then not one holding another replica of its deployment (`crowded`), then by name."""
    want = prefer or {}
    fits = [n for n in nodes if len(free[n]) >= shape.gpus and ok(n)]
    if len(fits) < shape.nodes:
        return None

    def key(n: NodeId) -> tuple[int, int, bool, bool, str]:
        preferred = min(len(want.get(n, set()).intersection(free[n])), shape.gpus)
        return (-preferred, len(free[n]), n in home, n in crowded, n)

    chosen = sorted(fits, key=key)[: shape.nodes]
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
    planner = _Planner(index, Shape.of(target), target_excluded, tries or [0])
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
    ) -> None:
        self.index = index
        self.shape = shape
        self.excluded = excluded
        self.tries = tries
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
        if not found or _pick(self.shape, after, nodes, self.fits_target) is None:
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
        if len(costs) < self.shape.nodes:
            return None
        chosen: dict[ReplicaId, Movable] = {}
        for _, _, evict in sorted(costs, key=lambda c: (c[0], c[1]))[: self.shape.nodes]:
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
        target = _pick(self.shape, after, nodes, self.fits_target, prefer=freed)
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
            still: list[Movable] = []
            for m in waiting:
                placed = self._place_copy(m, fabric, fabric_order, leave, scratch)
                if placed is None:
                    still.append(m)
                    continue
                leave -= placed.fabric != fabric
                stage.append(Move(m.id, placed))
            if not stage:
                return None
            stages.append(tuple(stage))
            # once this stage's copies are ready its originals stop: their GPUs come free,
            # less those the target is to take
            home = scratch[fabric]
            for m in waiting:
                if m in still:
                    continue
                for node, gpus in m.gpus:
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
        return _pick(own, free, nodes, fits, crowded=m.crowded, home=home)


def _placement(fabric: FabricId, got: Sequence[tuple[NodeId, tuple[int, ...]]]) -> Placement:
    return Placement(fabric, tuple(n for n, _ in got), tuple(g for _, g in got))


def _laid_out_as_profiled(rec: ReplicaRecord) -> bool:
    """A replica restored under a profile edited since it was placed keeps its old layout; its
    copy would be laid out anew, so such a replica is not moved."""
    p = rec.profile
    return rec.shard_count == p.nodes and all(len(s.gpus) == p.gpus_per_node for s in rec.specs)


class Defragmenter:
    """The moves in flight, and when to plan the next (see the module's text)."""

    def __init__(
        self,
        life: Lifecycle,
        node_ok: Callable[[NodeId], bool],
        may_run: Callable[[], bool],
    ) -> None:
        self._life = life
        self._node_ok = node_ok
        self._may_run = may_run
        self._copies: dict[ReplicaId, ReplicaId] = {}  # copy -> original
        self._originals: dict[ReplicaId, ReplicaId] = {}  # original -> copy
        self._next_ms = 0
        self._stages_left = 0
        """Stages the plan under way still has: they go on without waiting for the interval."""
        self.due = False
        """Something changed that may make a plan possible."""
        life.moves = self

    @property
    def in_flight(self) -> dict[ReplicaId, ReplicaId]:
        """Copy -> original, for every move not yet done."""
        return dict(self._copies)

    # --- hooks (`lifecycle.MoveHooks`) -------------------------------------------------------

    def is_copy(self, rid: ReplicaId) -> bool:
        return rid in self._copies

    def ready(self, rec: ReplicaRecord) -> None:
        self.due = True  # one more replica that could be moved
        if rec.id in self._copies:
            self._complete(rec)

    def settle(self) -> None:
        """Complete every move whose copy is ready and routable by now (one whose node turned
        suspect when it became ready waits until it is heard again)."""
        for copy in sorted(self._copies):
            rec = self._life.replicas.get(copy)
            if rec is not None and rec.state is ReplicaState.READY:
                self._complete(rec)

    def _complete(self, rec: ReplicaRecord) -> None:
        """The copy is ready: its original stops now, unless the copy cannot be routed to (a
        node suspect, or not heard alive), which would trade a serving replica for none."""
        if rec.unroutable or not all(self._node_ok(n) for n in rec.nodes):
            return
        original = self._copies.pop(rec.id)
        del self._originals[original]
        old = self._life.replicas[original]
        self._life.out.emit(
            "replica.moved",
            model=rec.model,
            replica=original,
            to=rec.id,
            fabric=rec.fabric,
            nodes=rec.nodes,
        )
        self._life.reap(old, f"moved to {rec.id}")

    def gone(self, rec: ReplicaRecord, scaled_down: bool) -> None:
        original = self._copies.pop(rec.id, None)
        if original is not None:  # the copy never became ready: the original stays
            del self._originals[original]
            self._stages_left = 0
            self._aborted(rec.model, original, rec.id, f"{rec.id} failed before the move was done")
            return
        copy = self._originals.pop(rec.id, None)
        if copy is None:
            return
        del self._copies[copy]
        self._stages_left = 0
        if scaled_down:
            self._aborted(rec.model, rec.id, copy, f"{rec.id} scaled down")
            self._life.reap(self._life.replicas[copy], "scaled down")
        else:  # the original failed first: its copy replaces it
            self._aborted(rec.model, rec.id, copy, f"{rec.id} failed; {copy} replaces it")

    def _aborted(self, model: str, original: ReplicaId, copy: ReplicaId, reason: str) -> None:
        self._life.out.emit(
            "replica.move_aborted", model=model, replica=original, to=copy, reason=reason
        )

    # --- planning ----------------------------------------------------------------------------

    def run(self) -> None:
        """Plan and start one defragmentation, if one is allowed now and a plan exists."""
        life = self._life
        now = life.out.now_ms
        max_moves = life.timings.defrag_max_moves
        waiting = now < self._next_ms  # inside the interval: only a plan under way goes on
        if max_moves <= 0 or self._copies or not self.due or (waiting and not self._stages_left):
            return
        if not self._may_run():
            return
        self.due = False
        stuck = [
            r
            for rid in life.replicas.pending
            if (r := life.replicas[rid]).unplaceable_reason is not None and r.not_before_ms <= now
        ]
        if not stuck:
            self._stages_left = 0
            return
        movable = self._movable()
        blocked = False
        tries = [0]
        seen: set[tuple[Shape, frozenset[NodeId]]] = set()
        for rec in sorted(stuck, key=gang_order):
            excluded = life.failures.excluded(rec.profile.name)
            if (Shape.of(rec.profile), excluded) in seen:
                continue
            seen.add((Shape.of(rec.profile), excluded))
            if len(seen) > TARGETS_TRIED:
                break
            per_fabric = life.replicas.per_fabric(rec.model)
            order = sorted(life.capacity.fabrics(), key=lambda f: (per_fabric.get(f, 0), f))
            plan = plan_moves(
                life.capacity,
                rec.profile,
                excluded,
                movable,
                max_moves,
                order,
                life.timings.defrag_moves_across_fabrics,
                tries,
            )
            if plan is None:
                continue
            if waiting and plan.stages > self._stages_left:
                blocked = True  # not the rest of the plan under way: it waits for the interval
                continue
            self._start(rec, plan)
            if not waiting:
                self._next_ms = now + life.timings.defrag_interval_ms
            self._stages_left = plan.stages - 1
            return
        self._stages_left = 0
        if blocked:
            self.due = True  # a plan exists: it starts once the interval has passed
            return
        # nothing found: wait for a change, and no sooner than a heartbeat from now
        self._next_ms = max(self._next_ms, now + life.timings.heartbeat_interval_ms)

    def _movable(self) -> list[Movable]:
        life = self._life
        out = []
        for rec in life.replicas.records.values():
            if (
                rec.state is not ReplicaState.READY
                or rec.unroutable
                or rec.fabric is None
                or rec.id in self._originals
                or not all(self._node_ok(n) for n in rec.nodes)
                or not _laid_out_as_profiled(rec)
            ):
                continue
            per_node = life.replicas.per_node(rec.model)
            mine = set(rec.nodes)
            crowded = frozenset(n for n, c in per_node.items() if c > (n in mine))
            out.append(
                Movable(
                    rec.id,
                    rec.profile,
                    rec.fabric,
                    tuple((s.node, s.gpus) for s in rec.specs),
                    life.failures.excluded(rec.profile.name),
                    crowded,
                )
            )
        return out

    def _start(self, target: ReplicaRecord, plan: DefragPlan) -> None:
        life = self._life
        shape = Shape.of(target.profile)
        stage = f", stage 1 of {plan.stages}" if plan.stages > 1 else ""
        reason = (
            f"defragmentation: room for {target.id} ({shape.nodes} node(s) x {shape.gpus} "
            f"GPU(s)) on {', '.join(plan.target.nodes)} in {plan.fabric}{stage}"
        )
        for move in plan.moves:
            old = life.replicas[move.replica]
            copy = life.new_record(old.model, old.profile)
            self._copies[copy.id] = old.id
            self._originals[old.id] = copy.id
            life.out.emit(
                "replica.moving",
                model=old.model,
                replica=old.id,
                to=copy.id,
                fabric=move.to.fabric,
                nodes=move.to.nodes,
                reason=reason,
            )
            life.bind(copy, move.to)
