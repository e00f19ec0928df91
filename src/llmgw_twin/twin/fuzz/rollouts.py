"""The fuzzer's `set_profile` faults: a deployment changed to another profile mid-run, and set
back to its own at the heal.

Role: `profile_faults(seed, plan, start_ms)` enables the kind in about a third of the seeds, by a
random source of its own (a string seed: the same in every process), so that every other draw of
a seed is what it was before the kind came. A seed that enables it draws one to three changes,
each of a deployment to a profile of the plan; a plan with one profile gets a second one of the
same shape (a new build of the same model), so that every enabling seed rolls something out.
`profile_heal(plan)` sets each changed deployment back at the heal; its replicas are rolled back
within the liveness bound, one at a time (`control/rollout.py`).

Invariants: a `set_profile` names a deployed model and a profile of the plan; the heal leaves
every deployment on its own profile, so the liveness expectation reads the plan's deployments.
"""

from __future__ import annotations

import random
from dataclasses import replace

from llmgw_twin.twin.fuzz.plan import Plan, PlanFault, PlanProfile

SET_PROFILE = "set_profile"
ROLLOUT_KINDS: tuple[str, ...] = (SET_PROFILE,)


def profile_faults(
    seed: int, plan: Plan, start_ms: int
) -> tuple[list[PlanFault], tuple[str, ...], tuple[PlanProfile, ...]]:
    """The set_profile faults this seed draws, the kinds it enables, and the profiles it adds."""
    rng = random.Random(f"set-profile-{seed}")
    if not plan.deployments or rng.random() >= 1 / 3:
        return [], (), ()
    added: tuple[PlanProfile, ...] = ()
    if len(plan.profiles) < 2:
        base = plan.profiles[0]
        load_ms = rng.randint(5, max(5, base.load_ms // 1000)) * 1000  # the bound stays
        added = (replace(base, name=f"{base.name}-v2", load_ms=load_ms),)
    profiles = plan.profiles + added
    faults = []
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(start_ms, plan.heal_at_ms)
        model = rng.choice(plan.deployments).model
        faults.append(PlanFault(at, SET_PROFILE, model=model, profile=rng.choice(profiles).name))
    return faults, ROLLOUT_KINDS, added


def profile_heal(plan: Plan) -> list[PlanFault]:
    """Every deployment whose profile the faults changed, set back to its own at the heal."""
    current = {d.model: d.profile for d in plan.deployments}
    for f in plan.faults:
        if f.kind == SET_PROFILE:
            current[f.model] = f.profile
    return [
        PlanFault(plan.heal_at_ms, SET_PROFILE, model=d.model, profile=d.profile)
        for d in plan.deployments
        if current[d.model] != d.profile
    ]


def profile_line(f: PlanFault) -> str:
    return f"set_profile: {{model: {f.model}, profile: {f.profile}}}"
