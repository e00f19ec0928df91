"""The scenario loader's `cluster.topology` (the project's addition): leaf and spine switches
below the fabrics, NVLink domains beside them (docs/topology.md).

```yaml
cluster:
  fabrics: {ib-a: [node01, node02, node03, node04]}
  topology:
    leaves: {leaf-1: [node01, node02], leaf-2: [node03, node04]}
    spines: {spine-1: [leaf-1], spine-2: [leaf-2]}
    nvlink_domains: {nvl-1: [node01, node02, node03, node04]}
```

Role: read the section, check it against the fleet, and hand each node its `NodeTopology`.

Invariants:
- A node is under at most one leaf and in at most one NVLink domain; a leaf is under at most
  one spine. A level may be left out, and a node left out of a level has nothing there.
- A leaf's nodes are one fabric's, and so are a spine's leaves (a switch belongs to one fabric).
- Leaves, spines and domains are names; a spine names leaves of `leaves`, a leaf and a domain
  name nodes of `cluster.fabrics`, each at least one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from yaml.nodes import Node

from llmgw_twin.control.model import FabricId, NodeId, NodeInfo
from llmgw_twin.control.topology import (
    LEAF_RULES,
    NVLINK_RULES,
    DomainId,
    LeafId,
    NodeTopology,
    SpineId,
)
from llmgw_twin.twin.scenario import yamlnodes as yn

TOPOLOGY_KEYS = ("leaves", "spines", "nvlink_domains")


@dataclass(frozen=True, slots=True)
class TopologyNames:
    """What topology faults may name: each leaf, spine and domain with its members."""

    leaves: dict[str, tuple[NodeId, ...]] = field(default_factory=dict)
    spines: dict[str, tuple[str, ...]] = field(default_factory=dict)
    domains: dict[str, tuple[NodeId, ...]] = field(default_factory=dict)


def load_topology(
    node: Node | None, infos: Sequence[NodeInfo]
) -> tuple[tuple[NodeInfo, ...], TopologyNames]:
    """`infos` with each node's place in the topology; unchanged when there is no section."""
    if node is None:
        return tuple(infos), TopologyNames()
    view = yn.MapView(node, "cluster.topology")
    view.check_keys(TOPOLOGY_KEYS)
    fabric_of = {i.node: i.fabric for i in infos}
    leaves = _members(view.get("leaves"), "cluster.topology.leaves", "leaf", fabric_of)
    domains = _members(
        view.get("nvlink_domains"), "cluster.topology.nvlink_domains", "NVLink domain", fabric_of
    )
    spines = _spines(view.get("spines"), leaves, fabric_of)
    leaf_of = {n: leaf for leaf, ns in leaves.items() for n in ns}
    spine_of = {leaf: spine for spine, ls in spines.items() for leaf in ls}
    domain_of = {n: d for d, ns in domains.items() for n in ns}
    out = []
    for info in infos:
        leaf = leaf_of.get(info.node)
        domain = domain_of.get(info.node)
        if leaf is None and domain is None:
            out.append(info)
            continue
        spine = spine_of.get(leaf) if leaf is not None else None
        topo = NodeTopology(
            LeafId(leaf) if leaf is not None else None,
            SpineId(spine) if spine is not None else None,
            DomainId(domain) if domain is not None else None,
        )
        out.append(replace(info, topology=topo))
    return tuple(out), TopologyNames(leaves, spines, domains)


def _members(
    node: Node | None, where: str, what: str, fabric_of: dict[NodeId, FabricId]
) -> dict[str, tuple[NodeId, ...]]:
    """A mapping of names to nodes, each node under one name at most."""
    if node is None:
        return {}
    out: dict[str, tuple[NodeId, ...]] = {}
    first: dict[str, str] = {}
    for entry in yn.MapView(node, where).entries:
        name = yn.name(entry.key_node, where, f"{what} name")
        here = f"{where}.{name}"
        items = yn.items(entry.value, here)
        if not items:
            raise yn.Invalid.at(entry.value, f"{what} '{name}' must list at least one node")
        names: list[NodeId] = []
        fabric: FabricId | None = None
        for i, item in enumerate(items):
            member = yn.text(item, f"{here}[{i}]", 128, "names")
            if member not in fabric_of:
                raise yn.Invalid.at(
                    item,
                    f"{here}[{i}]: unknown node '{yn.short(member)}' (expected a node listed "
                    f"under cluster.fabrics: {yn.preview(list(fabric_of))})",
                )
            node_id = NodeId(member)
            if member in first:
                raise yn.Invalid.at(
                    item, f"{here}: node '{member}' is already under {what} '{first[member]}'"
                )
            if what == "leaf" and fabric is not None and fabric_of[node_id] != fabric:
                raise yn.Invalid.at(
                    item,
                    f"{here}: node '{member}' is in fabric '{fabric_of[node_id]}', the leaf's "
                    f"other nodes in '{fabric}' (a leaf switch belongs to one fabric)",
                )
            fabric = fabric_of[node_id]
            first[member] = name
            names.append(node_id)
        out[name] = tuple(names)
    return out


def _spines(
    node: Node | None,
    leaves: dict[str, tuple[NodeId, ...]],
    fabric_of: dict[NodeId, FabricId],
) -> dict[str, tuple[str, ...]]:
    if node is None:
        return {}
    where = "cluster.topology.spines"
    out: dict[str, tuple[str, ...]] = {}
    first: dict[str, str] = {}
    for entry in yn.MapView(node, where).entries:
        name = yn.name(entry.key_node, where, "spine name")
        here = f"{where}.{name}"
        items = yn.items(entry.value, here)
        if not items:
            raise yn.Invalid.at(entry.value, f"spine '{name}' must list at least one leaf")
        names: list[str] = []
        fabric: FabricId | None = None
        for i, item in enumerate(items):
            leaf = yn.text(item, f"{here}[{i}]", 128, "names")
            if leaf not in leaves:
                raise yn.Invalid.at(
                    item,
                    f"{here}[{i}]: unknown leaf '{yn.short(leaf)}' (expected a leaf of "
                    f"cluster.topology.leaves: {yn.preview(list(leaves))})",
                )
            if leaf in first:
                raise yn.Invalid.at(
                    item, f"{here}: leaf '{leaf}' is already under spine '{first[leaf]}'"
                )
            leaf_fabric = fabric_of[leaves[leaf][0]]
            if fabric is not None and leaf_fabric != fabric:
                raise yn.Invalid.at(
                    item,
                    f"{here}: leaf '{leaf}' is in fabric '{leaf_fabric}', the spine's other "
                    f"leaves in '{fabric}' (a spine switch belongs to one fabric)",
                )
            fabric = leaf_fabric
            first[leaf] = name
            names.append(leaf)
        out[name] = tuple(names)
    return out


def load_rules(nvlink: Node | None, leaves: Node | None, where: str) -> tuple[str, str]:
    """A profile's `nvlink` and `leaves` rules (default `any`)."""
    nv = "any" if nvlink is None else yn.choice(nvlink, f"{where}.nvlink", NVLINK_RULES, "rule")
    lv = "any" if leaves is None else yn.choice(leaves, f"{where}.leaves", LEAF_RULES, "rule")
    return nv, lv
