"""The blast radius of a placed replica, per topology level: which failure of a node, a leaf
switch, a spine, an NVLink domain or the fabric takes it down (`ctl explain` shows it;
docs/topology.md).

- a node, an NVLink domain, a leaf: any that holds one of its shards (a domain fails as one; a
  leaf carries its nodes' links);
- a spine: only when the replica spans two leaves or more, the spines of its leaves (a spine down
  splits the fabric between its leaves; a replica under one leaf talks through that leaf alone);
- the fabric: its own.

Pure reads of the nodes' registered topology (`NodeInfo.topology`); a replica none of whose nodes
registered a topology gets only the node and fabric levels. Deterministic: names sorted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from llmgw_twin.control.model import NodeId, NodeInfo


def blast_radius(
    nodes: Sequence[NodeId], fabric: str | None, info: Callable[[NodeId], NodeInfo | None]
) -> dict[str, Any] | None:
    """Per level, what takes the replica on `nodes` down; None when no node has a topology."""
    places = [(n, i.topology if (i := info(n)) is not None else None) for n in nodes]
    if all(t is None for _, t in places):
        return None
    leaves = sorted({t.leaf for _, t in places if t is not None and t.leaf is not None})
    domains = sorted(
        {t.nvlink_domain for _, t in places if t is not None and t.nvlink_domain is not None}
    )
    spread = len(leaves) > 1 or any(t is None or t.leaf is None for _, t in places)
    spines = (
        sorted({t.spine for _, t in places if t is not None and t.spine is not None})
        if spread and len(nodes) > 1
        else []
    )
    return {
        "nodes": sorted(nodes),
        "leaves": leaves,
        "spines": spines,
        "nvlink_domains": domains,
        "fabric": fabric,
        "summary": summary(len(nodes), leaves, spines, domains),
    }


def summary(
    count: int, leaves: Sequence[str], spines: Sequence[str], domains: Sequence[str]
) -> str:
    parts = [f"any of its {count} node(s)"]
    if leaves:
        parts.append(f"leaf {', '.join(leaves)}")
    if spines:
        parts.append(f"spine {', '.join(spines)} (it spans leaves)")
    if domains:
        parts.append(f"NVLink domain {', '.join(domains)}")
    return "down if " + "; ".join(parts) + "; or its fabric"
