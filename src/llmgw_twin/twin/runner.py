"""Run one scenario in virtual time and judge it.

`run_scenario` builds the world (network, nodes, agents), a controller shell around the real
controller core, the fault timeline and the checkers, runs SimPy to the scenario's end, and
returns a `RunResult`: the trace, every expectation's outcome and every invariant's violations.
Same scenario and seed, same trace, byte for byte: all randomness comes from one seeded
`random.Random`, time is integer milliseconds, and SimPy breaks ties by scheduling order.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

import simpy

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import NodeId, TraceEvent
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Assigned,
    AssignShards,
    ControllerEvent,
    Heartbeat,
    NodeRegistered,
    Step,
)
from llmgw_twin.control.routing import Router
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.twin.checks import Invariants
from llmgw_twin.twin.expect import Outcome, judge_event, judge_state
from llmgw_twin.twin.faults import UnsupportedFault, schedule_faults
from llmgw_twin.twin.network import Network
from llmgw_twin.twin.scenario import EventExpectation, Scenario, StateExpectation
from llmgw_twin.twin.world import World


class UnsupportedScenario(Exception):
    """The file is valid but asks for something the twin cannot run yet."""


class ControllerShell:
    """Drives the controller core in virtual time: delivers messages, ticks, applies commands."""

    def __init__(self, scenario: Scenario, world: World, trace: list[TraceEvent]) -> None:
        self.world = world
        self.trace = trace
        self.router = Router()
        self.checks = Invariants(scenario, world)
        self.core = Controller(scenario.timings)
        self.models = [d.model for d in scenario.deployments]
        for profile in scenario.profiles:
            self.core.handle(ApplyProfile(profile), 0)
        for dep in scenario.deployments:
            self.core.handle(ApplyDeployment(dep), 0)
        self._apply(self.core.start(world.now), heard=None)

    def receive(self, msg: ControllerEvent) -> None:
        heard: NodeId | None = None
        if isinstance(msg, Heartbeat | NodeRegistered) and self.checks.delivered(msg):
            heard = msg.node if isinstance(msg, Heartbeat) else msg.info.node
        self._apply(self.core.handle(msg, self.world.now), heard)

    def operator(self, msg: ControllerEvent) -> None:
        """An admin API call (a deployment change): no network in between."""
        self._apply(self.core.handle(msg, self.world.now), heard=None)

    def _tick(self) -> None:
        self._apply(self.core.tick(self.world.now), heard=None)
        for model in self.models:  # one probe request per model per reconcile
            route = self.router.pick(model)
            if route is not None:
                self.checks.routed(self.core, self.world.now, route.replica)

    def _apply(self, step: Step, heard: NodeId | None) -> None:
        now = self.world.now
        for ev in step.events:
            self.trace.append(ev)
            rid = ev.get("replica")
            rec = self.core.replica(rid) if isinstance(rid, str) else None  # type: ignore[arg-type]
            self.router.follow(ev, rec.endpoint if rec is not None else None)
        self.checks.after_step(self.core, now, step.events, heard)
        for cmd in step.commands:
            match cmd:
                case AssignShards(node=node, shards=shards):
                    self.world.send_to_agent(node, Assigned(shards))
        if step.wake_at_ms is not None:
            self.world.later(step.wake_at_ms - now, self._tick)


@dataclass(frozen=True, slots=True)
class InvariantResult:
    name: str
    enabled: bool
    off_reason: str | None
    checks: int
    violations: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RunResult:
    scenario: Scenario
    seed: int
    trace: tuple[TraceEvent, ...]
    expectations: tuple[Outcome, ...]
    invariants: tuple[InvariantResult, ...]
    virtual_ms: int
    engine_starts: int

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.expectations) and not any(
            i.enabled and i.violations for i in self.invariants
        )

    @property
    def trace_sha256(self) -> str:
        return trace_sha256(self.trace)


def canonical_event(ev: TraceEvent) -> str:
    return json.dumps(ev.as_dict(), sort_keys=True, separators=(",", ":"))


def trace_sha256(trace: tuple[TraceEvent, ...] | list[TraceEvent]) -> str:
    digest = hashlib.sha256()
    for ev in trace:
        digest.update(canonical_event(ev).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def check_supported(scenario: Scenario) -> None:
    for profile in scenario.profiles:
        try:
            adapter_for(profile.engine)
        except KeyError as e:
            raise UnsupportedScenario(f"profile {profile.name}: {e.args[0]}") from None


def run_scenario(scenario: Scenario, seed: int | None = None) -> RunResult:
    check_supported(scenario)
    run_seed = scenario.seed if seed is None else seed
    env = simpy.Environment()
    trace: list[TraceEvent] = []
    network = Network(scenario.fabrics)
    shell: ControllerShell | None = None

    def to_controller(msg: ControllerEvent) -> None:
        if shell is not None:
            shell.receive(msg)

    world = World(
        env, scenario.nodes, network, scenario.timings, random.Random(run_seed), to_controller
    )
    shell = ControllerShell(scenario, world, trace)
    try:
        schedule_faults(scenario, world, shell.operator, trace)
    except UnsupportedFault as e:
        raise UnsupportedScenario(str(e)) from None
    for name in sorted(world.nodes):
        world.nodes[name].boot()

    outcomes: dict[int, Outcome] = {}
    # Run in segments that end just after each state check's instant: times are whole
    # milliseconds, so running to t+1 processes every event of instant t and none later.
    states = sorted(
        (exp.at_ms, i, exp)
        for i, exp in enumerate(scenario.expectations)
        if isinstance(exp, StateExpectation)
    )
    for at_ms, i, state_exp in states:
        if at_ms + 1 > env.now:
            env.run(until=at_ms + 1)
        outcomes[i] = judge_state(state_exp, shell.core)
    if scenario.duration_ms + 1 > env.now:
        env.run(until=scenario.duration_ms + 1)
    shell.checks.at_end(shell.core, scenario.duration_ms)

    for i, exp in enumerate(scenario.expectations):
        if isinstance(exp, EventExpectation):
            outcomes[i] = judge_event(exp, trace)
    off = dict(scenario.invariants_off)
    invariants = tuple(
        InvariantResult(
            name,
            name not in off,
            off.get(name),
            shell.checks.checks[name],
            tuple(shell.checks.violations[name]),
        )
        for name in shell.checks.violations
    )
    return RunResult(
        scenario=scenario,
        seed=run_seed,
        trace=tuple(trace),
        expectations=tuple(outcomes[i] for i in range(len(scenario.expectations))),
        invariants=invariants,
        virtual_ms=scenario.duration_ms,
        engine_starts=world.engine_starts,
    )
