"""What a fuzzer plan implies once it is drawn: its heal, its liveness bound, and whether its
healed fleet can hold it.

Role: the liveness side of `gen.py`. `heal_faults(plan)` is the heal at `plan.heal_at_ms` that
ends the fault phase (nodes restarted, cordons lifted, counts and profiles set back, controllers
healed); `liveness_bound_ms(plan)` is how long after it every deployment must be whole again
(docs/fuzzing.md derives it), and `duration_ms(plan)` the run's length; `capacity_allows(plan)`
says whether the liveness expectation may be asserted at all. `gen.scenario_text` writes all of
them into the scenario file, and `gen.py` re-exports every name here.

Invariants: pure functions of the plan -- no random source, no clock, no hash-ordered iteration
-- so a seed's scenario file is the same on every machine; `capacity_allows` is conservative:
when it is False the fleet may still hold the plan, but liveness is not asserted.
"""

from __future__ import annotations

from llmgw_twin.twin.fuzz.groups import group_capacity_allows, members_of, shards_of
from llmgw_twin.twin.fuzz.leaders import SLOWEST, controller_heal, leadership_bound_ms
from llmgw_twin.twin.fuzz.plan import Plan, PlanFault, PlanProfile
from llmgw_twin.twin.fuzz.rollouts import profile_heal

SLACK_MS = 30_000
"""Liveness bound slack: messages, sidecars, reconcile intervals, heartbeat phases."""


def heal_faults(plan: Plan) -> tuple[PlanFault, ...]:
    """The heal at `plan.heal_at_ms`: restart every node down by then (killed or crashed, not
    restarted since), uncordon every node cordoned or drained, and set every deployment whose
    count was changed back to its own."""
    down: dict[str, bool] = {}
    cordoned: set[str] = set()
    wanted = {d.model: d.replicas for d in plan.deployments}
    current = dict(wanted)
    for f in plan.faults:
        if f.kind in ("kill_node", "crash_node"):
            down[f.node] = True
        elif f.kind == "restart_node":
            down[f.node] = False
        elif f.kind == "set_replicas":
            current[f.model] = f.replicas
        elif f.kind in ("cordon", "drain"):
            cordoned.add(f.node)
    at = plan.heal_at_ms
    uncordons = [PlanFault(at, "uncordon", node=n.name) for n in plan.nodes if n.name in cordoned]
    restarts = [PlanFault(at, "restart_node", node=n.name) for n in plan.nodes if down.get(n.name)]
    sets = [
        PlanFault(at, "set_replicas", model=d.model, replicas=d.replicas)
        for d in plan.deployments
        if current[d.model] != wanted[d.model]
    ]
    return (*restarts, *uncordons, *sets, *profile_heal(plan), *controller_heal(plan))


def failed_gpus(plan: Plan) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for f in plan.faults:
        if f.kind == "fail_gpu":
            out.setdefault(f.node, set()).add(f.gpu)
    return out


def liveness_bound_ms(plan: Plan) -> int:
    """How long after the heal every deployment must be back to its desired count of ready
    replicas (docs/fuzzing.md derives it): a node silent since before the heal is lost
    (`node_lost_after`); the last replica started before the heal misses its start deadline
    (`2 x load + start_grace`) or its hung leader runs out of grace; the nodes it blamed stay
    quarantined, or its replacement backs off (`max(quarantine_for, restart_backoff_max)`); the
    replacement loads (`load`); plus `SLACK_MS`."""
    t = plan.timings
    load = max((p.load_ms for p in plan.profiles), default=0)
    recover = max(2 * load + t.start_grace_ms, t.probe_interval_ms + t.unresponsive_grace_ms)
    wait = max(t.quarantine_for_ms, t.restart_backoff_max_ms)
    bound = t.node_lost_after_ms + recover + wait + load + SLACK_MS + pace_ms(plan)
    if any(f.kind == "clock_skew" for f in plan.faults):
        bound = int(bound / SLOWEST) + 1  # a slow controller's timers run that much longer
    return bound + leadership_bound_ms(plan)


def pace_ms(plan: Plan) -> int:
    """How much later the eviction pace may declare the last silent node lost: if every
    desired replica sat on silent nodes, the smallest budget takes them down in
    `ceil(replicas / budget)` windows, the first at once (0 for the generator's usual plans)."""
    t = plan.timings
    budgets = [b for b in (t.eviction_budget, t.eviction_fabric_budget) if b > 0]
    if not budgets:
        return 0
    replicas = sum(members_of(d) for d in plan.deployments)
    return t.eviction_window_ms * max(0, -(-replicas // min(budgets)) - 1)


def duration_ms(plan: Plan) -> int:
    return plan.heal_at_ms + liveness_bound_ms(plan)


def capacity_allows(plan: Plan) -> bool:
    """Whether the healed fleet, less its failed GPUs, holds every desired replica however the
    controller lays them out: for each demanded profile, the other desired replicas, placed as
    adversarially as their shard sizes permit, cannot use up every fabric that could hold one
    more replica of it. Conservative: when False, liveness is not asserted."""
    failed = failed_gpus(plan)
    if not group_capacity_allows(plan, failed):
        return False
    shards: list[int] = []  # the GPU count of every desired shard
    demanded: list[PlanProfile] = []
    for d in plan.deployments:
        shards.extend(shards_of(plan, d))
        p = plan.profile(d.profile)
        if d.replicas > 0 and not d.roles and p not in demanded:
            demanded.append(p)
    for p in demanded:
        others = list(shards)
        for _ in range(p.nodes):
            others.remove(p.gpus_per_node)
        if not others:
            if not _fits_empty(plan, p, failed):
                return False
            continue
        smallest, largest = min(others), max(others)
        cost_shards = cost_gpus = 0
        for _, members in plan.fabrics:
            free = [n.gpus - len(failed.get(n.name, ())) for n in members]
            eligible = sorted(f for f in free if f >= p.gpus_per_node)
            if len(eligible) < p.nodes:
                continue  # this fabric can never hold one: nothing to block
            for f in eligible[: len(eligible) - p.nodes + 1]:  # the cheapest nodes to block
                need = f - p.gpus_per_node + 1  # GPUs to take for fewer than g to be free
                k = -(-need // largest)
                cost_shards += k
                cost_gpus += max(need, k * smallest)
        if cost_shards == 0 or (cost_shards <= len(others) and cost_gpus <= sum(others)):
            return False
    return True


def _fits_empty(plan: Plan, p: PlanProfile, failed: dict[str, set[int]]) -> bool:
    for _, members in plan.fabrics:
        free = [n.gpus - len(failed.get(n.name, ())) for n in members]
        if sum(1 for f in free if f >= p.gpus_per_node) >= p.nodes:
            return True
    return False
