"""Scale every duration of a scenario by one factor, and widen its windows for wall-clock runs.

`scale_scenario(s, 0.1)` is the same story ten times faster: every duration among the timings
(counts and shares stay), load times and start timeouts, fault instants and durations,
expectation windows and instants, the interval between requests, and the run's length, all
multiplied (rounded to whole
milliseconds, never below 1 ms where zero would mean something else). Real mode runs the
scaled file on real processes, whose timings carry noise the twin does not have: `widen` pads
every event window by a stated tolerance so that a verdict says what the twin predicted, give or
take that much (a window that forbids, narrowed instead).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import assert_never

from llmgw_twin.control.model import Timings
from llmgw_twin.engines.perf.model import EnginePerf
from llmgw_twin.twin.scenario.limits import MAX_RATE_PER_S
from llmgw_twin.twin.scenario.model import (
    AddNode,
    ClockSkew,
    Cordon,
    CrashNode,
    CutFabricLink,
    DelayHeartbeats,
    DeleteDeployment,
    EventExpectation,
    Expectation,
    FabricDown,
    FailGpu,
    Fault,
    FaultAction,
    HangEngine,
    KillController,
    KillEngine,
    KillNode,
    Partition,
    PartitionController,
    RequestsExpectation,
    RestartAgent,
    RestartController,
    RestartNode,
    Scenario,
    SetProfile,
    SetReplicas,
    SlowNode,
    StallController,
    StateExpectation,
    StoreDown,
    Traffic,
)
from llmgw_twin.twin.scenario.topo_actions import (
    LeafDown,
    NvlinkDegraded,
    NvlinkDomainDown,
    SpineDown,
)
from llmgw_twin.twin.scenario.workload import with_perf_args
from llmgw_twin.twin.scenario.workload_model import SloExpectation
from llmgw_twin.units import setting_keys

_TIMING_KEYS = setting_keys(Timings)


def _ms(value: int, factor: float, floor: int = 0) -> int:
    return max(floor, round(value * factor))


def _action(action: FaultAction, factor: float) -> FaultAction:
    match action:
        case Partition(nodes=nodes, for_ms=for_ms):
            return Partition(nodes, _ms(for_ms, factor, 1))
        case FabricDown(fabric=fabric, for_ms=for_ms):
            return FabricDown(fabric, _ms(for_ms, factor, 1))
        case RestartController(down_for_ms=down, controller=name):
            return RestartController(_ms(down, factor), name)
        case StallController(controller=name, for_ms=for_ms):
            return StallController(name, _ms(for_ms, factor, 1))
        case PartitionController(controller=name, side=side, for_ms=for_ms):
            return PartitionController(name, side, _ms(for_ms, factor, 1))
        case StoreDown(for_ms=for_ms):
            return StoreDown(_ms(for_ms, factor, 1))
        case RestartAgent(node=node, down_for_ms=down):
            return RestartAgent(node, _ms(down, factor))
        case CutFabricLink(node=node, for_ms=for_ms):
            return CutFabricLink(node, _ms(for_ms, factor, 1))
        case SlowNode(node=node, factor_num=num, factor_den=den, for_ms=for_ms):
            return SlowNode(node, num, den, _ms(for_ms, factor, 1))
        case DelayHeartbeats(nodes=nodes, by_ms=by_ms, for_ms=for_ms):
            return DelayHeartbeats(nodes, _ms(by_ms, factor, 1), _ms(for_ms, factor, 1))
        case LeafDown() | SpineDown() | NvlinkDegraded():
            return replace(action, for_ms=_ms(action.for_ms, factor, 1))
        case NvlinkDomainDown(for_ms=for_ms) if for_ms is not None:
            return replace(action, for_ms=_ms(for_ms, factor, 1))
        case (
            KillNode()
            | CrashNode()
            | RestartNode()
            | KillEngine()
            | HangEngine()
            | FailGpu()
            | SetReplicas()
            | SetProfile()
            | Cordon()
            | DeleteDeployment()
            | KillController()
            | ClockSkew()
            | AddNode()
            | NvlinkDomainDown()
        ):
            return action  # instantaneous: only its time moves, and `at_ms` is scaled apart
        case _:
            assert_never(action)


def _expectation(exp: Expectation, factor: float) -> Expectation:
    if isinstance(exp, SloExpectation):  # the engines run as much faster: so do its bounds

        def bound(ms: int | None) -> int | None:
            return None if ms is None else _ms(ms, factor, 1)

        return replace(
            exp,
            start_ms=_ms(exp.start_ms, factor),
            end_ms=_ms(exp.end_ms, factor),
            ttft_p99_ms=bound(exp.ttft_p99_ms),
            e2e_p99_ms=bound(exp.e2e_p99_ms),
            ttft_ms=bound(exp.ttft_ms),
        )
    if isinstance(exp, EventExpectation | RequestsExpectation):
        return replace(exp, start_ms=_ms(exp.start_ms, factor), end_ms=_ms(exp.end_ms, factor))
    return replace(exp, at_ms=_ms(exp.at_ms, factor))


def _traffic(traffic: Traffic, factor: float) -> Traffic:
    """The same requests over the scaled run: the interval between them scales."""
    ratio = Fraction(traffic.every_ms) * Fraction(factor) / traffic.count
    ratio = max(ratio.limit_denominator(1_000_000), Fraction(1, MAX_RATE_PER_S // 1_000))
    wl = traffic.workload
    if wl is not None and wl.trace is not None:  # its rows' times scale as the run's
        f = Fraction(factor).limit_denominator(1_000_000)
        wl = replace(wl, trace=replace(wl.trace, scale=wl.trace.scale * f))
    elif wl is not None:
        wl = replace(
            wl,
            diurnal=None
            if wl.diurnal is None
            else replace(wl.diurnal, period_ms=_ms(wl.diurnal.period_ms, factor, 1)),
            bursts=tuple(
                replace(b, start_ms=_ms(b.start_ms, factor), end_ms=_ms(b.end_ms, factor))
                for b in wl.bursts
            ),
        )
    return replace(traffic, count=ratio.denominator, every_ms=ratio.numerator, workload=wl)


def _perf(perf: EnginePerf, factor: float) -> EnginePerf:
    """The engine `factor` times as fast per iteration: its times scale as the run's do."""
    f = Fraction(factor).limit_denominator(1_000_000)
    return replace(
        perf,
        iteration_us=perf.iteration_us * f,
        prefill_us_per_token=perf.prefill_us_per_token * f,
        decode_us_per_token=perf.decode_us_per_token * f,
    )


