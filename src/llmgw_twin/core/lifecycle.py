"""The replica lifecycle half of the controller core: fail, reap, retire, create, place, bind.

A mixin of `Controller` (control/controller.py), split out to keep each module readable; it
declares the controller state it works on. Every change to where a replica lives goes with the
durable write that records it (`PutReplica` on bind, `DeleteReplica` on reap, `PutSeq` when an
id is handed out), so the store always says where every live replica is.
"""

from __future__ import annotations

from collections import deque

from llmgw_twin.core.durable import DeleteReplica, PutReplica, PutSeq, ReplicaRow, Write
from llmgw_twin.core.model import (
    RENDEZVOUS_PORT_BASE,
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    Profile,
    ProfileName,
    ReplicaId,
    ReplicaState,
    ShardKey,
    ShardReport,
    ShardSpec,
)
from llmgw_twin.core.placement import CapacityIndex, Placement
from llmgw_twin.core.replica import ReplicaRecord

REAPED_KEPT = 1024
"""How many reaped replicas the controller still answers for (the oldest are forgotten first):
a fleet that fails for months must not grow without bound."""


class ReplicaLifecycle:
    # state owned by Controller.__init__
    _reaped: deque[ReplicaId]
    _capacity: CapacityIndex
    _profiles: dict[ProfileName, Profile]
    _deployments: dict[ModelName, Deployment]
    _replicas: dict[ReplicaId, ReplicaRecord]
    _by_model: dict[ModelName, dict[ReplicaId, None]]
    _pending: dict[ReplicaId, None]
    _assigned: dict[NodeId, dict[ShardKey, ShardSpec]]
    _seq: dict[ModelName, int]
    _per_fabric: dict[ModelName, dict[FabricId, int]]
    _last_report: dict[NodeId, tuple[ShardReport, ...]]
    _dirty_models: set[ModelName]
    _dirty_replicas: set[ReplicaId]
    _adopting: set[ReplicaId]
    _dirty_nodes: set[NodeId]
    _capacity_changed: bool
    _writes: list[Write]
    _now: int

    def _emit(self, kind: str, **subjects: object) -> None:
        raise NotImplementedError

    def _reconcile_replica(self, rid: ReplicaId) -> None:
        rec = self._replicas[rid]
        if not rec.state.live or not rec.placed:
            return
        if rec.state is ReplicaState.PLACED and rec.reports:
            rec.state = ReplicaState.STARTING
        if rec.state is not ReplicaState.READY and rec.whole():
            rec.state = ReplicaState.READY
            rec.endpoint = rec.reports[0].endpoint
            self._emit(
                "replica.ready",
                model=rec.model,
                replica=rec.id,
                fabric=rec.fabric,
                nodes=rec.nodes,
            )

    def _fail(self, rec: ReplicaRecord, reason: str, node: NodeId | None) -> None:
        """Fail a replica that is whole no more, and reap it in the same step."""
        if not rec.state.live:
            return
        rec.state = ReplicaState.FAILED
        rec.endpoint = None
        self._emit(
            "replica.failed",
            model=rec.model,
            replica=rec.id,
            fabric=rec.fabric,
            node=node,
            reason=reason,
        )
        self._reap(rec, reason)

    def _reap(self, rec: ReplicaRecord, reason: str) -> None:
        """Drop the replica's shards from every node's assignment and free its GPUs."""
        if rec.fabric is not None and rec.placed:
            self._replicas_per_fabric(rec.model)[rec.fabric] -= 1
        rec.state = ReplicaState.REAPED
        rec.endpoint = None
        self._adopting.discard(rec.id)
        self._dirty_replicas.discard(rec.id)
        self._reaped.append(rec.id)
        if len(self._reaped) > REAPED_KEPT:  # keep recent history, not all of it
            self._replicas.pop(self._reaped.popleft(), None)
        for spec in rec.specs:
            self._assigned[spec.node].pop(spec.key, None)
            self._last_report.pop(spec.node, None)
            self._capacity.release(spec.node, spec.gpus)
            self._dirty_nodes.add(spec.node)
        if rec.placed:
            self._capacity_changed = True
        if rec.placed:
            self._writes.append(DeleteReplica(rec.id))
        self._pending.pop(rec.id, None)
        self._by_model.get(rec.model, {}).pop(rec.id, None)
        self._dirty_models.add(rec.model)
        self._emit(
            "replica.reaped", model=rec.model, replica=rec.id, fabric=rec.fabric, reason=reason
        )

    def _reconcile_deployment(self, model: ModelName) -> None:
        dep = self._deployments.get(model)
        want = dep.replicas if dep is not None else 0
        live = self._by_model.get(model, {})
        while len(live) < want and dep is not None:
            self._new_replica(dep)
        while len(live) > want:
            # retire the least useful one at a time: unplaced before placed, not ready before
            # ready, then from the fabric holding the most replicas of this model, the newest
            per_fabric = self._replicas_per_fabric(model)
            victim = min(
                (self._replicas[r] for r in live),
                key=lambda r: (
                    r.placed,
                    r.state is ReplicaState.READY,
                    -per_fabric.get(r.fabric, 0) if r.fabric is not None else 0,
                    -r.seq,
                ),
            )
            self._reap(victim, "scaled down")

    def _new_replica(self, dep: Deployment) -> None:
        seq = self._seq.get(dep.model, 0) + 1
        self._seq[dep.model] = seq
        self._writes.append(PutSeq(dep.model, seq))
        rid = ReplicaId(f"{dep.model}-r{seq}")
        rec = ReplicaRecord(rid, dep.model, self._profiles[dep.profile], seq, self._now)
        self._replicas[rid] = rec
        self._by_model[dep.model][rid] = None
        self._pending[rid] = None
        self._capacity_changed = True  # a new replica is a reason to try placing

    def _replicas_per_fabric(self, model: ModelName) -> dict[FabricId, int]:
        """Live placed replicas of `model` per fabric (kept up to date by bind and reap)."""
        return self._per_fabric.setdefault(model, {})

    def _place_pending(self) -> None:
        for rid in list(self._pending):
            rec = self._replicas[rid]
            result = self._capacity.place(rec.profile, self._replicas_per_fabric(rec.model))
            if isinstance(result, Placement):
                self._bind(rec, result)
            elif result.reason != rec.unplaceable_reason:
                rec.unplaceable_reason = result.reason
                self._emit(
                    "replica.unplaceable", model=rec.model, replica=rid, reason=result.reason
                )

    def _bind(self, rec: ReplicaRecord, placement: Placement) -> None:
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
            self._capacity.book(spec.node, spec.gpus)
            self._assigned[spec.node][spec.key] = spec
            self._last_report.pop(spec.node, None)
            self._dirty_nodes.add(spec.node)
        rec.specs = specs
        rec.fabric = placement.fabric
        per_fabric = self._replicas_per_fabric(rec.model)
        per_fabric[placement.fabric] = per_fabric.get(placement.fabric, 0) + 1
        rec.state = ReplicaState.PLACED
        rec.unplaceable_reason = None
        del self._pending[rec.id]
        self._writes.append(
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
        self._emit(
            "replica.placed",
            model=rec.model,
            replica=rec.id,
            fabric=placement.fabric,
            nodes=placement.nodes,
        )
