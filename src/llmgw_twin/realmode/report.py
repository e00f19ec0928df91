"""Reports of a real run, and the fidelity table that sets it beside the twin's.

The timeline and verdict read like the twin's. `fidelity` runs nothing: given the twin's result
and the real one for the same scaled file, it lines up, for every event expectation, the first
matching event's virtual time and real time and their difference, and says whether the two runs
made the same sequence of control decisions (the kinds of control events, shard reports aside,
in order).
"""

from __future__ import annotations

from typing import Any

from llmgw_twin.core.model import TraceEvent
from llmgw_twin.realmode.runner import RealResult
from llmgw_twin.twin.expect import matches
from llmgw_twin.twin.report import describe, judged_json, judged_lines, requests_lines
from llmgw_twin.twin.runner import RunResult, trace_sha256
from llmgw_twin.twin.scenario import EventExpectation
from llmgw_twin.units import fmt_ms, fmt_offset

DECISIONS = (
    "node.joined",
    "node.lost",
    "replica.placed",
    "replica.ready",
    "replica.failed",
    "replica.reaped",
    "replica.unplaceable",
    "replica.adopted",
)
"""Control decisions whose order a faithful twin reproduces (heartbeat-phase effects such as
suspect/recovered and the shard reports are left out)."""


def timeline(result: RealResult) -> str:
    sc = result.scenario
    lines = [
        f"{sc.name} (real, time scale {result.time_scale}, tolerance "
        f"{fmt_ms(result.tolerance_ms)}) {sc.path}"
    ]
    for ev in result.trace:
        lines.append(f"  {fmt_offset(ev.t_ms):>13}  {ev.kind:<20} {describe(ev)}")
    lines.extend(requests_lines(result.requests))
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
        "answered": result.answered,
        **({} if result.requests is None else {"requests": result.requests}),
        "events": [ev.as_dict() for ev in result.trace],
        **judged_json(result.expectations, result.invariants),
    }


def _first(exp: EventExpectation, trace: tuple[TraceEvent, ...] | list[TraceEvent]) -> int | None:
    inside = [e.t_ms for e in trace if matches(e, exp) and exp.start_ms <= e.t_ms <= exp.end_ms]
    anywhere = [e.t_ms for e in trace if matches(e, exp)]
    found = inside or anywhere
    return found[0] if found else None


def fidelity(twin: RunResult, real: RealResult) -> tuple[list[dict[str, Any]], bool]:
    """Rows (expectation, virtual ms, real ms, difference) and whether the decisions matched."""
    rows: list[dict[str, Any]] = []
    for exp in real.scenario.expectations:
        if not isinstance(exp, EventExpectation) or exp.never:
            continue
        v, r = _first(exp, twin.trace), _first(exp, real.trace)
        rows.append(
            {
                "expectation": exp.text,
                "virtual_ms": v,
                "real_ms": r,
                "difference_ms": r - v if v is not None and r is not None else None,
            }
        )
    same = decisions(list(twin.trace)) == decisions(real.trace)
    return rows, same


def decisions(trace: list[TraceEvent]) -> list[tuple[str, object]]:
    return [(e.kind, e.get("fabric")) for e in trace if e.kind in DECISIONS]


def _cell(ms: int | None) -> str:
    return "-" if ms is None else fmt_ms(ms)


def _signed(ms: int | None) -> str:
    return "-" if ms is None else fmt_offset(ms)


def fidelity_table(rows: list[dict[str, Any]], same: bool) -> str:
    out = [f"{'virtual':>12} {'real':>12} {'real-virtual':>13}  expectation"]
    for row in rows:
        out.append(
            f"{_cell(row['virtual_ms']):>12} {_cell(row['real_ms']):>12} "
            f"{_signed(row['difference_ms']):>13}  {row['expectation']}"
        )
    out.append(f"control decisions in the same order: {'yes' if same else 'no'}")
    return "\n".join(out)
