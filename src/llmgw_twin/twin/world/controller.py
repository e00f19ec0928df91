"""The controllers in the twin: one or more controller processes on one shared store.

`ControllerShell` is what the rest of the world talks to. It routes each agent's message to the
controller that leads (believes it leads, hears the agents and is not stalled), each operator
call to the leader (waiting while there is none, as the operator's client retries), and carries
out every step with `control.apply.apply_step`, as the service does: writes committed to the
store (conditionally on the leader's epoch: a deposed leader's step ends there), then events
into the trace and the router, then commands, each stamped with the leader's epoch, over the
simulated network. Each process (`leader.ControllerProcess`) keeps its own lease, clock and
faults; the store outlives them all. A new leader starts its core from the store and adopts what
the agents still run, as a restarted controller does; its report requests leave at most
`DELIVERY_WORKERS` at a time, as the service's delivery sends them, and the core is told when
each was delivered, so that it judges no node before its answer could arrive. With several
controllers every event a controller publishes names it (`controller`).
"""

from __future__ import annotations

import heapq
from typing import assert_never

from llmgw_twin.control.apply import apply_step
from llmgw_twin.control.controller import QUIET_STEP, Controller
from llmgw_twin.control.durable import Write
from llmgw_twin.control.model import NodeId, TraceEvent
from llmgw_twin.control.protocol import (
    ApplyAutoscale,
    ApplyDeployment,
    ApplyProfile,
    Assigned,
    AssignShards,
    ClearFailedGpu,
    ControllerCommand,
    ControllerEvent,
    Heartbeat,
    LoadReport,
    NodeRegistered,
    ReportRequested,
    RequestReport,
    Step,
)
from llmgw_twin.store.sqlite import Fenced, Store
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.world.autoscale import LoadReporter
from llmgw_twin.twin.world.checks import Invariants
from llmgw_twin.twin.world.leader import ControllerProcess, StoreUnreachable
from llmgw_twin.twin.world.probe import Probe
from llmgw_twin.twin.world.reconciles import Reconciles
from llmgw_twin.twin.world.sim import World
from llmgw_twin.twin.world.traffic import TrafficRouter

OPERATOR_RETRY_MS = 1_000
"""How often an operator's client retries a call no controller took (none led)."""
DELIVERY_WORKERS = 64
"""A controller's report requests leave through this many connections at a time, each held for
the request's round trip, as the service's delivery sends them (`MAX_IN_FLIGHT` there): a large
fleet's requests are delivered over time, not at once."""


class Deposed(Exception):
    """A step's commit was refused: its controller no longer leads."""


