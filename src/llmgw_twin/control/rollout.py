"""Rollout: a deployment whose profile changes has its replicas replaced by replicas of the new
profile, make-before-break, one move at a time per model.

When the operator changes a deployment's profile (`deployment.profile_changed`), every live
replica of the model that runs another profile is outdated (`Lifecycle.outdated`). Each reconcile,
for each model being rolled:

- an outdated replica that serves nothing yet (pending, placed, starting) is reaped at once
  (`profile changed to P`) and the deployment's count brings a replica of the new profile;
- otherwise, while no move of the model is in flight and every replica of the new profile is
  ready, one ready outdated replica (one on a node not heard alive first, then the oldest) gets a
  copy on the new profile (`replica.moving` with `reason: profile changed to P`), placed as any
  pending replica is. The copy does not count toward the deployment while its original lives;
  once it is ready and routable the original is reaped in the same step (`replica.moved`), so the
  deployment never has fewer ready replicas than before;
- a copy the placement found no room for (and that no defragmentation is making room for) ends
  its move if outdated replicas hold the room it needs: the fewest ready outdated replicas of
  one fabric whose GPUs would let it be placed (its original first) are reaped (`profile changed
  to P: no room for a copy`), and the copy, now an ordinary replica of the deployment, takes
  their room. A replica of the new profile left pending for room (a replacement, say) is given
  room the same way (`profile changed to P: no room for R`). Where no such set exists nothing
  is retired for nothing: the copy waits with its reason and the outdated replicas serve on.
  The next move waits until every replica of the new profile is ready, so the rollout never
  has more than one replica of the model down at a time on its account (a wider profile: the
  few whose room one new replica takes);
- when no outdated replica is left, `deployment.rolled_out`.

A copy that fails leaves its original serving and the next reconcile starts a new copy (after
the deployment's back-off: a new profile that cannot start does not take the old one down). An
original that fails first leaves its copy as its replacement. A profile changed again mid-move
reaps a copy that is outdated in turn. Scale-down prefers outdated replicas, and the
defragmenter does not move them. While the mass-loss guard holds, moves whose copy is ready
complete, and nothing else is started or retired. A move, and a retirement for room, spends from
the eviction budget as a drain's move does (`pace.EvictionPace`): past it, it waits.

A restart forgets the moves in flight, but what the rollout needs is in the store: the
deployment's profile and each replica's. The restored controller rolls every model with an
outdated replica; a model with more replicas than it wants pairs a surplus replica of the new
profile (the newest) with an outdated original as its copy (`relink`), so the copy is not
scaled down while it loads and the original goes once it is ready.
"""

from __future__ import annotations

from collections.abc import Callable

from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import ModelName, ProfileName, ReplicaId, ReplicaState
from llmgw_twin.control.moves import ROLLOUT, Move, Moves
from llmgw_twin.control.placement import Placement
from llmgw_twin.control.replicas import ReplicaRecord

NOT_SERVING = (ReplicaState.PENDING, ReplicaState.PLACED, ReplicaState.STARTING)
"""Outdated replicas in these states are reaped without a copy: they serve nothing yet."""


