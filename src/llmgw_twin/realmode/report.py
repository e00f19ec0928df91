"""Reports of a real run, and the fidelity table that sets it beside the twin's.

The timeline and verdict read like the twin's. `fidelity` runs nothing: given the twin's result
and the real one for the same scaled file, it lines up, for every event expectation, the first
matching event inside the expectation's window in each run (the twin's window as the twin judged
it, the real one widened by the tolerance; none when no event falls in it) and their difference,
and says whether the two runs made the same control decisions (`decisions`): per replica, what
the controller decided of it, in order, and per node its losses and recoveries. Which joins came
first, and how each replica's story interleaves with another's, are left out: real processes
start in an order of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.realmode.runner import RealResult
from llmgw_twin.twin.report.text import (
    describe,
    judged_json,
    judged_lines,
    latency_lines,
    requests_lines,
)
from llmgw_twin.twin.scenario.model import EventExpectation
from llmgw_twin.twin.world.expect import matches
from llmgw_twin.twin.world.runner import RunResult, trace_sha256
from llmgw_twin.units import fmt_ms, fmt_offset

REPLICA_DECISIONS: dict[str, tuple[str, ...]] = {
    "replica.placed": ("fabric", "nodes"),
    "replica.ready": (),
    "replica.failed": (),  # which node it names is whose report came first: a fabric outage
    # or a crash fails every rank at once, and real reports race where the twin's do not
    "replica.reaped": (),
    "replica.adopted": ("fabric", "nodes", "ready"),
    "replica.moving": ("to", "fabric", "nodes"),
    "replica.moved": ("to",),
    "replica.move_aborted": ("to",),
}
"""The control decisions about a replica, and the subjects of each that make the decision (free
text such as a reason is left out: its wording carries times and names of its own)."""


def timeline(result: RealResult, events: bool = True) -> str:
    """The run for people: its events (unless `events` is False: the progress lines printed
    each one as it happened, and the timeline is not printed twice), requests, results."""
    sc = result.scenario
    lines = [
        f"{sc.name} (real, time scale {result.time_scale}, tolerance "
        f"{fmt_ms(result.tolerance_ms)}) {sc.path}"
    ]
    if not events:
        lines.append(f"  {len(result.trace)} events, each printed above as it happened")
    for ev in result.trace if events else ():
        lines.append(f"  {fmt_offset(ev.t_ms):>13}  {ev.kind:<20} {describe(ev)}")
    lines.extend(requests_lines(result.requests))
    lines.extend(latency_lines(result.latency))
    lines.extend(judged_lines(result.expectations, result.invariants))
    if result.left_running:
        lines.append(f"left running: process groups {result.left_running}")
    lines.append(verdict(result))
    return "\n".join(lines)


def verdict(result: RealResult) -> str:
    passed = sum(1 for o in result.expectations if o.passed)
    enabled = [i for i in result.invariants if i.enabled]
    held = sum(1 for i in enabled if not i.violations)
    word = "PASS" if result.passed else "FAIL"
    left = f", {len(result.left_running)} process groups left" if result.left_running else ""
    return (
        f"{word} {result.scenario.name} (real): {passed}/{len(result.expectations)} "
        f"expectations, {held}/{len(enabled)} invariants hold, {len(result.trace)} events, "
        f"{fmt_ms(result.wall_ms)} wall{left}"
    )


def to_json(result: RealResult) -> dict[str, Any]:
    return {
        "scenario": result.scenario.name,
        "file": result.scenario.path,
        "mode": "real",
        "seed": result.scenario.seed,
        "virtual_ms": result.scenario.duration_ms,
        "trace_sha256": trace_sha256(result.trace),
        "time_scale": result.time_scale,
        "tolerance_ms": result.tolerance_ms,
        "passed": result.passed,
        "wall_ms": result.wall_ms,
        "left_running": result.left_running,
        "workdir": result.workdir,
        "process_groups": result.groups,
        "answered": result.answered,
        **({} if result.requests is None else {"requests": result.requests}),
        **({} if result.latency is None else {"latency": result.latency}),
        "events": [ev.as_dict() for ev in result.trace],
        **judged_json(result.expectations, result.invariants),
    }


def _first(exp: EventExpectation, trace: Sequence[TraceEvent]) -> int | None:
    """The first event matching `exp` inside its window; None when none falls in it."""
    for e in trace:
        if exp.start_ms <= e.t_ms <= exp.end_ms and matches(e, exp):
            return e.t_ms
    return None


@dataclass(frozen=True, slots=True)
class Fidelity:
    rows: list[dict[str, Any]]
    """Per event expectation: its text, the twin's and the real run's first event in its
    window (ms, None: none), and the difference."""
    differences: list[str]
    """Each replica or node whose decisions differ, and how (empty: the same decisions)."""

    @property
    def same(self) -> bool:
        return not self.differences

    def as_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "same_decisions": self.same, "differences": self.differences}


def fidelity(twin: RunResult, real: RealResult) -> Fidelity:
    """The twin's run and the real one of the same scaled file, expectation by expectation
    (the same list, in the same order: the real one's windows widened) and decision by
    decision, each up to the scaled run's end."""
    rows: list[dict[str, Any]] = []
    for predicted, judged in zip(
        twin.scenario.expectations, real.scenario.expectations, strict=True
    ):
        if not isinstance(judged, EventExpectation) or judged.never:
            continue
        assert isinstance(predicted, EventExpectation)
        v, r = _first(predicted, twin.trace), _first(judged, real.trace)
        rows.append(
            {
                "expectation": judged.text,
                "virtual_ms": v,
                "real_ms": r,
                "difference_ms": r - v if v is not None and r is not None else None,
            }
        )
    end = real.scenario.duration_ms
    return Fidelity(rows, decision_differences(twin.trace, real.trace, end))


Decision = tuple[object, ...]


def decisions(trace: Sequence[TraceEvent], end_ms: int | None = None) -> dict[str, list[Decision]]:
    """What the controller decided, keyed by replica id (`replica X`: its placements, readiness,
    failures, reaps, adoption and moves, in order) and by node (`node N`: lost, and recovered
    once lost), up to `end_ms`. A replica's id is the controller's own count per model, so two
    runs that place the same replicas name them alike."""
    out: dict[str, list[Decision]] = {}
    lost: set[str] = set()
    for ev in trace:
        if end_ms is not None and ev.t_ms > end_ms:
            continue
        keys = REPLICA_DECISIONS.get(ev.kind)
        if keys is not None:
            what = (ev.kind.removeprefix("replica."), *(_plain(ev.get(k)) for k in keys))
            out.setdefault(f"replica {ev.get('replica')}", []).append(what)
            continue
        node = str(ev.get("node"))
        if ev.kind == "node.lost":
            lost.add(node)
            out.setdefault(f"node {node}", []).append(("lost",))
        elif ev.kind == "node.recovered" and node in lost:  # back from lost, not a suspect blip
            lost.discard(node)
            out.setdefault(f"node {node}", []).append(("recovered",))
    return {key: _adopted_loading(steps) for key, steps in out.items()}


def _adopted_loading(steps: list[Decision]) -> list[Decision]:
    """An adoption of a replica still loading, then its readiness, is one decision with an
    adoption of it ready: the controller adopted it as it was (no engine restarted), and it
    serves once loaded either way. Which of the two a run shows depends on whether the engine
    finished loading before or after the restarted controller heard it, a race of the engine's
    start-up time, not a decision."""
    out: list[Decision] = []
    for step in steps:
        if step == ("ready",) and out and out[-1][0] == "adopted" and out[-1][-1] is False:
            out[-1] = (*out[-1][:-1], True)
            continue
        out.append(step)
    return out


def _plain(value: object) -> object:
    """A subject as a comparable, printable value: a node list as `node01+node02`."""
    return "+".join(map(str, value)) if isinstance(value, tuple | list) else value


def decision_differences(
    twin: Sequence[TraceEvent], real: Sequence[TraceEvent], end_ms: int | None = None
) -> list[str]:
    """One line per replica or node whose decisions differ between the two traces."""
    a, b = decisions(twin, end_ms), decisions(real, end_ms)
    out = []
    for key in sorted(a.keys() | b.keys()):
        va, vb = a.get(key, []), b.get(key, [])
        if va != vb:
            out.append(f"{key}: twin {_story(va)}; real {_story(vb)}")
    return out


def _story(steps: list[Decision]) -> str:
    """`placed ib-a node01+node02, ready, failed node=node02, reaped`."""
    if not steps:
        return "nothing"
    said = []
    for kind, *values in steps:
        keys = REPLICA_DECISIONS.get(f"replica.{kind}", ())
        parts = [str(kind)]
        for key, value in zip(keys, values, strict=True):
            if value is not None:
                parts.append(str(value) if key in ("fabric", "nodes") else f"{key}={value}")
        said.append(" ".join(parts))
    return ", ".join(said)


def _cell(ms: int | None) -> str:
    return "none" if ms is None else fmt_ms(ms)


def _signed(ms: int | None) -> str:
    return "-" if ms is None else fmt_offset(ms)


def fidelity_table(rows: list[dict[str, Any]], same: bool, differences: Sequence[str] = ()) -> str:
    out = [f"{'virtual':>12} {'real':>12} {'real-virtual':>13}  expectation"]
    for row in rows:
        out.append(
            f"{_cell(row['virtual_ms']):>12} {_cell(row['real_ms']):>12} "
            f"{_signed(row['difference_ms']):>13}  {row['expectation']}"
        )
    out.append(f"same control decisions per replica and node: {'yes' if same else 'no'}")
    out.extend(f"  {line}" for line in differences)
    return "\n".join(out)
