"""The fuzzer's generator: one seed in, one random scenario plan out, and its scenario file.

Role: `generate(seed)` draws, from a `random.Random(seed)` and nothing else, a fleet (1-3
fabrics, 2-12 nodes of 4 or 8 GPUs, engines [sim]), profiles (1-2 nodes x 2-8 GPUs, load 5-30s),
deployments (1-3 models, 1-4 replicas), a few control-plane timings, and a fault schedule in the
swarm style: the seed enables a random subset of `FAULT_KINDS` and draws every fault from that
subset only, some of them in bursts (within two seconds of the one before, or at its very
instant). The schedule ends in a heal (`Plan.heal_at_ms`): every node still down is restarted
and every deployment is set back to its desired count; partitions, fabric outages and controller
outages are drawn to be over by then. About a third of the seeds also run two or three
controllers and draw their own faults (`leaders.py`). `scenario_text(plan)` writes the plan as
a scenario file (docs/scenarios.md) whose only expectation is liveness: at the end, every
deployment has its desired count of ready replicas -- asserted only when `capacity_allows(plan)`.
What the plan implies (the heal, the liveness bound, the capacity check) is `liveness.py`'s,
re-exported here.

Invariants: the same seed gives the same plan and the same text, on every machine (no clock, no
hash-ordered iteration); every text this module writes loads with `load_scenario_text`; the run
lasts `heal_at_ms + liveness_bound_ms(plan)`.
"""

from __future__ import annotations

import random
from dataclasses import fields, replace

from llmgw_twin.control.model import Timings
from llmgw_twin.twin.fuzz.groups import group_deployment, members_of
from llmgw_twin.twin.fuzz.leaders import CONTROLLER_KINDS, controller_faults, controller_line
from llmgw_twin.twin.fuzz.liveness import (
    SLACK_MS,
    capacity_allows,
    duration_ms,
    failed_gpus,
    heal_faults,
    liveness_bound_ms,
    pace_ms,
)
from llmgw_twin.twin.fuzz.plan import Plan, PlanDeployment, PlanFault, PlanNode, PlanProfile
from llmgw_twin.twin.fuzz.rollouts import ROLLOUT_KINDS, profile_faults, profile_line
from llmgw_twin.twin.fuzz.shapes import SHAPE_KINDS, shape_faults, shape_line
from llmgw_twin.twin.fuzz.topo import TOPOLOGY_KINDS, topology_faults, topology_line, topology_lines
from llmgw_twin.units import fmt_duration, setting_keys

__all__ = [
    "FABRIC_NAMES",
    "FAULT_KINDS",
    "OPERATOR_KINDS",
    "SLACK_MS",
    "SWARM_KINDS",
    "TRAFFIC_RATE",
    "capacity_allows",
    "duration_ms",
    "failed_gpus",
    "generate",
    "heal_faults",
    "liveness_bound_ms",
    "pace_ms",
    "pace_timings",
    "scenario_text",
]

SWARM_KINDS: tuple[str, ...] = (
    "kill_node",
    "restart_node",
    "crash_node",
    "partition",
    "kill_engine",
    "hang_engine",
    "restart_controller",
    "fail_gpu",
    "fabric_down",
    "set_replicas",
)
"""The fault kinds a seed may enable (swarm testing: each seed enables a random subset)."""
OPERATOR_KINDS: tuple[str, ...] = ("cordon", "drain", "restart_agent")
"""Further kinds, each enabled in about a third of the seeds by a random source of their own
(`_operator_faults`), so that the plans of the kinds above are what they were before these came:
a node cordoned or drained (uncordoned at the heal), an agent that dies alone and comes back."""
FAULT_KINDS: tuple[str, ...] = SWARM_KINDS + OPERATOR_KINDS + CONTROLLER_KINDS + ROLLOUT_KINDS
FAULT_KINDS += SHAPE_KINDS + TOPOLOGY_KINDS

FABRIC_NAMES = ("ib-a", "ib-b", "ib-c")


