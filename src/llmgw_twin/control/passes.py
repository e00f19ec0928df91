"""One placement pass over the whole pending set, planned before anything is bound.

The pass places the largest replicas first (`gang_order`), each where it leaves the most room
for the rest (`placement`, `room`). The plan is made on the capacity index itself, booking as it
goes and releasing everything at the end, so nothing is bound and nothing is said until the
plan is chosen. When the first order leaves replicas unplaced and the pass is small enough
(`REPAIR_LIMIT`), a few other orders are tried the same way (`ORDERS`: widest shards first,
most nodes first, smallest first), and the plan that scores best wins: the most GPUs placed,
then the most deployments with a replica, then the most replicas, then the earlier order.
Replicas of a pass's own plan start nothing until bound, so trying again costs no engine a
restart.

Invariants: planning leaves the capacity index as it found it; a plan's placements are
disjoint from one another and from every booking made before the pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmgw_twin.control.model import FabricId, ModelName, NodeId, Profile, ProfileName, ReplicaId
from llmgw_twin.control.placement import CapacityIndex, Placement, Unplaceable
from llmgw_twin.control.replicas import ReplicaRecord, ReplicaTable
from llmgw_twin.control.room import Demand, Shape

Order = Callable[[ReplicaRecord, int], tuple[int | str, ...]]
"""A sort key from a replica and its rank in its deployment (how many of the deployment's
replicas are placed, or come before it in the pass): equal gangs take turns by deployment."""


def gang_order(rec: ReplicaRecord, rank: int = 0) -> tuple[int | str, ...]:
    """Largest gangs first (GPUs, then nodes, then GPUs per node), deployments taking turns;
    model and creation last."""
    p = rec.profile
    return (-p.nodes * p.gpus_per_node, -p.nodes, -p.gpus_per_node, rank, rec.model, rec.seq)


def _widest_first(rec: ReplicaRecord, rank: int) -> tuple[int | str, ...]:
    p = rec.profile
    return (-p.gpus_per_node, -p.nodes, rank, rec.model, rec.seq)


def _most_nodes_first(rec: ReplicaRecord, rank: int) -> tuple[int | str, ...]:
    p = rec.profile
    return (-p.nodes, -p.gpus_per_node, rank, rec.model, rec.seq)


def _smallest_first(rec: ReplicaRecord, rank: int) -> tuple[int | str, ...]:
    p = rec.profile
    return (p.nodes * p.gpus_per_node, p.nodes, rank, rec.model, rec.seq)


ORDERS: tuple[Order, ...] = (gang_order, _widest_first, _most_nodes_first, _smallest_first)

REPAIR_LIMIT = 256
"""Passes with more pending replicas than this try only the first order."""

Result = Placement | Unplaceable


def plan_pass(
    capacity: CapacityIndex,
    todo: Sequence[ReplicaRecord],
    replicas: ReplicaTable,
    excluded: Callable[[ProfileName], frozenset[NodeId]],
    limit: int | None = None,
    keep: bool = False,
) -> list[tuple[ReplicaRecord, Result]]:
    """The chosen plan: each pending replica with where it goes, or why it cannot; with a
    `limit`, only the first `limit` of `todo` in the first order are planned. Nothing is left
    booked, except with `keep` when every replica of the plan is placed: then its GPUs stay
    booked, as the dry run booked them, for the caller to bind without booking again."""
    best: tuple[tuple[int, ...], list[tuple[ReplicaRecord, Result]]] | None = None
    ranks: dict[ReplicaId, int] = {}
    turns: dict[ModelName, int] = {}
    for rec in sorted(todo, key=lambda r: (r.model, r.seq)):
        turn = turns.get(rec.model)
        if turn is None:
            turn = sum(replicas.per_fabric(rec.model).values())
        ranks[rec.id] = turn
        turns[rec.model] = turn + 1
    if limit is not None and len(todo) > limit:
        first = ORDERS[0]
        todo = sorted(todo, key=lambda r: first(r, ranks[r.id]))[:limit]
    orders = ORDERS if len(todo) <= REPAIR_LIMIT else ORDERS[:1]
    for tried, order in enumerate(orders):
        ordered = sorted(todo, key=lambda r, order=order: order(r, ranks[r.id]))  # type: ignore[misc]
        plan = _dry_run(capacity, ordered, replicas, excluded, keep)
        score = _score(plan, replicas, tried)
        if best is None or score > best[0]:
            best = (score, plan)
        if whole(plan):
            break  # everything fits: no order can do better
    assert best is not None
    return best[1]


def whole(plan: Sequence[tuple[ReplicaRecord, Result]]) -> bool:
    """Every replica of `plan` placed (what `plan_pass(keep=True)` leaves booked)."""
    return all(isinstance(r, Placement) for _, r in plan)


def _dry_run(
    capacity: CapacityIndex,
    todo: Sequence[ReplicaRecord],
    replicas: ReplicaTable,
    excluded: Callable[[ProfileName], frozenset[NodeId]],
    keep: bool = False,
) -> list[tuple[ReplicaRecord, Result]]:
    """Each of `todo` placed in turn, booked as it goes; the bookings are released at the end,
    unless `keep` and every one was placed (a whole plan: no other order can beat it)."""
    demand = Demand(capacity, [Shape.of(r.profile) for r in todo])
    per_fabric: dict[ModelName, dict[FabricId, int]] = {}
    per_node: dict[ModelName, dict[NodeId, int]] = {}
    plan: list[tuple[ReplicaRecord, Result]] = []
    # what did not fit, while nothing has been booked since: the same profile on the same
    # capacity, away from the same nodes, cannot fit either (spread and room only rank where
    # it goes), and a registration storm's pending thousands are tried against it at once
    unfit: dict[tuple[Profile, frozenset[NodeId]], Unplaceable] = {}
    kept = False
    try:
        for rec in todo:
            demand.take(Shape.of(rec.profile))
            # copied once a model and pass (a deployment's replicas per node can be thousands)
            fabrics = per_fabric.get(rec.model)
            if fabrics is None:
                fabrics = per_fabric[rec.model] = dict(replicas.per_fabric(rec.model))
            nodes = per_node.get(rec.model)
            if nodes is None:
                nodes = per_node[rec.model] = dict(replicas.per_node(rec.model))
            away = excluded(rec.profile.name)
            ruled = rec.profile.topology.constrained  # rules may weigh spread: always asked
            known = None if ruled else unfit.get((rec.profile, away))
            if known is None:
                result: Result = capacity.place(rec.profile, fabrics, away, nodes, demand)
            else:
                result = known
            plan.append((rec, result))
            if isinstance(result, Unplaceable):
                if not ruled:
                    unfit[rec.profile, away] = result
            else:
                unfit.clear()  # booked: what did not fit may now be elsewhere
                for node, gpus in zip(result.nodes, result.gpus, strict=True):
                    capacity.book(node, gpus)
                    nodes[node] = nodes.get(node, 0) + 1
                fabrics[result.fabric] = fabrics.get(result.fabric, 0) + 1
                demand.placed(result.fabric, Shape.of(rec.profile))
        kept = keep and whole(plan)
    finally:
        for _, result in [] if kept else plan:
            if isinstance(result, Placement):
                for node, gpus in zip(result.nodes, result.gpus, strict=True):
                    capacity.release(node, gpus)
    return plan


def _score(
    plan: Sequence[tuple[ReplicaRecord, Result]], replicas: ReplicaTable, rank: int
) -> tuple[int, ...]:
    placed = [rec for rec, r in plan if isinstance(r, Placement)]
    gpus = sum(r.profile.nodes * r.profile.gpus_per_node for r in placed)
    served = {r.model for r in placed} | {
        m for m in {r.model for r, _ in plan} if any(replicas.per_fabric(m).values())
    }
    return (gpus, len(served), len(placed), -rank)