def _without_perf_flag(args: tuple[str, ...]) -> tuple[str, ...]:
    if "--perf-model" not in args:
        return args
    i = args.index("--perf-model")
    return args[:i] + args[i + 2 :]


def scale_scenario(scenario: Scenario, factor: float) -> Scenario:
    if factor <= 0:
        raise ValueError("the time scale must be positive")
    t = scenario.timings
    timings = replace(
        t,
        **{
            k.attr: _ms(getattr(t, k.attr), factor, k.minimum)
            for k in _TIMING_KEYS
            if k.kind == "duration"
        },
    )
    profiles = tuple(
        replace(
            p,
            load_time_ms=_ms(p.load_time_ms, factor),
            # 0 means "derived from the load time", which scales by itself
            start_timeout_ms=_ms(p.start_timeout_ms, factor, 1) if p.start_timeout_ms else 0,
            args=_without_perf_flag(p.args),
        )
        for p in scenario.profiles
    )
    engine_model = tuple(replace(m, perf=_perf(m.perf, factor)) for m in scenario.engine_model)
    profiles = with_perf_args(profiles, engine_model)
    faults = tuple(
        Fault(_ms(f.at_ms, factor), _action(f.action, factor), f.id, f.line)
        for f in scenario.faults
    )
    return replace(
        scenario,
        duration_ms=_ms(scenario.duration_ms, factor, 1),
        timings=timings,
        profiles=profiles,
        faults=faults,
        expectations=tuple(_expectation(e, factor) for e in scenario.expectations),
        traffic=tuple(_traffic(t, factor) for t in scenario.traffic),
        engine_model=engine_model,
    )


def widen(scenario: Scenario, tolerance_ms: int) -> Scenario:
    """Pad every event window by `tolerance_ms` on both sides (clamped to the run); a `never`
    window, and a `requests` window (it bounds failures), is narrowed instead, so that it still
    only forbids what surely falls inside it (one shorter than twice the tolerance is left its
    midpoint). A state assertion keeps its instant: real mode reads the state there, and again
    until one reading holds, up to `tolerance_ms` later but never at the next fault
    (`realmode/checks.state_span`): moving the instant could carry it past a fault."""

    def one(exp: Expectation) -> Expectation:
        if isinstance(exp, StateExpectation):
            return exp
        if isinstance(exp, RequestsExpectation | SloExpectation) or exp.never:
            start, end = exp.start_ms + tolerance_ms, exp.end_ms - tolerance_ms
            if start > end:
                start = end = (exp.start_ms + exp.end_ms) // 2
        else:
            start = max(0, exp.start_ms - tolerance_ms)
            end = min(scenario.duration_ms, exp.end_ms + tolerance_ms)
        return replace(exp, start_ms=start, end_ms=end)

    return replace(scenario, expectations=tuple(one(e) for e in scenario.expectations))
