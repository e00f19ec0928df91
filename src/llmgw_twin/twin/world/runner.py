"""Run one scenario in virtual time and judge it.

`run_scenario` builds the world (network, nodes, agents), a controller shell around the real
controller core, the fault timeline and the checkers, runs SimPy to the scenario's end, and
returns a `RunResult`: the trace, every expectation's outcome and every invariant's violations.
Same scenario and seed, same trace, byte for byte: all randomness comes from one seeded
`random.Random`, time is integer milliseconds, and SimPy breaks ties by scheduling order.
"""

from __future__ import annotations

import gc
import hashlib
import json
import random
from dataclasses import dataclass

import simpy

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.control.protocol import ControllerEvent
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.twin.scenario.model import (
    EventExpectation,
    RequestsExpectation,
    Scenario,
    StateExpectation,
)
from llmgw_twin.twin.scenario.workload_model import SloExpectation
from llmgw_twin.twin.world.controller import ControllerShell
from llmgw_twin.twin.world.expect import (
    Outcome,
    anchored,
    judge_event,
    judge_requests,
    judge_state,
)
from llmgw_twin.twin.world.faults import schedule_faults
from llmgw_twin.twin.world.initial import InitialShell, boot_nodes
from llmgw_twin.twin.world.latency import judge_slo
from llmgw_twin.twin.world.network import Network
from llmgw_twin.twin.world.sim import World


class UnsupportedScenario(Exception):
    """The file is valid but asks for something the twin cannot run yet."""


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
    engine_starts_by_ms: tuple[int, ...] = ()
    """When each engine process was started (virtual ms): restarts are visible here even when
    the controller does not know of them."""
    requests: dict[str, dict[str, int]] | None = None
    """Per model with traffic: sent, served, failed, failed in flight (`world/traffic.py`); None
    without traffic."""
    latency: dict[str, dict[str, object]] | None = None
    """Per model with traffic: TTFT, end-to-end, queueing and between-token percentiles, goodput
    (`world/latency.py`); None unless the scenario uses the workload additions."""
    failed_at: dict[str, tuple[int, ...]] | None = None
    """Per model with traffic, the arrival time of each failed request, in order (None without
    traffic): what failed in a span of the run (`what-if` counts those after its actions)."""
    sent_at: dict[str, tuple[int, ...]] | None = None
    """Per model with traffic, the arrival time of every request, in order."""

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


def run_scenario(scenario: Scenario, seed: int | None = None, bulk: bool = True) -> RunResult:
    """`bulk`: account for quiet heartbeats in bulk (the same result as one event per heartbeat,
    `twin/world/heartbeats.py`); False runs every heartbeat as its two events."""
    check_supported(scenario)
    run_seed = scenario.seed if seed is None else seed
    env = simpy.Environment()
    trace: list[TraceEvent] = []
    network = Network(scenario.all_fabrics)
    shell: ControllerShell | None = None

    def to_controller(msg: ControllerEvent) -> None:
        if shell is not None:
            shell.receive(msg)

    world = World(
        env,
        scenario.all_nodes,  # a node added later is in the world, powered off until its fault
        network,
        scenario.timings,
        random.Random(run_seed),
        to_controller,
        bulk,
    )
    shell = (InitialShell if scenario.initial is not None else ControllerShell)(
        scenario, world, trace
    )
    world.heartbeats.receive = shell.receive_heartbeat
    world.heartbeats.on_coast = shell.coast
    world.heartbeats.on_land = shell.land
    schedule_faults(scenario, world, shell, trace)
    if scenario.initial is not None:  # its shards running, for the controller to adopt
        boot_nodes(scenario, scenario.initial, world)
    else:
        for name in sorted(n.node for n in scenario.nodes):
            world.nodes[name].boot()
    # The cycle collector paused for the run: the world, the fleet and the controller live for
    # the whole run and it walked them again and again (a third of a 10,000-node hour), while a
    # run makes no cyclic garbage as it goes (its timers are objects, not closures that name
    # themselves; tests/test_twin_garbage.py holds it to that). Reference counting frees the
    # rest as ever; the collector is back as it was once the run ends.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _run(scenario, run_seed, env, world, shell, trace)
    finally:
        if paused:
            gc.enable()


def _run(
    scenario: Scenario,
    run_seed: int,
    env: simpy.Environment,
    world: World,
    shell: ControllerShell,
    trace: list[TraceEvent],
) -> RunResult:

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
        leading = tuple(p.name for p in shell.leaders())
        clock = anchored(state_exp.text, scenario.faults)
        outcomes[i] = judge_state(state_exp, shell.core, leading, clock)
    if scenario.duration_ms + 1 > env.now:
        env.run(until=scenario.duration_ms + 1)
    shell.checks.at_end(shell.core, scenario.duration_ms)

    for i, exp in enumerate(scenario.expectations):
        if isinstance(exp, EventExpectation):
            outcomes[i] = judge_event(exp, trace, anchored(exp.text, scenario.faults))
        elif isinstance(exp, RequestsExpectation):
            assert shell.traffic is not None  # the loader asks for traffic to the model
            counts = shell.traffic.counts[exp.model]
            clock = anchored(exp.text, scenario.faults)
            outcomes[i] = judge_requests(exp, counts.arrivals, counts.failed_at, clock)
        elif isinstance(exp, SloExpectation):
            assert shell.traffic is not None and shell.traffic.latencies is not None
            clock = anchored(exp.text, scenario.faults)
            counted = shell.traffic.counts[exp.model]
            outcomes[i] = judge_slo(
                exp, shell.traffic.latencies, counted.arrivals, counted.failed_at, clock
            )
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
        engine_starts_by_ms=tuple(world.engine_start_times),
        requests=None if shell.traffic is None else shell.traffic.report(),
        latency=None if shell.traffic is None else shell.traffic.latency_report(),
        failed_at=None
        if shell.traffic is None
        else {m: tuple(c.failed_at) for m, c in shell.traffic.counts.items()},
        sent_at=None
        if shell.traffic is None
        else {m: tuple(c.arrivals) for m, c in shell.traffic.counts.items()},
    )