def generate(seed: int) -> Plan:
    rng = random.Random(seed)
    n_fabrics = rng.randint(1, 3)
    n_nodes = rng.randint(max(2, n_fabrics), 12)
    sizes = [1] * n_fabrics
    for _ in range(n_nodes - n_fabrics):
        sizes[rng.randrange(n_fabrics)] += 1
    fabrics: list[tuple[str, tuple[PlanNode, ...]]] = []
    number = 0
    for f, size in enumerate(sizes):
        members = []
        for _ in range(size):
            number += 1
            members.append(PlanNode(f"node{number:02d}", rng.choice((4, 8))))
        fabrics.append((FABRIC_NAMES[f], tuple(members)))

    lost = rng.choice((30_000, 60_000))
    timings = Timings(
        heartbeat_interval_ms=rng.choice((5_000, 10_000)),
        node_suspect_after_ms=lost // 2,
        node_lost_after_ms=lost,
        start_grace_ms=rng.choice((30_000, 60_000)),
        restart_backoff_ms=rng.choice((5_000, 10_000)),
        restart_backoff_max_ms=rng.choice((30_000, 60_000)),
        quarantine_for_ms=rng.choice((120_000, 240_000)),
    )
    timings = pace_timings(seed, timings)
    n_deployments = rng.randint(1, 3)
    profiles = tuple(
        PlanProfile(f"p{i + 1}", rng.randint(1, 2), _gpus(rng), rng.randint(5, 30) * 1000)
        for i in range(rng.randint(1, n_deployments))
    )
    deployments = tuple(
        PlanDeployment(f"m{i + 1}", rng.choice(profiles).name, rng.randint(1, 4))
        for i in range(n_deployments)
    )
    enabled = tuple(k for k in SWARM_KINDS if rng.random() < 0.5) or (rng.choice(SWARM_KINDS),)
    start_ms = rng.randint(10, 90) * 1000
    heal_at_ms = start_ms + rng.randint(2, 8) * 60_000
    plan = Plan(seed, timings, tuple(fabrics), profiles, deployments, (), heal_at_ms, enabled)
    times: list[int] = []
    for _ in range(rng.randint(1, 12)):
        if times and rng.random() < 0.3:  # a burst: close on the last one, or at its instant
            times.append(min(heal_at_ms - 1, times[-1] + rng.choice((0, rng.randrange(2000)))))
        else:
            times.append(rng.randrange(start_ms, heal_at_ms))
    faults = [_fault(rng, plan, rng.choice(enabled), t) for t in times]
    extra, more = _operator_faults(seed, plan, start_ms)
    enabled += more
    faults += extra
    extra, more, controllers = controller_faults(seed, plan, start_ms)
    enabled += more
    faults += extra
    extra, more, added = profile_faults(seed, plan, start_ms)  # `rollouts.py`
    enabled += more
    faults += extra
    profiles += added
    extra, more = shape_faults(seed, plan, start_ms)  # `shapes.py`
    enabled += more
    faults += extra
    topology, extra, more = topology_faults(seed, plan, start_ms)  # `topo.py`
    enabled += more
    faults += extra
    faults.sort(key=lambda f: f.at_ms)  # stable: ties keep the order they were drawn in
    groups, group_profiles = group_deployment(seed, plan)  # `groups.py`: drawn last
    return Plan(
        seed,
        timings,
        tuple(fabrics),
        profiles + group_profiles,
        deployments + groups,
        tuple(faults),
        heal_at_ms,
        enabled,
        controllers,
        topology,
    )


def _operator_faults(
    seed: int, plan: Plan, start_ms: int
) -> tuple[list[PlanFault], tuple[str, ...]]:
    """The operator kinds this seed enables, and one to three faults of each, drawn from a
    random source of their own (a string seed: the same in every process)."""
    rng = random.Random(f"operator-faults-{seed}")
    enabled = tuple(k for k in OPERATOR_KINDS if rng.random() < 1 / 3)
    faults = []
    for kind in enabled:
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(start_ms, plan.heal_at_ms)
            node = rng.choice(plan.nodes).name
            down = min(plan.heal_at_ms - at, rng.randint(0, 90) * 1000)
            faults.append(PlanFault(at, kind, node=node, for_ms=down * (kind == "restart_agent")))
    return faults, enabled


