"""The twin's cost in steady state, side by side with bare SimPy running the same heartbeat
pattern, and the control core's own cost, in one run.

    .venv/bin/python benchmarks/twin.py [--nodes 100,1000,10000] [--virtual 10m,1h,24h]
                                        [--repeats 3] [--budget 120]
                                        [--no-baseline] [--json FILE]

1. A steady fleet (8-GPU nodes in fabrics of 100, 95% of the GPUs held by 2-node replicas, no
   faults) for each size and virtual time: the twin's wall time (bulk heartbeats, the default),
   min and median of the repeats, beside the same twin with one event per heartbeat (once,
   skipped on budget as below), and against bare SimPy on exactly the twin's heartbeat
   pattern: every node beats at a seeded phase in (0, interval], each beat is delivered after
   the control latency (2 ms), and a 1 s reconcile tick runs; no control logic. The twin and
   bare SimPy run in turn, one of each per repeat, so a slow spell of the machine falls on
   both. Printed with the ratio (of the two minimums) and the speed over real time.
   A run whose estimate (from the last smaller run of the same size) exceeds `--budget`
   seconds is skipped and its estimate printed.
2. The control core alone at 1,000 and 10,000 nodes: one steady tick, one placement, and the
   placement of a whole fleet's worth of replicas.
3. Peak memory per node of the twin run (tracemalloc, 10 minutes virtual, once per size).
4. How each cost grows from one size to the next.

`--no-baseline` runs the twin alone (no per-beat run, no bare SimPy: at 10,000 nodes a bare
SimPy day takes about nine minutes). `--json FILE` writes the fleet rows there as well, for
`benchmarks/all.py` to judge.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import simpy

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import (
    Deployment,
    ModelName,
    NodeId,
    ProfileName,
    ShardReport,
    ShardState,
    Timings,
)
from llmgw_twin.control.protocol import ApplyDeployment, ApplyProfile, Heartbeat, NodeRegistered
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.world.runner import run_scenario
from llmgw_twin.units import fmt_duration, parse_duration

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_progress import step
from fleet import fleet_scenario

CONTROL_LATENCY_MS = 2
"""Node to management switch to controller, as the twin's network has it."""


