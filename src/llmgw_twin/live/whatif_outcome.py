"""What one twin run predicts the actions of `what-if` do, and the summary over its seeds.

Role: `Outcome.of(result, at_ms)` reads a run's trace from the actions' instant on: replicas
failed, moved and placed, engines started, when every model serves its wanted count again, each
model's shortfall, the requests that failed at the traffic's rate, and the replicas left placed
nowhere with the controller's reason. `render` prints the seeds side by side with each model's
capacity as a sparkline (the least of the seeds at each instant); `as_json` is the same as data.

Invariants:
- Only what happens at or after the actions' instant counts: the fleet before it is the
  snapshot's, and the twin's adoption of it at the start is not a prediction.
- A function of the runs alone: the same snapshot, actions and seeds print the same lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.twin.report import capacity
from llmgw_twin.twin.world.runner import RunResult
from llmgw_twin.units import fmt_duration

SPARK_WIDTH = 48


@dataclass(frozen=True, slots=True)
class Outcome:
    seed: int
    failed: int
    moved: int
    placed: int
    engines_started: int
    whole_after_ms: int | None
    """Time from the actions until every model serves its wanted count for good; 0 when none
    ever fell short, None when some model is still short at the end."""
    short: tuple[capacity.Shortfall, ...]
    requests_sent: dict[str, int]
    requests_failed: dict[str, int]
    unplaceable: tuple[tuple[str, str, int], ...]
    """(model, the controller's last reason, replicas) for replicas placed nowhere at the end."""
    drains: tuple[tuple[str, int | None], ...] = ()
    """(node, time from the actions until it was drained, or None: not by the end) for each
    drain begun at or after the actions."""
    serving: dict[str, capacity.Series] = field(repr=False, default_factory=dict)
    wanted: dict[str, capacity.Series] = field(repr=False, default_factory=dict)
    trace_sha256: str = ""

    @classmethod
    def of(cls, result: RunResult, at_ms: int) -> Outcome:
        after = [ev for ev in result.trace if ev.t_ms >= at_ms]
        end = result.virtual_ms
        want = capacity.wanted(result.scenario, result.trace)
        serve = capacity.serving(result.trace, list(want))
        whole = capacity.whole_again(serve, want, at_ms, end)
        short = tuple(
            capacity.shortfall(serve[m], want.get(m, [(0, 0)]), at_ms, end, m)
            for m in sorted(serve)
        )
        sent = {m: sum(1 for t in ts if t >= at_ms) for m, ts in (result.sent_at or {}).items()}
        failed = {m: sum(1 for t in ts if t >= at_ms) for m, ts in (result.failed_at or {}).items()}
        return cls(
            seed=result.seed,
            failed=sum(1 for ev in after if ev.kind == "replica.failed"),
            moved=sum(1 for ev in after if ev.kind == "replica.moved"),
            placed=sum(1 for ev in after if ev.kind == "replica.placed"),
            engines_started=sum(1 for t in result.engine_starts_by_ms if t >= at_ms),
            whole_after_ms=None if whole is None else whole - at_ms,
            short=short,
            requests_sent=sent,
            requests_failed=failed,
            unplaceable=_unplaceable(result),
            drains=_drains(after, at_ms),
            serving=serve,
            wanted=want,
            trace_sha256=result.trace_sha256,
        )


def _unplaceable(result: RunResult) -> tuple[tuple[str, str, int], ...]:
    """Replicas whose last word in the trace is `replica.unplaceable`, by model and reason."""
    last: dict[str, tuple[str, str, str]] = {}
    for ev in result.trace:
        rid = ev.get("replica")
        if rid is None or not ev.kind.startswith("replica."):
            continue
        last[str(rid)] = (ev.kind, str(ev.get("model")), str(ev.get("reason") or ""))
    groups: dict[tuple[str, str], int] = {}
    for kind, model, reason in last.values():
        if kind == "replica.unplaceable":
            groups[(model, reason)] = groups.get((model, reason), 0) + 1
    return tuple((m, r, n) for (m, r), n in sorted(groups.items()))


def _drains(after: list[TraceEvent], at_ms: int) -> tuple[tuple[str, int | None], ...]:
    began: dict[str, int | None] = {}
    for ev in after:
        node = str(ev.get("node"))
        if ev.kind == "node.draining":
            began[node] = None
        elif ev.kind == "node.drained" and node in began:
            began[node] = ev.t_ms - at_ms
    return tuple(sorted(began.items()))


def _whole(ms: int | None) -> str:
    if ms is None:
        return "not by the end"
    return "never short" if ms == 0 else f"+{fmt_duration(ms)}"


def _spread(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def render(outcomes: list[Outcome], at_ms: int, end_ms: int, headline: str) -> str:
    lines = [headline, ""]
    models = sorted({m for o in outcomes for m in o.requests_sent})
    head = (
        f"{'seed':>6} {'failed':>7} {'moved':>6} {'placed':>7} {'engines':>8}  {'whole again':<15}"
    )
    head += "".join(f" {'failed ' + m:>14}" for m in models)
    lines.append(head.rstrip())
    for o in outcomes:
        row = f"{o.seed:>6} {o.failed:>7} {o.moved:>6} {o.placed:>7} {o.engines_started:>8}  "
        row += f"{_whole(o.whole_after_ms):<15}"
        row += "".join(
            f" {o.requests_failed.get(m, 0):>6} of {o.requests_sent.get(m, 0):<6}" for m in models
        )
        lines.append(row.rstrip())
    if len(outcomes) > 1:
        lines.append(
            f"{'all':>6} {_spread([o.failed for o in outcomes]):>7} "
            f"{_spread([o.moved for o in outcomes]):>6} {_spread([o.placed for o in outcomes]):>7} "
            f"{_spread([o.engines_started for o in outcomes]):>8}  "
            f"{_worst_whole(outcomes)}"
        )
    lines += [
        "",
        f"capacity: replicas serving per model, the least of {len(outcomes)} seed(s) at each "
        f"instant, from the actions (+0s) to +{fmt_duration(end_ms - at_ms)} "
        "(a full block: the count it wants)",
    ]
    for model in sorted(outcomes[0].serving):
        serve = capacity.least_of([o.serving[model] for o in outcomes])
        want = outcomes[0].wanted.get(model, [(0, 0)])
        spark = capacity.sparkline(serve, want, at_ms, end_ms, SPARK_WIDTH)
        worst = min(
            (s for o in outcomes for s in o.short if s.model == model),
            key=lambda s: (s.least, -s.short_ms),
        )
        short = max(s.short_ms for o in outcomes for s in o.short if s.model == model)
        when = fmt_duration(worst.least_at_ms - at_ms)
        note = f"least {worst.least} of {worst.wanted_then} at +{when}" + (
            f", short of its count for up to {fmt_duration(short)}" if short else ", never short"
        )
        lines.append(f"  {model:<16} |{spark}| {note}")
    drains = sorted({node for o in outcomes for node, _ in o.drains})
    for node in drains:
        took = [dict(o.drains).get(node) for o in outcomes]
        done = [d for d in took if d is not None]
        if len(done) == len(took):
            lines.append(f"drain of {node}: done by +{fmt_duration(max(done))}")
        else:
            lines.append(
                f"drain of {node}: NOT done by the end in {len(took) - len(done)} of "
                f"{len(took)} seed(s) (its replicas have nowhere to go: see unplaceable)"
            )
    stuck = sorted({u for o in outcomes for u in o.unplaceable})
    lines.append("")
    if not stuck:
        lines.append("unplaceable at the end: none")
    else:
        lines.append("unplaceable at the end (model: replicas, the controller's reason):")
        for model, reason, n in stuck:
            lines.append(f"  {model}: {n}, {reason or 'no reason given'}")
    return "\n".join(lines)


def _worst_whole(outcomes: list[Outcome]) -> str:
    if any(o.whole_after_ms is None for o in outcomes):
        return "not by the end (some seed)"
    worst = max(o.whole_after_ms or 0 for o in outcomes)
    return "never short" if worst == 0 else f"by +{fmt_duration(worst)}"


def as_json(o: Outcome) -> dict[str, Any]:
    return {
        "seed": o.seed,
        "trace_sha256": o.trace_sha256,
        "replicas_failed": o.failed,
        "replicas_moved": o.moved,
        "replicas_placed": o.placed,
        "engines_started": o.engines_started,
        "whole_again_after_ms": o.whole_after_ms,
        "models": {
            s.model: {
                "least_serving": s.least,
                "least_at_ms": s.least_at_ms,
                "wanted_then": s.wanted_then,
                "short_ms": s.short_ms,
                "serving": [list(p) for p in o.serving[s.model]],
                "wanted": [list(p) for p in o.wanted.get(s.model, [(0, 0)])],
            }
            for s in o.short
        },
        "requests": {
            m: {"sent": n, "failed": o.requests_failed.get(m, 0)}
            for m, n in sorted(o.requests_sent.items())
        },
        "unplaceable": [{"model": m, "reason": r, "replicas": n} for m, r, n in o.unplaceable],
        "drains": [{"node": n, "drained_after_ms": d} for n, d in o.drains],
    }
