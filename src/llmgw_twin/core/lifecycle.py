"""A replica's lifecycle in the controller core: create, place, bind, mark ready, fail, reap.

`Lifecycle` is one part of the controller, composed of the parts whose state it changes: the
replica table, the node assignments, the capacity index and the outbox. Every change to where a
replica lives goes with the durable write that records it (`PutSeq` before an id is handed out,
`PutReplica` on bind, `DeleteReplica` on reap), so the store always says where every live
replica is. Every state change goes through `ReplicaRecord.move` (the table in `states.py`).

Invariants: a failed replica is reaped in the same call (its GPUs freed, its shards dropped from
every node's assignment); a replica leaves the router's view the moment it fails.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw_twin.core.assignments import Assignments
from llmgw_twin.core.durable import DeleteReplica, PutReplica, PutSeq, ReplicaRow
from llmgw_twin.core.model import (
    RENDEZVOUS_PORT_BASE,
    Deployment,
    EngineName,
    ModelName,
    NodeId,
    Profile,
    ProfileName,
    ReplicaId,
    ReplicaState,
    ShardSpec,
)
from llmgw_twin.core.outbox import Outbox
from llmgw_twin.core.placement import CapacityIndex, Placement
from llmgw_twin.core.replicas import ReplicaRecord, ReplicaTable


class Lifecycle:
    def __init__(
        self,
        replicas: ReplicaTable,
        assignments: Assignments,
        capacity: CapacityIndex,
        profiles: Mapping[ProfileName, Profile],
        deployments: Mapping[ModelName, Deployment],
        out: Outbox,
    ) -> None:
        self.replicas = replicas
        self.assignments = assignments
        self.capacity = capacity
        self.profiles = profiles
        self.deployments = deployments
        self.out = out
        self.placement_due = False
        """Something changed that may let a pending replica fit (capacity or a new replica)."""

    def reconcile_replica(self, rid: ReplicaId) -> None:
        rec = self.replicas[rid]
        if not rec.state.live or not rec.placed:
            return
        if rec.state is ReplicaState.PLACED and rec.reports:
            rec.move(ReplicaState.STARTING)
        if rec.state is not ReplicaState.READY and rec.whole():
            rec.move(ReplicaState.READY)
            rec.endpoint = rec.reports[0].endpoint
            self.out.emit(
                "replica.ready",
                model=rec.model,
                replica=rec.id,
                fabric=rec.fabric,
                nodes=rec.nodes,
                endpoint=rec.endpoint,
            )

    def fail(self, rec: ReplicaRecord, reason: str, node: NodeId | None) -> None:
        """Fail a replica that is whole no more, and reap it in the same step."""
        if not rec.state.live:
            return
        rec.move(ReplicaState.FAILED)
        rec.endpoint = None
        self.out.emit(
            "replica.failed",
            model=rec.model,
            replica=rec.id,
            fabric=rec.fabric,
            node=node,
            reason=reason,
        )
        self.reap(rec, reason)

    def reap(self, rec: ReplicaRecord, reason: str) -> None:
        """Drop the replica's shards from every node's assignment and free its GPUs."""
        rec.move(ReplicaState.REAPED)
        rec.endpoint = None
        self.replicas.reaped(rec)
        for spec in rec.specs:
            self.assignments.drop(spec)
            self.capacity.release(spec.node, spec.gpus)
        if rec.placed:
            self.placement_due = True
            self.out.write(DeleteReplica(rec.id))
        self.out.emit(
            "replica.reaped", model=rec.model, replica=rec.id, fabric=rec.fabric, reason=reason
        )

    def reconcile_deployment(self, model: ModelName) -> None:
        dep = self.deployments.get(model)
        want = dep.replicas if dep is not None else 0
        while self.replicas.live_count(model) < want and dep is not None:
            self.new_replica(dep)
        while self.replicas.live_count(model) > want:
            # retire the least useful one at a time: unplaced before placed, not ready before
            # ready, then from the fabric holding the most replicas of this model, the newest
            per_fabric = self.replicas.per_fabric(model)
            victim = min(
                self.replicas.live(model),
                key=lambda r: (
                    r.placed,
                    r.state is ReplicaState.READY,
                    -per_fabric.get(r.fabric, 0) if r.fabric is not None else 0,
                    -r.seq,
                ),
            )
            self.reap(victim, "scaled down")

    def new_replica(self, dep: Deployment) -> None:
        rid, seq = self.replicas.next_id(dep.model)
        self.out.write(PutSeq(dep.model, seq))
        rec = ReplicaRecord(rid, dep.model, self.profiles[dep.profile], seq, self.out.now_ms)
        self.replicas.add(rec)
        self.placement_due = True  # a new replica is a reason to try placing

    def place_pending(self) -> None:
        for rid in list(self.replicas.pending):
            rec = self.replicas[rid]
            result = self.capacity.place(rec.profile, self.replicas.per_fabric(rec.model))
            if isinstance(result, Placement):
                self.bind(rec, result)
            elif result.reason != rec.unplaceable_reason:
                rec.unplaceable_reason = result.reason
                self.out.emit(
                    "replica.unplaceable", model=rec.model, replica=rid, reason=result.reason
                )

    def bind(self, rec: ReplicaRecord, placement: Placement) -> None:
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
            )
            for rank, (node, gpus) in enumerate(zip(placement.nodes, placement.gpus, strict=True))
        )
        for spec in specs:
            self.capacity.book(spec.node, spec.gpus)
            self.assignments.add(spec)
        rec.specs = specs
        rec.fabric = placement.fabric
        rec.move(ReplicaState.PLACED)
        rec.unplaceable_reason = None
        self.replicas.placed(rec)
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
                )
            )
        )
        self.out.emit(
            "replica.placed",
            model=rec.model,
            replica=rec.id,
            fabric=placement.fabric,
            nodes=placement.nodes,
        )
