"""Capacity per model over a run: how many replicas could serve, against how many are wanted.

Role: the measure of `what-if` (`live/whatif.py`) and the capacity chart of the HTML report. A
replica counts from the event that lets the router send it requests (`replica.ready`,
`replica.recovered`, `replica.routable`, or `replica.adopted` with `ready`) until the one that
stops that (`replica.failed`, `replica.reaped`, `replica.degraded`, `replica.unroutable`): the
same events a router follows (`control/routing.py`). The wanted count is each deployment's
replicas, changed by `set_replicas` and `delete_deployment` faults at their times.

Invariants:
- A series is a list of `(t_ms, count)` steps, times strictly increasing, the first at 0: the
  count holds from its time until the next step's.
- Pure functions of the run's trace and scenario: same run, same series.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.control.routing_feed import JOINS, LEAVES
from llmgw_twin.twin.scenario.model import DeleteDeployment, Scenario, SetReplicas

Series = list[tuple[int, int]]

BARS = " ▁▂▃▄▅▆▇█"
"""A sparkline's levels, from none to the full wanted count."""


def _step(series: Series, t_ms: int, count: int) -> None:
    if series and series[-1][0] == t_ms:
        series[-1] = (t_ms, count)
    elif not series or series[-1][1] != count:
        series.append((t_ms, count))
    if len(series) >= 2 and series[-1][1] == series[-2][1]:
        series.pop()


def serving(trace: tuple[TraceEvent, ...], models: list[str]) -> dict[str, Series]:
    """Per model, the replicas a router may send requests to, as steps over the run."""
    live: dict[str, set[str]] = {m: set() for m in models}
    out: dict[str, Series] = {m: [(0, 0)] for m in models}
    for ev in trace:
        kind = ev.kind
        if kind not in JOINS and kind not in LEAVES:
            continue
        model, replica = str(ev.get("model")), str(ev.get("replica"))
        if model not in live:
            live[model] = set()
            out[model] = [(0, 0)]
        joins = kind in JOINS and (kind != "replica.adopted" or bool(ev.get("ready")))
        if joins:
            live[model].add(replica)
        elif kind in LEAVES:
            live[model].discard(replica)
        else:
            continue
        _step(out[model], ev.t_ms, len(live[model]))
    return out


def wanted(scenario: Scenario, trace: tuple[TraceEvent, ...] = ()) -> dict[str, Series]:
    """Per model, the replicas its deployment asks for, as steps over the run: the file's
    counts, changed by its `set_replicas` and `delete_deployment` faults and by the
    autoscaler's `deployment.scaled` events in `trace`."""
    out: dict[str, Series] = {str(d.model): [(0, d.replicas)] for d in scenario.deployments}
    changes: list[tuple[int, int, str, int]] = []
    for i, f in enumerate(scenario.faults):
        a = f.action
        if isinstance(a, SetReplicas):
            changes.append((f.at_ms, i, str(a.model), a.replicas))
        elif isinstance(a, DeleteDeployment):
            changes.append((f.at_ms, i, str(a.model), 0))
    base = len(scenario.faults)
    for i, ev in enumerate(trace):
        if ev.kind == "deployment.scaled":
            changes.append((ev.t_ms, base + i, str(ev.get("model")), int(str(ev.get("replicas")))))
    for t_ms, _, model, count in sorted(changes):
        _step(out.setdefault(model, [(0, 0)]), t_ms, count)
    return out


def replica_ms(trace: tuple[TraceEvent, ...], end_ms: int) -> dict[str, int]:
    """Per model, the time its replicas held GPUs, summed: from `replica.placed` (or a
    `replica.adopted`) to `replica.failed` or `replica.reaped` (or the run's end). What a fixed
    count or an autoscaler costs, in replica-milliseconds."""
    since: dict[str, tuple[str, int]] = {}
    out: dict[str, int] = {}
    for ev in trace:
        rid, model = str(ev.get("replica")), str(ev.get("model"))
        if ev.kind in ("replica.placed", "replica.adopted") and rid not in since:
            since[rid] = (model, ev.t_ms)
        elif ev.kind in ("replica.failed", "replica.reaped") and rid in since:
            m, t0 = since.pop(rid)
            out[m] = out.get(m, 0) + ev.t_ms - t0
    for m, t0 in since.values():
        out[m] = out.get(m, 0) + end_ms - t0
    return out


