"""A replica's lifecycle in the controller core: create, place, bind, mark ready, fail, reap.

`Lifecycle` is one part of the controller, composed of the parts whose state it changes: the
replica table, the node assignments, the capacity index and the outbox. Every change to where a
replica lives goes with the durable write that records it (`PutSeq` before an id is handed out,
`PutReplica` on bind, `DeleteReplica` on reap), so the store always says where every live
replica is. Every state change goes through `ReplicaRecord.move` (the table in `states.py`).

Placing the pending set and binding each placement is a part of its own (`placer.Placer`,
reached through `place_if_due` and `bind`). Its timers are data, in a part of their own
(`timers.Timers`, a heap the controller's tick drains): each placed replica's start deadline,
each degraded replica's grace, each backed-off replacement's earliest placement. Failures feed
the `FailureBook`, whose back-off, quarantines and not-heard-since nodes shape every later
placement.

Invariants: a failed replica is reaped in the same call (its GPUs freed, its shards dropped from
every node's assignment); a replica leaves the router's view the moment it fails, degrades or
has a shard on a node turned suspect, and rejoins it when whole and heard again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from llmgw_twin.control.durable import DeleteReplica, PutSeq
from llmgw_twin.control.groups import Groups
from llmgw_twin.control.model import (
    Deployment,
    FabricId,
    ModelName,
    NodeId,
    Profile,
    ProfileName,
    ReplicaId,
    ReplicaState,
)
from llmgw_twin.control.moves import DRAIN, Move, Moves, MoveUser
from llmgw_twin.control.parts import Books
from llmgw_twin.control.placement import Placement
from llmgw_twin.control.placer import Placer
from llmgw_twin.control.protocol import RequestReport
from llmgw_twin.control.replicas import ReplicaRecord
from llmgw_twin.control.slices import Slices
from llmgw_twin.control.surplus import retire_order
from llmgw_twin.control.timers import Timers


class Lifecycle:
    def __init__(
        self,
        books: Books,
        moves: Moves,
        node_ok: Callable[[NodeId], bool],
        counts: Callable[[ReplicaRecord], bool],
        draining: Callable[[NodeId], bool],
    ) -> None:
        self.books = books
        self.timings = books.timings
        self.replicas = books.replicas
        self.assignments = books.assignments
        self.capacity = books.capacity
        self.profiles: Mapping[ProfileName, Profile] = books.profiles
        self.deployments: Mapping[ModelName, Deployment] = books.deployments
        self.out = books.out
        self.failures = books.failures
        self.moves = moves
        self.node_ok = node_ok
        """Whether a node is alive and heard (for choosing which replica to retire)."""
        self.counts = counts
        """Whether a live replica counts toward its deployment (`parts.Liveness.counts`)."""
        self.draining = draining
        """The operator is draining this node (`drain.Drainer`): its replicas go first."""
        self.timers = Timers(books, self.fail, self.placement_may_fit)
        """Start deadlines, degraded graces and back-offs, as data; and what each does when due."""
        self.slices = Slices()
        """What one reconcile may create, retire and place (`control/slices.py`)."""
        self.groups = Groups(self)
        """The role groups of deployments with roles (`control/groups.py`)."""
        self.placer = Placer(books, moves, self.timers, self.slices, self.groups)
        """The pending set's placement and each replica's bind (`control/placer.py`)."""

    def reconcile_replica(self, rid: ReplicaId) -> None:
        rec = self.replicas[rid]
        if not rec.state.live or not rec.placed:
            return
        if rec.state is ReplicaState.PLACED and rec.reports:
            rec.move(ReplicaState.STARTING)
        if rec.state in (ReplicaState.PLACED, ReplicaState.STARTING) and rec.whole():
            rec.move(ReplicaState.READY)
            self.replicas.unready.pop(rec.id, None)
            rec.endpoint = rec.reports[0].endpoint
            self.out.emit(
                "replica.ready",
                model=rec.model,
                replica=rec.id,
                fabric=rec.fabric,
                nodes=rec.nodes,
                endpoint=rec.routed_endpoint,
                **rec.tags,
            )
            for move in self.moves.ready(rec):
                self.take_over(rec, move)

    def settle_moves(self, user: MoveUser) -> None:
        """Complete every move of `user` whose copy is ready and routable by now (one whose
        node turned suspect when it became ready waits until it is heard again)."""
        for move in self.moves.in_flight(user):
            rec = self.replicas.get(move.copy)
            if rec is not None and rec.state is ReplicaState.READY:
                done = self.moves.completes(rec, user)
                if done is not None:
                    self.take_over(rec, done)

    def afford_moves(self, originals: list[ReplicaRecord]) -> bool:
        """Whether moves of `originals` may start now within the eviction pace (each takes one
        replica down when its copy serves: the budget of `control/pace.py`, shared with losses
        for silence); if so, they are spent from it."""
        costs: dict[FabricId, int] = {}
        for rec in originals:
            if rec.fabric is not None:
                costs[rec.fabric] = costs.get(rec.fabric, 0) + 1
        return self.books.pace.take(costs, self.out.now_ms)

    def take_over(self, copy: ReplicaRecord, move: Move) -> None:
        """A move's copy is ready and routable: its original is reaped in this step
        (`replica.moved`, then `replica.reaped`), a drain's `drain of NODE` said in both."""
        why = move.why
        extra = {"reason": why} if why else {}
        self.out.emit(
            "replica.moved",
            model=copy.model,
            replica=move.original,
            to=copy.id,
            fabric=copy.fabric,
            nodes=copy.nodes,
            **extra,
        )
        reason = f"moved to {copy.id}" + (f" ({why})" if why else "")
        self.reap(self.replicas[move.original], reason)
        if self.moves.ended(move):
            self.placer.due = True

    def fail(
        self,
        rec: ReplicaRecord,
        reason: str,
        node: NodeId | None,
        crash: bool = False,
        blamed: tuple[NodeId, ...] | None = None,
        reporter: NodeId | None = None,
    ) -> None:
        """Fail a replica that is whole no more, and reap it in the same step. `crash`: the
        engine itself failed (an exit, a missed start deadline, a hung rank), which counts
        toward back-off and, against `blamed` (default: `node`), toward quarantine; a failure
        the infrastructure caused does not."""
        if not rec.state.live:
            return
        if blamed is None:
            blamed = (node,) if node is not None else ()
        started = self.failures.replica_failed(
            rec.model,
            rec.profile.name,
            blamed,
            rec.nodes,
            self.out.now_ms,
            crash,
            reporter,
            replica=rec.id,
        )
        if crash:  # counted toward back-off and quarantine: a successor counts on from here
            for write in self.failures.history(rec.model, rec.profile.name, blamed):
                self.out.write(write)
        for n in rec.nodes if crash else ():
            if n != reporter and self.node_ok(n):
                # is it still there? a replacement avoids it until it answers
                self.out.command(RequestReport(n))
        rec.move(ReplicaState.FAILED)
        rec.endpoint = None
        self.out.emit(
            "replica.failed",
            model=rec.model,
            replica=rec.id,
            fabric=rec.fabric,
            node=node,
            reason=reason,
            **rec.tags,
        )
        self.reap(rec, reason)
        self.timers.announce(started)

    def reap(self, rec: ReplicaRecord, reason: str, scaled_down: bool = False) -> None:
        """Drop the replica's shards from every node's assignment and free its GPUs."""
        rec.move(ReplicaState.REAPED)
        rec.endpoint = None
        self.replicas.reaped(rec)
        for spec in rec.specs:
            self.assignments.drop(spec)
            self.capacity.release(spec.node, spec.gpus)
        if rec.placed:
            self.placer.due = True
            self.out.write(DeleteReplica(rec.id))
        self.out.emit(
            "replica.reaped",
            model=rec.model,
            replica=rec.id,
            fabric=rec.fabric,
            reason=reason,
            **rec.tags,
        )
        broken, freed = self.moves.gone(rec, scaled_down)
        if freed:
            self.placer.due = True
        for b in broken:
            m = b.move
            self.out.emit(
                "replica.move_aborted",
                model=b.model,
                replica=m.original,
                to=m.copy,
                reason=b.reason,
            )
            if b.reap_copy:
                self.reap(self.replicas[m.copy], "scaled down", scaled_down=m.user == DRAIN)

    def reconcile_deployment(self, model: ModelName) -> None:
        dep = self.deployments.get(model)
        if dep is not None and dep.roles:
            self.groups.reconcile(dep)
            return
        want = dep.replicas if dep is not None else 0
        counted = [
            r for r in self.replicas.live(model) if self.counts(r) and not self.moves.is_copy(r.id)
        ]
        while len(counted) < want and dep is not None:
            if not self.slices.may_create(model):
                return
            counted.append(self.new_replica(dep))
        surplus = len(counted) - want
        if surplus <= 0:
            self.slices.retiring.pop(model, None)
            return
        take = self.slices.retirable(model, surplus)
        # retire the least useful one at a time (the order: `surplus.retire_order`); a cut
        # scale-down goes on in the order judged when it started
        planned = self.slices.retiring.pop(model, None)
        order = planned[1] if planned is not None and planned[0] == want else None
        if order is None:
            order = retire_order(
                counted,
                lambda r: (
                    all(self.node_ok(n) for n in r.nodes),
                    r.placed,
                    r.state is ReplicaState.READY,
                    not self.outdated(r),
                    not any(self.draining(n) for n in r.nodes),
                ),
                self.replicas.per_fabric(model),
            )
        if take < surplus:
            self.slices.retiring[model] = (want, order)
        still = {r.id for r in counted}
        while take > 0 and (victim := next(order, None)) is not None:
            if victim.id in still and victim.state.live:
                self.reap(victim, "scaled down", scaled_down=True)
                take -= 1

    def outdated(self, rec: ReplicaRecord) -> bool:
        """`rec` runs another profile than its deployment names now (`rollout.Rollout` replaces
        it)."""
        dep = self.deployments.get(rec.model)
        if dep is None:
            return False
        if rec.role:
            role = dep.role(rec.role)
            return role is not None and rec.profile.name != role.profile
        return rec.profile.name != dep.profile

    def new_replica(self, dep: Deployment, profile: Profile | None = None) -> ReplicaRecord:
        """A new pending replica of `dep` (of `profile`, a role's, if given), in back-off when
        its model failed recently."""
        rec = self.new_record(dep.model, profile or self.profiles[dep.profile])
        now = self.out.now_ms
        delay = self.failures.backoff_ms(dep.model, now)
        if delay > 0:
            rec.not_before_ms = now + delay
            self.timers.arm(rec.not_before_ms, "backoff", rec.id)
            self.out.emit("replica.backoff", model=dep.model, replica=rec.id, delay_ms=delay)
        return rec

    def new_record(self, model: ModelName, profile: Profile) -> ReplicaRecord:
        """A new pending replica of `model`, its id recorded durably first."""
        rid, seq = self.replicas.next_id(model)
        self.out.write(PutSeq(model, seq))
        rec = ReplicaRecord(rid, model, profile, seq, self.out.now_ms)
        self.replicas.add(rec)
        self.placer.due = True  # a new replica is a reason to try placing
        return rec

    # --- placement, a part of its own (`control/placer.py`) -----------------------------------

    def placement_may_fit(self) -> None:
        """Something changed that may let a pending replica fit (capacity, a node heard, a
        quarantine lifted): the next reconcile places the pending set."""
        self.placer.due = True

    def place_if_due(self) -> bool:
        """Place the pending set if a reason to was given (`Placer.place_if_due`)."""
        return self.placer.place_if_due()

    def bind(self, rec: ReplicaRecord, placement: Placement, booked: bool = False) -> None:
        """Give `rec` its place (`Placer.bind`)."""
        self.placer.bind(rec, placement, booked)

    # --- readiness both ways -----------------------------------------------------------------

    def degrade(self, rec: ReplicaRecord, reason: str) -> None:
        """A ready replica's leader stopped answering: out of routing now, failed after the
        grace unless it answers again."""
        rec.move(ReplicaState.DEGRADED)
        rec.degraded_since_ms = self.out.now_ms
        rec.endpoint = None
        grace_end = self.out.now_ms + self.timings.unresponsive_grace_ms
        self.timers.arm(grace_end, "degraded", rec.id)
        self.out.emit("replica.degraded", model=rec.model, replica=rec.id, reason=reason)

    def recover(self, rec: ReplicaRecord, endpoint: str | None) -> None:
        rec.move(ReplicaState.READY)
        rec.endpoint = endpoint
        self.out.emit(
            "replica.recovered",
            model=rec.model,
            replica=rec.id,
            endpoint=rec.routed_endpoint,
            **rec.tags,
        )

    def unroute(self, rec: ReplicaRecord, node: NodeId) -> None:
        """`node` (which holds a shard of `rec`) turned suspect. Said to the routers whatever
        the state a router may hold the replica in: ready, or restored and not judged yet (a
        router that resynced keeps an adopting replica's route until told otherwise)."""
        was = rec.unroutable
        rec.unroutable = was | {node}
        if not was and rec.state in (ReplicaState.READY, ReplicaState.ADOPTING):
            self.out.emit(
                "replica.unroutable", model=rec.model, replica=rec.id, reason=f"node {node} suspect"
            )

    def reroute(self, rec: ReplicaRecord, node: NodeId | None, reason: str) -> None:
        """`node` was heard again (None: every node, as a mass-loss hold keeps routes)."""
        if not rec.unroutable:
            return
        rec.unroutable = frozenset() if node is None else rec.unroutable - {node}
        if not rec.unroutable and rec.state is ReplicaState.READY:
            self.out.emit(
                "replica.routable",
                model=rec.model,
                replica=rec.id,
                endpoint=rec.endpoint,
                reason=reason,
                **rec.tags,
            )
