"""The fuzzer's topology: leaves, spines and NVLink domains over the plan's fleet, and the faults
per level (docs/topology.md).

Role: `topology_faults(seed, plan, start_ms)` gives about a third of the seeds a topology, from
a random source of its own (a string seed: the same in every process), so that every other draw
of a seed is what it was before it came: within each fabric, its nodes in order are cut into
leaves of one to three nodes and NVLink domains of two to four, and its leaves into spines of
one or two. A seed with a topology enables a non-empty subset of `TOPOLOGY_KINDS` and draws one
or two faults of each: `leaf_down` and `spine_down` for 5-120 s, `nvlink_domain_down` always
with a `for` (5-180 s), so its nodes are back by the heal, and `nvlink_degraded` (a factor of 2
or 3, for 5-180 s). Profiles stay without rules, so the liveness rule (`gen.capacity_allows`,
which reads fabrics only) stays sound.

Invariants: every fault is over by the heal; each names a leaf, spine or domain of the plan's
topology, which names only the plan's own nodes; `without_nodes` keeps the topology and its
faults consistent when the shrinker takes nodes away.
"""

from __future__ import annotations

import random
from dataclasses import replace

from llmgw_twin.twin.fuzz.plan import Groups, Plan, PlanFault, PlanTopology
from llmgw_twin.units import fmt_duration

TOPOLOGY_KINDS: tuple[str, ...] = (
    "leaf_down",
    "spine_down",
    "nvlink_domain_down",
    "nvlink_degraded",
)


def _cut(rng: random.Random, items: list[str], low: int, high: int) -> list[list[str]]:
    out: list[list[str]] = []
    while items:
        size = rng.randint(low, high)
        out.append(items[:size])
        items = items[size:]
    return out


def draw_topology(rng: random.Random, plan: Plan) -> PlanTopology:
    leaves: list[tuple[str, tuple[str, ...]]] = []
    spines: list[tuple[str, tuple[str, ...]]] = []
    domains: list[tuple[str, tuple[str, ...]]] = []
    for _, members in plan.fabrics:
        names = [n.name for n in members]
        mine = []
        for group in _cut(rng, list(names), 1, 3):
            leaves.append((f"leaf{len(leaves) + 1:02d}", tuple(group)))
            mine.append(leaves[-1][0])
        for group in _cut(rng, mine, 1, 2):
            spines.append((f"spine{len(spines) + 1:02d}", tuple(group)))
        for group in _cut(rng, list(names), 2, 4):
            domains.append((f"nvl{len(domains) + 1:02d}", tuple(group)))
    return PlanTopology(tuple(leaves), tuple(spines), tuple(domains))


def topology_faults(
    seed: int, plan: Plan, start_ms: int
) -> tuple[PlanTopology | None, list[PlanFault], tuple[str, ...]]:
    """The seed's topology (or None), its faults, and the kinds it enables."""
    rng = random.Random(f"topology-{seed}")
    if rng.random() >= 1 / 3:
        return None, [], ()
    topology = draw_topology(rng, plan)
    enabled = tuple(k for k in TOPOLOGY_KINDS if rng.random() < 0.5) or (
        rng.choice(TOPOLOGY_KINDS),
    )
    faults: list[PlanFault] = []
    for kind in enabled:
        for _ in range(rng.randint(1, 2)):
            at = rng.randrange(start_ms, plan.heal_at_ms)
            left = plan.heal_at_ms - at

            def span(longest_s: int, left: int = left) -> int:
                return max(1, min(left, rng.randint(5, longest_s) * 1000))

            match kind:
                case "leaf_down":
                    leaf = rng.choice(topology.leaves)[0]
                    faults.append(PlanFault(at, kind, group=leaf, for_ms=span(120)))
                case "spine_down":
                    spine = rng.choice(topology.spines)[0]
                    faults.append(PlanFault(at, kind, group=spine, for_ms=span(120)))
                case "nvlink_domain_down":
                    domain = rng.choice(topology.domains)[0]
                    faults.append(PlanFault(at, kind, group=domain, for_ms=span(180)))
                case "nvlink_degraded":
                    node = rng.choice(plan.nodes).name
                    factor = rng.choice(("2", "3"))
                    faults.append(PlanFault(at, kind, node=node, rate=factor, for_ms=span(180)))
    return topology, faults, enabled


def topology_line(f: PlanFault) -> str:
    """The body of a topology fault's line in the scenario file."""
    for_text = fmt_duration(f.for_ms)
    match f.kind:
        case "leaf_down":
            return f"leaf_down: {{leaf: {f.group}, for: {for_text}}}"
        case "spine_down":
            return f"spine_down: {{spine: {f.group}, for: {for_text}}}"
        case "nvlink_domain_down":
            return f"nvlink_domain_down: {{domain: {f.group}, for: {for_text}}}"
        case "nvlink_degraded":
            return f"nvlink_degraded: {{node: {f.node}, factor: {f.rate}, for: {for_text}}}"
    raise ValueError(f"not a topology fault: {f.kind!r}")


def topology_lines(topology: PlanTopology | None) -> list[str]:
    """The `topology:` lines under `cluster:` (none without a topology)."""
    if topology is None:
        return []
    out = ["  topology:"]
    for key, groups in (
        ("leaves", topology.leaves),
        ("spines", topology.spines),
        ("nvlink_domains", topology.domains),
    ):
        if groups:
            body = ", ".join(f"{name}: [{', '.join(m)}]" for name, m in groups)
            out.append(f"    {key}: {{{body}}}")
    return out


def without_nodes(plan: Plan) -> Plan:
    """`plan` (whose fleet the shrinker cut) with its topology cut to match: gone nodes leave
    their leaves and domains, empty ones go, and so do spines left without a leaf and the
    faults that name something gone."""
    topo = plan.topology
    if topo is None:
        return plan
    kept = {n.name for n in plan.nodes}
    leaves = _keep(topo.leaves, kept)
    domains = _keep(topo.domains, kept)
    spines = _keep(topo.spines, {name for name, _ in leaves})
    names = {name for groups in (leaves, spines, domains) for name, _ in groups}
    faults = tuple(f for f in plan.faults if not f.group or f.group in names)
    return replace(plan, topology=PlanTopology(leaves, spines, domains), faults=faults)


def _keep(groups: Groups, members: set[str]) -> Groups:
    out = []
    for name, group in groups:
        left = tuple(m for m in group if m in members)
        if left:
            out.append((name, left))
    return tuple(out)
