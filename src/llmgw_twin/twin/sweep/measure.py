"""What a sweep measures of one run, and each grid point's figures over its seeds.

Role: `measure(result)` reads a twin run: how long the controller took to declare a node lost
after it really went silent (detection), how many nodes it declared lost that were not silent
(false losses), and from the first fault on (the whole run when there is none): requests
failed, the longest span in which some model was short of its count, how long models were
short in all; and whether the file's expectations held. `Figures` is the mean, least and
most of each over a point's seeds.

A node is really silent while a fault keeps its heartbeats from the controller: from a
`kill_node` or `crash_node` until a `restart_node`, through a `partition` naming it, through a
`restart_agent`'s downtime. A `node.lost` whose last `node_lost_after` saw no such silence is a
false loss: late heartbeats, a slow node, a stalled or skewed controller declared it.

Invariants:
- A function of the run alone: the same run, the same figures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from llmgw_twin.twin.report import capacity
from llmgw_twin.twin.scenario.model import (
    CrashNode,
    KillNode,
    Partition,
    RestartAgent,
    RestartNode,
    Scenario,
)
from llmgw_twin.twin.scenario.workload_model import SloExpectation
from llmgw_twin.twin.world.runner import RunResult

METRICS: tuple[tuple[str, str], ...] = (
    ("detection_ms", "detection (ms)"),
    ("false_losses", "false losses"),
    ("failed_requests", "failed requests"),
    ("outage_ms", "longest outage (ms)"),
    ("short_ms", "short (replica-ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("slo_met", "SLOs met"),
    ("replica_hours", "replica-hours"),
    ("passed", "passed"),
)
"""(key, heading) of every figure, in the table's order."""

FOREVER = 1 << 62


def silences(scenario: Scenario) -> dict[str, list[tuple[int, int]]]:
    """Per node, the spans `[from, to)` in which a fault keeps its heartbeats away."""
    out: dict[str, list[tuple[int, int]]] = {}
    down: dict[str, int] = {}
    for f in scenario.faults:
        a = f.action
        if isinstance(a, KillNode | CrashNode):
            down.setdefault(str(a.node), f.at_ms)
        elif isinstance(a, RestartNode) and str(a.node) in down:
            out.setdefault(str(a.node), []).append((down.pop(str(a.node)), f.at_ms))
        elif isinstance(a, Partition):
            for n in a.nodes:
                out.setdefault(str(n), []).append((f.at_ms, f.at_ms + a.for_ms))
        elif isinstance(a, RestartAgent):
            out.setdefault(str(a.node), []).append((f.at_ms, f.at_ms + a.down_for_ms))
    for node, at in down.items():
        out.setdefault(node, []).append((at, FOREVER))
    return out


@dataclass(frozen=True, slots=True)
class Measure:
    detection_ms: float | None
    """Mean over the true losses of the time from the silence's start to `node.lost`."""
    false_losses: int
    failed_requests: int
    outage_ms: int
    """From the first fault on, the longest span in which some model served fewer replicas
    than it wanted (one still open at the end counts to the end)."""
    short_ms: int
    """From the first fault, per model, the time it served fewer replicas than it wanted,
    summed."""
    ttft_p99_ms: float | None
    """The worst model's p99 time to first token (scenarios with the engine model or `slo`)."""
    slo_met: float | None
    """The share of the file's `slo` expectations that held; None without any."""
    replica_hours: float
    """Replicas' time holding GPUs over the run, all models."""
    passed: bool

    def value(self, key: str) -> float | None:
        v = getattr(self, key)
        return None if v is None else float(v)


def measure(result: RunResult) -> Measure:
    sc = result.scenario
    quiet = silences(sc)
    lost_after = sc.timings.node_lost_after_ms
    detections: list[int] = []
    false = 0
    for ev in result.trace:
        if ev.kind != "node.lost":
            continue
        spans = quiet.get(str(ev.get("node")), [])
        starts = [a for a, b in spans if a <= ev.t_ms and b > ev.t_ms - lost_after]
        if starts:
            detections.append(ev.t_ms - max(starts))
        else:
            false += 1
    want = capacity.wanted(sc, result.trace)
    serve = capacity.serving(result.trace, list(want))
    first = min((f.at_ms for f in sc.faults), default=None)
    since = 0 if first is None else first
    short = sum(
        capacity.shortfall(serve[m], want.get(m, [(0, 0)]), since, result.virtual_ms, m).short_ms
        for m in serve
    )
    failed = sum(1 for ts in (result.failed_at or {}).values() for t in ts if t >= since)
    return Measure(
        detection_ms=statistics.fmean(detections) if detections else None,
        false_losses=false,
        failed_requests=failed,
        outage_ms=capacity.longest_short(serve, want, since, result.virtual_ms),
        short_ms=short,
        ttft_p99_ms=_ttft_p99(result),
        slo_met=_slo_met(result),
        replica_hours=sum(capacity.replica_ms(result.trace, result.virtual_ms).values()) / 3.6e6,
        passed=result.passed,
    )


def _ttft_p99(result: RunResult) -> float | None:
    worst = None
    for figures in (result.latency or {}).values():
        ttft = figures.get("ttft_ms")
        p99 = ttft.get("p99") if isinstance(ttft, dict) else None
        if isinstance(p99, int | float) and (worst is None or p99 > worst):
            worst = float(p99)
    return worst


def _slo_met(result: RunResult) -> float | None:
    judged = [
        o.passed
        for e, o in zip(result.scenario.expectations, result.expectations, strict=True)
        if isinstance(e, SloExpectation)
    ]
    return sum(judged) / len(judged) if judged else None


@dataclass(frozen=True, slots=True)
class Figure:
    mean: float | None
    least: float | None
    most: float | None
    missing: int
    """Seeds with no value (no loss detected)."""


def figures(runs: list[Measure]) -> dict[str, Figure]:
    out = {}
    for key, _ in METRICS:
        values = [v for m in runs if (v := m.value(key)) is not None]
        out[key] = Figure(
            statistics.fmean(values) if values else None,
            min(values) if values else None,
            max(values) if values else None,
            len(runs) - len(values),
        )
    return out
