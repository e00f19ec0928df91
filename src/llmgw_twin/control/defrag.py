"""Defragmentation: when a pending replica fits nowhere, but would fit in a fabric if a few of
that fabric's running replicas sat elsewhere, move them there, make-before-break. Planning is
`defrag_plan.plan_moves`.

Execution (`Defragmenter`): the first stage's moves start; each creates a new replica of the same
model (a copy, which does not count toward the deployment while its original lives), bound where the
plan says (`replica.moving`); the GPUs free now that the target is to take are held for it. When a
copy is ready and routable, its original is reaped in the same step (`replica.moved`), so the
deployment never has fewer ready replicas than before, and the held and freed room is placed in that
step too. A copy that fails aborts its move and the original stays; an original that fails first
leaves its copy as its replacement; an original scaled down takes its copy with it (each
`replica.move_aborted`). One defragmentation at a time; the next starts no sooner than
`defrag_interval` after the last one began, except the next stage of the plan under way (a plan
found then with no more stages than were left); none while the mass-loss guard holds. After a search
that found nothing, the next waits for a change (capacity, a pending replica, a replica ready) and
at least a heartbeat interval. A controller restart forgets moves in flight: copy and original are
both adopted, and the deployment's surplus is scaled down as usual.
"""

from __future__ import annotations

from collections.abc import Callable

from llmgw_twin.control.defrag_plan import DefragPlan, Movable, plan_moves
from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import NodeId, ReplicaId, ReplicaState
from llmgw_twin.control.passes import gang_order
from llmgw_twin.control.replicas import ReplicaRecord
from llmgw_twin.control.room import Shape

TARGETS_TRIED = 8
"""The most unplaceable replicas (of distinct shapes) one defragmentation tries to make room for."""


def can_take_over(rec: ReplicaRecord, node_ok: Callable[[NodeId], bool]) -> bool:
    """A move's ready copy may take its original's place only once it can be routed to (no node
    of it suspect, every one heard alive): else the move would trade a serving replica for
    none. The defragmenter's moves and the drainer's alike."""
    return not rec.unroutable and all(node_ok(n) for n in rec.nodes)


def take_over(life: Lifecycle, copy: ReplicaRecord, original: ReplicaId, why: str = "") -> None:
    """The copy is ready: its original is reaped in this step (`replica.moved`, then
    `replica.reaped`), `why` (a drain's `drain of NODE`) said in both when given."""
    extra = {"reason": why} if why else {}
    life.out.emit(
        "replica.moved",
        model=copy.model,
        replica=original,
        to=copy.id,
        fabric=copy.fabric,
        nodes=copy.nodes,
        **extra,
    )
    life.reap(life.replicas[original], f"moved to {copy.id}" + (f" ({why})" if why else ""))


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
        self._held: dict[NodeId, tuple[int, ...]] = {}
        """GPUs free when the moves began that the target is to take: held for it meanwhile."""
        self._target: ReplicaId | None = None
        """The pending replica the moves under way make room for."""
        self._next_ms = 0
        self._stages_left = 0
        """Stages the plan under way still has: they go on without waiting for the interval."""
        self.due = False
        """Something changed that may make a plan possible."""
        life.moves = self

    @property
    def held(self) -> dict[NodeId, tuple[int, ...]]:
        """GPUs held for the target of the moves under way, per node."""
        return dict(self._held)

    @property
    def in_flight(self) -> dict[ReplicaId, ReplicaId]:
        """Copy -> original, for every move not yet done."""
        return dict(self._copies)

    # --- hooks (`lifecycle.MoveHooks`) -------------------------------------------------------

    def is_copy(self, rid: ReplicaId) -> bool:
        return rid in self._copies

    def making_room_for(self, rid: ReplicaId) -> bool:
        return rid == self._target

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
        if not can_take_over(rec, self._node_ok):
            return
        original = self._copies.pop(rec.id)
        del self._originals[original]
        take_over(self._life, rec, original)
        if not self._copies:
            self._release()

    def _release(self) -> None:
        """The moves are over (done or broken): what was held for the target is free again, to
        be placed in this very step."""
        for node, gpus in self._held.items():
            self._life.capacity.release(node, gpus)
        if self._held:
            self._life.placement_due = True
        self._held = {}
        self._target = None

    def gone(self, rec: ReplicaRecord, scaled_down: bool) -> None:
        original = self._copies.pop(rec.id, None)
        if original is not None:  # the copy never became ready: the original stays
            del self._originals[original]
            self._broken()
            self._aborted(rec.model, original, rec.id, f"{rec.id} failed before the move was done")
            return
        copy = self._originals.pop(rec.id, None)
        if copy is None:
            return
        del self._copies[copy]
        self._broken()
        if scaled_down:
            self._aborted(rec.model, rec.id, copy, f"{rec.id} scaled down")
            self._life.reap(self._life.replicas[copy], "scaled down")
        else:  # the original failed first: its copy replaces it
            self._aborted(rec.model, rec.id, copy, f"{rec.id} failed; {copy} replaces it")

    def _broken(self) -> None:
        """A move was aborted: the plan is void, its later stages with it."""
        self._stages_left = 0
        self._release()

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
        self._target = target.id
        for node, gpus in zip(plan.target.nodes, plan.target.gpus, strict=True):
            free_now = set(life.capacity.free_gpus(node)).intersection(gpus)
            if free_now:  # nothing else is placed there while the moves run
                self._held[node] = tuple(sorted(free_now))
                life.capacity.book(node, self._held[node])
