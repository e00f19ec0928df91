"""Random small placement instances, the exact optimum of each (OR-tools CP-SAT), and what the
controller makes of the same instance in the twin.

An instance is a fleet (up to 12 nodes in up to 3 fabrics, 2, 4 or 8 GPUs each) and mixed
deployments (1 to 3 nodes x 1 to 8 GPUs, 1 to 3 replicas). Half of them arrive all at once;
the other half arrive one deployment every two minutes, so that earlier placements are made
without knowing what comes next and only defragmentation can reach the optimum.

The optimum is lexicographic: the most GPUs held by placed replicas (the fleet's serving
capacity), then the most deployments with a replica (none starves for another's second), then
the most replicas. A replica's shards go one per node, all in one fabric; GPUs per node are a
capacity. When deployments arrive one after another, each arrival is judged on its own: the
replicas already placed when it came must stay placed (they may move, never be given up for a
newcomer), and the controller's answer is what is ready just before the next arrival (or at the
end), each phase long enough for every defragmentation to finish.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ortools.sat.python import cp_model

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.twin.scenario.loader import load_scenario_text
from llmgw_twin.twin.world.runner import run_scenario


@dataclass(frozen=True, slots=True)
class Gang:
    model: str
    nodes: int
    gpus: int
    replicas: int

    @property
    def size(self) -> int:
        return self.nodes * self.gpus


@dataclass(frozen=True, slots=True)
class Instance:
    seed: int
    fabrics: tuple[tuple[str, tuple[int, ...]], ...]
    """Fabric -> GPUs of each of its nodes."""
    gangs: tuple[Gang, ...]
    staggered: bool

    def node_names(self) -> list[tuple[str, str, int]]:
        out: list[tuple[str, str, int]] = []
        for fabric, gpus in self.fabrics:
            for g in gpus:
                out.append((f"n{len(out) + 1:02d}", fabric, g))
        return out


def instance(seed: int) -> Instance:
    rng = random.Random(seed)
    total = rng.randint(2, 12)
    count = rng.randint(1, min(3, total))
    sizes = [1] * count
    for _ in range(total - count):
        sizes[rng.randrange(count)] += 1
    fabrics = tuple(
        (f"ib-{'abc'[i]}", tuple(rng.choice((2, 4, 8, 8)) for _ in range(size)))
        for i, size in enumerate(sizes)
    )
    biggest = max(max(g) for _, g in fabrics)
    gangs = []
    for i in range(rng.randint(2, 4)):
        nodes = rng.choice((1, 1, 2, 3))
        gpus = rng.choice([g for g in (1, 2, 4, 8) if g <= biggest])
        gangs.append(Gang(f"m{i}", nodes, gpus, rng.randint(1, 3)))
    return Instance(seed, fabrics, tuple(gangs), staggered=rng.random() < 0.5)


Score = tuple[int, int, int]
"""GPUs held by placed replicas, deployments with at least one, replicas placed."""


def optimum(
    fabrics: tuple[tuple[str, tuple[int, ...]], ...],
    gangs: tuple[Gang, ...],
    floors: dict[str, int] | None = None,
) -> Score:
    """The best layout's score, lexicographically; `floors`: replicas per model that must stay
    placed (they run already; they may move, but are never given up for a newcomer)."""
    m = cp_model.CpModel()
    nodes = [(f"{fabric}/{i}", fabric, g) for fabric, gpus in fabrics for i, g in enumerate(gpus)]
    items: list[tuple[Gang, cp_model.IntVar]] = []
    firsts: list[cp_model.IntVar] = []
    load: dict[str, list[cp_model.LinearExprT]] = {n: [] for n, _, _ in nodes}
    for gang in gangs:
        chain: list[cp_model.IntVar] = []
        for _ in range(gang.replicas):
            placed = m.new_bool_var("")
            in_fabric = []
            for fabric, _ in fabrics:
                y = m.new_bool_var("")
                here = [n for n, f, _ in nodes if f == fabric]
                xs = [m.new_bool_var("") for _ in here]
                m.add(sum(xs) == gang.nodes * y)
                for n, x in zip(here, xs, strict=True):
                    load[n].append(gang.gpus * x)
                in_fabric.append(y)
            m.add(sum(in_fabric) == placed)
            if chain:  # replicas of one deployment are interchangeable
                m.add(chain[-1] >= placed)
            chain.append(placed)
            items.append((gang, placed))
        firsts.append(chain[0])
        floor = (floors or {}).get(gang.model, 0)
        if floor:
            m.add(sum(chain) >= floor)
    for n, _, gpus in nodes:
        if load[n]:
            m.add(sum(load[n]) <= gpus)
    count_w = 1
    served_w = len(items) + 1
    gpu_w = served_w * (len(gangs) + 1)
    m.maximize(
        sum(gpu_w * gang.size * placed + count_w * placed for gang, placed in items)
        + served_w * sum(firsts)
    )
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    status = solver.solve(m)
    assert status == cp_model.OPTIMAL, solver.status_name(status)
    chosen = [gang for gang, placed in items if solver.value(placed)]
    return sum(g.size for g in chosen), len({g.model for g in chosen}), len(chosen)


STEP_S = 600
"""Seconds between arrivals in a staggered instance."""


def scenario_text(inst: Instance, extra_timings: str = "") -> str:
    """The instance as a scenario file, run long enough for every move to finish."""
    arrivals = len(inst.gangs) if inst.staggered else 0
    lines = [
        f"name: oracle-{inst.seed}",
        f"seed: {inst.seed}",
        f"duration: {STEP_S * arrivals + 1200}s",
    ]
    if extra_timings:
        lines += ["timings:", *(f"  {t}" for t in extra_timings.split(";"))]
    lines += ["cluster:", "  fabrics:"]
    nodes = inst.node_names()
    for fabric, _ in inst.fabrics:
        members = ", ".join(n for n, f, _ in nodes if f == fabric)
        lines.append(f"    {fabric}: [{members}]")
    lines += ["  nodes:", "    default: {gpus: 8, gpu_memory: 80GiB, engines: [sim]}"]
    for n, _, gpus in nodes:
        lines.append(f"    {n}: {{gpus: {gpus}}}")
    lines.append("profiles:")
    for g in inst.gangs:
        lines.append(
            f"  p-{g.model}: {{engine: sim, nodes: {g.nodes}, gpus_per_node: {g.gpus}, "
            f"load_time: 20s, model: /models/{g.model}}}"
        )
    lines.append("deployments:")
    for g in inst.gangs:
        first = 0 if inst.staggered else g.replicas
        lines.append(f"  - {{model: {g.model}, profile: p-{g.model}, replicas: {first}}}")
    if inst.staggered:
        lines.append("faults:")
        for i, g in enumerate(inst.gangs):
            lines.append(
                f"  - {{at: {STEP_S * i + 5}s, set_replicas: {{model: {g.model}, "
                f"replicas: {g.replicas}}}}}"
            )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Phase:
    """One arrival's comparison: what the controller held when the next one came (or at the
    end), against the best it could have held given what already ran when this one came."""

    arrived: tuple[str, ...]
    floors: dict[str, int]
    got: Score
    best: Score

    @property
    def optimal(self) -> bool:
        return self.got == self.best


def judge(inst: Instance, extra_timings: str = "") -> tuple[list[Phase], bool]:
    """Every phase of the instance in the twin, and whether every invariant held."""
    scenario = load_scenario_text(scenario_text(inst, extra_timings), f"oracle-{inst.seed}")
    result = run_scenario(scenario)
    size = {g.model: g.size for g in inst.gangs}
    arrivals = [(STEP_S * i + 5) * 1000 for i in range(len(inst.gangs))] if inst.staggered else [0]
    cutoffs = [*arrivals[1:], result.virtual_ms + 1]
    phases = []
    for i, (start, cutoff) in enumerate(zip(arrivals, cutoffs, strict=True)):
        arrived = inst.gangs[: i + 1] if inst.staggered else inst.gangs
        floors = _live_by_model(result.trace, start, "replica.placed")
        got = _live_by_model(result.trace, cutoff, "replica.ready")
        score = (
            sum(size[m] * k for m, k in got.items()),
            len([m for m, k in got.items() if k]),
            sum(got.values()),
        )
        best = optimum(inst.fabrics, tuple(arrived), floors)
        phases.append(Phase(tuple(g.model for g in arrived), floors, score, best))
    invariants_hold = not any(i.enabled and i.violations for i in result.invariants)
    return phases, invariants_hold


def _live_by_model(trace: tuple[TraceEvent, ...], before_ms: int, kind: str) -> dict[str, int]:
    """Replicas (placed or ready, per `kind`) not reaped, per model, before `before_ms`."""
    live: dict[str, str] = {}
    for ev in trace:
        if ev.t_ms >= before_ms:
            break
        rid = ev.get("replica")
        if ev.kind == kind and isinstance(rid, str):
            live[rid] = str(ev.get("model"))
        elif ev.kind == "replica.reaped" and isinstance(rid, str):
            live.pop(rid, None)
    out: dict[str, int] = {}
    for m in live.values():
        out[m] = out.get(m, 0) + 1
    return out
