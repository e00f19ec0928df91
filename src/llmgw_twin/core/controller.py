"""The controller core: `handle(event, now)` and `tick(now)` in, commands and trace events out.

Level-triggered, in the manner of a reconcile loop. `handle` records what agents report and what
the operator wants (emitting what it observed: joins, recoveries, shard starts), takes a replica
out of service the moment a report shows it lost a shard (an exit, a shard gone from its node's
report, a shard no longer up), and marks what it touched. `tick` (every reconcile interval)
decides from observed plus desired state: expires silent nodes, fails and reaps every replica
that lost a shard, marks whole replicas ready, creates or retires replicas to meet each
deployment, places pending replicas where a whole replica fits, and tells each touched node its
full shard set. Work is proportional to what changed: dirty sets, never a sweep of the fleet.

A restarted controller starts from its store (`restored`): desired state, node registry and
where each live replica was placed. It asks every known agent to report at once and adopts a
replica whose every shard is reported present (no engine restarted, routable again if it was
serving); a replica short of a shard is failed, reaped and replaced, never ready in between;
shards no replica claims are stopped. A known node counts as alive from the restart, but nothing
is placed on it until it is heard from.

Invariants kept: a replica's shards are all in one fabric (placement never returns otherwise);
a GPU is booked for at most one live replica; a replica leaves `ready` the moment the controller
learns it lost a shard; a failed replica is reaped in that same step, its GPUs freed and its
shards dropped from every node's assignment.
"""

from __future__ import annotations

from collections import deque

