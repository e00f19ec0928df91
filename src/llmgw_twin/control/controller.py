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
shards no replica claims are stopped. A known node's silence is counted from the last time a
controller heard it (the store keeps that), not from the restart, and nothing is placed on it
until it is heard from (`control/restart.py`). The faults this meets are described in
docs/faults.md.

Invariants kept: a replica's shards are all in one fabric (placement never returns otherwise);
a GPU is booked for at most one live replica; a replica leaves `ready` the moment the controller
learns it lost a shard; a failed replica is reaped in that same step, its GPUs freed and its
shards dropped from every node's assignment.
"""

from __future__ import annotations

from dataclasses import replace
from typing import assert_never

from llmgw_twin.control.answers import FirstJudgement
from llmgw_twin.control.autoscale import Autoscaler, LoadSample
from llmgw_twin.control.defrag import Defragmenter
from llmgw_twin.control.drain import Drainer
from llmgw_twin.control.durable import DeleteQuarantine, DurableState, PutClock
from llmgw_twin.control.lifecycle import Lifecycle
from llmgw_twin.control.model import NodeId, NodeState, Timings
from llmgw_twin.control.moves import Moves
from llmgw_twin.control.node_inputs import QUIET_STEP, NodeInputs
from llmgw_twin.control.nodes import NodeRegistry
from llmgw_twin.control.operator import Operator
from llmgw_twin.control.parts import Books, Liveness
from llmgw_twin.control.protocol import (
    ApplyAutoscale,
    ApplyDeployment,
    ApplyProfile,
    AssignShards,
    ClearFailedGpu,
    ClearQuarantine,
    ControllerCommand,
    ControllerEvent,
    ControllerLagged,
    Cordon,
    DeleteDeployment,
    Drain,
    Heartbeat,
    LoadReport,
    NodeRegistered,
    RequestReport,
    Step,
)
from llmgw_twin.control.reports import ShardReports
from llmgw_twin.control.restart import Restart
from llmgw_twin.control.rollout import Rollout
from llmgw_twin.control.views import ControllerViews
from llmgw_twin.control.wake import on_grid_at_or_after, quiet_until, underway

__all__ = ["QUIET_STEP", "Controller"]


class Controller(ControllerViews):
    """The controller core, composed of parts that own their state: the node registry (health,
    the mass-loss guard), the capacity index, the replica table, the node assignments, the
    failure book, the outbox, and the replica lifecycle that works on them. What is left here is
    the routing of inputs and the reconcile pass; a node's registrations and heartbeats are
    taken by `NodeInputs` (`control/node_inputs.py`), restore and adoption are `Restart`'s
    (`control/restart.py`)."""

    def __init__(self, timings: Timings, restored: DurableState | None = None) -> None:
        self.timings = timings
        self._restored = restored
        books = Books(timings)
        self._capacity = books.capacity
        self._out = books.out
        self._replicas = books.replicas
        self._assignments = books.assignments
        self._profiles = books.profiles
        self._deployments = books.deployments
        self._failures = books.failures
        self._live = Liveness(timings)
        self._moves = Moves(books.capacity, self._live.node_ok)
        draining: dict[NodeId, bool] = {}
        self._life = Lifecycle(
            books, self._moves, self._live.node_ok, self._live.counts, draining.__contains__
        )
        self._fleet = NodeRegistry(books, self._live, self._life)
        self._defrag = Defragmenter(
            self._life, self._moves, self._live.node_ok, lambda: not self._live.guard.held
        )
        self._drain = Drainer(self._life, self._moves, draining)
        self._draining = draining
        self._rollout = Rollout(self._life, self._moves, lambda: not self._live.guard.held)
        self._reports = ShardReports(self._replicas, self._assignments, self._life, self._out)
        self._operator = Operator(
            self._life,
            self._profiles,
            self._deployments,
            self._failures,
            self._drain,
            self._rollout,
        )
        self._nodes = NodeInputs(books, self._fleet, self._reports, self._life)
        self._restart = Restart(books, self._fleet, self._life, self._drain, self._rollout)
        self._autoscaler = Autoscaler()
        self._clock_written_ms: int | None = None
        self._quiet_until_ms: int | None = None
        """After a reconcile with nothing under way: the earliest deadline (`control/wake.py`)."""
        self._due_ms: int | None = None
        """When the next reconcile is due: the reconciles keep the phase `start` gave them."""
        self._started_reported = True  # start() arms the controller.started report
        self._first = FirstJudgement(timings)
        """Nothing is judged before the agents asked at the start could answer."""

    # --- bulk heartbeats: a shell that accounts for quiet heartbeats itself (the twin) --------

    def settled(self, node: NodeId) -> bool:
        """Nothing here waits on the node's next heartbeat (see `NodeRegistry.settled`)."""
        return self._fleet.settled(node)

    def dirty_nodes(self) -> set[NodeId]:
        """Nodes whose assignment changed since the last tick (read-only by convention)."""
        return self._assignments.dirty

    def coast(self, node: NodeId) -> None:
        self._fleet.health.coast(node)

    def land(self, node: NodeId, last_seen_ms: int) -> None:
        self._fleet.health.land(node, last_seen_ms)

    # --- inputs ------------------------------------------------------------------------------

    def handle(self, event: ControllerEvent, now_ms: int) -> Step:
        """Take one input. A step that may have changed anything asks for the next reconcile
        of the grid (`wake_at_ms`): the reconciles between two inputs are skipped while
        nothing is under way (`control/wake.py`)."""
        step = self._handle(event, now_ms)
        if step is QUIET_STEP or self._due_ms is None:
            return step
        wake = self.reconcile_at_or_after(now_ms)
        return Step(step.commands, step.events, wake, step.writes)  # (`replace`, without its cost)

    def reconcile_would_act(self, now_ms: int) -> bool:
        """Whether a reconcile at `now_ms` could change anything, no input having come since
        the last one: False before the earliest deadline when nothing is under way."""
        quiet = self._quiet_until_ms
        return quiet is None or quiet <= now_ms

    def quiet_until_ms(self) -> int | None:
        """The earliest deadline after the last reconcile, while nothing is under way (a
        reconcile before it, no input having come, would change nothing); None: none known."""
        return self._quiet_until_ms

    def reconcile_at_or_after(self, now_ms: int) -> int | None:
        """The first reconcile of the grid at or after `now_ms` (None before `start`): when a
        shell that told the core something outside `handle` (`land`) wakes it."""
        if self._due_ms is None:
            return None
        return on_grid_at_or_after(self._due_ms, self.timings.reconcile_interval_ms, now_ms)

    def _handle(self, event: ControllerEvent, now_ms: int) -> Step:
        self._out.now_ms = now_ms
        match event:
            case NodeRegistered():
                self._nodes.registered(event, now_ms)
            case Heartbeat():
                answer = self._nodes.heartbeat(event, now_ms)
                if answer is not None:
                    return answer  # a report request, or `QUIET_STEP`
            case (
                ApplyProfile()
                | ApplyDeployment()
                | ClearFailedGpu()
                | ClearQuarantine()
                | DeleteDeployment()
                | Cordon()
                | Drain()
            ):
                self._operator.handle(event)
            case ApplyAutoscale(policy=policy):
                self._autoscaler.set_policy(policy)
            case LoadReport(samples=samples):
                self._autoscale(samples, now_ms)
            case ControllerLagged(lag_ms=lag_ms):
                if lag_ms <= 0:
                    raise ValueError("a lag is a positive number of milliseconds")
                self._fleet.health.forgive(lag_ms, now_ms)
                self._life.timers.excuse(lag_ms)
                self._out.emit("controller.lagged", lag_ms=lag_ms)
            case _:
                assert_never(event)
        return self._out.flush()

    def _autoscale(self, samples: tuple[LoadSample, ...], now_ms: int) -> None:
        """Each autoscaled model's count from its load (`control/autoscale.py`): changed as the
        operator changes it, and said as `deployment.scaled`."""
        for sample in samples:
            self._autoscaler.observe(sample, now_ms)
        for sample in samples:
            dep = self._deployments.get(sample.model)
            if dep is None or dep.roles:  # (a group's load is per decode, its count per group)
                continue
            moving = any(self._moves.moving(r.id) for r in self._replicas.live(dep.model))
            decision = self._autoscaler.decide(dep.model, dep.replicas, now_ms, sample.held, moving)
            if decision is None:
                continue
            self._operator.handle(ApplyDeployment(replace(dep, replicas=decision.replicas)))
            self._out.emit(
                "deployment.scaled",
                model=dep.model,
                replicas=decision.replicas,
                was=dep.replicas,
                reason=decision.reason,
            )

    def start(self, now_ms: int, *, awaits_delivery: bool = False) -> Step:
        """The controller process came up. It restores what its store holds, asks every known
        agent to report now, and judges nothing before they could answer (`control/answers.py`):
        its first reconcile comes one interval later at the earliest, and later still while a
        node asked has not answered and its request was delivered less than an interval ago.
        `awaits_delivery`: the shell queues the requests and says when each was delivered
        (`report_delivered`); otherwise they count as delivered now. The reconciles keep the
        phase of the start (`_next_due`)."""
        self._out.now_ms = now_ms
        self._due_ms = now_ms + self.timings.reconcile_interval_ms
        self._started_reported = False
        commands: list[ControllerCommand] = []
        if self._restored is not None:
            self._restart.restore(self._restored, now_ms)
            commands = [RequestReport(n) for n in sorted(self._fleet.infos)]
            lost = NodeState.LOST
            asked = [n for n in self._fleet.infos if self._fleet.health.state(n) is not lost]
            self._first.asked(now_ms, asked, awaits_delivery)
        return self._out.flush(tuple(commands), wake_at_ms=self._due_ms)

    def report_delivered(self, node: NodeId, now_ms: int) -> None:
        """The start's report request to `node` was delivered (or its send failed) at `now_ms`:
        its answer is waited for one reconcile interval from then, at most."""
        self._first.delivered(node, now_ms)

    def awaiting_answers(self) -> list[NodeId]:
        """The nodes asked at the start whose answers the first judgement still waits for."""
        return self._first.unanswered(self._fleet.heard_nodes)

    def tick(self, now_ms: int) -> Step:
        """One reconcile pass over what changed since the last one."""
        self._out.now_ms = now_ms
        self._quiet_until_ms = None
        slices = self._life.slices
        slices.begin()
        wait = self._first.wait_until(now_ms, self._fleet.heard_nodes)
        if wait is not None:  # the agents asked at the start may still answer: judge nothing
            return self._out.flush((), wake_at_ms=min(wait, self._next_due(now_ms)))
        for change in self._fleet.health.expire_suspect(now_ms):
            self._fleet.on_health(change)
        self._fleet.judge_mass_loss(now_ms)
        if not self._fleet.guard.held and self._fleet.expire_lost(now_ms):
            # the store's clock says a controller ran past these losses: a successor restores
            # the nodes lost, and does not declare them lost a second time
            self._clock_written_ms = None
        self._fleet.forget_long_lost(now_ms)
        for q in self._failures.expired(now_ms):
            self._out.write(DeleteQuarantine(q.node, q.profile))
            self._out.emit("node.unquarantined", node=q.node, profile=q.profile, reason="expired")
            self._life.placement_may_fit()
        self._restart.adopt()
        if not self._started_reported:
            self._started_reported = True
            self._out.emit(
                "controller.started",
                adopted=self._restart.adopted_count,
                restored=self._restart.restored_count,
            )
        self._life.timers.run()
        dirty = self._replicas.dirty
        for rid in sorted(dirty):
            if rid in dirty:
                self._life.reconcile_replica(rid)
        dirty.clear()
        if self._replicas.dirty_models:
            self._drain.relink()
            self._rollout.relink(self._replicas.dirty_models)
        for model in sorted(self._replicas.dirty_models):
            self._life.reconcile_deployment(model)
        self._replicas.dirty_models.clear()
        self._replicas.dirty_models.update(slices.again)  # cut: the rest at the next reconcile
        slices.again.clear()
        self._drain.run()
        self._rollout.run()
        if self._life.place_if_due():
            self._defrag.wake()
        self._defrag.settle()
        if self._replicas.pending and not slices.in_round():
            self._defrag.run()  # (after a whole round: a replica not yet tried is not stuck)
        commands: list[ControllerCommand] = []
        for node in self._assignments.take_dirty():
            if self._fleet.health.state(node) in (NodeState.ALIVE, NodeState.SUSPECT):
                commands.append(AssignShards(node, self.assigned(node)))
        written = self._clock_written_ms
        if written is None or now_ms - written >= self.timings.heartbeat_interval_ms:
            self._clock_written_ms = now_ms
            self._out.write(PutClock(now_ms))
        return self._out.flush(tuple(commands), wake_at_ms=self._wake_after(now_ms))

    def _wake_after(self, now_ms: int) -> int:
        """The next reconcile needed after the one at `now_ms`: the next of the grid while
        anything is under way, else the first of the grid at or after the earliest deadline
        (`control/wake.py`). Each deadline is one a reconcile before it would not act on."""
        due = self._next_due(now_ms)
        if self._life.slices.more:
            return now_ms  # a large operation goes on at once, the runtime served in between
        fleet, written = self._fleet, self._clock_written_ms
        busy = underway(
            self._replicas,
            self._assignments.dirty,
            self._live,
            fleet.paced,
            self._moves,
            self._draining,
            self._rollout.rolling,
        )
        lost = fleet.health.first_lost_seen_ms()
        quiet = quiet_until(
            busy,
            (
                fleet.health.next_deadline_ms(),
                self._life.timers.next_due_ms(),
                min((q.until_ms for q in self._failures.quarantines.values()), default=None),
                None if lost is None else lost + self.timings.forget_lost_after_ms,
                None if written is None else written + self.timings.heartbeat_interval_ms,
            ),
        )
        self._quiet_until_ms = quiet
        if quiet is None:
            return due
        return on_grid_at_or_after(due, self.timings.reconcile_interval_ms, quiet)

    def _next_due(self, now_ms: int) -> int:
        """The reconcile after the one at `now_ms`, on the grid `start` set: a late reconcile
        (a busy host) does not move the later ones, and one later than a whole interval skips
        the instants it missed rather than running them all at once."""
        interval = self.timings.reconcile_interval_ms
        due = now_ms if self._due_ms is None else self._due_ms
        if now_ms >= due:
            due += interval * (1 + (now_ms - due) // interval)
        self._due_ms = due
        return due
