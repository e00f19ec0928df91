"""The controller core: `handle(event, now)` and `tick(now)` in, commands and trace events out.

Level-triggered, in the manner of a reconcile loop. `handle` records what agents report and what
the operator wants (emitting what it observed: joins, recoveries, shard starts), takes a replica
out of service the moment a report shows it lost a shard (an exit, a shard gone from its node's
report, a shard no longer up), and marks what it touched. `tick` (every reconcile interval)
decides from observed plus desired state: expires silent nodes, fails and reaps every replica
that lost a shard, marks whole replicas ready, creates or retires replicas to meet each
deployment, places pending replicas where a whole replica fits, and tells each touched node its
full shard set. Work is proportional to what changed: dirty sets, never a sweep of the fleet.

Invariants kept: a replica's shards are all in one fabric (placement never returns otherwise);
a GPU is booked for at most one live replica; a replica leaves `ready` the moment the controller
learns it lost a shard; a failed replica is reaped in that same step, its GPUs freed and its
shards dropped from every node's assignment.
"""

from __future__ import annotations

from llmgw_twin.control.health import HealthChange, HealthTracker
from llmgw_twin.control.model import (
    RENDEZVOUS_PORT_BASE,
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    NodeState,
    Profile,
    ProfileName,
    ReplicaId,
    ReplicaState,
    ShardKey,
    ShardReport,
    ShardSpec,
    ShardState,
    Timings,
    TraceEvent,
)
from llmgw_twin.control.placement import CapacityIndex, Placement
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    AssignShards,
    ControllerCommand,
    ControllerEvent,
    Heartbeat,
    NodeRegistered,
    Step,
)
from llmgw_twin.control.replica import ReplicaRecord


