"""Reports of a run: a timeline for people, a JSON document for programs.

The JSON report holds the fields docs/scenarios.md lists; `wall_ms` is measured by the caller
(the twin never reads a clock). The timeline prints every trace event at its virtual time, with
the argv each shard was started with, then every expectation and invariant, then one verdict line.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.twin.world.expect import Outcome
from llmgw_twin.twin.world.runner import InvariantResult, RunResult
from llmgw_twin.units import fmt_ms

_ORDER = (
    "controller",
    "epoch",
    "fault",
    "action",
    "leaf",
    "spine",
    "leaves",
    "domain",
    "node",
    "gpu",
    "nodes",
    "fabric",
    "model",
    "replica",
    "to",
    "rank",
    "replicas",
    "profile",
    "was",
    "group",
    "role",
)
_LATER = ("adopted", "restored", "ready", "down_for_ms", "side", "reason")


def to_json(result: RunResult, wall_ms: int) -> dict[str, Any]:
    return {
        "scenario": result.scenario.name,
        "file": result.scenario.path,
        "seed": result.seed,
        "passed": result.passed,
        "trace_sha256": result.trace_sha256,
        "virtual_ms": result.virtual_ms,
        "wall_ms": wall_ms,
        "engine_starts": result.engine_starts,
        "events": [ev.as_dict() for ev in result.trace],
        **judged_json(result.expectations, result.invariants),
        **({} if result.requests is None else {"requests": result.requests}),
        **({} if result.latency is None else {"latency": result.latency}),
    }


def requests_lines(requests: dict[str, dict[str, int]] | None) -> list[str]:
    """The timeline's request counts, one line per model (the twin's and real mode's)."""
    if not requests:
        return []
    lines = ["requests"]
    for model, c in requests.items():
        line = (
            f"  {model}: {c['sent']} sent, {c['served']} served, {c['failed']} failed "
            f"({c['failed_in_flight']} in flight on a replica that died, "
            f"{c['failed_no_replica']} with no replica to take them), {c['retried']} retried"
        )
        lines.append(line + (f", {c['ejections']} ejections" if "ejections" in c else ""))
    return lines


def latency_lines(latency: dict[str, dict[str, Any]] | None) -> list[str]:
    """The timeline's latency figures, one line per model (`world/latency.py`)."""
    if not latency:
        return []
    lines = ["latency (ms)"]
    for model, c in latency.items():
        ttft, e2e, queued = c["ttft_ms"], c["e2e_ms"], c["queued_ms"]
        lines.append(
            f"  {model}: TTFT p50 {ttft['p50']:g} p99 {ttft['p99']:g}, end-to-end p50 "
            f"{e2e['p50']:g} p99 {e2e['p99']:g}, queued p99 {queued['p99']:g}, "
            f"goodput {c['goodput_per_s']:g}/s"
        )
    return lines


def judged_json(
    expectations: Sequence[Outcome], invariants: Sequence[InvariantResult]
) -> dict[str, Any]:
    """The `expectations` and `invariants` of a JSON report (the twin's and real mode's)."""
    return {
        "expectations": [
            {"text": o.text, "line": o.line, "passed": o.passed, "message": o.message}
            for o in expectations
        ],
        "invariants": [
            {
                "name": i.name,
                "enabled": i.enabled,
                "off_reason": i.off_reason,
                "checks": i.checks,
                "violations": list(i.violations),
            }
            for i in invariants
        ],
    }


def judged_lines(
    expectations: Sequence[Outcome], invariants: Sequence[InvariantResult]
) -> list[str]:
    """The expectations and invariants part of a timeline (the twin's and real mode's)."""
    lines = ["expectations"]
    for o in expectations:
        mark = "PASS" if o.passed else "FAIL"
        lines.append(f"  {mark}  line {o.line:<4} {o.text}")
        lines.append(f"  {'':>4}  {'':9} {o.message}")
    lines.append("invariants")
    for inv in invariants:
        if not inv.enabled:
            lines.append(f"  off   {inv.name}: {inv.off_reason}")
            continue
        mark = "ok  " if not inv.violations else "FAIL"
        lines.append(f"  {mark}  {inv.name} ({inv.checks} checks)")
        lines.extend(f"          {v}" for v in inv.violations)
    return lines


def _value(v: object) -> str:
    if isinstance(v, tuple):
        return ",".join(str(x) for x in v)
    return str(v)


def describe(ev: TraceEvent) -> str:
    parts: list[str] = []
    for key in (*_ORDER, *_LATER):
        v = ev.get(key)
        if v is None or key == "argv":
            continue
        if key == "reason":
            parts.append(f"({v})")
        else:
            parts.append(f"{key}={_value(v)}")
    return " ".join(parts)


def timeline(result: RunResult, wall_ms: int) -> str:
    sc = result.scenario
    lines = [f"{sc.name} (seed {result.seed}) {sc.path}"]
    if sc.description:
        lines.append(f"  {sc.description}")
    for ev in result.trace:
        lines.append(f"  {'+' + fmt_ms(ev.t_ms):>13}  {ev.kind:<20} {describe(ev)}")
        argv = ev.get("argv")
        if isinstance(argv, tuple) and argv:
            lines.append(f"  {'':>13}  {'':<20} $ {shlex.join(str(a) for a in argv)}")
    lines.extend(requests_lines(result.requests))
    lines.extend(latency_lines(result.latency))
    lines.extend(judged_lines(result.expectations, result.invariants))
    lines.append(verdict(result, wall_ms))
    return "\n".join(lines)


def verdict(result: RunResult, wall_ms: int) -> str:
    passed_exp = sum(1 for o in result.expectations if o.passed)
    enabled = [i for i in result.invariants if i.enabled]
    held = sum(1 for i in enabled if not i.violations)
    word = "PASS" if result.passed else "FAIL"
    return (
        f"{word} {result.scenario.name}: {passed_exp}/{len(result.expectations)} expectations, "
        f"{held}/{len(enabled)} invariants hold, {len(result.trace)} events, "
        f"{fmt_ms(result.virtual_ms)} virtual in {wall_ms} ms, "
        f"trace sha256 {result.trace_sha256[:16]}"
    )
