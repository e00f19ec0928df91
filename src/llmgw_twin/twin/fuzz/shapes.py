"""The fuzzer's fault shapes real fleets show: a node's own fabric link cut, a straggler,
heartbeats that arrive late, a node added at run time.

Role: `shape_faults(seed, plan, start_ms)` enables these kinds in about a third of the seeds, by
a random source of its own (a string seed: the same in every process), so that every other draw
of a seed is what it was before they came. A seed that enables them picks a non-empty subset and
draws one to three faults of each, on the plan's own nodes. Everything is over by the heal: a cut
link is back, a slowdown ended, the last late heartbeat landed (`PlanFault.end_ms` counts the
delay). An added node (`added01`, ...) joins a fabric of the plan with 4 or 8 GPUs and stays: no
other fault names it, and the liveness check, which counts the plan's own nodes only, stays
conservative.

Invariants: each fault names nodes and fabrics of the plan; a slowdown's factor is 1.5 to 5
mostly, up to 20 at times; a heartbeat delay is at most three quarters of `node_lost_after`, so
a delayed node may turn suspect but its late heartbeats still decide whether it is lost.
"""

from __future__ import annotations

import random

from llmgw_twin.twin.fuzz.plan import Plan, PlanFault
from llmgw_twin.units import fmt_duration

SHAPE_KINDS: tuple[str, ...] = ("cut_fabric_link", "slow_node", "delay_heartbeats", "add_node")
FACTORS = ("1.5", "2", "3", "5", "20")


def shape_faults(seed: int, plan: Plan, start_ms: int) -> tuple[list[PlanFault], tuple[str, ...]]:
    """The shape faults this seed draws, and the kinds it enables."""
    rng = random.Random(f"shape-faults-{seed}")
    if rng.random() >= 1 / 3:
        return [], ()
    enabled = tuple(k for k in SHAPE_KINDS if rng.random() < 0.5) or (rng.choice(SHAPE_KINDS),)
    nodes = [n.name for n in plan.nodes]
    faults: list[PlanFault] = []
    added = 0
    for kind in enabled:
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(start_ms, plan.heal_at_ms)
            left = plan.heal_at_ms - at

            def span(longest_s: int, left: int = left) -> int:
                return max(1, min(left, rng.randint(5, longest_s) * 1000))

            match kind:
                case "cut_fabric_link":
                    faults.append(PlanFault(at, kind, node=rng.choice(nodes), for_ms=span(120)))
                case "slow_node":
                    factor = rng.choice(FACTORS)
                    faults.append(
                        PlanFault(at, kind, node=rng.choice(nodes), rate=factor, for_ms=span(180))
                    )
                case "delay_heartbeats":
                    k = rng.randint(1, min(3, len(nodes)))
                    members = tuple(sorted(rng.sample(nodes, k)))
                    most = max(1, plan.timings.node_lost_after_ms * 3 // 4 // 1000)
                    by = min(rng.randint(1, most) * 1000, max(1, left // 2))
                    for_ms = max(1, min(left - by, rng.randint(5, 120) * 1000))
                    faults.append(PlanFault(at, kind, nodes=members, by_ms=by, for_ms=for_ms))
                case "add_node":
                    added += 1
                    fabric = rng.choice(plan.fabrics)[0]
                    name = f"added{added:02d}"
                    faults.append(
                        PlanFault(at, kind, node=name, fabric=fabric, gpus=rng.choice((4, 8)))
                    )
    return faults, enabled


def shape_line(f: PlanFault) -> str:
    """The body of a shape fault's line in the scenario file."""
    match f.kind:
        case "cut_fabric_link":
            return f"cut_fabric_link: {{node: {f.node}, for: {fmt_duration(f.for_ms)}}}"
        case "slow_node":
            return f"slow_node: {{node: {f.node}, factor: {f.rate}, for: {fmt_duration(f.for_ms)}}}"
        case "delay_heartbeats":
            return (
                f"delay_heartbeats: {{nodes: [{', '.join(f.nodes)}], "
                f"by: {fmt_duration(f.by_ms)}, for: {fmt_duration(f.for_ms)}}}"
            )
        case "add_node":
            return f"add_node: {{node: {f.node}, fabric: {f.fabric}, gpus: {f.gpus}}}"
    raise ValueError(f"not a shape fault: {f.kind!r}")