def at(series: Series, t_ms: int) -> int:
    """The count a series holds at `t_ms`."""
    count = series[0][1]
    for t, c in series:
        if t > t_ms:
            break
        count = c
    return count


@dataclass(frozen=True, slots=True)
class Shortfall:
    """How far a model fell short of what it wants over a span of the run."""

    model: str
    least: int
    """The fewest serving replicas in the span."""
    least_at_ms: int
    wanted_then: int
    short_ms: int
    """How long, in all, it served fewer replicas than it wanted."""


def shortfall(serve: Series, want: Series, start_ms: int, end_ms: int, model: str) -> Shortfall:
    times = sorted({start_ms, *(t for t, _ in serve + want if start_ms < t < end_ms)})
    least, least_at, wanted_then, short = None, start_ms, 0, 0
    for i, t in enumerate(times):
        nxt = times[i + 1] if i + 1 < len(times) else end_ms
        s, w = at(serve, t), at(want, t)
        if least is None or s < least:
            least, least_at, wanted_then = s, t, w
        if s < w:
            short += nxt - t
    return Shortfall(model, least or 0, least_at, wanted_then, short)


def _any_short(
    serve: dict[str, Series], want: dict[str, Series], start_ms: int, end_ms: int
) -> list[tuple[int, bool]]:
    """At `start_ms` and at each change within `[start_ms, end_ms]`: whether some model then
    serves fewer replicas than it wants (it stays so until the next entry)."""
    changes = {t for s in (*serve.values(), *want.values()) for t, _ in s}
    times = sorted({start_ms, *(t for t in changes if start_ms < t <= end_ms)})
    return [
        (t, any(at(serve.get(m, [(0, 0)]), t) < at(w, t) for m, w in want.items())) for t in times
    ]


def whole_again(
    serve: dict[str, Series], want: dict[str, Series], start_ms: int, end_ms: int
) -> int | None:
    """The first time at or after `start_ms` from which every model serves at least what it
    wants until `end_ms`; None when some model is short at the end."""
    steps = _any_short(serve, want, start_ms, end_ms)
    short = [i for i, (_, is_short) in enumerate(steps) if is_short]
    if not short:
        return start_ms
    return steps[short[-1] + 1][0] if short[-1] + 1 < len(steps) else None


def longest_short(
    serve: dict[str, Series], want: dict[str, Series], start_ms: int, end_ms: int
) -> int:
    """The longest span within `[start_ms, end_ms]` in which some model served fewer replicas
    than it wanted (a span still open at `end_ms` counts to it); 0 when none was short."""
    longest, began = 0, None
    for t, short in _any_short(serve, want, start_ms, end_ms):
        if short and began is None:
            began = t
        elif not short and began is not None:
            longest, began = max(longest, t - began), None
    if began is not None:
        longest = max(longest, end_ms - began)
    return longest


def sparkline(serve: Series, want: Series, start_ms: int, end_ms: int, width: int = 48) -> str:
    """The serving count over `[start_ms, end_ms]` in `width` characters, each the least count
    in its slice of time, scaled to the most the model wants in the span (full block: whole)."""
    top = max(*(c for _, c in want), *(c for _, c in serve), 1)
    span = max(end_ms - start_ms, 1)
    out = []
    for i in range(width):
        lo = start_ms + span * i // width
        hi = start_ms + span * (i + 1) // width
        inside = [c for t, c in serve if lo < t < hi]
        least = min([at(serve, lo), *inside])
        out.append(BARS[round(least * (len(BARS) - 1) / top)])
    return "".join(out)


def least_of(runs: list[Series]) -> Series:
    """The step series of the least count across several runs at each instant (the worst
    seed's capacity, instant by instant)."""
    times = sorted({t for s in runs for t, _ in s})
    out: Series = []
    for t in times:
        _step(out, t, min(at(s, t) for s in runs))
    return out or [(0, 0)]
