"""Placement under topology rules against the exact optimum (OR-tools CP-SAT), and against an
upper bound of it for fleets too large to solve exactly.

An instance is a fleet whose nodes each sit under a leaf and in an NVLink domain, and
deployments whose profiles may ask `nvlink: same_domain` and/or `leaves: fewest`. Everything
arrives at once and is placed by one whole-set pass (`passes.plan_pass`), as the controller does.

The optimum is lexicographic: the most GPUs held by placed replicas, then the most deployments
with a replica, then the most replicas, then the fewest leaf switches spanned by the replicas
of `leaves: fewest` profiles. A replica's shards go one per node, all in one fabric, and, under
`same_domain`, all in one NVLink domain.

`bound` is for fleets of a thousand nodes: per group (a domain for `same_domain` gangs, a
fabric for the others), how many replicas of each gang it holds, subject to the group's GPUs
and per-gang slots only (shards on distinct nodes, `free // g` per node); its optimum is at
least the real one, so a placement within 1% of it is within 1% of the optimum.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

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
from llmgw_twin.control.topology import DomainId, LeafId, NodeTopology, TopologyRules

SIM = EngineName("sim")


@dataclass(frozen=True, slots=True)
class TNode:
    name: str
    fabric: str
    leaf: str
    domain: str
    gpus: int


@dataclass(frozen=True, slots=True)
class TGang:
    model: str
    nodes: int
    gpus: int
    replicas: int
    nvlink: str = "any"
    leaves: str = "any"

    @property
    def size(self) -> int:
        return self.nodes * self.gpus


@dataclass(frozen=True, slots=True)
class TInstance:
    seed: int
    nodes: tuple[TNode, ...]
    gangs: tuple[TGang, ...]


def instance(seed: int) -> TInstance:
    """Up to 12 nodes in up to 2 fabrics, leaves of 1-3 nodes, domains of 2-4 nodes (a leaf
    may straddle two domains); 2-4 deployments of 1-3 nodes x 1-8 GPUs, each rule at random."""
    rng = random.Random(seed)
    count = rng.randint(3, 12)
    fabrics = rng.randint(1, min(2, count // 2))
    nodes: list[TNode] = []
    leaf = domain = 0
    in_leaf = in_domain = 0
    leaf_size, domain_size = rng.randint(1, 3), rng.randint(2, 4)
    for i in range(count):
        fabric = f"ib-{'ab'[i * fabrics // count]}"
        if nodes and nodes[-1].fabric != fabric:
            leaf, domain, in_leaf, in_domain = leaf + 1, domain + 1, 0, 0
        if in_leaf == leaf_size:
            leaf, in_leaf, leaf_size = leaf + 1, 0, rng.randint(1, 3)
        if in_domain == domain_size:
            domain, in_domain, domain_size = domain + 1, 0, rng.randint(2, 4)
        gpus = rng.choice((4, 8, 8))
        nodes.append(TNode(f"n{i + 1:02d}", fabric, f"l{leaf}", f"d{domain}", gpus))
        in_leaf += 1
        in_domain += 1
    gangs = []
    for i in range(rng.randint(2, 4)):
        nvlink = rng.choice(("any", "same_domain", "same_domain"))
        leaves = rng.choice(("any", "fewest", "fewest"))
        gangs.append(
            TGang(
                f"m{i}",
                rng.choice((1, 2, 2, 3)),
                rng.choice((1, 2, 4, 8)),
                rng.randint(1, 3),
                nvlink,
                leaves,
            )
        )
    return TInstance(seed, tuple(nodes), tuple(gangs))


Score = tuple[int, int, int, int]
"""GPUs placed, deployments with a replica, replicas placed, minus the leaves spanned by the
replicas of `leaves: fewest` profiles."""


def optimum(inst: TInstance) -> Score:
    m = cp_model.CpModel()
    items: list[tuple[TGang, cp_model.IntVar]] = []
    firsts = []
    load: dict[str, list[cp_model.LinearExprT]] = {n.name: [] for n in inst.nodes}
    spans: list[cp_model.IntVar] = []
    for gang in inst.gangs:
        chain: list[cp_model.IntVar] = []
        for _ in range(gang.replicas):
            placed = m.new_bool_var("")
            groups: dict[str, list[TNode]] = {}
            for n in inst.nodes:
                key = n.fabric + ("/" + n.domain if gang.nvlink == "same_domain" else "")
                groups.setdefault(key, []).append(n)
            ys = []
            xs_all: dict[str, list[cp_model.IntVar]] = {}
            for members in groups.values():
                y = m.new_bool_var("")
                xs = [m.new_bool_var("") for _ in members]
                m.add(sum(xs) == gang.nodes * y)
                for n, x in zip(members, xs, strict=True):
                    load[n.name].append(gang.gpus * x)
                    xs_all.setdefault(n.leaf, []).append(x)
                ys.append(y)
            m.add(sum(ys) == placed)
            if gang.leaves == "fewest":
                for xs in xs_all.values():
                    z = m.new_bool_var("")
                    for x in xs:
                        m.add(z >= x)
                    spans.append(z)
            if chain:
                m.add(chain[-1] >= placed)
            chain.append(placed)
            items.append((gang, placed))
        firsts.append(chain[0])
    for n in inst.nodes:
        if load[n.name]:
            m.add(sum(load[n.name]) <= n.gpus)
    leaf_w = 1
    count_w = len(spans) + 1
    served_w = count_w * (len(items) + 1)
    gpu_w = served_w * (len(inst.gangs) + 1)
    m.maximize(
        sum(gpu_w * g.size * p + count_w * p for g, p in items)
        + served_w * sum(firsts)
        - leaf_w * sum(spans)
    )
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    status = solver.solve(m)
    assert status == cp_model.OPTIMAL, solver.status_name(status)
    chosen = [g for g, p in items if solver.value(p)]
    leaves = sum(solver.value(z) for z in spans)
    return sum(g.size for g in chosen), len({g.model for g in chosen}), len(chosen), -leaves


def infos(nodes: Sequence[TNode]) -> list[NodeInfo]:
    return [
        NodeInfo(
            NodeId(n.name),
            FabricId(n.fabric),
            n.gpus,
            81920,
            (SIM,),
            NodeTopology(LeafId(n.leaf), None, DomainId(n.domain)),
        )
        for n in nodes
    ]


def records(gangs: Sequence[TGang]) -> list[ReplicaRecord]:
    out = []
    for gang in gangs:
        rules = TopologyRules(gang.nvlink, gang.leaves)
        profile = Profile(
            ProfileName(f"p-{gang.model}"), SIM, gang.nodes, gang.gpus, "/m", topology=rules
        )
        for r in range(gang.replicas):
            rid = ReplicaId(f"{gang.model}-r{r + 1}")
            out.append(ReplicaRecord(rid, ModelName(gang.model), profile, r + 1, 0))
    return out


def placed(nodes: Sequence[TNode], gangs: Sequence[TGang]) -> tuple[Score, list[Placement]]:
    """What one whole-set pass places, as a score, and its placements (checked: one fabric,
    one domain where asked, no GPU twice)."""
    idx = CapacityIndex()
    for info in infos(nodes):
        idx.add_node(info)
        idx.set_schedulable(info.node, True)
    where = {n.name: n for n in nodes}
    plan = plan_pass(idx, records(gangs), ReplicaTable(), lambda _p: frozenset())
    got: list[tuple[ReplicaRecord, Placement]] = []
    for rec, result in plan:
        if isinstance(result, Placement):
            for node, held in zip(result.nodes, result.gpus, strict=True):
                idx.book(node, held)  # raises on a GPU booked twice
            got.append((rec, result))
    leaves = 0
    for rec, p in got:
        assert len({where[n].fabric for n in p.nodes}) == 1
        if rec.profile.topology.nvlink == "same_domain":
            assert len({where[n].domain for n in p.nodes}) == 1, (rec.id, p)
        if rec.profile.topology.leaves == "fewest":
            leaves += len({where[n].leaf for n in p.nodes})
    score = (
        sum(r.profile.nodes * r.profile.gpus_per_node for r, _ in got),
        len({r.model for r, _ in got}),
        len(got),
        -leaves,
    )
    return score, [p for _, p in got]


def bound(nodes: Sequence[TNode], gangs: Sequence[TGang], seconds: float = 60.0) -> int:
    """An upper bound of the GPUs any placement holds (the module's text)."""
    m = cp_model.CpModel()
    groups: dict[str, list[TNode]] = {}
    for n in nodes:
        groups.setdefault(f"{n.fabric}/{n.domain}", []).append(n)
        groups.setdefault(n.fabric, []).append(n)
    ks: dict[tuple[str, str], cp_model.IntVar] = {}
    for gang in gangs:
        mine = []
        for key, members in groups.items():
            if ("/" in key) != (gang.nvlink == "same_domain"):
                continue
            slots = sum(min(n.gpus // gang.gpus, gang.replicas) for n in members)
            most = min(gang.replicas, slots // gang.nodes) if len(members) >= gang.nodes else 0
            k = m.new_int_var(0, most, "")
            ks[gang.model, key] = k
            mine.append(k)
        m.add(sum(mine) <= gang.replicas)
    # GPUs: every domain's and every fabric's, whichever gangs use them
    for n_key, members in groups.items():
        fabric = n_key.split("/")[0]
        users = []
        for gang in gangs:
            if "/" in n_key:
                here = ks.get((gang.model, n_key))
                if here is not None:
                    users.append(gang.size * here)
            else:
                for (model, key), k in ks.items():
                    if model == gang.model and key.split("/")[0] == fabric:
                        users.append(gang.size * k)
        if users:
            m.add(sum(users) <= sum(n.gpus for n in members))
    size = {g.model: g.size for g in gangs}
    m.maximize(sum(size[model] * k for (model, _), k in ks.items()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 1
    status = solver.solve(m)
    assert status in (cp_model.OPTIMAL, cp_model.FEASIBLE), solver.status_name(status)
    return int(solver.best_objective_bound)


def large(nodes: int, seed: int = 0, load: float = 1.2) -> tuple[list[TNode], list[TGang]]:
    """A fleet of 4- and 8-GPU nodes in NVLink domains of 18, leaves of 9, fabrics of 4
    domains; deployments of 1 to 16 nodes, each of more than one node asking for one domain,
    70% asking for the fewest leaves, with `load` times the fleet's GPUs in demand."""
    rng = random.Random(seed)
    out = [
        TNode(
            f"n{i:05d}",
            f"ib-{i // 72:03d}",
            f"l{i // 9:04d}",
            f"d{i // 18:04d}",
            rng.choice((4, 8)),
        )
        for i in range(nodes)
    ]
    shapes = ((1, 4), (2, 4), (3, 4), (4, 8), (6, 4), (8, 4), (1, 2), (2, 8), (16, 4), (1, 8))
    total = sum(n.gpus for n in out) * load
    gangs: list[TGang] = []
    while sum(g.size * g.replicas for g in gangs) < total:
        n, g = shapes[rng.randrange(len(shapes))]
        nvlink = "same_domain" if n > 1 or rng.random() < 0.5 else "any"
        leaves = "fewest" if rng.random() < 0.7 else "any"
        gangs.append(TGang(f"m{len(gangs)}", n, g, rng.randint(1, 12), nvlink, leaves))
    return out, gangs