class Rollout:
    """The models being rolled to a new profile, and their moves (see the module's text)."""

    def __init__(self, life: Lifecycle, moves: Moves, may_run: Callable[[], bool]) -> None:
        self._life = life
        self._moves = moves
        self._may_run = may_run
        """False while the mass-loss guard holds: nothing new is started or retired then."""
        self._rolling: set[ModelName] = set()

    def rolling(self) -> frozenset[ModelName]:
        return frozenset(self._rolling)

    def copy_of(self, original: ReplicaId) -> ReplicaId | None:
        """The rollout copy being made of `original`, if any."""
        return self._moves.copy_of(original, ROLLOUT)

    def original_of(self, copy: ReplicaId) -> ReplicaId | None:
        """The replica the rollout copy `copy` is to replace, if it is one."""
        move = next((m for m in self._moves.in_flight(ROLLOUT) if m.copy == copy), None)
        return move.original if move is not None else None

    # --- the operator's word, and a restart --------------------------------------------------

    def changed(self, model: ModelName, old: ProfileName, new: ProfileName) -> None:
        """The deployment of `model` now names `new` (it named `old`): roll it. A move in
        flight whose copy runs another profile than `new` ends, its copy reaped."""
        life = self._life
        life.out.emit("deployment.profile_changed", model=model, profile=new, was=old)
        self._rolling.add(model)
        for move in self._moves_of(model):
            copy = life.replicas[move.copy]
            if copy.profile.name != new:
                self._moves.forget(move)
                life.reap(copy, f"profile changed to {new}")

    def restore(self) -> None:
        """After a restart: roll every model that has an outdated replica."""
        life = self._life
        for rec in life.replicas.records.values():
            if rec.state.live and life.outdated(rec):
                self._rolling.add(rec.model)

    # --- each reconcile ----------------------------------------------------------------------

    def relink(self, models: set[ModelName]) -> None:
        """Before the deployments' counts are reconciled: in a rolled model with more replicas
        than it wants and no move in flight, the newest surplus replica of the new profile
        becomes the copy of an outdated original (a restarted controller forgot the move)."""
        life = self._life
        for model in sorted(self._rolling & models):
            dep = life.deployments.get(model)
            if dep is None or self._moves_of(model):
                continue
            live = life.replicas.live(model)
            counted = [r for r in live if life.counts(r) and not self._moves.is_copy(r.id)]
            if len(counted) <= dep.replicas:
                continue
            free = [r for r in counted if not self._moves.moving(r.id)]
            spare = [r for r in free if not life.outdated(r) and r.placed]
            originals = [r for r in free if life.outdated(r) and r.placed]
            if spare and originals:
                copy = max(spare, key=lambda r: r.seq)
                self._start(min(originals, key=self._order), copy, dep.profile)

    def run(self) -> None:
        """Settle the moves whose copy is ready, then take each rolled model one step on (not
        while the mass-loss guard holds)."""
        if not self._rolling:
            return
        self._life.settle_moves(ROLLOUT)
        if not self._may_run():
            return
        for model in sorted(self._rolling):
            self._step(model)

    def _step(self, model: ModelName) -> None:
        life = self._life
        dep = life.deployments.get(model)
        if dep is None:  # deleted: its replicas are gone with it
            self._rolling.discard(model)
            return
        new = dep.profile
        live = life.replicas.live(model)
        outdated = [r for r in live if life.outdated(r)]
        if not outdated:
            self._rolling.discard(model)
            life.out.emit("deployment.rolled_out", model=model, profile=new)
            return
        moves = self._moves
        # (a copy of another part's move goes too: that part makes a new one, on the new profile)
        idle = [
            r
            for r in outdated
            if r.state in NOT_SERVING and (moves.is_copy(r.id) or not moves.moving(r.id))
        ]
        for rec in idle:
            life.reap(rec, f"profile changed to {new}")
        if idle:
            life.reconcile_deployment(model)  # the new profile takes their place now
            live = life.replicas.live(model)
        free = sorted(
            (r for r in outdated if r.state is ReplicaState.READY and not moves.moving(r.id)),
            key=self._order,
        )
        mine = self._moves_of(model)
        if mine:
            (move,) = mine
            copy = life.replicas[move.copy]
            if self._stuck(copy):  # no room for the copy: outdated replicas give theirs
                room = self._room_for(copy, [life.replicas[move.original], *free])
                if room and life.afford_moves(room):
                    moves.forget(move)  # the copy is an ordinary replica from now
                    for rec in room:
                        life.reap(rec, f"profile changed to {new}: no room for a copy")
            return
        waiting = [
            r
            for r in live
            if not life.outdated(r)
            and r.state is not ReplicaState.READY
            and not moves.is_copy(r.id)  # another part's copy: that part's to wait for
        ]
        stuck = [r for r in waiting if self._stuck(r)]
        if stuck:  # a replica of the new profile found no room: outdated replicas give theirs
            room = self._room_for(stuck[0], free)
            if room and life.afford_moves(room):
                for rec in room:
                    life.reap(rec, f"profile changed to {new}: no room for {stuck[0].id}")
            return
        if waiting:
            return  # a replica of the new profile is on its way: one down at a time
        if free and life.afford_moves(free[:1]):  # (within the eviction pace, `pace.py`)
            self._start(free[0], life.new_replica(dep), new)

    def _stuck(self, rec: ReplicaRecord) -> bool:
        """`rec` is pending, and the last placement found no room for it (and no
        defragmentation is making some)."""
        return (
            not rec.placed
            and rec.unplaceable_reason is not None
            and rec.not_before_ms <= self._life.out.now_ms
            and not self._moves.making_room_for(rec.id)
        )

    def _room_for(self, rec: ReplicaRecord, candidates: list[ReplicaRecord]) -> list[ReplicaRecord]:
        """The fewest of `candidates` (outdated replicas, all in one fabric, taken in the order
        given) whose GPUs, were they free, would let `rec` be placed; none if no such set
        exists, and then nothing is retired for nothing. Tried on the capacity index itself,
        each trial undone."""
        life = self._life
        capacity = life.capacity
        excluded = life.failures.excluded(rec.profile.name)
        per_fabric = life.replicas.per_fabric(rec.model)
        by_fabric: dict[str, list[ReplicaRecord]] = {}
        for cand in candidates:
            if cand.fabric is not None and cand.placed:
                by_fabric.setdefault(cand.fabric, []).append(cand)
        best: list[ReplicaRecord] = []
        for group in by_fabric.values():  # the first candidate's fabric first
            freed: list[ReplicaRecord] = []
            fits = False
            for cand in group:
                if any(set(s.gpus) & set(capacity.failed_gpus(s.node)) for s in cand.specs):
                    continue  # (a failed GPU is not booked again: leave it be)
                for spec in cand.specs:
                    capacity.release(spec.node, spec.gpus)
                freed.append(cand)
                if isinstance(capacity.place(rec.profile, per_fabric, excluded), Placement):
                    fits = True
                    break
            for cand in freed:
                for spec in cand.specs:
                    capacity.book(spec.node, spec.gpus)
            if fits and (not best or len(freed) < len(best)):
                best = freed
        return best

    def _order(self, rec: ReplicaRecord) -> tuple[bool, int]:
        """Outdated replicas are replaced in this order: one on a node not heard alive first,
        then the oldest."""
        return all(self._life.node_ok(n) for n in rec.nodes), rec.seq

    def _start(self, original: ReplicaRecord, copy: ReplicaRecord, profile: ProfileName) -> None:
        self._moves.start(Move(ROLLOUT, original.id, copy.id, profile=profile))
        self._life.out.emit(
            "replica.moving",
            model=original.model,
            replica=original.id,
            to=copy.id,
            reason=f"profile changed to {profile}",
        )

    def _moves_of(self, model: ModelName) -> list[Move]:
        replicas = self._life.replicas
        return [m for m in self._moves.in_flight(ROLLOUT) if replicas[m.original].model == model]
