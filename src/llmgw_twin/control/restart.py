"""A restarted controller's way back: restore from its store, then adopt what the agents report.

`Restart` is one part of the controller core (`Controller.start` restores through it, and each
reconcile judges the restored replicas through it). `restore` loads what the store holds into
the controller's books: desired state, the node registry with each node's silence, failed GPUs,
quarantines, failure history, cordons, and every live replica where it was placed, booked and
assigned as it was, in state `adopting`. `adopt` decides each adopting replica once every node
it was placed on has been heard since the start: one whose every shard is reported present is
adopted (ready again if whole, no engine restarted), one short of a shard is failed and reaped,
one on a node found lost is failed.

Invariants: a known node's silence is counted from the last time a controller heard it (the
store keeps that), never from the restart; a restored node is not schedulable until heard from;
a restored replica is never ready before it is adopted; every GPU a restored replica holds is
booked before anything is placed.
"""

from __future__ import annotations

from llmgw_twin.control.drain import Drainer
from llmgw_twin.control.durable import DurableState, PutSilence
from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import NodeState, ReplicaState
from llmgw_twin.control.nodes import NodeRegistry
from llmgw_twin.control.parts import Books
from llmgw_twin.control.replicas import ReplicaRecord
from llmgw_twin.control.rollout import Rollout


class Restart:
    """Restore and adoption (see the module's text), with the counts `controller.started`
    reports."""

    def __init__(
        self,
        books: Books,
        fleet: NodeRegistry,
        life: Lifecycle,
        drain: Drainer,
        rollout: Rollout,
    ) -> None:
        self.timings = books.timings
        self._capacity = books.capacity
        self._out = books.out
        self._replicas = books.replicas
        self._assignments = books.assignments
        self._profiles = books.profiles
        self._deployments = books.deployments
        self._failures = books.failures
        self._fleet = fleet
        self._life = life
        self._drain = drain
        self._rollout = rollout
        self.restored_count = 0
        """Replicas the store held at the start."""
        self.adopted_count = 0
        """Restored replicas adopted so far."""

    def restore(self, state: DurableState, now_ms: int) -> None:
        self._profiles.update({p.name: p for p in state.profiles})
        for dep in state.deployments:
            self._deployments[dep.model] = dep
            self._replicas.track_model(dep.model)
        self._replicas.seqs.update(state.seqs)
        silent = dict(state.silent)
        # silence is counted from the last time a controller heard the node (or, if it was not
        # marked silent, from the last time a controller ran): restarts never reset it
        clock = min(state.clock_ms, now_ms) if state.clock_ms > 0 else now_ms
        seen = {n.node: min(silent.get(n.node, clock), now_ms) for n in state.nodes}
        for info in state.nodes:
            self._fleet.infos[info.node] = info
            self._capacity.add_node(info)  # not schedulable until heard from
            self._assignments.track(info.node)
        lost_after = self.timings.node_lost_after_ms
        placed_on = {spec.node for row in state.replicas for spec in row.specs}
        for node in sorted(seen, key=lambda n: (seen[n], n)):
            # silent past the lost window while a controller still ran: declared lost then
            # (a node that still holds a replica was not: its loss was held or paced, since
            # the step declaring a loss deletes every replica on the node)
            was_lost = (
                node in silent and clock - silent[node] >= lost_after and node not in placed_on
            )
            self._fleet.health.restore(node, seen[node], was_lost)
            if silent.get(node) != seen[node]:
                self._out.write(PutSilence(node, seen[node]))
            self._fleet.silence_marked.add(node)
        for node, gpu in state.failed_gpus:
            if self._capacity.has_node(node):
                self._capacity.fail_gpu(node, gpu)
        self._failures.restore(state.quarantines)
        self._failures.restore_history(state.model_failures, state.node_failures)
        self._drain.restore(state.cordons)
        for row in state.replicas:
            profile = self._profiles[row.profile]
            rec = ReplicaRecord(row.id, row.model, profile, row.seq, row.created_ms)
            rec.state, rec.fabric, rec.specs = ReplicaState.ADOPTING, row.fabric, row.specs
            rec.layout_shards = row.shard_count
            rec.group, rec.role = row.group, row.specs[0].role if row.specs else ""
            self._replicas.add(rec)
            for spec in row.specs:
                self._capacity.book(spec.node, spec.gpus)
                self._assignments.restore(spec)
        self.restored_count = len(state.replicas)
        self._rollout.restore()

    # --- adoption ----------------------------------------------------------------------------

    def adopt(self) -> None:
        """Decide each restored replica whose nodes have all spoken (the tick's step)."""
        for rid in sorted(self._replicas.adopting):
            if rid in self._replicas.adopting:  # a failure earlier in this pass may have reaped it
                self.try_adopt(self._replicas[rid])

    def try_adopt(self, rec: ReplicaRecord) -> None:
        """Decide a restored replica once every node it was placed on has spoken."""
        adopting = self._replicas.adopting
        if not rec.state.live:
            adopting.discard(rec.id)
            return
        lost = [s.node for s in rec.specs if self._fleet.health.state(s.node) is NodeState.LOST]
        if lost:
            self._life.fail(rec, f"node {lost[0]} lost", lost[0])
            return
        if any(spec.node not in self._fleet.heard_nodes for spec in rec.specs):
            return  # wait: an unheard node is declared lost after its silence, failing this
        adopting.discard(rec.id)
        missing = [s for s in rec.specs if s.rank not in rec.reports]
        if missing or len(rec.specs) != rec.shard_count:
            where = ", ".join(f"{s.rank} on {s.node}" for s in missing)
            node = missing[0].node if missing else None
            self._life.fail(rec, f"short of shard {where} after restart", node)
            return
        ready = rec.whole()
        rec.move(ReplicaState.READY if ready else ReplicaState.STARTING)
        rec.endpoint = rec.reports[0].endpoint if ready else None
        if not ready:
            self._life.timers.watch_start(rec)
        self._replicas.dirty_models.add(rec.model)  # counted again, if it was not
        self.adopted_count += 1
        self._out.emit(
            "replica.adopted",
            model=rec.model,
            replica=rec.id,
            fabric=rec.fabric,
            nodes=rec.nodes,
            ready=ready,
            endpoint=rec.routed_endpoint,
            **rec.tags,
        )
