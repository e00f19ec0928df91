"""Placement under a profile's topology rules (`topology.TopologyRules`): one NVLink domain, one
leaf, or the fewest leaves.

Only a profile with a rule comes here (`CapacityIndex.place`); every other placement is the
fabric placement of `placement.py`, untouched. For a ruled profile:

1. Each fabric's eligible nodes (schedulable, onboarded with the engine, linked when the replica
   spans nodes, not excluded, with `g` free GPUs) are split into groups: per NVLink domain for
   `nvlink: same_domain`, per leaf for `leaves: same`, both for both; the whole fabric when
   neither hard rule is asked (`leaves: fewest` alone). A node outside every domain (or leaf) is
   a group of its own (`topology.domain_key`).
2. In each group with `n` eligible nodes, nodes are chosen: for `leaves: fewest`, the fewest
   leaves that hold `n` of them (largest first; a single leaf, the tightest that can), then
   inside, fewest replicas of the deployment on the node, tightest fit, least instability, name.
3. Groups are ranked by the room the choice takes from what is pending (`room.Demand`), the
   deployment's replicas already in the fabric, the leaves used (`fewest` only), the free GPUs
   the choice leaves, then fabric and group name.

The eligible groups of a fabric are cached per fabric version (`CapacityBook.version_of`), so a
pass costs the fabrics that changed, not the fleet, when nothing is excluded.

Invariant: a choice's nodes are one fabric's, each eligible; under `same_domain` all share one
NVLink domain, under `leaves: same` one leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from llmgw_twin.control.capacity import CapacityBook
from llmgw_twin.control.model import FabricId, NodeId, Profile
from llmgw_twin.control.room import Demand, Shape
from llmgw_twin.control.topology import TopologyRules, group_key, leaf_key

REASON_GROUPS = 6
"""An unplaceable reason names at most this many groups (those closest to fitting)."""

Member = tuple[int, NodeId, str]
"""An eligible node: its free GPUs, its name, its leaf group."""


@dataclass(slots=True)
class GroupCache:
    """Per (fabric, shape, grouping): the fabric version it was read at and its groups."""

    entries: dict[tuple[FabricId, Shape, str], tuple[int, list[tuple[str, list[Member]]]]] = field(
        default_factory=dict
    )


def _grouping(rules: TopologyRules) -> str:
    return f"{rules.nvlink}/{'same' if rules.leaves == 'same' else 'any'}"


def _groups(
    book: CapacityBook,
    fabric: FabricId,
    shape: Shape,
    rules: TopologyRules,
    excluded: frozenset[NodeId],
    cache: GroupCache,
) -> list[tuple[str, list[Member]]]:
    """The fabric's eligible nodes split into the rules' groups, by group name."""
    key = (fabric, shape, _grouping(rules))
    version = book.version_of(fabric)
    use_cache = not any(book.fabric_of(n) == fabric for n in excluded)
    if use_cache and (hit := cache.entries.get(key)) is not None and hit[0] == version:
        return hit[1]
    groups: dict[str, list[Member]] = {}
    for node in book.nodes_of(fabric):
        if node in excluded or not book.can_run(node, shape):
            continue
        free = len(book.free_gpus(node))
        if free < shape.gpus:
            continue
        topo = book.topology_of(node)
        group = group_key(node, topo, rules) or "fabric"
        groups.setdefault(group, []).append((free, node, leaf_key(node, topo)))
    out = sorted(groups.items())
    if use_cache:
        cache.entries[key] = (version, out)
    return out


def _choose(
    book: CapacityBook,
    members: list[Member],
    shape: Shape,
    rules: TopologyRules,
    spread: Mapping[NodeId, int],
    loss: Callable[[list[tuple[int, int]]], int] | None = None,
) -> tuple[list[NodeId], list[int], int]:
    """The nodes of one group for a replica (`len(members) >= shape.nodes`): the nodes, their
    free counts, and the leaves they span. With `loss` (room is tight in the fabric), each node
    is the one whose taking loses the least room from what is pending, as `placement._choose`
    does."""
    risk = book.stability.risk

    def order(m: Member) -> tuple[int, int, float, NodeId]:
        return (spread.get(m[1], 0), m[0], risk.get(m[1], 0.0), m[1])

    need = shape.nodes
    if rules.leaves != "fewest":
        if loss is None:
            picked = sorted(members, key=order)[:need]
        else:
            picked = _least_loss(members, need, shape, order, loss)
        return [m[1] for m in picked], [m[0] for m in picked], len({m[2] for m in picked})
    by_leaf: dict[str, list[Member]] = {}
    for m in members:
        by_leaf.setdefault(m[2], []).append(m)
    for ms in by_leaf.values():
        ms.sort(key=order)
    # the fewest leaves: the largest first, the last one the tightest that holds the rest
    sizes = sorted(by_leaf, key=lambda k: (-len(by_leaf[k]), k))
    chosen: list[Member] = []
    used = 0
    while len(chosen) < need:
        rest = need - len(chosen)
        fits = [k for k in sizes if len(by_leaf[k]) >= rest]
        if fits:
            last = min(fits, key=lambda k: (_cost(by_leaf[k][:rest], shape, spread), k))
            chosen.extend(by_leaf[last][:rest])
            used += 1
            break
        leaf = sizes.pop(0)
        chosen.extend(by_leaf[leaf])
        used += 1
    if loss is not None:
        # the fewest leaves only where they lose no more room than the least-loss choice
        other = _least_loss(members, need, shape, order, loss)
        spent = loss([(m[0], m[0] - shape.gpus) for m in chosen])
        if loss([(m[0], m[0] - shape.gpus) for m in other]) < spent:
            chosen, used = other, len({m[2] for m in other})
    return [m[1] for m in chosen], [m[0] for m in chosen], used


def _least_loss(
    members: list[Member],
    need: int,
    shape: Shape,
    order: Callable[[Member], tuple[int, int, float, NodeId]],
    loss: Callable[[list[tuple[int, int]]], int],
) -> list[Member]:
    """`need` members, one at a time, each the least loss, then by `order`."""
    rest = sorted(members, key=order)
    picked: list[Member] = []
    changes: list[tuple[int, int]] = []
    for _ in range(need):
        best: tuple[tuple[int, int, int, float, NodeId], int] | None = None
        seen: set[int] = set()
        for i, m in enumerate(rest):
            if m[0] in seen:
                continue  # the first of each free count is the best of it by `order`
            seen.add(m[0])
            key = (loss([*changes, (m[0], m[0] - shape.gpus)]), *order(m))
            if best is None or key < best[0]:
                best = (key, i)
        assert best is not None
        m = rest.pop(best[1])
        picked.append(m)
        changes.append((m[0], m[0] - shape.gpus))
    return picked


def _cost(ms: list[Member], shape: Shape, spread: Mapping[NodeId, int]) -> tuple[int, int]:
    return sum(spread.get(m[1], 0) for m in ms), sum(m[0] - shape.gpus for m in ms)


def place_by_topology(
    book: CapacityBook,
    profile: Profile,
    replicas_per_fabric: Mapping[FabricId, int],
    excluded: frozenset[NodeId],
    spread: Mapping[NodeId, int],
    demand: Demand | None,
    cache: GroupCache,
    only: FabricId | None = None,
) -> tuple[FabricId, list[NodeId]] | str:
    """A fabric and nodes for one replica of a ruled profile, or why there are none."""
    shape = Shape.of(profile)
    rules = profile.topology
    fewest = rules.leaves == "fewest"
    best: tuple[tuple[int, int, int, int, FabricId, str], list[NodeId]] | None = None
    short: list[tuple[int, str]] = []
    for fabric in book.fabrics():
        if only is not None and fabric != only:
            continue
        tight = demand is not None and demand.tight(fabric)
        for name, members in _groups(book, fabric, shape, rules, excluded, cache):
            if len(members) < shape.nodes:
                short.append((len(members), _label(fabric, name)))
                continue
            judge = None
            if tight and demand is not None:
                judge = partial(demand.loss, fabric, shape.engine)
            nodes, frees, leaves = _choose(book, members, shape, rules, spread, judge)
            loss = 0
            if judge is not None:
                loss = judge([(v, v - shape.gpus) for v in frees])
            leftover = sum(v - shape.gpus for v in frees)
            same = replicas_per_fabric.get(fabric, 0)
            key = (loss, same, leaves if fewest else 0, leftover, fabric, name)
            if best is None or key < best[0]:
                best = (key, nodes)
    if best is not None:
        return best[0][4], best[1]
    return _reason(profile, short)


def _label(fabric: FabricId, group: str) -> str:
    """`ib-a` for a whole fabric, else `ib-a/nvl-1`, `ib-a/nvl-1+leaf-2`, `ib-a/node07`."""
    if group == "fabric":
        return fabric
    return f"{fabric}/" + "+".join(part.split(":", 1)[1] for part in group.split("+"))


def _reason(profile: Profile, short: list[tuple[int, str]]) -> str:
    where = profile.topology.describe()
    need = (
        f"needs {profile.nodes} node(s) with {profile.gpus_per_node} free GPU(s) and "
        f"engine {profile.engine} in one fabric" + (f", {where}" if where else "")
    )
    closest = sorted((s for s in short if s[0] > 0), key=lambda s: (-s[0], s[1]))
    if not closest:
        return f"{need}: no group has an eligible node"
    shown = closest[:REASON_GROUPS]
    text = "; ".join(f"{label} has {count}" for count, label in sorted(shown, key=lambda s: s[1]))
    more = len(closest) - len(shown)
    if more:
        text += f"; {more} more group(s) have fewer"
    return f"{need}: {text}"