def _gpus(rng: random.Random) -> int:
    """GPUs per shard, 2-8: mostly the sizes that divide a node (2, 4, 8), so that more fleets
    can hold their deployments and liveness is asserted more often."""
    return rng.choice((2, 2, 4, 4, 8)) if rng.random() < 0.7 else rng.randint(2, 8)


def _fault(rng: random.Random, plan: Plan, kind: str, at_ms: int) -> PlanFault:
    nodes = plan.nodes
    left_ms = plan.heal_at_ms - at_ms  # everything is over by the heal

    def span(longest_ms: int) -> int:
        return max(1, min(left_ms, rng.randint(5, longest_ms // 1000) * 1000))

    match kind:
        case "kill_node" | "crash_node" | "restart_node":
            return PlanFault(at_ms, kind, node=rng.choice(nodes).name)
        case "partition":
            k = rng.randint(1, len(nodes))
            members = tuple(sorted(n.name for n in rng.sample(nodes, k)))
            return PlanFault(at_ms, kind, nodes=members, for_ms=span(180_000))
        case "kill_engine" | "hang_engine":
            model = rng.choice(plan.deployments).model
            return PlanFault(at_ms, kind, node=rng.choice(nodes).name, model=model)
        case "restart_controller":
            return PlanFault(at_ms, kind, for_ms=min(left_ms, rng.randint(0, 60) * 1000))
        case "fail_gpu":
            node = rng.choice(nodes)
            return PlanFault(at_ms, kind, node=node.name, gpu=rng.randrange(node.gpus))
        case "fabric_down":
            fabric = rng.choice(plan.fabrics)[0]
            return PlanFault(at_ms, kind, fabric=fabric, for_ms=span(180_000))
        case "set_replicas":
            model = rng.choice(plan.deployments).model
            return PlanFault(at_ms, kind, model=model, replicas=rng.randint(0, 4))
    raise ValueError(f"unknown fault kind {kind!r}")


def pace_timings(seed: int, timings: Timings) -> Timings:
    """In about half the seeds, eviction budgets small enough to bind (2 or 4 replicas a minute
    in the fleet, 1 or 2 in a fabric), and in about half a mass-loss hold bound of 2 to 4
    minutes: from a random source of their own, so every other draw of the seed is unchanged."""
    rng = random.Random(f"pace-{seed}")
    if rng.random() < 0.5:
        timings = replace(
            timings,
            eviction_budget=rng.choice((2, 4)),
            eviction_fabric_budget=rng.choice((1, 2)),
        )
    if rng.random() < 0.5:
        timings = replace(timings, mass_loss_hold_max_ms=rng.choice((2, 3, 4)) * 60_000)
    return timings


# --- the scenario file -------------------------------------------------------------------------

_TIMING_KEYS = {k.attr: k for k in setting_keys(Timings)}
_DEFAULTS = Timings()


def _timing_lines(t: Timings) -> list[str]:
    lines = []
    for f in fields(Timings):
        value = getattr(t, f.name)
        if value == getattr(_DEFAULTS, f.name) and f.name != "node_suspect_after_ms":
            continue
        key = _TIMING_KEYS[f.name]
        text = fmt_duration(value) if key.kind == "duration" else str(value)
        lines.append(f"  {key.key}: {text}")
    return lines


def _fault_line(f: PlanFault, fault_id: str) -> str:
    head = f"  - {{id: {fault_id}, at: {fmt_duration(f.at_ms)}, "
    match f.kind:
        case "kill_node" | "crash_node" | "restart_node" | "cordon" | "uncordon" | "drain":
            body = f"{f.kind}: {f.node}"
        case "restart_agent":
            body = f"restart_agent: {{node: {f.node}, down_for: {fmt_duration(f.for_ms)}}}"
        case "partition":
            body = f"partition: {{nodes: [{', '.join(f.nodes)}], for: {fmt_duration(f.for_ms)}}}"
        case "kill_engine" | "hang_engine":
            body = f"{f.kind}: {{node: {f.node}, replica_of: {f.model}}}"
        case "restart_controller" if not f.controller:
            body = f"restart_controller: {{down_for: {fmt_duration(f.for_ms)}}}"
        case "fail_gpu":
            body = f"fail_gpu: {{node: {f.node}, gpu: {f.gpu}}}"
        case "fabric_down":
            body = f"fabric_down: {{fabric: {f.fabric}, for: {fmt_duration(f.for_ms)}}}"
        case "set_replicas":
            body = f"set_replicas: {{model: {f.model}, replicas: {f.replicas}}}"
        case "set_profile":
            body = profile_line(f)
        case "cut_fabric_link" | "slow_node" | "delay_heartbeats" | "add_node":
            body = shape_line(f)
        case "leaf_down" | "spine_down" | "nvlink_domain_down" | "nvlink_degraded":
            body = topology_line(f)
        case _:
            body = controller_line(f)
    return head + body + "}"


TRAFFIC_RATE = "6/min"
"""Each generated deployment's traffic."""


def scenario_text(plan: Plan, name: str = "", description: str = "") -> str:
    """The plan as a scenario file: the fault phase (ids f01...), the heal (ids heal01...) and,
    when `capacity_allows(plan)`, the liveness expectation at the end."""
    kinds = ", ".join(plan.enabled)
    desc = description or f"generated by llmgw-twin fuzz from seed {plan.seed}; enabled: {kinds}"
    out = [
        f"name: {name or f'fuzz-seed-{plan.seed}'}",
        f"description: {_quote(desc)}",
        f"seed: {plan.seed}",
        f"duration: {fmt_duration(duration_ms(plan))}",
        "",
        "timings:",
        *_timing_lines(plan.timings),
        "",
        "cluster:",
        *([f"  controllers: {plan.controllers}"] if plan.controllers > 1 else []),
        "  fabrics:",
        *(f"    {f}: [{', '.join(n.name for n in members)}]" for f, members in plan.fabrics),
        "  nodes:",
        "    default: {gpus: 8, gpu_memory: 80GiB, engines: [sim]}",
        *(f"    {n.name}: {{gpus: {n.gpus}}}" for n in plan.nodes if n.gpus != 8),
        *topology_lines(plan.topology),
    ]
    if plan.profiles:
        out += ["", "profiles:"]
        for p in plan.profiles:
            out.append(
                f"  {p.name}: {{engine: sim, nodes: {p.nodes}, gpus_per_node: {p.gpus_per_node}, "
                f"load_time: {fmt_duration(p.load_ms)}, model: /models/{p.name}}}"
            )
    if plan.deployments:
        out += ["", "deployments:"]
        out += [_deployment_line(d) for d in plan.deployments]
    heal = heal_faults(plan)
    if plan.faults or heal:
        out += ["", "faults:"]
        out += [_fault_line(f, f"f{i + 1:02d}") for i, f in enumerate(plan.faults)]
        out += [_fault_line(f, f"heal{i + 1:02d}") for i, f in enumerate(heal)]
    if plan.deployments:
        # clients through the router all along: `routes_to_ready` is judged on every pick
        out += ["", "traffic:"]
        out += [f"  - {{model: {d.model}, rate: {TRAFFIC_RATE}}}" for d in plan.deployments]
    if plan.deployments and capacity_allows(plan):
        ready = ", ".join(f"{d.model}: {members_of(d)}" for d in plan.deployments)
        out += [
            "",
            "expect:",
            "  # liveness: back to the desired counts within "
            f"{fmt_duration(liveness_bound_ms(plan))} of the heal",
            "  - at: end",
            f"    ready_replicas: {{{ready}}}",
        ]
    return "\n".join(out) + "\n"


def _deployment_line(d: PlanDeployment) -> str:
    if not d.roles:
        return f"  - {{model: {d.model}, profile: {d.profile}, replicas: {d.replicas}}}"
    roles = ", ".join(f"{n}: {{profile: {p}, count: {c}}}" for n, p, c in d.roles)
    return f"  - {{model: {d.model}, replicas: {d.replicas}, roles: {{{roles}}}}}"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
