"""A sweep's grid: settings to vary over one scenario file, and the scenario of each point.

Role: `--grid KEY=V1,V2,...` (repeatable) names what to vary; `points` is the cross product in
the order given (the first key varies slowest); `scenario_text` is the file with one point's
values set. A key is a control-plane timing (`heartbeat_interval`, `node_lost_after`, any key
`timings` takes), `replicas.MODEL` (the deployment's count), `rate.MODEL` (a traffic item's
rate: `5/s`), or `target.MODEL` (an autoscaled deployment's target). Every point's scenario is
loaded (checked) before anything runs, so a value the loader refuses is one error naming the
point, not a failure halfway through.

Invariants:
- A point is a tuple of (key, value text) in grid order; its label is `key=value, ...`.
- The scenario of a point differs from the file only in the keys the grid names.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import yaml

from llmgw_twin.control.model import Timings
from llmgw_twin.units import setting_keys

MAX_POINTS = 1_000
"""Grid points one sweep may have (each runs once per seed)."""
TIMING_KEYS = {k.key for k in setting_keys(Timings)}


class GridError(ValueError):
    """A grid that cannot be swept: one line, why."""


@dataclass(frozen=True, slots=True)
class Axis:
    key: str
    values: tuple[str, ...]


Point = tuple[tuple[str, str], ...]


def parse_axis(text: str) -> Axis:
    key, found, rest = text.partition("=")
    values = tuple(v.strip() for v in rest.split(",") if v.strip())
    if not found or not key or not values:
        raise GridError(f"--grid {text!r}: expected KEY=V1,V2,... (heartbeat_interval=1s,2s,5s)")
    key = key.strip()
    kind, _, model = key.partition(".")
    if key not in TIMING_KEYS and not (kind in ("replicas", "rate", "target") and model):
        raise GridError(
            f"--grid {key}: not a key a sweep varies (a timing such as heartbeat_interval or "
            "node_lost_after, replicas.MODEL, rate.MODEL, or target.MODEL)"
        )
    if len(set(values)) != len(values):
        raise GridError(f"--grid {key}: a value is listed twice")
    return Axis(key, values)


def points(axes: list[Axis]) -> list[Point]:
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        raise GridError("--grid: a key is given twice")
    grid = [
        tuple(zip(keys, combo, strict=True))
        for combo in itertools.product(*(a.values for a in axes))
    ]
    if len(grid) > MAX_POINTS:
        raise GridError(f"--grid: {len(grid):,} points, more than the {MAX_POINTS:,} a sweep runs")
    return grid


def label(point: Point) -> str:
    return ", ".join(f"{k}={v}" for k, v in point)


def scenario_text(data: dict[str, Any], point: Point) -> str:
    """The file's scenario (`data`, as YAML loaded it) with the point's values set."""
    out = dict(data)
    for key, value in point:
        kind, _, model = key.partition(".")
        if key in TIMING_KEYS:
            out["timings"] = {**(out.get("timings") or {}), key: value}
        elif kind == "target":
            deps = [dict(d) for d in out.get("deployments") or []]
            hits = [d for d in deps if d.get("model") == model and d.get("autoscale")]
            if not hits:
                raise GridError(f"--grid {key}: the file does not autoscale a model '{model}'")
            for d in hits:
                d["autoscale"] = {**d["autoscale"], "target": value}
            out["deployments"] = deps
        elif kind == "replicas":
            deps = [dict(d) for d in out.get("deployments") or []]
            hits = [d for d in deps if d.get("model") == model]
            if not hits:
                raise GridError(f"--grid {key}: the file deploys no model '{model}'")
            for d in hits:
                d["replicas"] = int(value) if value.isdigit() else value
            out["deployments"] = deps
        else:
            given = out.get("traffic")
            items = given if isinstance(given, list) else [given] if given else []
            items = [dict(t) for t in items]
            hits = [t for t in items if t.get("model") == model]
            if not hits:
                raise GridError(f"--grid {key}: the file sends no traffic to '{model}'")
            for t in hits:
                t["rate"] = value
            out["traffic"] = items
    return yaml.safe_dump(out, sort_keys=False)