def steady(nodes: int, virtual_ms: int) -> Scenario:
    scenario = fleet_scenario(nodes, max(1, virtual_ms // 60_000))
    return replace(scenario, faults=(), duration_ms=virtual_ms)


def twin_seconds(scenario: Scenario, bulk: bool = True) -> float:
    start = time.perf_counter()
    result = run_scenario(scenario, bulk=bulk)
    took = time.perf_counter() - start
    assert result.passed, "the steady fleet must pass its invariants"
    return took


def bare_seconds(nodes: int, virtual_ms: int, timings: Timings, seed: int) -> float:
    """Bare SimPy, the same pattern: seeded phases, one delivery per beat, a 1 s tick."""
    env = simpy.Environment()
    rng = random.Random(seed)
    interval = timings.heartbeat_interval_ms

    def delivered(_ev: simpy.Event) -> None:
        return None

    def node(phase: int) -> simpy.events.ProcessGenerator:
        yield env.timeout(phase)
        while True:
            env.timeout(CONTROL_LATENCY_MS).callbacks.append(delivered)
            yield env.timeout(interval)

    def tick() -> simpy.events.ProcessGenerator:
        while True:
            yield env.timeout(timings.reconcile_interval_ms)

    for _ in range(nodes):
        env.process(node(rng.randrange(1, interval + 1)))
    env.process(tick())
    start = time.perf_counter()
    env.run(until=virtual_ms + 1)
    return time.perf_counter() - start


def repeat(fn: Callable[[], float], times: int) -> tuple[float, float]:
    return summary([clean(fn) for _ in range(times)])


def summary(runs: list[float]) -> tuple[float, float]:
    return min(runs), statistics.median(runs)


def clean(fn: Callable[[], float]) -> float:
    """`fn` timed after the garbage of what ran before it is collected: a run's world is freed
    by the cycle collector, and a run timed after another would otherwise pay for walking its
    predecessor's (a tenth of a 1,000-node hour). The standard library's `timeit` keeps the
    collector off while it times for the same reason; both sides here are measured alike."""
    gc.collect()
    return fn()


def fleet_rows(
    sizes: list[int], virtuals: list[int], repeats: int, budget: float, baseline: bool = True
) -> list[dict[str, object]]:
    """Print the steady fleet's rows; return them as data (seconds; None where not run)."""
    rows: list[dict[str, object]] = []
    print("steady fleet: twin against bare SimPy on the same heartbeat pattern")
    print(
        f"{'nodes':>7} {'virtual':>8} {'twin min / median':>22} {'per-beat':>9} "
        f"{'bare min / median':>22} {'twin/bare':>9} {'x real time':>12}"
    )
    for nodes in sizes:
        per_virtual_ms: float | None = None  # twin seconds per virtual ms, last run of this size
        per_beat_rate: float | None = None
        previous: float | None = None
        for virtual in virtuals:
            label = fmt_duration(virtual)
            if per_virtual_ms is not None and per_virtual_ms * virtual * repeats > budget:
                estimate = per_virtual_ms * virtual
                print(f"{nodes:>7} {label:>8}   skipped: about {estimate:.0f} s a run")
                rows.append({"nodes": nodes, "virtual_ms": virtual, "skipped": True})
                continue
            scenario = steady(nodes, virtual)
            twin_fn = partial(twin_seconds, scenario)
            bare_fn = partial(bare_seconds, nodes, virtual, scenario.timings, scenario.seed)
            if baseline:  # side by side, a run of each in turn: a slow spell hits both
                step(
                    f"steady fleet, {nodes} nodes, {label} virtual: twin and bare SimPy x{repeats}"
                )
                pairs = [(clean(twin_fn), clean(bare_fn)) for _ in range(repeats)]
                twin = summary([t for t, _ in pairs])
                bare: tuple[float, float] | None = summary([b for _, b in pairs])
            else:
                step(f"steady fleet, {nodes} nodes, {label} virtual: the twin x{repeats}")
                twin, bare = repeat(twin_fn, repeats), None
            beat, beat_s = "skipped" if baseline else "not run", None
            if baseline and (per_beat_rate is None or per_beat_rate * virtual <= budget):
                step(f"steady fleet, {nodes} nodes, {label} virtual: one event per heartbeat")
                beat_s = clean(partial(twin_seconds, scenario, bulk=False))
                per_beat_rate = beat_s / virtual
                beat = f"{beat_s:.2f} s"
            growth = f" (x{twin[0] / previous:.1f} over the last)" if previous else ""
            bare_text = (
                f"{bare[0]:>9.2f} s / {bare[1]:>7.2f} s {twin[0] / bare[0]:>9.2f}"
                if bare is not None
                else f"{'not run':>22} {'':>9}"
            )
            print(
                f"{nodes:>7} {label:>8} {twin[0]:>9.2f} s / {twin[1]:>7.2f} s {beat:>9} "
                f"{bare_text} {virtual / 1000 / twin[0]:>11.0f}x{growth}"
            )
            rows.append(
                {
                    "nodes": nodes,
                    "virtual_ms": virtual,
                    "twin_min_s": twin[0],
                    "twin_median_s": twin[1],
                    "per_beat_s": beat_s,
                    "bare_min_s": bare[0] if bare else None,
                    "bare_median_s": bare[1] if bare else None,
                }
            )
            per_virtual_ms = twin[0] / virtual
            previous = twin[0]
    print()
    return rows


def up_reports(ctl: Controller, node: NodeId) -> tuple[ShardReport, ...]:
    return tuple(
        ShardReport(
            s,
            ShardState.SERVING if s.rank == 0 else ShardState.RUNNING,
            f"http://{s.node}:{8000 + s.gpus[0]}" if s.rank == 0 else None,
            None,
            (),
        )
        for s in ctl.assigned(node)
    )


def core_rows(sizes: list[int], repeats: int) -> None:
    print("control core alone (min / median)")
    print(f"{'nodes':>7} {'steady tick':>20} {'one placement':>20} {'whole fleet placed':>22}")
    for nodes in sizes:
        step(f"control core alone, {nodes} nodes")
        rows = core_row(nodes, repeats)
        print(
            f"{nodes:>7} "
            + " ".join(f"{ms(a):>9} / {ms(b):>8}" for a, b in rows[:2])
            + f" {ms(rows[2][0]):>10} / {ms(rows[2][1]):>9}"
        )
    print()


def core_row(nodes: int, repeats: int) -> list[tuple[float, float]]:
    scenario = fleet_scenario(nodes, 10)
    profile = scenario.profiles[0]
    want = scenario.deployments[0].replicas

    def fleet(replicas: int) -> Controller:
        ctl = Controller(scenario.timings)
        ctl.handle(ApplyProfile(profile), 0)
        ctl.handle(ApplyDeployment(Deployment(ModelName("m"), profile.name, replicas)), 0)
        for info in scenario.nodes:
            ctl.handle(NodeRegistered(info), 0)
        return ctl

    def whole() -> float:
        ctl = fleet(want)
        start = time.perf_counter()
        ctl.tick(1_000)
        return time.perf_counter() - start

    placed = fleet(want)
    placed.tick(1_000)
    for info in scenario.nodes:
        placed.handle(Heartbeat(info.node, up_reports(placed, info.node)), 2_000)
    placed.tick(3_000)
    clock = [3_000]

    def steady_tick() -> float:
        clock[0] += 1_000
        start = time.perf_counter()
        placed.tick(clock[0])
        return time.perf_counter() - start

    def one() -> float:
        clock[0] += 1_000
        name = ModelName(f"one-{clock[0]}")
        placed.handle(ApplyDeployment(Deployment(name, ProfileName(profile.name), 1)), 0)
        start = time.perf_counter()
        placed.tick(clock[0])
        return time.perf_counter() - start

    return [repeat(fn, repeats) for fn in (steady_tick, one, whole)]


def memory_rows(sizes: list[int]) -> None:
    print("peak memory of a 10-minute twin run (tracemalloc)")
    for nodes in sizes:
        step(f"peak memory, {nodes} nodes, 10 min virtual")
        tracemalloc.start()
        run_scenario(steady(nodes, 600_000))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"{nodes:>7} nodes: {peak / 2**20:8.1f} MiB, {peak / nodes / 1024:6.1f} KiB per node")
    print()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,1000,10000")
    parser.add_argument("--virtual", default="10m,1h,24h")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--no-baseline", action="store_true", help="the twin alone")
    parser.add_argument("--json", type=Path, help="write the fleet rows to this file")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    virtuals = [parse_duration(v) for v in args.virtual.split(",")]
    rows = fleet_rows(sizes, virtuals, args.repeats, args.budget, not args.no_baseline)
    if args.json is not None:
        args.json.write_text(json.dumps({"fleet": rows}, indent=1) + "\n")
    core_rows([n for n in sizes if n >= 1000], args.repeats)
    memory_rows([n for n in sizes if n <= 1000])


if __name__ == "__main__":
    main()
