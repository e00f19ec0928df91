"""The control decisions a log shows in a window, as expectations, and the twin's against them.

Role: `decisions(...)` picks the window's decisions -- `node.lost`, `replica.failed`,
`replica.reaped`, `replica.placed`, `replica.moved`, `replica.unplaceable`, `node.drained` --
each with the subjects that say what was decided (a replica's id only where it was live at the
window's start: the twin numbers the replicas it makes itself). `expectations(...)` writes each
as an event expectation `within` the tolerance around its time; `compare(...)` matches the twin's
trace against them one to one (nearest in time, within the tolerance) and says, for each logged
decision the twin did not make, what it did instead where it can tell.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.units import fmt_duration

FILTERS: dict[str, tuple[str, ...]] = {
    "node.lost": ("node",),
    "replica.failed": ("model", "node"),
    "replica.reaped": ("model", "fabric"),
    "replica.placed": ("model", "fabric"),
    "replica.moved": ("model", "fabric"),
    "replica.unplaceable": ("model",),
    "node.drained": ("node",),
}
"""Each pinned decision kind and the subjects that say what was decided."""
NAMED = frozenset(("replica.failed", "replica.reaped", "replica.moved"))
"""Kinds whose replica is named, where it was live at the window's start."""


@dataclass(frozen=True, slots=True)
class Decision:
    t_ms: int  # from the window's start
    kind: str
    filters: tuple[tuple[str, str], ...]

    def matches(self, ev: TraceEvent) -> bool:
        return ev.kind == self.kind and all(str(ev.get(k)) == v for k, v in self.filters)

    def text(self) -> str:
        subjects = " ".join(f"{k}={v}" for k, v in self.filters)
        return f"{self.kind} {subjects} at +{fmt_duration(self.t_ms)}"


def decisions(window: list[TraceEvent], start_ms: int, start_ids: set[str]) -> list[Decision]:
    out: list[Decision] = []
    for ev in window:
        keys = FILTERS.get(ev.kind)
        if keys is None:
            continue
        pairs = [(k, str(ev.get(k))) for k in keys if ev.get(k) is not None]
        rid = str(ev.get("replica"))
        if ev.kind in NAMED and rid in start_ids:
            pairs.append(("replica", rid))
        out.append(Decision(max(0, ev.t_ms - start_ms), ev.kind, tuple(sorted(pairs))))
    return out


def expectations(logged: list[Decision], tolerance_ms: int) -> list[dict[str, object]]:
    seen: set[tuple[object, ...]] = set()
    out: list[dict[str, object]] = []
    for d in logged:
        lo, hi = max(0, d.t_ms - tolerance_ms), d.t_ms + tolerance_ms
        key = (d.kind, d.filters, lo, hi)
        if key in seen:
            continue
        seen.add(key)
        item: dict[str, object] = {"event": d.kind, **dict(d.filters)}
        item["within"] = [fmt_duration(lo), fmt_duration(hi)]
        out.append(item)
    return out


def compare(
    logged: list[Decision], trace: tuple[TraceEvent, ...], tolerance_ms: int, end_ms: int
) -> tuple[list[str], list[str]]:
    """(each logged decision the twin did not make, with why where known; each decision the
    twin made in the window that the log does not show)."""
    theirs = [ev for ev in trace if ev.kind in FILTERS]
    by_kind: dict[str, list[int]] = {}  # indexes into `theirs`, in time order
    for i, ev in enumerate(theirs):
        by_kind.setdefault(ev.kind, []).append(i)
    used: set[int] = set()
    missed: list[str] = []
    for d in sorted(logged, key=lambda d: d.t_ms):
        mine = by_kind.get(d.kind, [])
        lo = bisect.bisect_left(mine, d.t_ms - tolerance_ms, key=lambda i: theirs[i].t_ms)
        hi = bisect.bisect_right(mine, d.t_ms + tolerance_ms, key=lambda i: theirs[i].t_ms)
        near = [i for i in mine[lo:hi] if i not in used and d.matches(theirs[i])]
        if near:
            used.add(min(near, key=lambda i: abs(theirs[i].t_ms - d.t_ms)))
            continue
        missed.append(f"{d.text()}: {_why(d, theirs, used)}")
    extra = [
        _event_text(ev)
        for i, ev in enumerate(theirs)
        if i not in used and ev.t_ms <= end_ms + tolerance_ms
    ]
    return missed, extra


def _why(d: Decision, theirs: list[TraceEvent], used: set[int]) -> str:
    same = [i for i, ev in enumerate(theirs) if d.matches(ev)]
    free = [i for i in same if i not in used]
    if free:
        ev = theirs[min(free, key=lambda i: abs(theirs[i].t_ms - d.t_ms))]
        gap = ev.t_ms - d.t_ms
        sign = "later" if gap > 0 else "earlier"
        return f"the twin made it {fmt_duration(abs(gap))} {sign}, outside the tolerance"
    if same:
        return f"the twin made fewer: each of its {len(same)} answers another logged one"
    wanted = dict(d.filters)
    kin = [
        ev
        for i, ev in enumerate(theirs)
        if i not in used
        and ev.kind == d.kind
        and abs(ev.t_ms - d.t_ms) <= 60_000
        and any(str(ev.get(k)) == v for k, v in wanted.items() if k in ("model", "node"))
    ]
    if kin:
        ev = min(kin, key=lambda e: abs(e.t_ms - d.t_ms))
        diffs = [
            f"{k}={ev.get(k)} (the log: {v})" for k, v in wanted.items() if str(ev.get(k)) != v
        ]
        return f"the twin decided differently at +{fmt_duration(ev.t_ms)}: {', '.join(diffs)}"
    return f"the twin made no such {d.kind}"


def _event_text(ev: TraceEvent) -> str:
    keys = FILTERS[ev.kind] + ("replica",)
    subjects = " ".join(f"{k}={ev.get(k)}" for k in keys if ev.get(k) is not None)
    return f"{ev.kind} {subjects} at +{fmt_duration(ev.t_ms)}"