class Controller:
    def __init__(self, timings: Timings) -> None:
        self.timings = timings
        self._health = HealthTracker(timings)
        self._capacity = CapacityIndex()
        self._nodes: dict[NodeId, NodeInfo] = {}
        self._profiles: dict[ProfileName, Profile] = {}
        self._deployments: dict[ModelName, Deployment] = {}
        self._replicas: dict[ReplicaId, ReplicaRecord] = {}
        self._by_model: dict[ModelName, dict[ReplicaId, None]] = {}  # live, in creation order
        self._pending: dict[ReplicaId, None] = {}  # creation order
        self._assigned: dict[NodeId, dict[ShardKey, ShardSpec]] = {}
        self._seq: dict[ModelName, int] = {}
        self._per_fabric: dict[ModelName, dict[FabricId, int]] = {}
        self._last_report: dict[NodeId, tuple[ShardReport, ...]] = {}
        """The last full report per node, until its assignment changes."""
        self._out_of_sync: set[NodeId] = set()
        """Nodes whose last report did not match their assignment."""
        # what the next tick must look at
        self._dirty_replicas: set[ReplicaId] = set()
        self._dirty_models: set[ModelName] = set()
        self._dirty_nodes: set[NodeId] = set()
        self._capacity_changed = False
        self._events: list[TraceEvent] = []
        self._now = 0

    # --- read-only views (for shells, the router and the twin's checkers) ---------------------

    def node_state(self, node: NodeId) -> NodeState | None:
        return self._health.state(node)

    def node_info(self, node: NodeId) -> NodeInfo | None:
        return self._nodes.get(node)

    def nodes(self) -> list[NodeId]:
        return sorted(self._nodes)

    def replica(self, rid: ReplicaId) -> ReplicaRecord | None:
        return self._replicas.get(rid)

    def replicas(self) -> list[ReplicaRecord]:
        return [self._replicas[r] for r in sorted(self._replicas)]

    def live_replicas(self, model: ModelName) -> list[ReplicaRecord]:
        return [self._replicas[r] for r in self._by_model.get(model, {})]

    def ready_replicas(self, model: ModelName) -> list[ReplicaRecord]:
        return [r for r in self.live_replicas(model) if r.state is ReplicaState.READY]

    def assigned(self, node: NodeId) -> tuple[ShardSpec, ...]:
        return tuple(self._assigned.get(node, {})[k] for k in sorted(self._assigned.get(node, {})))

    def replicas_on(self, node: NodeId) -> list[ReplicaId]:
        return sorted({k.replica for k in self._assigned.get(node, {})})

    def deployments(self) -> list[Deployment]:
        return [self._deployments[m] for m in sorted(self._deployments)]

    # --- inputs ------------------------------------------------------------------------------

    def handle(self, event: ControllerEvent, now_ms: int) -> Step:
        self._now = now_ms
        match event:
            case NodeRegistered(info=info, shards=shards):
                self._register(info, now_ms)
                self._observe(info.node, shards)
            case Heartbeat(node=node, shards=shards):
                if node not in self._nodes:
                    return Step()  # not registered: its registration will follow
                self._heard(self._health.seen(node, now_ms))
                self._observe(node, shards)
            case ApplyProfile(profile=profile):
                self._profiles[profile.name] = profile
            case ApplyDeployment(deployment=dep):
                if dep.profile not in self._profiles:
                    raise ValueError(f"deployment {dep.model}: unknown profile {dep.profile}")
                self._deployments[dep.model] = dep
                self._by_model.setdefault(dep.model, {})
                self._dirty_models.add(dep.model)
        return self._flush(commands=())

    def start(self, now_ms: int) -> Step:
        """The controller process came up; the first reconcile is one interval later, which
        gives agents that interval to register before anything is judged unplaceable."""
        self._now = now_ms
        self._emit("controller.started", adopted=0)
        return self._flush((), wake_at_ms=now_ms + self.timings.reconcile_interval_ms)

    def tick(self, now_ms: int) -> Step:
        """One reconcile pass over what changed since the last one."""
        self._now = now_ms
        for change in self._health.expire(now_ms):
            self._heard(change)
        for rid in sorted(self._dirty_replicas):
            self._reconcile_replica(rid)
        self._dirty_replicas.clear()
        for model in sorted(self._dirty_models):
            self._reconcile_deployment(model)
        self._dirty_models.clear()
        if self._pending and self._capacity_changed:
            self._place_pending()
        self._capacity_changed = False
        commands: list[ControllerCommand] = []
        for node in sorted(self._dirty_nodes):
            if self._health.state(node) in (NodeState.ALIVE, NodeState.SUSPECT):
                commands.append(AssignShards(node, self.assigned(node)))
        self._dirty_nodes.clear()
        return self._flush(tuple(commands), wake_at_ms=now_ms + self.timings.reconcile_interval_ms)

    def _flush(
        self, commands: tuple[ControllerCommand, ...], wake_at_ms: int | None = None
    ) -> Step:
        events, self._events = tuple(self._events), []
        return Step(commands, events, wake_at_ms)

    def _emit(self, kind: str, **subjects: object) -> None:
        self._events.append(TraceEvent.of(self._now, kind, **subjects))

    # --- nodes -------------------------------------------------------------------------------

    def _register(self, info: NodeInfo, now_ms: int) -> None:
        self._nodes[info.node] = info
        self._last_report.pop(info.node, None)  # a new agent: judge its report afresh
        self._capacity.add_node(info)
        self._assigned.setdefault(info.node, {})
        self._health.seen(info.node, now_ms)
        self._emit("node.joined", node=info.node, fabric=info.fabric)
        self._capacity.set_schedulable(info.node, True)
        self._capacity_changed = True
        self._dirty_nodes.add(info.node)

    def _heard(self, change: HealthChange | None) -> None:
        """Act on a node's health changing."""
        if change is None or change.before is None:
            return
        node, fabric = change.node, self._nodes[change.node].fabric
        match change.after:
            case NodeState.ALIVE:
                self._emit("node.recovered", node=node, fabric=fabric)
                self._capacity.set_schedulable(node, True)
                self._capacity_changed = True
                self._dirty_nodes.add(node)
            case NodeState.SUSPECT:
                self._emit("node.suspect", node=node, fabric=fabric)
                self._capacity.set_schedulable(node, False)
            case NodeState.LOST:
                self._emit("node.lost", node=node, fabric=fabric)
                self._capacity.set_schedulable(node, False)
                for rid in self.replicas_on(node):
                    self._fail(self._replicas[rid], f"node {node} lost", node)

    def _observe(self, node: NodeId, shards: tuple[ShardReport, ...]) -> None:
        """Record a node's full report: every shard it runs, and by omission what it does not.

        A report equal to the last one, against an unchanged assignment, changes nothing: the
        usual heartbeat costs one comparison."""
        if self._last_report.get(node) == shards:
            if node in self._out_of_sync:
                self._dirty_nodes.add(node)
            return
        self._last_report[node] = shards
        self._out_of_sync.discard(node)
        reported: set[ShardKey] = set()
        for report in shards:
            key = report.spec.key
            reported.add(key)
            rec = self._replicas.get(key.replica)
            if rec is None or not rec.state.live or not rec.placed:
                self._dirty_nodes.add(node)  # an orphan: the next assignment drops it
                continue
            if rec.specs[key.rank].node != node:
                self._dirty_nodes.add(node)
                continue
            self._record_report(rec, key.rank, report)
        wanted = self._assigned.get(node, {})
        if set(wanted) != reported:
            self._dirty_nodes.add(node)
            self._out_of_sync.add(node)
        for key in sorted(wanted):
            rec = self._replicas[key.replica]
            if rec.state.live and key not in reported and key.rank in rec.reports:
                # it ran here and is gone without an exit report: the agent lost it
                self._fail(rec, f"shard {key.rank} vanished from {node}", node)

    def _record_report(self, rec: ReplicaRecord, rank: int, report: ShardReport) -> None:
        before = rec.reports.get(rank)
        rec.reports[rank] = report
        if before is not None and before.state is report.state:
            return
        spec = rec.specs[rank]
        if report.state is ShardState.EXITED:
            # whole no more: out of service in this very step, not at the next tick
            reason = f"shard {rank} exited with code {report.exit_code} on {spec.node}"
            self._fail(rec, reason, spec.node)
            return
        up = ShardState.SERVING if rank == 0 else ShardState.RUNNING
        if rec.state is ReplicaState.READY and report.state is not up:
            self._fail(rec, f"shard {rank} on {spec.node} went {report.state.value}", spec.node)
            return
        if report.state is ShardState.STARTING:
            self._emit(
                "shard.started",
                node=spec.node,
                model=rec.model,
                replica=rec.id,
                rank=rank,
                argv=report.argv,
            )
        elif report.state is ShardState.SERVING:
            self._emit("shard.serving", node=spec.node, model=rec.model, replica=rec.id, rank=rank)
        self._dirty_replicas.add(rec.id)

    # --- replicas ----------------------------------------------------------------------------

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
        for spec in rec.specs:
            self._assigned[spec.node].pop(spec.key, None)
            self._last_report.pop(spec.node, None)
            self._capacity.release(spec.node, spec.gpus)
            self._dirty_nodes.add(spec.node)
        if rec.placed:
            self._capacity_changed = True
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
            # retire the least useful one at a time: not ready before ready, then from the
            # fabric holding the most replicas of this model, then the newest
            per_fabric = self._replicas_per_fabric(model)
            victim = min(
                (self._replicas[r] for r in live),
                key=lambda r: (
                    r.state is ReplicaState.READY,
                    -per_fabric.get(r.fabric, 0) if r.fabric is not None else 0,
                    -r.seq,
                ),
            )
            self._reap(victim, "scaled down")

    def _new_replica(self, dep: Deployment) -> None:
        seq = self._seq.get(dep.model, 0) + 1
        self._seq[dep.model] = seq
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
        self._emit(
            "replica.placed",
            model=rec.model,
            replica=rec.id,
            fabric=placement.fabric,
            nodes=placement.nodes,
        )
