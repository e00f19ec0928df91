"""The fuzzer's role groups: a deployment of prefill and decode roles beside the plan's own.

Role: `group_deployment(seed, plan)` adds, in about a quarter of the seeds, a deployment `g1`
of one or two role groups (`control/groups.py`): a prefill role (one replica) and a decode role
(one or two), each its own profile of 1-2 nodes. It is drawn by a random source of its own (a
string seed: the same in every process) after every other draw, so every other part of a seed's
plan is what it was before groups came, and no fault of the plan names `g1`: the node, fabric,
engine and controller faults reach its members as they reach any replica.

`group_capacity_allows(plan)` is the liveness side: a group must fit whole in one fabric, so the
groups' liveness is asserted only when some fabric has a node that can hold any group member for
every shard the plan wants (all deployments, the groups included) -- whatever the controller
does with the rest, each group then still fits whole there. Conservative: when False, liveness
is not asserted.

Invariants: a group's roles name profiles of the plan; a plan without groups is unchanged.
"""

from __future__ import annotations

import random

from llmgw_twin.twin.fuzz.plan import Plan, PlanDeployment, PlanProfile

GROUP_MODEL = "g1"


def group_deployment(
    seed: int, plan: Plan
) -> tuple[tuple[PlanDeployment, ...], tuple[PlanProfile, ...]]:
    """The group deployment this seed adds (none, mostly), and its roles' profiles."""
    rng = random.Random(f"role-group-{seed}")
    if rng.random() >= 1 / 4:
        return (), ()
    prefill = PlanProfile("gp", rng.randint(1, 2), rng.choice((2, 4, 8)), rng.randint(5, 20) * 1000)
    decode = PlanProfile("gd", rng.randint(1, 2), rng.choice((2, 4, 8)), rng.randint(5, 20) * 1000)
    roles = (("prefill", prefill.name, 1), ("decode", decode.name, rng.randint(1, 2)))
    dep = PlanDeployment(GROUP_MODEL, prefill.name, rng.randint(1, 2), roles)
    return (dep,), (prefill, decode)


def shards_of(plan: Plan, dep: PlanDeployment) -> list[int]:
    """The GPU count of every shard `dep` wants (a group's: every member's)."""
    if not dep.roles:
        p = plan.profile(dep.profile)
        return [p.gpus_per_node] * (p.nodes * dep.replicas)
    out: list[int] = []
    for _, profile, count in dep.roles:
        p = plan.profile(profile)
        out += [p.gpus_per_node] * (p.nodes * count * dep.replicas)
    return out


def members_of(dep: PlanDeployment) -> int:
    """The replicas `dep` wants ready (a group's: all its members)."""
    return dep.replicas * (sum(c for _, _, c in dep.roles) if dep.roles else 1)


def group_capacity_allows(plan: Plan, failed: dict[str, set[int]]) -> bool:
    """Whether every group fits whole in some fabric however the rest is placed (the text)."""
    groups = [d for d in plan.deployments if d.roles and d.replicas > 0]
    if not groups:
        return True
    shards = sum(len(shards_of(plan, d)) for d in plan.deployments)
    widest = max(plan.profile(p).gpus_per_node for d in groups for _, p, _ in d.roles)
    for _, members in plan.fabrics:
        free = [n.gpus - len(failed.get(n.name, ())) for n in members]
        if sum(1 for f in free if f >= widest) >= shards:
            return True
    return False
