"""The topology below and beside a fabric: leaf and spine switches, NVLink domains, and a
profile's placement rules over them.

A fabric is a tree of switches: nodes hang off a leaf switch, leaves off a spine, the spines join
at the fabric's core. An NVLink domain (a GB200 NVL72 rack: 18 nodes) is a separate dimension:
nodes whose GPUs share one NVLink switch system, whatever leaf they are under. A node knows its
place in both (`NodeTopology`, carried in `NodeInfo.topology`); a node with no such record, or
with a level left empty, is simply not under anything at that level.

A profile may ask (`TopologyRules`): `nvlink: same_domain`, every shard of a replica in one
NVLink domain (a hard rule, as the fabric is); `leaves: same`, every shard under one leaf (hard);
`leaves: fewest`, as few leaves as the fabric allows (a preference). Both default to `any`, which
leaves placement exactly as it is without a topology.

Invariant: for grouping, a node with no domain (or no leaf) is a group of its own, named by the
node, so a one-node replica always fits its rule and a multi-node one never lands on nodes the
topology does not join.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

LeafId = NewType("LeafId", str)
SpineId = NewType("SpineId", str)
DomainId = NewType("DomainId", str)

NVLINK_RULES = ("any", "same_domain")
"""`nvlink`: no rule, or every shard of a replica in one NVLink domain."""
LEAF_RULES = ("any", "fewest", "same")
"""`leaves`: no rule, as few leaf switches as can be, or exactly one."""


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """Where a node sits: its leaf switch, that leaf's spine, its NVLink domain (None: none)."""

    leaf: LeafId | None = None
    spine: SpineId | None = None
    nvlink_domain: DomainId | None = None


@dataclass(frozen=True, slots=True)
class TopologyRules:
    """A profile's placement rules per level (see the module's text)."""

    nvlink: str = "any"
    leaves: str = "any"

    def __post_init__(self) -> None:
        if self.nvlink not in NVLINK_RULES:
            raise ValueError(f"nvlink must be one of {', '.join(NVLINK_RULES)}")
        if self.leaves not in LEAF_RULES:
            raise ValueError(f"leaves must be one of {', '.join(LEAF_RULES)}")

    @property
    def constrained(self) -> bool:
        """Placement must read the topology (any rule other than `any`)."""
        return self.nvlink != "any" or self.leaves != "any"

    def describe(self) -> str:
        """The rules as a clause of an unplaceable reason: `in one NVLink domain, ...`."""
        parts = []
        if self.nvlink == "same_domain":
            parts.append("in one NVLink domain")
        if self.leaves == "same":
            parts.append("under one leaf switch")
        return ", ".join(parts)


NO_TOPOLOGY = NodeTopology()
ANY = TopologyRules()


def domain_key(node: str, topo: NodeTopology | None) -> str:
    """The NVLink group a node belongs to for placement: its domain, else itself alone."""
    if topo is not None and topo.nvlink_domain is not None:
        return f"domain:{topo.nvlink_domain}"
    return f"node:{node}"


def leaf_key(node: str, topo: NodeTopology | None) -> str:
    """The leaf group a node belongs to for placement: its leaf, else itself alone."""
    if topo is not None and topo.leaf is not None:
        return f"leaf:{topo.leaf}"
    return f"node:{node}"


def group_key(node: str, topo: NodeTopology | None, rules: TopologyRules) -> str:
    """The group of `rules`' hard rules a node is in (every node of a replica in one): its
    NVLink domain, its leaf, or both; "" when the rules ask neither."""
    parts = []
    if rules.nvlink == "same_domain":
        parts.append(domain_key(node, topo))
    if rules.leaves == "same":
        parts.append(leaf_key(node, topo))
    return "+".join(parts)
