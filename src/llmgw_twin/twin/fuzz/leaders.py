"""The controllers' own faults for the fuzzer: several controllers on one store, and their
kills, stalls, partitions, store outages and clock skews (scenario version 1.2).

A seed enables them in about a third of the runs, from a random source of its own (a string
seed, so the plans of every other kind are what they were before these came): two or three
controllers, and one to three faults of each enabled kind, each over by the heal. The heal
restarts every controller killed, and sets every skewed clock back to real time, so that
liveness (a leader, and every deployment whole again) can be asserted after it.

Invariants: the same seed gives the same faults; a fault names `c1`..`cK` or `leader`; no span
outlasts the heal.
"""

from __future__ import annotations

import random

from llmgw_twin.twin.fuzz.plan import Plan, PlanFault
from llmgw_twin.units import fmt_duration

CONTROLLER_KINDS: tuple[str, ...] = (
    "kill_controller",
    "stall_controller",
    "partition_controller",
    "store_down",
    "clock_skew",
)
SIDES = ("store", "agents", "peers", "all")
RATES = ("0.9", "0.95", "1.05", "1.1")
SLOWEST = 0.9
"""The slowest clock a seed may draw: a controller's timers run up to 1/0.9 as long."""


def controller_faults(
    seed: int, plan: Plan, start_ms: int
) -> tuple[list[PlanFault], tuple[str, ...], int]:
    """The controller kinds this seed enables, their faults, and how many controllers run."""
    rng = random.Random(f"controller-faults-{seed}")
    if rng.random() >= 1 / 3:
        return [], (), 1
    controllers = rng.randint(2, 3)
    names = [f"c{i + 1}" for i in range(controllers)]
    enabled = tuple(k for k in CONTROLLER_KINDS if rng.random() < 0.5) or (
        rng.choice(CONTROLLER_KINDS),
    )
    faults = []
    for kind in enabled:
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(start_ms, plan.heal_at_ms)
            span = max(1, min(plan.heal_at_ms - at, rng.randint(1, 90) * 1000))
            who = rng.choice([*names, "leader"])
            match kind:
                case "kill_controller":
                    faults.append(PlanFault(at, kind, controller=rng.choice(names)))
                case "stall_controller":
                    faults.append(PlanFault(at, kind, controller=who, for_ms=span))
                case "partition_controller":
                    side = rng.choice(SIDES)
                    faults.append(PlanFault(at, kind, controller=who, side=side, for_ms=span))
                case "store_down":
                    faults.append(PlanFault(at, kind, for_ms=span))
                case "clock_skew":
                    rate = rng.choice(RATES)
                    faults.append(PlanFault(at, kind, controller=rng.choice(names), rate=rate))
    return faults, enabled, controllers


def controller_heal(plan: Plan) -> list[PlanFault]:
    """At the heal: every controller killed starts again, every skewed clock keeps time."""
    at = plan.heal_at_ms
    killed = sorted({f.controller for f in plan.faults if f.kind == "kill_controller"})
    skewed = sorted({f.controller for f in plan.faults if f.kind == "clock_skew"})
    return [
        *(PlanFault(at, "restart_controller", controller=c) for c in killed),
        *(PlanFault(at, "clock_skew", controller=c, rate="1") for c in skewed),
    ]


def controller_line(f: PlanFault) -> str:
    """The body of a controller fault's line in the scenario file."""
    match f.kind:
        case "kill_controller":
            return f"kill_controller: {f.controller}"
        case "restart_controller" if f.controller:
            return (
                f"restart_controller: {{controller: {f.controller}, "
                f"down_for: {fmt_duration(f.for_ms)}}}"
            )
        case "stall_controller":
            return (
                f"stall_controller: {{controller: {f.controller}, for: {fmt_duration(f.for_ms)}}}"
            )
        case "partition_controller":
            return (
                f"partition_controller: {{controller: {f.controller}, from: {f.side}, "
                f"for: {fmt_duration(f.for_ms)}}}"
            )
        case "store_down":
            return f"store_down: {{for: {fmt_duration(f.for_ms)}}}"
        case "clock_skew":
            return f"clock_skew: {{controller: {f.controller}, rate: {f.rate}}}"
    raise ValueError(f"not a controller fault: {f.kind!r}")


def leadership_bound_ms(plan: Plan) -> int:
    """How much later than with one controller liveness may come: a lease and a retry until a
    leader, the stretch of a slow clock over the rest (`SLOWEST`) being added by the caller."""
    if plan.controllers == 1 and not any(f.kind in CONTROLLER_KINDS for f in plan.faults):
        return 0
    lease = plan.timings.lease_ms
    return lease + lease // 5 + plan.timings.reconcile_interval_ms
