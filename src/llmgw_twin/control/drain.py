"""Cordon and drain: the operator's word on a node's placement.

A cordoned node takes no new shard (`CapacityIndex.set_cordoned`); what it runs keeps running,
its health is watched as before, and a restart keeps the cordon (`PutCordon`). Draining a node
cordons it and moves each replica with a shard on it, make-before-break: a copy of the same
deployment is created and placed as any pending replica is (so never on a cordoned node); it does
not count toward the deployment while its original lives; once the copy is ready and routable
the original is retired in the same step (`replica.moved`, reason `drain of NODE`), so the
deployment never has fewer ready replicas than before. A copy that fails is replaced by a new
copy after the deployment's back-off (the original keeps serving meanwhile); an original that
fails first leaves its copy as its replacement; one scaled down takes its copy with it. A copy
that cannot be placed waits, pending, with its reason, and the original stays: `explain` tells
why. When nothing is left on the node, `node.drained`; it stays cordoned until uncordoned.
Uncordoning ends the drain: copies not yet placed are retired, placed ones finish their move.
Each move spends one replica from the eviction budget (`pace.EvictionPace`) when it starts; a
move the budget has no room for waits for a later reconcile.

The defragmenter's moves are separate; both are moves of the one move service (`moves.Moves`),
which the lifecycle tells of replicas ready or gone.
"""

from __future__ import annotations

from llmgw_twin.control.durable import DeleteCordon, PutCordon
from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import NodeId, ReplicaId, ReplicaState
from llmgw_twin.control.moves import DRAIN, Move, Moves
from llmgw_twin.control.replicas import ReplicaRecord


class Drainer:
    """Cordoned and draining nodes, and the drain moves in flight (see the module's text)."""

    def __init__(
        self,
        life: Lifecycle,
        moves: Moves,
        draining: dict[NodeId, bool],
    ) -> None:
        self._life = life
        self._moves = moves
        self._draining = draining
        """Node -> drained (announced) yet; shared with the lifecycle, which reads it only."""

    # --- the operator's word -----------------------------------------------------------------

    def cordoned(self) -> frozenset[NodeId]:
        return self._life.capacity.cordoned()

    def draining(self) -> frozenset[NodeId]:
        return frozenset(self._draining)

    def drained(self, node: NodeId) -> bool:
        return self._draining.get(node, False)

    def copy_of(self, rid: ReplicaId) -> ReplicaId | None:
        """The drain copy being made of `rid`, if any."""
        return self._moves.copy_of(rid, DRAIN)

    def cordon(self, node: NodeId) -> bool:
        """Returns whether that is news."""
        if not self._life.capacity.set_cordoned(node, True):
            return False
        self._life.out.write(PutCordon(node, draining=False))
        self._life.out.emit("node.cordoned", node=node)
        return True

    def uncordon(self, node: NodeId) -> bool:
        if not self._life.capacity.set_cordoned(node, False):
            return False
        self._draining.pop(node, None)
        for move in self._moves.in_flight(DRAIN):
            rec = self._life.replicas[move.copy]
            if move.drain == node and not rec.placed:
                self._moves.forget(move)
                self._life.reap(rec, f"drain of {node} ended")
        self._life.out.write(DeleteCordon(node))
        self._life.out.emit("node.uncordoned", node=node)
        self._life.placement_may_fit()
        return True

    def drain(self, node: NodeId) -> bool:
        """Returns whether that is news (a node already draining is not)."""
        if node in self._draining:
            return False
        self._life.capacity.set_cordoned(node, True)
        self._draining[node] = False
        self._life.out.write(PutCordon(node, draining=True))
        self._life.out.emit("node.draining", node=node)
        return True

    def restore(self, cordons: tuple[tuple[NodeId, bool], ...]) -> None:
        for node, draining in cordons:
            self._life.capacity.set_cordoned(node, True)
            if draining:
                self._draining[node] = False

    # --- each tick ---------------------------------------------------------------------------

    def run(self) -> None:
        """Start a copy for each replica on a draining node that has none, complete the moves
        whose copy is ready, and announce a node left empty. Its cost is the replicas on
        draining nodes, not the fleet."""
        if not self._draining:
            return
        self.settle()
        life = self._life
        for node in sorted(self._draining):
            left = [r for r in life.assignments.replicas_on(node) if life.replicas[r].state.live]
            if not left:
                if not self._draining[node]:
                    self._draining[node] = True
                    life.out.emit("node.drained", node=node)
                continue
            self._draining[node] = False
            for rid in sorted(left):
                self._start(life.replicas[rid], node)

    def relink(self) -> None:
        """Before a deployment's count is reconciled: a replica on a draining node with no copy,
        in a deployment that has more replicas than it wants, takes a surplus replica elsewhere
        as its copy (the newest first) rather than have one scaled down. A restarted controller,
        which forgot the moves in flight, adopts both copy and original: this pairs them again,
        so the copy is not stopped as surplus and the original stops once it is ready."""
        life = self._life
        for node in sorted(self._draining):
            for rid in sorted(life.assignments.replicas_on(node)):
                rec = life.replicas[rid]
                if rec.state.live and not self._moves.moving(rec.id):
                    self._pair(rec, node)

    def _pair(self, rec: ReplicaRecord, node: NodeId) -> None:
        life = self._life
        dep = life.deployments.get(rec.model)
        if dep is None or rec.group:  # (a group's surplus member is retired by its group)
            return
        live = life.replicas.live(rec.model)
        counted = [r for r in live if life.counts(r) and not self._moves.is_copy(r.id)]
        if len(counted) <= dep.replicas:
            return
        spare = [
            r
            for r in counted
            if r.id != rec.id
            and not self._moves.moving(r.id)
            and not any(n in self._draining for n in r.nodes)
        ]
        if not spare:
            return
        copy = max(spare, key=lambda r: r.seq)
        self._moves.start(Move(DRAIN, rec.id, copy.id, node))
        life.out.emit("replica.moving", model=rec.model, replica=rec.id, to=copy.id, drain=node)

    def _start(self, rec: ReplicaRecord, node: NodeId) -> None:
        life = self._life
        if self._moves.moving(rec.id) or rec.state is ReplicaState.ADOPTING:
            return  # moving already (or still being adopted after a restart: decided then)
        dep = life.deployments.get(rec.model)
        if dep is None:
            return  # its deployment is going: it is retired anyway
        if not life.afford_moves([rec]):
            return  # past the eviction pace: it moves when the budget has room again
        role = dep.role(rec.role) if rec.group else None
        if role is not None:  # a member's copy joins its group, in the group's fabric
            copy = life.groups.new_member(dep, rec.group, role)
        else:
            copy = life.new_replica(dep)
        self._moves.start(Move(DRAIN, rec.id, copy.id, node))
        life.out.emit("replica.moving", model=rec.model, replica=rec.id, to=copy.id, drain=node)

    def settle(self) -> None:
        """Complete every drain move whose copy is ready and routable by now."""
        self._life.settle_moves(DRAIN)
