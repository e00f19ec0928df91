"""The controller's shell in the twin: a controller process in virtual time, with its store.

It delivers messages to the controller core, runs its reconcile ticks, and carries out every
step with `control.apply.apply_step`, as the service does: writes committed to the store, then
events into the trace and the router, then commands over the simulated network. It can crash:
the process and its memory are gone (ticks stop, messages to it are dropped, operator calls wait
for it), while the store survives; after the outage a new core starts from that store and adopts
what the agents still run.
"""

from __future__ import annotations

from typing import assert_never

from llmgw_twin.control.apply import apply_step
from llmgw_twin.control.controller import QUIET_STEP, Controller
from llmgw_twin.control.model import NodeId, TraceEvent
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Assigned,
    AssignShards,
    ClearFailedGpu,
    ControllerCommand,
    ControllerEvent,
    Heartbeat,
    NodeRegistered,
    ReportRequested,
    RequestReport,
    Step,
)
from llmgw_twin.control.routing import Router
from llmgw_twin.store.sqlite import Store
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.world.checks import Invariants
from llmgw_twin.twin.world.sim import World
from llmgw_twin.twin.world.traffic import TrafficRouter


class ControllerShell:
    def __init__(self, scenario: Scenario, world: World, trace: list[TraceEvent]) -> None:
        self.world = world
        self.trace = trace
        self.timings = scenario.timings
        self.checks = Invariants(scenario, world)
        self.models = [d.model for d in scenario.deployments]
        self.store = Store(":memory:")  # the controller's disk: it outlives the process
        self.router = Router()
        self.core = Controller(scenario.timings)
        self.up = True
        self.generation = 0  # bumped at every crash: a dead process's timers do nothing
        self._waiting_ops: list[ControllerEvent] = []
        self.traffic: TrafficRouter | None = None
        """The clients' router, its own process: it outlives a controller crash."""
        if scenario.traffic:
            self.traffic = TrafficRouter(
                scenario, world, self.checks, lambda: self.core, lambda: self.up
            )
        for profile in scenario.profiles:
            self._apply(self.core.handle(ApplyProfile(profile), 0), heard=None)
        for dep in scenario.deployments:
            self._apply(self.core.handle(ApplyDeployment(dep), 0), heard=None)
        self._apply(self.core.start(world.now), heard=None)

    def receive(self, msg: ControllerEvent) -> None:
        self._receive(msg)

    def receive_heartbeat(self, msg: Heartbeat) -> bool:
        """Deliver a heartbeat; True when it changed nothing but its node's last-seen time, and
        nothing here waits on that node's next one."""
        return self._receive(msg)

    def _receive(self, msg: ControllerEvent) -> bool:
        if not self.up:
            return False  # nobody listening: the agent's message is lost
        heard: NodeId | None = None
        if isinstance(msg, Heartbeat | NodeRegistered) and self.checks.delivered(msg):
            heard = msg.node if isinstance(msg, Heartbeat) else msg.info.node
        step = self.core.handle(msg, self.world.now)
        if step is QUIET_STEP and heard is None:  # no commit, no events, nothing to check
            if self.world.gpu_violations:
                self.checks.after_step(self.core, self.world.now, (), None)
            return isinstance(msg, Heartbeat) and self.core.settled(msg.node)
        self._apply(step, heard)
        return False

    def coast(self, node: NodeId) -> None:
        self.core.coast(node)

    def land(self, node: NodeId, last_seen_ms: int) -> None:
        self.core.land(node, last_seen_ms)

    def operator(self, msg: ControllerEvent) -> None:
        """An admin API call (a deployment change); while the controller is down the operator's
        client keeps retrying, so the call lands when it is back."""
        if not self.up:
            self._waiting_ops.append(msg)
            return
        if isinstance(msg, ClearFailedGpu):  # the node's next heartbeat reports the GPU again
            self.world.heartbeats.land(msg.node)
        self._apply(self.core.handle(msg, self.world.now), heard=None)

    def crash(self) -> None:
        """The controller process dies with everything in its memory, the router's table too."""
        self.world.heartbeats.land_all()  # heartbeats to a dead controller are lost, not quiet
        self.up = False
        self.generation += 1
        if self.traffic is not None:
            self.traffic.controller_died(self.core)

    def restart(self) -> None:
        """A new controller process starts from the store."""
        self.world.heartbeats.land_all()  # (a restart without a crash between: outages overlap)
        if self.traffic is not None and self.up:  # restarted while up (outages overlap): the
            self.traffic.controller_died(self.core)  # process it replaces said its last word
        self.up = True
        self.generation += 1
        self.router = Router()
        self.core = Controller(self.timings, restored=self.store.load())
        self._apply(self.core.start(self.world.now), heard=None)
        if self.traffic is not None:  # the router reconnects and finds a new controller
            self.traffic.controller_started(self.core)
        waiting, self._waiting_ops = self._waiting_ops, []
        for msg in waiting:
            self.operator(msg)

    def _tick(self, generation: int) -> None:
        if not self.up or generation != self.generation:
            return
        self._apply(self.core.tick(self.world.now), heard=None)
        for model in self.models:  # one probe request per model per reconcile
            route = self.router.pick(model, self.world.now)
            if route is not None:
                self.checks.routed(self.core, self.world.now, route.replica)
                self.router.finished(route.replica, True, self.world.now)

    def _apply(self, step: Step, heard: NodeId | None) -> None:
        now = self.world.now
        apply_step(step, commit=self.store.commit, publish=self._publish, send=self._send)
        self.checks.after_step(self.core, now, step.events, heard)
        coasting = self.world.heartbeats.coasting
        if coasting:
            # a node whose assignment changed will not stay quiet: its heartbeats become events
            for node in sorted(n for n in self.core.dirty_nodes() if n in coasting):
                self.world.heartbeats.land(node)
        if step.wake_at_ms is not None:
            generation = self.generation
            self.world.later(step.wake_at_ms - now, lambda: self._tick(generation))

    def _publish(self, event: TraceEvent) -> None:
        self.trace.append(event)
        self.router.follow(event)
        if self.traffic is not None:
            self.traffic.router.follow(event)

    def _send(self, cmd: ControllerCommand) -> None:
        self.world.heartbeats.land(cmd.node)  # told something: the node will not stay quiet
        match cmd:
            case AssignShards(node=node, shards=shards):
                self.world.send_to_agent(node, Assigned(shards))
            case RequestReport(node=node):
                self.world.send_to_agent(node, ReportRequested())
            case _:
                assert_never(cmd)
