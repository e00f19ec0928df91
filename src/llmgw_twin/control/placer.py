"""Placing the lifecycle's pending replicas, and binding each placement.

`Placer` is a part of `lifecycle.Lifecycle`, which keeps `placement_may_fit`, `place_if_due`,
`place_pending` and `bind` as its own and hands them here. A reason to place (`due`: a new
replica, GPUs freed, a node heard, a quarantine lifted, a back-off ended) makes the next
reconcile place the pending set, in one pass planned before anything is bound
(`passes.plan_pass`), a slice at a time when the set is large (`control/slices.py`); the
replicas of role groups are placed group by group (`groups.Groups.place`). A replica that fits
nowhere keeps its reason (`replica.unplaceable`, said when it changes).

Invariants: a replica is bound with the durable write that records where it lives
(`PutReplica`); its GPUs are booked once, by the pass that kept its bookings or at the bind;
every bound replica's start deadline is armed (`Timers.watch_start`).
"""

from __future__ import annotations

from llmgw_twin.control.durable import PutReplica, ReplicaRow
from llmgw_twin.control.groups import Groups
from llmgw_twin.control.model import RENDEZVOUS_PORT_BASE, EngineName, ReplicaState, ShardSpec
from llmgw_twin.control.moves import Moves
from llmgw_twin.control.parts import Books
from llmgw_twin.control.passes import plan_pass, whole
from llmgw_twin.control.placement import Placement
from llmgw_twin.control.replicas import ReplicaRecord
from llmgw_twin.control.slices import Slices
from llmgw_twin.control.timers import Timers


class Placer:
    """The pending set's placement and each replica's bind (see the module's text)."""

    def __init__(
        self, books: Books, moves: Moves, timers: Timers, slices: Slices, groups: Groups
    ) -> None:
        self.replicas = books.replicas
        self.assignments = books.assignments
        self.capacity = books.capacity
        self.out = books.out
        self.failures = books.failures
        self.moves = moves
        self.timers = timers
        self.slices = slices
        self.groups = groups
        self.due = False
        """Something changed that may let a pending replica fit (capacity or a new replica)."""

    def place_if_due(self) -> bool:
        """Place the pending set if something changed since the last reconcile that may let a
        replica fit, or go on with a round of slices; returns whether it was tried. A reason is
        spent when a round starts (one given during a round starts another after it)."""
        slices = self.slices
        if not (self.replicas.pending and (self.due or slices.in_round())):
            slices.tried.clear()
            self.due = False
            return False
        if not slices.in_round():
            self.due = False
        self.place_pending()
        return True

    def place_pending(self) -> None:
        """Place the pending set at once (`passes.plan_pass`): the largest replicas first, each
        where it leaves the most room for the rest; model names only break the last ties. A set
        larger than a slice goes a slice a reconcile (`control/slices.py`)."""
        now = self.out.now_ms
        tried = self.slices.tried
        todo = []
        grouped = []
        for rid in self.replicas.pending:
            r = self.replicas[rid]
            if r.group:
                grouped.append(r)  # placed group by group, in and out of back-off alike
            elif r.not_before_ms <= now and rid not in tried:
                todo.append(r)
        self.capacity.stability.advance(now)
        limit = self.slices.placing(len(todo))
        plan = plan_pass(
            self.capacity, todo, self.replicas, self.failures.excluded, limit, keep=True
        )
        if limit is not None:
            tried.update(rec.id for rec, _ in plan)
        booked = whole(plan)  # the pass kept its bookings
        for rec, result in plan:
            if isinstance(result, Placement):
                self.bind(rec, result, booked)
            elif result.reason != rec.unplaceable_reason and not self.moves.making_room_for(rec.id):
                # (while moves make its room, its reason only says the room is held: not news)
                rec.unplaceable_reason = result.reason
                self.out.emit(
                    "replica.unplaceable", model=rec.model, replica=rec.id, reason=result.reason
                )
        if grouped:
            self.groups.place(grouped)

    def bind(self, rec: ReplicaRecord, placement: Placement, booked: bool = False) -> None:
        """Give `rec` its place: shards, assignments, the store's row; its GPUs booked (already,
        with `booked`: a placement pass that kept its whole plan's bookings)."""
        profile = rec.profile
        specs = tuple(
            ShardSpec(
                replica=rec.id,
                model=rec.model,
                profile=profile.name,
                engine=EngineName(profile.engine),
                model_path=profile.model,
                rank=rank,
                shard_count=profile.nodes,
                node=node,
                gpus=gpus,
                leader=placement.nodes[0],
                nodes=placement.nodes,
                rendezvous_port=RENDEZVOUS_PORT_BASE + placement.gpus[0][0],
                rank_ports=tuple(RENDEZVOUS_PORT_BASE + g[0] for g in placement.gpus),
                load_time_ms=profile.load_time_ms,
                args=profile.args,
                role=rec.role,
            )
            for rank, (node, gpus) in enumerate(zip(placement.nodes, placement.gpus, strict=True))
        )
        for spec in specs:
            if not booked:
                self.capacity.book(spec.node, spec.gpus)
            self.assignments.add(spec)
        rec.specs = specs
        rec.fabric = placement.fabric
        rec.move(ReplicaState.PLACED)
        rec.unplaceable_reason = None
        self.replicas.placed(rec)
        self.timers.watch_start(rec)
        self.out.write(
            PutReplica(
                ReplicaRow(
                    rec.id,
                    rec.model,
                    profile.name,
                    rec.seq,
                    rec.created_ms,
                    placement.fabric,
                    rec.shard_count,
                    specs,
                    rec.group,
                )
            )
        )
        self.out.emit(
            "replica.placed",
            model=rec.model,
            replica=rec.id,
            fabric=placement.fabric,
            nodes=placement.nodes,
            **rec.tags,
        )