from llmgw_twin.core.durable import DurableState, PutDeployment, PutNode, PutProfile, Write
from llmgw_twin.core.health import HealthChange, HealthTracker
from llmgw_twin.core.lifecycle import ReplicaLifecycle
from llmgw_twin.core.model import (
    Deployment,
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
from llmgw_twin.core.placement import CapacityIndex
from llmgw_twin.core.protocol import (
    ApplyDeployment,
    ApplyProfile,
    AssignShards,
    ControllerCommand,
    ControllerEvent,
    Heartbeat,
    NodeRegistered,
    RequestReport,
    Step,
)
from llmgw_twin.core.replica import ReplicaRecord


class Controller(ReplicaLifecycle):
    def __init__(self, timings: Timings, restored: DurableState | None = None) -> None:
        self.timings = timings
        self._restored = restored
        self._health = HealthTracker(timings)
        self._capacity = CapacityIndex()
        self._nodes: dict[NodeId, NodeInfo] = {}
        self._profiles: dict[ProfileName, Profile] = {}
        self._deployments: dict[ModelName, Deployment] = {}
        self._replicas: dict[ReplicaId, ReplicaRecord] = {}
        self._reaped: deque[ReplicaId] = deque()
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
        self._writes: list[Write] = []
        self._incarnations: dict[NodeId, int] = {}
        self._heard_nodes: set[NodeId] = set()
        """Nodes heard from since this controller started: only these are placed on."""
        self._adopting: set[ReplicaId] = set()
        self._started_reported = True  # start() arms the controller.started report
        self._restored_count = 0
        self._adopted_count = 0
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
            case NodeRegistered(info=info, shards=shards, incarnation=incarnation):
                self._register(info, now_ms, incarnation)
                self._gpus_failed(info.node, event.failed_gpus)
                self._observe(info.node, shards)
            case Heartbeat(node=node, shards=shards):
                if node not in self._nodes:
                    # unknown here (registered while this controller was down, say)
                    return Step(commands=(RequestReport(node),))
                self._hear(node, now_ms)
                self._gpus_failed(node, event.failed_gpus)
                self._observe(node, shards)
            case ApplyProfile(profile=profile):
                self._profiles[profile.name] = profile
                self._writes.append(PutProfile(profile))
            case ApplyDeployment(deployment=dep):
                if dep.profile not in self._profiles:
                    raise ValueError(f"deployment {dep.model}: unknown profile {dep.profile}")
                self._deployments[dep.model] = dep
                self._by_model.setdefault(dep.model, {})
                self._dirty_models.add(dep.model)
                self._writes.append(PutDeployment(dep))
        return self._flush(commands=())

    def start(self, now_ms: int) -> Step:
        """The controller process came up. It restores what its store holds, asks every known
        agent to report now, and reconciles first one interval later: agents have that long to
        register or answer before anything is judged unplaceable or short of a shard."""
        self._now = now_ms
        self._started_reported = False
        commands: list[ControllerCommand] = []
        if self._restored is not None:
            self._restore(self._restored, now_ms)
            commands = [RequestReport(n) for n in sorted(self._nodes)]
        return self._flush(tuple(commands), wake_at_ms=now_ms + self.timings.reconcile_interval_ms)

    def _restore(self, state: DurableState, now_ms: int) -> None:
        self._profiles = {p.name: p for p in state.profiles}
        for dep in state.deployments:
            self._deployments[dep.model] = dep
            self._by_model.setdefault(dep.model, {})
            self._dirty_models.add(dep.model)
        self._seq = dict(state.seqs)
        for info in state.nodes:
            self._nodes[info.node] = info
            self._capacity.add_node(info)  # not schedulable until heard from
            self._assigned.setdefault(info.node, {})
            self._health.seen(info.node, now_ms)  # silence is counted from the restart
        for row in state.replicas:
            profile = self._profiles[row.profile]
            rec = ReplicaRecord(row.id, row.model, profile, row.seq, row.created_ms)
            rec.state, rec.fabric, rec.specs = ReplicaState.ADOPTING, row.fabric, row.specs
            self._replicas[rec.id] = rec
            self._by_model.setdefault(rec.model, {})[rec.id] = None
            per_fabric = self._replicas_per_fabric(rec.model)
            per_fabric[row.fabric] = per_fabric.get(row.fabric, 0) + 1
            for spec in row.specs:
                self._capacity.book(spec.node, spec.gpus)
                self._assigned[spec.node][spec.key] = spec
            self._adopting.add(rec.id)
        self._restored_count = len(state.replicas)

    def tick(self, now_ms: int) -> Step:
        """One reconcile pass over what changed since the last one."""
        self._now = now_ms
        for change in self._health.expire(now_ms):
            self._heard(change)
        for rid in sorted(self._adopting):
            if rid in self._adopting:  # a failure earlier in this pass may have reaped it
                self._try_adopt(self._replicas[rid])
        if not self._started_reported:
            self._started_reported = True
            self._emit(
                "controller.started",
                adopted=self._adopted_count,
                restored=self._restored_count,
            )
        for rid in sorted(self._dirty_replicas):
            if rid in self._dirty_replicas:
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
        writes, self._writes = tuple(self._writes), []
        return Step(commands, events, wake_at_ms, writes)

    def _emit(self, kind: str, **subjects: object) -> None:
        self._events.append(TraceEvent.of(self._now, kind, **subjects))

    # --- nodes -------------------------------------------------------------------------------

    def _register(self, info: NodeInfo, now_ms: int, incarnation: int) -> None:
        known = self._nodes.get(info.node)
        if known != info:
            self._writes.append(PutNode(info))
            self._nodes[info.node] = info
            self._capacity.add_node(info)  # new facts: re-indexed, unschedulable until heard
            self._heard_nodes.discard(info.node)
        # a node never seen, or a new agent process on a node seen before, has joined; a
        # known node answering a restarted controller has not
        before = self._incarnations.get(info.node)
        joined = known is None or (before is not None and before != incarnation)
        self._incarnations[info.node] = incarnation
        self._last_report.pop(info.node, None)  # judge its report afresh
        self._assigned.setdefault(info.node, {})
        if joined:
            self._emit("node.joined", node=info.node, fabric=info.fabric)
        self._hear(info.node, now_ms, announce=not joined)
        self._dirty_nodes.add(info.node)

    def _gpus_failed(self, node: NodeId, gpus: tuple[int, ...]) -> None:
        """A failed GPU is never offered again (the replica using it fails by its exit)."""
        for gpu in gpus:
            if self._capacity.fail_gpu(node, gpu):
                self._capacity_changed = True

    def _hear(self, node: NodeId, now_ms: int, announce: bool = True) -> None:
        """A node spoke: it is alive, and once heard it may be placed on."""
        change = self._health.seen(node, now_ms)
        if node not in self._heard_nodes:
            self._heard_nodes.add(node)
            self._capacity.set_schedulable(node, True)
            self._capacity_changed = True
        self._heard(change, announce)

    def _heard(self, change: HealthChange | None, announce: bool = True) -> None:
        """Act on a node's health changing."""
        if change is None or change.before is None:
            return
        node, fabric = change.node, self._nodes[change.node].fabric
        match change.after:
            case NodeState.ALIVE:
                if announce:
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
            if key.rank >= len(rec.specs) or rec.specs[key.rank] != report.spec:
                self._dirty_nodes.add(node)  # not the shard this replica placed here
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
        if rec.state is ReplicaState.ADOPTING:
            return  # a shard that was running before the restart: nothing started it now
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

    # --- adoption ----------------------------------------------------------------------------

    def _try_adopt(self, rec: ReplicaRecord) -> None:
        """Decide a restored replica once every node it was placed on has spoken."""
        if not rec.state.live:
            self._adopting.discard(rec.id)
            return
        if any(spec.node not in self._heard_nodes for spec in rec.specs):
            return  # wait: an unheard node is declared lost after its silence, failing this
        self._adopting.discard(rec.id)
        missing = [s for s in rec.specs if s.rank not in rec.reports]
        if missing or len(rec.specs) != rec.profile.nodes:
            where = ", ".join(f"{s.rank} on {s.node}" for s in missing)
            node = missing[0].node if missing else None
            self._fail(rec, f"short of shard {where} after restart", node)
            return
        rec.state = ReplicaState.READY if rec.whole() else ReplicaState.STARTING
        rec.endpoint = rec.reports[0].endpoint if rec.state is ReplicaState.READY else None
        self._adopted_count += 1
        self._emit(
            "replica.adopted",
            model=rec.model,
            replica=rec.id,
            fabric=rec.fabric,
            nodes=rec.nodes,
            ready=rec.state is ReplicaState.READY,
        )
