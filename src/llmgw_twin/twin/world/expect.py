"""Expectations: event windows judged over the finished trace, state assertions judged live,
request counts judged over every request of the run.

An event expectation passes when the number of matching events inside its window is right (at
least one; none for `never`; exactly `count`). A state expectation is judged at its instant,
after every other event of that instant, on the controller's own view. A requests expectation
passes when at most `failed_max` of the model's requests that arrived in its window failed.
Each result carries a message a person can act on: what matched and when, or what came nearest,
with every time as the file wrote it: relative to the fault its expectation names (`anchored`:
`kill+57s (1m57.000s)`), else from the start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import FabricId, ModelName, NodeState, TraceEvent
from llmgw_twin.twin.scenario.model import (
    EventExpectation,
    Fault,
    RequestsExpectation,
    StateExpectation,
)
from llmgw_twin.units import fmt_duration, fmt_ms

Clock = Callable[[int], str]
"""How an expectation's message writes an instant of the run."""

_WORD = re.compile(r"[A-Za-z_]\w*(?:-[A-Za-z_]\w*)*")


def anchored(text: str, faults: Sequence[Fault]) -> Clock:
    """Instants as `text` (an expectation as written) names them: relative to the first fault
    id it names, with the run's time beside (`kill+57s (1m57.000s)`); from the start when it
    names none."""
    anchors = {f.id: f.at_ms for f in faults if f.id is not None}
    anchor = next((m[0] for m in _WORD.finditer(text) if m[0] in anchors), None)
    if anchor is None:
        return fmt_ms
    at = anchors[anchor]

    def clock(t_ms: int) -> str:
        d = t_ms - at
        return f"{anchor}{'-' if d < 0 else '+'}{fmt_duration(abs(d))} ({fmt_ms(t_ms)})"

    return clock


@dataclass(frozen=True, slots=True)
class Outcome:
    text: str
    line: int
    passed: bool
    message: str


def _text(value: object) -> str:
    """A subject as a scenario file writes it: booleans in YAML's spelling."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def matches(ev: TraceEvent, exp: EventExpectation) -> bool:
    if ev.kind != exp.kind:
        return False
    for key, want in exp.filters:
        got = ev.get(key)
        if got is None or _text(got) != _text(want):
            return False
    return True


def judge_event(exp: EventExpectation, trace: list[TraceEvent], clock: Clock = fmt_ms) -> Outcome:
    all_matching = [ev for ev in trace if matches(ev, exp)]
    inside = [ev for ev in all_matching if exp.start_ms <= ev.t_ms <= exp.end_ms]
    window = f"[{clock(exp.start_ms)}, {clock(exp.end_ms)}]"
    times = ", ".join(clock(ev.t_ms) for ev in inside[:5]) + (" ..." if len(inside) > 5 else "")
    if exp.never:
        passed = not inside
        message = f"none in {window}" if passed else f"{len(inside)} in {window}, at {times}"
    elif exp.at_most is not None:
        passed = len(inside) <= exp.at_most
        message = f"{len(inside)} in {window} (at most {exp.at_most})" + (
            f", at {times}" if inside else ""
        )
    elif exp.count is not None:
        passed = len(inside) == exp.count
        message = f"{len(inside)} in {window} (want {exp.count})" + (
            f", at {times}" if inside else ""
        )
    elif inside:
        passed = True
        message = f"at {times}, inside {window}"
    else:
        passed = False
        nearest = sorted(
            all_matching, key=lambda ev: min(abs(ev.t_ms - exp.start_ms), abs(ev.t_ms - exp.end_ms))
        )
        message = f"none in {window}" + (
            f"; nearest at {clock(nearest[0].t_ms)}" if nearest else "; none in the whole run"
        )
    return Outcome(exp.text, exp.line, passed, message)


def judge_state(
    exp: StateExpectation,
    ctl: Controller,
    leaders: tuple[str, ...] = ("c1",),
    clock: Clock = fmt_ms,
) -> Outcome:
    """`ctl`: the view of the controller leading at the instant; `leaders`: who leads then."""
    problems: list[str] = []
    seen: list[str] = []
    if exp.leader is not None:
        seen.append(f"leading {list(leaders)}")
        if exp.leader not in leaders:
            problems.append(f"{exp.leader} does not lead (leading: {list(leaders) or 'none'})")
    if exp.leaders is not None:
        if exp.leader is None:
            seen.append(f"leading {list(leaders)}")
        if len(leaders) != exp.leaders:
            problems.append(f"{len(leaders)} controller(s) lead, want {exp.leaders}")
    if exp.ready_replicas is not None:
        for model, want in exp.ready_replicas:
            got = len(ctl.ready_replicas(ModelName(model)))
            seen.append(f"{model} ready {got}")
            if got != want:
                problems.append(f"{model}: {got} ready replicas, want {want}")
    if exp.idle_nodes is not None:
        idle = [
            n for n in ctl.nodes() if ctl.node_state(n) is NodeState.ALIVE and not ctl.assigned(n)
        ]
        seen.append(f"idle {idle}")
        if sorted(idle) != sorted(exp.idle_nodes):
            problems.append(f"idle nodes are {idle}, want {sorted(exp.idle_nodes)}")
    if exp.node_state is not None:
        for node, want_state in exp.node_state:
            state = ctl.node_state(node)
            got_state = state.value if state is not None else "unknown"
            seen.append(f"{node} {got_state}")
            if got_state != want_state:
                problems.append(f"{node} is {got_state}, want {want_state}")
    if exp.replicas_in is not None:
        for fabric, want in exp.replicas_in:
            got = count_in_fabric(ctl, fabric)
            seen.append(f"{fabric} {got}")
            if got != want:
                problems.append(f"{fabric} holds {got} replicas, want {want}")
    at = f"at {clock(exp.at_ms)}: "
    if problems:
        return Outcome(exp.text, exp.line, False, at + "; ".join(problems))
    return Outcome(exp.text, exp.line, True, at + ", ".join(seen))


def count_in_fabric(ctl: Controller, fabric: FabricId) -> int:
    return sum(1 for r in ctl.replicas() if r.state.live and r.fabric == fabric)


def judge_requests(
    exp: RequestsExpectation, arrivals: list[int], failed_at: list[int], clock: Clock = fmt_ms
) -> Outcome:
    """`arrivals` and `failed_at`: the arrival times of the model's requests, and of its failed
    ones (real mode's harness and the twin both count them so)."""
    window = f"[{clock(exp.start_ms)}, {clock(exp.end_ms)}]"
    sent = sum(1 for t in arrivals if exp.start_ms <= t <= exp.end_ms)
    failed = [t for t in failed_at if exp.start_ms <= t <= exp.end_ms]
    passed = len(failed) <= exp.failed_max
    message = (
        f"{len(failed)} of {sent} requests arriving in {window} failed (at most {exp.failed_max})"
    )
    if failed:
        shown = ", ".join(clock(t) for t in failed[:5]) + (" ..." if len(failed) > 5 else "")
        message += f"; they arrived at {shown}"
    return Outcome(exp.text, exp.line, passed, message)
