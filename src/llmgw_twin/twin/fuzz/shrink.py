"""The fuzzer's shrinker: greedy delta debugging over a failing plan.

Role: `shrink_plan(plan, kind)` tries smaller plans one at a time, biggest cuts first -- drop
chunks of faults (halving the chunk size down to single faults), drop a deployment, a fabric or
a node (with every fault that names it), lower a replica count, move the heal earlier, shift
the schedule earlier, shorten outages, shorten load times and timings -- and keeps a candidate
whenever it still fails with the same `kind` (the same invariant, liveness, or the same
exception type). It starts over from each kept candidate and stops when a full pass keeps
nothing, or after `budget` runs.

Invariants: every candidate is a plan, so its heal and its liveness expectation are derived
again by the same rules as the seed's own (a candidate whose fleet cannot hold its deployments
asserts no liveness, and so cannot keep a liveness failure); the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from llmgw_twin.twin.fuzz import topo
from llmgw_twin.twin.fuzz.gen import duration_ms, scenario_text
from llmgw_twin.twin.fuzz.judge import Shrunk, Verdict, judge_plan
from llmgw_twin.twin.fuzz.plan import Plan, PlanFault

SHRINK_BUDGET = 400
"""At most this many candidate runs per failing seed (each costs one twin run)."""


def size_of(plan: Plan) -> tuple[int, int, int, int]:
    return (len(plan.faults), len(plan.nodes), len(plan.deployments), duration_ms(plan))


def shrink_plan(plan: Plan, kind: str, budget: int = SHRINK_BUDGET) -> Shrunk:
    runs = 0
    current = plan
    verdict: Verdict | None = None
    progress = True
    while progress and runs < budget:
        progress = False
        for candidate in candidates(current):
            if runs >= budget:
                break
            runs += 1
            got = judge_plan(candidate)
            if kind in got.kinds:
                current, verdict, progress = candidate, got, True
                break
    if verdict is None:
        verdict = judge_plan(current)
    message = next(
        (m for k, m in zip(verdict.kinds, verdict.messages, strict=True) if k == kind), kind
    )
    description = (
        f"found by llmgw-twin fuzz --seeds {plan.seed}..{plan.seed}, shrunk; "
        f"fails {kind}: {message}"
    )
    text = scenario_text(current, f"fuzz-seed-{plan.seed}-min", description)
    return Shrunk(
        text=text,
        full_text=scenario_text(plan),
        trace_sha256=verdict.trace_sha256,
        runs=runs,
        before=size_of(plan),
        after=size_of(current),
    )


def candidates(plan: Plan) -> Iterator[Plan]:
    """Smaller plans, biggest cuts first."""
    faults = plan.faults
    size = len(faults)
    while size >= 1:
        for start in range(0, len(faults), size):
            yield replace(plan, faults=faults[:start] + faults[start + size :])
        size //= 2
    for d in plan.deployments:
        yield without_model(plan, d.model)
    if len(plan.fabrics) > 1:
        for _, members in plan.fabrics:
            yield without_nodes(plan, {n.name for n in members})
    if len(plan.nodes) > 1:
        for n in plan.nodes:
            yield without_nodes(plan, {n.name})
    for i, d in enumerate(plan.deployments):
        for fewer in sorted({d.replicas // 2, d.replicas - 1}):
            if 0 < fewer < d.replicas:
                deps = list(plan.deployments)
                deps[i] = replace(d, replicas=fewer)
                yield replace(plan, deployments=tuple(deps))
    yield from _shorter(plan)
    yield from _simpler(plan)


def _shorter(plan: Plan) -> Iterator[Plan]:
    last = max((f.end_ms for f in plan.faults), default=0)
    if last < plan.heal_at_ms:
        yield replace(plan, heal_at_ms=last)
    first = min((f.at_ms for f in plan.faults), default=plan.heal_at_ms)
    shift = first // 2
    if shift >= 1000:
        moved = tuple(replace(f, at_ms=f.at_ms - shift) for f in plan.faults)
        yield replace(plan, faults=moved, heal_at_ms=plan.heal_at_ms - shift)
    for i, f in enumerate(plan.faults):
        if f.for_ms >= 2000:
            faults = list(plan.faults)
            faults[i] = replace(f, for_ms=f.for_ms // 2)
            yield replace(plan, faults=tuple(faults))


def _simpler(plan: Plan) -> Iterator[Plan]:
    for i, p in enumerate(plan.profiles):
        profiles = list(plan.profiles)
        if p.load_ms > 5000:
            profiles[i] = replace(p, load_ms=5000)
            yield replace(plan, profiles=tuple(profiles))
    t = plan.timings
    shorter = {
        "quarantine_for_ms": 120_000,
        "restart_backoff_max_ms": 30_000,
        "start_grace_ms": 30_000,
    }
    for name, value in shorter.items():
        if getattr(t, name) > value:
            yield replace(plan, timings=replace(t, **{name: value}))
    if t.node_lost_after_ms > 30_000:
        yield replace(
            plan, timings=replace(t, node_lost_after_ms=30_000, node_suspect_after_ms=15_000)
        )


def without_model(plan: Plan, model: str) -> Plan:
    deployments = tuple(d for d in plan.deployments if d.model != model)
    faults = tuple(f for f in plan.faults if f.model != model)
    used = {d.profile for d in deployments} | {f.profile for f in faults if f.profile}
    used |= {profile for d in deployments for _, profile, _ in d.roles}
    return replace(
        plan,
        deployments=deployments,
        profiles=tuple(p for p in plan.profiles if p.name in used),
        faults=faults,
    )


def without_nodes(plan: Plan, gone: set[str]) -> Plan:
    fabrics = tuple(
        (fabric, kept)
        for fabric, members in plan.fabrics
        if (kept := tuple(n for n in members if n.name not in gone))
    )
    left = {f for f, _ in fabrics}
    faults: list[PlanFault] = []
    for f in plan.faults:
        if f.node in gone or (f.fabric and f.fabric not in left):
            continue
        nodes = tuple(n for n in f.nodes if n not in gone)
        if f.nodes and not nodes:
            continue
        faults.append(replace(f, nodes=nodes) if f.nodes else f)
    return topo.without_nodes(replace(plan, fabrics=fabrics, faults=tuple(faults)))
