"""Placement and defragmentation: what they cost at 1,000 and 10,000 nodes, and how close
placement comes to the optimum, side by side with the greedy placer it replaced
(`benchmarks/greedy_baseline.py`), in one run.

    .venv/bin/python benchmarks/placement.py [--repeats 3] [--instances 400]

1. One placement pass over 100 and 1,000 pending replicas of mixed shapes (1 to 4 nodes x 1
   to 8 GPUs, 20 deployments) on fleets of 8-GPU nodes in fabrics of 32: whole-set placement
   (`passes.plan_pass`, then booking) against the greedy placer, min and median of the repeats,
   and the growth from one size to the next.
2. One defragmentation plan (`defrag_plan.plan_moves`) on a fleet where every node holds a 1x4
   replica and a 2x8 one is pending: two moves make room, found among every fabric's replicas.
3. The random instances of the placement oracle (tests/helpers/placement_oracle.py) placed all
   at once: placed GPUs against the CP-SAT optimum, whole-set placement and greedy on the same
   instances; then the instances whose deployments arrive one after another, run in the twin
   with defragmentation on and off.
4. With `--topology`: the same for profiles with topology rules (one NVLink domain, the fewest
   leaves; tests/helpers/topology_oracle.py): small instances against the exact optimum, and
   fleets of 1,000 nodes (4- and 8-GPU nodes in NVLink domains of 18) against an upper bound of
   the optimum, at loads from 0.8 to 1.5 times the fleet's GPUs.

Needs the dev dependencies (OR-tools).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from llmgw_twin.control.defrag_plan import Movable, plan_moves
from llmgw_twin.control.model import (
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaId,
)
from llmgw_twin.control.passes import plan_pass
from llmgw_twin.control.placement import CapacityIndex, Placement
from llmgw_twin.control.replicas import ReplicaRecord, ReplicaTable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from bench_progress import step, steps
from greedy_baseline import GreedyIndex
from helpers.placement_oracle import instance, judge, optimum

FABRIC_SIZE = 32
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (4, 8), (1, 4), (1, 2), (2, 2))
SIM = EngineName("sim")


def infos(nodes: int, gpus: tuple[int, ...] = (8,)) -> list[NodeInfo]:
    return [
        NodeInfo(
            NodeId(f"n{i:05d}"),
            FabricId(f"ib-{i // FABRIC_SIZE:04d}"),
            gpus[i % len(gpus)],
            81920,
            (SIM,),
        )
        for i in range(nodes)
    ]


def pending(count: int, seed: int = 0) -> list[ReplicaRecord]:
    rng = random.Random(seed)
    shapes = [SHAPES[rng.randrange(len(SHAPES))] for _ in range(20)]
    out = []
    for i in range(count):
        m = i % 20
        n, g = shapes[m]
        profile = Profile(ProfileName(f"p{m}"), SIM, n, g, f"/models/m{m}", 20_000)
        out.append(ReplicaRecord(ReplicaId(f"m{m}-r{i}"), ModelName(f"m{m}"), profile, i, 0))
    return out


def new_index(fleet: list[NodeInfo]) -> CapacityIndex:
    idx = CapacityIndex()
    for info in fleet:
        idx.add_node(info)
        idx.set_schedulable(info.node, True)
    return idx


def place_whole_set(fleet: list[NodeInfo], todo: list[ReplicaRecord]) -> tuple[float, int]:
    idx = new_index(fleet)
    start = time.perf_counter()
    plan = plan_pass(idx, todo, ReplicaTable(), lambda _p: frozenset())
    gpus = 0
    for rec, result in plan:
        if isinstance(result, Placement):
            for node, held in zip(result.nodes, result.gpus, strict=True):
                idx.book(node, held)
            gpus += rec.profile.nodes * rec.profile.gpus_per_node
    return time.perf_counter() - start, gpus


def place_greedy(fleet: list[NodeInfo], todo: list[ReplicaRecord]) -> tuple[float, int]:
    idx = GreedyIndex()
    for info in fleet:
        idx.add_node(info)
    per: dict[ModelName, dict[FabricId, int]] = {}
    start = time.perf_counter()
    gpus = 0
    for rec in todo:
        spread = per.setdefault(rec.model, {})
        result = idx.place(rec.profile, spread)
        if isinstance(result, Placement):
            for node, held in zip(result.nodes, result.gpus, strict=True):
                idx.book(node, held)
            spread[result.fabric] = spread.get(result.fabric, 0) + 1
            gpus += rec.profile.nodes * rec.profile.gpus_per_node
    return time.perf_counter() - start, gpus


Placer = Callable[[list[NodeInfo], list[ReplicaRecord]], tuple[float, int]]


def seconds_of(placer: Placer, fleet: list[NodeInfo], todo: list[ReplicaRecord]) -> float:
    return placer(fleet, todo)[0]


def timed(fn: Callable[[], float], repeats: int) -> tuple[float, float]:
    runs = [fn() for _ in range(repeats)]
    return min(runs), statistics.median(runs)


def defrag_plan(nodes: int) -> float:
    fleet = infos(nodes)
    idx = new_index(fleet)
    small = Profile(ProfileName("small"), SIM, 1, 4, "/models/small", 20_000)
    movable = []
    for info in fleet:
        idx.book(info.node, (0, 1, 2, 3))
        held = ((info.node, (0, 1, 2, 3)),)
        movable.append(Movable(ReplicaId(f"s-{info.node}"), small, info.fabric, held, frozenset()))
    big = Profile(ProfileName("big"), SIM, 2, 8, "/models/big", 20_000)
    order = list(idx.fabrics())
    start = time.perf_counter()
    plan = plan_moves(idx, big, frozenset(), movable, 4, order, 2)
    took = time.perf_counter() - start
    assert plan is not None and len(plan.moves) == 2
    return took


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def scale(repeats: int) -> None:
    print("placement pass (min / median of", repeats, "runs)")
    print(f"{'nodes':>7} {'pending':>8} {'whole-set':>22} {'greedy':>22} {'GPUs placed':>22}")
    results: dict[tuple[int, int], tuple[float, float]] = {}
    for nodes in (1_000, 10_000):
        fleet = infos(nodes)
        for count in (100, 1_000):
            step(f"placement pass, {nodes} nodes, {count} pending")
            todo = pending(count)
            new_gpus = place_whole_set(fleet, todo)[1]
            old_gpus = place_greedy(fleet, todo)[1]
            new = timed(partial(seconds_of, place_whole_set, fleet, todo), repeats)
            old = timed(partial(seconds_of, place_greedy, fleet, todo), repeats)
            results[nodes, count] = (new[0], old[0])
            print(
                f"{nodes:>7} {count:>8} {ms(new[0]):>10} / {ms(new[1]):>9} "
                f"{ms(old[0]):>10} / {ms(old[1]):>9} {new_gpus:>10} vs {old_gpus:<9}"
            )
    for count in (100, 1_000):
        a, b = results[1_000, count], results[10_000, count]
        print(
            f"growth 1k -> 10k nodes at {count} pending: whole-set x{b[0] / a[0]:.1f}, "
            f"greedy x{b[1] / a[1]:.1f}"
        )
    for nodes in (1_000, 10_000):
        a, b = results[nodes, 100], results[nodes, 1_000]
        print(
            f"growth 100 -> 1000 pending at {nodes} nodes: whole-set x{b[0] / a[0]:.1f}, "
            f"greedy x{b[1] / a[1]:.1f}"
        )
    print()
    print("defragmentation plan (2x8 pending, every node holding a 1x4; min / median)")
    for nodes in (1_000, 10_000):
        step(f"defragmentation plan, {nodes} nodes")
        low, mid = timed(partial(defrag_plan, nodes), repeats)
        print(f"{nodes:>7} nodes: {ms(low)} / {ms(mid)}")
    print()


def quality(count: int) -> None:
    at_once = [0, 0, 0, 0, 0]  # instances, whole-set optimal, greedy optimal, GPUs new, old
    best_gpus = 0
    for seed in steps(range(count), count, "instances against the CP-SAT optimum"):
        inst = instance(seed)
        best = optimum(inst.fabrics, inst.gangs)
        fleet = [
            NodeInfo(NodeId(n), FabricId(f), g, 81920, (SIM,)) for n, f, g in inst.node_names()
        ]
        todo = []
        for gang in inst.gangs:
            profile = Profile(ProfileName(f"p-{gang.model}"), SIM, gang.nodes, gang.gpus, "/m")
            for r in range(gang.replicas):
                rid = ReplicaId(f"{gang.model}-r{r + 1}")
                todo.append(ReplicaRecord(rid, ModelName(gang.model), profile, r + 1, 0))
        new = place_whole_set(fleet, todo)[1]
        old = place_greedy(fleet, todo)[1]
        at_once[0] += 1
        at_once[1] += new == best[0]
        at_once[2] += old == best[0]
        at_once[3] += new
        at_once[4] += old
        best_gpus += best[0]
    n = at_once[0]
    print(f"{n} random instances placed at once, against the CP-SAT optimum (placed GPUs):")
    print(
        f"  whole-set: optimal on {at_once[1]} ({100 * at_once[1] / n:.1f}%), "
        f"GPUs {100 * at_once[3] / best_gpus:.2f}% of the optimum's"
    )
    print(
        f"  greedy:    optimal on {at_once[2]} ({100 * at_once[2] / n:.1f}%), "
        f"GPUs {100 * at_once[4] / best_gpus:.2f}% of the optimum's"
    )
    staggered = [s for s in range(count) if instance(s).staggered]
    for label, extra in (("on", ""), ("off", "defrag_max_moves: 0")):
        optimal = 0
        got = best_sum = 0
        what = f"staggered instances in the twin, defragmentation {label}"
        for seed in steps(staggered, len(staggered), what):
            phases, _ = judge(instance(seed), extra)
            optimal += all(p.optimal for p in phases)
            got += sum(p.got[0] for p in phases)
            best_sum += sum(p.best[0] for p in phases)
        print(
            f"{len(staggered)} of them arriving one after another, in the twin, "
            f"defragmentation {label}: optimal on {optimal} "
            f"({100 * optimal / len(staggered):.1f}%), GPUs {100 * got / best_sum:.2f}%"
        )


def topology(count: int) -> None:
    from helpers import topology_oracle as topo

    got = best = optimal = 0
    for seed in steps(range(count), count, "topology instances against the CP-SAT optimum"):
        inst = topo.instance(seed)
        mine, ideal = topo.placed(inst.nodes, inst.gangs)[0], topo.optimum(inst)
        got, best, optimal = got + mine[0], best + ideal[0], optimal + (mine[:3] == ideal[:3])
    print(f"{count} random instances with topology rules, placed at once:")
    print(f"  optimal on {optimal} ({100 * optimal / count:.1f}%), GPUs {100 * got / best:.2f}%")
    print("1,000 nodes with topology rules, against an upper bound of the optimum:")
    for seed, load in ((0, 0.8), (1, 1.0), (2, 1.2), (3, 1.5)):
        step(f"1,000 nodes, load {load}")
        nodes, gangs = topo.large(1000, seed, load)
        start = time.perf_counter()
        placed = topo.placed(nodes, gangs)[0][0]
        took = time.perf_counter() - start
        upper = topo.bound(nodes, gangs, seconds=60)
        replicas = sum(g.replicas for g in gangs)
        print(
            f"  load {load}: {replicas} replicas, placed {placed} GPUs of a bound of {upper} "
            f"({100 * placed / upper:.2f}%), pass {ms(took)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--instances", type=int, default=400)
    parser.add_argument(
        "--topology", action="store_true", help="only the topology rules' quality (part 4)"
    )
    args = parser.parse_args()
    if args.topology:
        topology(args.instances)
        return
    scale(args.repeats)
    quality(args.instances)


if __name__ == "__main__":
    main()
