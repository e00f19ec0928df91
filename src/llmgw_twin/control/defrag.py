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
at least a heartbeat interval. A plan's moves are spent from the eviction budget
(`pace.EvictionPace`) when they start; a plan the budget has no room for is planned again at a
later reconcile. A controller restart forgets moves in flight: copy and original are
both adopted, and the deployment's surplus is scaled down as usual.
"""

from __future__ import annotations

from collections.abc import Callable

from llmgw_twin.control.defrag_plan import DefragPlan, Movable, plan_moves
from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import ModelName, NodeId, ReplicaId, ReplicaState
from llmgw_twin.control.moves import DEFRAG, Move, Moves
from llmgw_twin.control.passes import gang_order
from llmgw_twin.control.replicas import ReplicaRecord
from llmgw_twin.control.room import Shape

TARGETS_TRIED = 8
"""The most unplaceable replicas (of distinct shapes) one defragmentation tries to make room for."""


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
        moves: Moves,
        node_ok: Callable[[NodeId], bool],
        may_run: Callable[[], bool],
    ) -> None:
        self._life = life
        self._moves = moves
        self._node_ok = node_ok
        self._may_run = may_run
        self._next_ms = 0
        self._stages_left = 0
        """Stages the plan under way still has: they go on without waiting for the interval."""
        self._due = False
        """Something changed that may make a plan possible."""

    def wake(self) -> None:
        """A placement pass ran: a replica it left unplaceable may now be worth a plan."""
        self._due = True

    def in_flight(self) -> dict[ReplicaId, ReplicaId]:
        """Copy -> original, for every move not yet done."""
        return {m.copy: m.original for m in self._moves.in_flight(DEFRAG)}

    def settle(self) -> None:
        """Complete every move whose copy is ready and routable by now (one whose node turned
        suspect when it became ready waits until it is heard again)."""
        self._life.settle_moves(DEFRAG)

    # --- planning ----------------------------------------------------------------------------

    def run(self) -> None:
        """Plan and start one defragmentation, if one is allowed now and a plan exists."""
        life = self._life
        now = life.out.now_ms
        max_moves = life.timings.defrag_max_moves
        if self._moves.take_broken():
            self._stages_left = 0  # a move broke: the plan is void, its later stages with it
        if self._moves.take_readied():
            self._due = True  # one more replica that could be moved
        waiting = now < self._next_ms  # inside the interval: only a plan under way goes on
        if (
            max_moves <= 0
            or self._moves.busy(DEFRAG)
            or not self._due
            or (waiting and not self._stages_left)
        ):
            return
        if not self._may_run():
            return
        self._due = False
        stuck = [
            r
            for rid in life.replicas.pending
            if (r := life.replicas[rid]).unplaceable_reason is not None
            and r.not_before_ms <= now
            and not r.group  # a role group is placed whole, by `groups.py`
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
            if not life.afford_moves([life.replicas[m.replica] for m in plan.moves]):
                blocked = True  # past the eviction pace: planned again when it has room
                continue
            self._start(rec, plan)
            if not waiting:
                self._next_ms = now + life.timings.defrag_interval_ms
            self._stages_left = plan.stages - 1
            return
        self._stages_left = 0
        if blocked:
            self._due = True  # a plan exists: it starts once the interval has passed
            return
        # nothing found: wait for a change, and no sooner than a heartbeat from now
        self._next_ms = max(self._next_ms, now + life.timings.heartbeat_interval_ms)

    def _movable(self) -> list[Movable]:
        life = self._life
        out = []
        # one copy of each deployment's replicas per node, shared by its movables (a copy
        # each, or a set of the crowded nodes each, is quadratic in the deployment's size)
        deployments: dict[ModelName, dict[NodeId, int]] = {}
        for rec in life.replicas.records.values():
            if (
                rec.state is not ReplicaState.READY
                or rec.unroutable
                or rec.fabric is None
                or self._moves.is_original(rec.id, DEFRAG)
                or not all(self._node_ok(n) for n in rec.nodes)
                or not _laid_out_as_profiled(rec)
                or life.outdated(rec)  # the rollout replaces it (`rollout.Rollout`)
                or rec.group  # a role group's member stays in the group's fabric
            ):
                continue
            deployment = deployments.get(rec.model)
            if deployment is None:
                deployment = deployments[rec.model] = dict(life.replicas.per_node(rec.model))
            out.append(
                Movable(
                    rec.id,
                    rec.profile,
                    rec.fabric,
                    tuple((s.node, s.gpus) for s in rec.specs),
                    life.failures.excluded(rec.profile.name),
                    deployment,
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
            self._moves.start(Move(DEFRAG, old.id, copy.id))
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
        self._moves.aim(target.id)
        for node, gpus in zip(plan.target.nodes, plan.target.gpus, strict=True):
            free_now = set(life.capacity.free_gpus(node)).intersection(gpus)
            if free_now:  # nothing else is placed there while the moves run
                self._moves.hold(node, tuple(sorted(free_now)))