class ControllerShell:
    def __init__(self, scenario: Scenario, world: World, trace: list[TraceEvent]) -> None:
        self.world = world
        self.trace = trace
        self.timings = scenario.timings
        self.scenario = scenario
        self.checks = Invariants(scenario, world)
        self.models = [d.model for d in scenario.deployments]
        self.store = Store(":memory:")  # the controllers' database: it outlives every process
        self.store_down = False
        self._outages = 0
        self.several = scenario.controllers > 1
        self.probe = Probe(self.models, self.checks)
        """The leader's routing probe at each reconcile (`probe.py`)."""
        self.procs = [ControllerProcess(f"c{i + 1}", self) for i in range(scenario.controllers)]
        self._initialized = False
        """A leader has set the scenario's desired state up (the store holds it since)."""
        self.reconciles = Reconciles(self._tick)
        """Each core reconciled on its grid when it needs it (`reconciles.py`)."""
        self._last: ControllerProcess = self.procs[0]
        """The controller that led last (the routers follow it)."""
        self._last_core = Controller(self.timings)
        """Its core: the view judged while no controller leads."""
        self._last_gone = True
        """The router was told the last leader stopped (there was none yet, at first)."""
        self._waiting_ops: list[ControllerEvent] = []
        self._coasting_in: dict[NodeId, tuple[ControllerProcess, Controller]] = {}
        self._senders: dict[str, list[int]] = {}
        """Per controller: when each of its delivery connections is free next (a heap)."""
        self.traffic: TrafficRouter | None = None
        """The clients' router, its own process: it outlives a controller crash."""
        if scenario.traffic:
            self.traffic = TrafficRouter(
                scenario, world, self.checks, lambda: self.core, lambda: self.up
            )
        self.load = LoadReporter(scenario, world, lambda: self.traffic, self.load_report)
        """The autoscaled models' load, reported to the leader (`autoscale.py`)."""
        world.on_command = self._agent_answered
        for proc in self.procs:  # c1 first: it leads first
            proc.start()

    # --- who leads ---------------------------------------------------------------------------

    def proc(self, name: str) -> ControllerProcess:
        for p in self.procs:
            if p.name == name:
                return p
        raise KeyError(name)

    def leaders(self) -> list[ControllerProcess]:
        """The controllers that lead now: each believes it does, is not stalled, and holds an
        unexpired lease in its epoch in the store's time."""
        lease = self.store.lease()
        if lease is None or lease.expires_ms <= self.world.now:
            return []
        return [
            p
            for p in self.procs
            if p.leading
            and p.stalled_until is None
            and p.name == lease.holder
            and p.epoch == lease.epoch
        ]

    def leader(self, name: str | None = None) -> ControllerProcess | None:
        """The controller `name` names (`leader` or None: whichever leads now)."""
        if name is not None and name != "leader":
            return self.proc(name)
        leading = self.leaders()
        return leading[0] if leading else None

    @property
    def core(self) -> Controller:
        """The view of the controller leading now (else of the last one that led)."""
        now = self.leader()
        if now is not None and now.core is not None:
            return now.core
        return self._last_core

    @property
    def up(self) -> bool:
        return any(p.listening for p in self.procs)

    def new_core(self, proc: ControllerProcess) -> Controller:
        if self._initialized:
            return Controller(self.timings, restored=self.store.load())
        return Controller(self.timings)

    def took_over(self, proc: ControllerProcess) -> None:
        """`proc` starts leading: the world's bulk heartbeats are accounted again, the routers
        resync from it, and it sets up the desired state (the first leader) and starts."""
        core = proc.core
        assert core is not None
        if self.traffic is not None and not self._last_gone:
            # the last leader did not stop (stalled, or cut off): what the router may still
            # pick is its last word; one that stopped told the router so then
            self.traffic.controller_died(self._last_core)
        self._last_gone = False
        self._last = proc
        self._last_core = core
        self.probe.reset()
        self._senders[proc.name] = [0] * DELIVERY_WORKERS
        now = proc.local()
        if not self._initialized:
            for profile in self.scenario.profiles:
                self.step(proc, core.handle(ApplyProfile(profile), now))
            for dep in self.scenario.deployments:
                self.step(proc, core.handle(ApplyDeployment(dep), now))
            if proc.core is None:
                return
            self._initialized = True
        for policy in self.scenario.autoscale:  # configuration, given at every start
            self.step(proc, core.handle(ApplyAutoscale(policy), now))
        self.step(proc, core.start(now, awaits_delivery=True))
        if proc.core is None:
            return
        if self.traffic is not None:  # the router follows the new leader and resyncs
            self.traffic.controller_started(core)
        waiting, self._waiting_ops = self._waiting_ops, []
        for msg in waiting:
            self.operator(msg)

    def lost_leader(self, proc: ControllerProcess, deposed: bool = False) -> None:
        """`proc` stops leading: it died (its memory is what it published: it dies between two
        steps), or it stepped down, maybe in the middle of a step the store refused, whose
        decisions its memory holds but nobody ever heard of."""
        if self.traffic is None or proc.core is None or proc is not self._last:
            return
        self._last_gone = True
        if deposed:
            self.traffic.controller_deposed()
        else:
            self.traffic.controller_died(proc.core)

    # --- the old single-controller faults ----------------------------------------------------

    def crash(self, name: str | None = None) -> ControllerProcess:
        """A controller process dies with everything in its memory (unnamed or `leader`: the
        one leading now, or else the one that led last)."""
        proc = self.leader(name) or self._last
        proc.kill()
        return proc

    def restart(self, proc: ControllerProcess) -> None:
        """A new process of that controller starts (from the store, if it comes to lead); one
        still running is replaced (restarts that overlap)."""
        if proc.up:
            proc.kill()
        proc.start()

    # --- messages ----------------------------------------------------------------------------

    def receive(self, msg: ControllerEvent) -> None:
        self._receive(msg)

    def receive_heartbeat(self, msg: Heartbeat) -> bool:
        """Deliver a heartbeat; True when it changed nothing but its node's last-seen time, and
        nothing here waits on that node's next one."""
        return self._receive(msg)

    def _receive(self, msg: ControllerEvent) -> bool:
        listening = [p for p in self.procs if p.listening]
        if not listening:
            return False  # nobody listening: the agent's message is lost
        heard: NodeId | None = None
        if isinstance(msg, Heartbeat | NodeRegistered) and self.checks.delivered(msg):
            heard = msg.node if isinstance(msg, Heartbeat) else msg.info.node
        quiet = len(listening) == 1
        for proc in listening:
            core = proc.core
            assert core is not None
            step = core.handle(msg, proc.local())
            if step is QUIET_STEP and heard is None:  # no commit, no events, nothing to check
                if self.world.gpu_violations:
                    self.checks.after_step(core, self.world.now, (), None)
                quiet = quiet and isinstance(msg, Heartbeat) and core.settled(msg.node)
                continue
            quiet = False
            self.step(proc, step, heard)
        return quiet

    def coast(self, node: NodeId) -> None:
        """The world accounts for `node`'s quiet heartbeats in bulk: the one core that hears
        them sets it aside (a heartbeat coasts only while exactly one controller listens)."""
        for proc in self.procs:
            if proc.listening and proc.core is not None:
                proc.core.coast(node)
                self._coasting_in[node] = (proc, proc.core)

    def land(self, node: NodeId, last_seen_ms: int) -> None:
        got = self._coasting_in.pop(node, None)
        if got is not None:  # told to the core that set it aside, whether it still leads,
            proc, core = got  # in its own clock's time
            core.land(node, proc.local_at(last_seen_ms))
            self.reconciles.changed(proc, core)  # its silence counts again: judged on time

    def load_report(self, msg: LoadReport) -> None:
        """The models' load, to the leader; lost while none leads (the next one comes)."""
        proc = self.leader()
        if proc is not None and proc.core is not None:
            self.step(proc, proc.core.handle(msg, proc.local()))

    def operator(self, msg: ControllerEvent) -> None:
        """An admin API call (a deployment change); while no controller leads the operator's
        client keeps retrying, so the call lands at the next leader."""
        proc = self.leader()
        if proc is not None and proc.core is not None:
            if isinstance(msg, ClearFailedGpu):  # the node's next heartbeat reports the GPU again
                self.world.heartbeats.land(msg.node)
            if self.step(proc, proc.core.handle(msg, proc.local())):
                return
            # its commit was refused (the leader was deposed): the call failed, and the
            # operator's client tries again
        self._waiting_ops.append(msg)
        if len(self._waiting_ops) == 1:
            self.world.later(OPERATOR_RETRY_MS, self._retry_ops)

    def _retry_ops(self) -> None:
        """The operator's client tries again: a controller may lead now without having just
        taken over (one that woke from a stall, or was heard again, still holding its lease)."""
        if not self._waiting_ops:
            return
        if self.leader() is None:
            self.world.later(OPERATOR_RETRY_MS, self._retry_ops)
            return
        waiting, self._waiting_ops = self._waiting_ops, []
        for msg in waiting:
            self.operator(msg)

    def _tick(self, proc: ControllerProcess) -> None:
        core = proc.core
        if core is None:
            return
        self.step(proc, core.tick(proc.local()))
        if proc.core is None or proc is not self._last:
            return
        self.probe.run(core, self.world.now)

    # --- carrying out a step -----------------------------------------------------------------

    def step(self, proc: ControllerProcess, step: Step, heard: NodeId | None = None) -> bool:
        """Carry `step` out for `proc`; False when its commit was refused and `proc` stepped
        down (nothing of the step left it)."""
        core = proc.core
        if core is None:
            return False
        now = self.world.now
        try:
            apply_step(
                step,
                commit=lambda writes: self._commit(proc, step, writes),
                publish=lambda ev: self._publish(proc, ev),
                send=lambda cmd: self._send(proc, cmd),
            )
        except Deposed:
            proc.step_down()
            return False
        self.checks.after_step(core, now, step.events, heard)
        coasting = self.world.heartbeats.coasting
        if coasting:
            # a node whose assignment changed will not stay quiet: its heartbeats become events
            for node in sorted(n for n in core.dirty_nodes() if n in coasting):
                self.world.heartbeats.land(node)
        self.reconciles.stepped(proc, step)
        return True

    def _commit(self, proc: ControllerProcess, step: Step, writes: tuple[Write, ...]) -> None:
        """The step's writes, in one transaction conditional on the leader's epoch (a step
        that would change nothing and tell no one needs no commit)."""
        if not (writes or step.events or step.commands):
            return
        try:
            proc.store_call(lambda: self.store.commit(writes, epoch=proc.epoch))
        except (Fenced, StoreUnreachable):
            raise Deposed(proc.name) from None
        self.checks.committed(proc.name, proc.epoch, self.world.now)

    def emit(self, proc: ControllerProcess, kind: str, **subjects: object) -> None:
        """A controller's own event (leadership), straight into the trace."""
        self.trace.append(TraceEvent.of(self.world.now, kind, **subjects))

    def _publish(self, proc: ControllerProcess, event: TraceEvent) -> None:
        # the trace keeps the world's time: a controller whose clock is skewed stamps its
        # events with its own, which is not when they happened
        now = self.world.now
        if self.several:
            event = TraceEvent.of(now, event.kind, controller=proc.name, **dict(event.subjects))
        elif event.t_ms != now:
            event = TraceEvent(now, event.kind, event.subjects)
        self.trace.append(event)
        if proc is not self._last:
            return
        self.probe.follow(event)
        if self.traffic is not None:
            self.traffic.router.follow(event)

    def _send(self, proc: ControllerProcess, cmd: ControllerCommand) -> None:
        if proc.cut_agents:
            return  # it cannot reach the agents: the command is lost
        self.world.heartbeats.land(cmd.node)  # told something: the node will not stay quiet
        match cmd:
            case AssignShards(node=node, shards=shards):
                self.world.send_to_agent(node, Assigned(shards, proc.epoch))
            case RequestReport(node=node):
                self._request_report(proc, node)
            case _:
                assert_never(cmd)

    def _request_report(self, proc: ControllerProcess, node: NodeId) -> None:
        """Ask `node` to report over the next free delivery connection: it leaves then, and the
        connection is held for the round trip (a send to a node down or cut off fails at
        once); the core is told when it was delivered, as the service's delivery tells it."""
        now = self.world.now
        free = self._senders.setdefault(proc.name, [0] * DELIVERY_WORKERS)
        leaves = max(now, heapq.heappop(free))
        latency = self.world.network.control_latency_ms(node)
        reached = latency is not None and self.world.nodes[node].up
        done = leaves + (2 * latency if latency is not None and reached else 0)
        heapq.heappush(free, done)
        msg = ReportRequested(proc.epoch)
        if leaves == now:
            self.world.send_to_agent(node, msg)
        else:
            proc.later(leaves - now, lambda: self.world.send_to_agent(node, msg))
        core = proc.core
        if core is not None:
            proc.later(done - now, lambda: core.report_delivered(node, proc.local()))

    def _agent_answered(self, node: NodeId, incarnation: int, epoch: int, refused: bool) -> None:
        """An agent acted on, or refused, a controller command of `epoch`."""
        self.checks.agent_command(node, incarnation, epoch, refused, self.world.now)
        if refused:
            self.trace.append(
                TraceEvent.of(self.world.now, "command.refused", node=node, epoch=epoch)
            )

    # --- the controllers' own faults ---------------------------------------------------------

    def named(self, name: str | None) -> ControllerProcess:
        """The controller a fault names (`leader` or None: the one leading now, else the one
        that led last)."""
        return self.leader(name) or self._last

    def store_outage(self, for_ms: int) -> None:
        """The store refuses every call for `for_ms` (outages that overlap end with the last)."""
        self._outages += 1
        self.store_down = True

        def end() -> None:
            self._outages -= 1
            self.store_down = self._outages > 0

        self.world.later(for_ms, end)
