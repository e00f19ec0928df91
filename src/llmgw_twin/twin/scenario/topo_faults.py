"""The scenario loader's fault actions per topology level: `leaf_down`, `spine_down`,
`nvlink_domain_down` and `nvlink_degraded` (docs/topology.md).

Role: read one such action, its leaf, spine or domain checked against `cluster.topology`
(`topology.TopologyNames`), and carry the members the world acts on in the action itself.

Invariants: a named leaf, spine or domain exists; `for` is longer than 0 (optional for a
domain); a degradation factor is exact, from 1 to `shapes.MAX_SLOW_FACTOR`.
"""

from __future__ import annotations

from collections.abc import Callable

from yaml.nodes import Node

from llmgw_twin.control.model import NodeId
from llmgw_twin.twin.scenario import yamlnodes as yn
from llmgw_twin.twin.scenario.limits import MAX_NAME_LEN
from llmgw_twin.twin.scenario.topo_actions import (
    LeafDown,
    NvlinkDegraded,
    NvlinkDomainDown,
    SpineDown,
    TopologyFault,
)
from llmgw_twin.twin.scenario.topology import TopologyNames

TOPOLOGY_ACTION_KEYS: dict[str, tuple[str, ...]] = {
    "leaf_down": ("leaf", "for"),
    "spine_down": ("spine", "for"),
    "nvlink_domain_down": ("domain", "for"),
    "nvlink_degraded": ("node", "factor", "for"),
}
"""Each action's keys, as `faults._ACTION_KEYS` gives the others'."""

DEFAULT_DEGRADED_FACTOR = 2
"""How much slower a node's engines run over a degraded NVLink unless the fault says."""


def _named(node: Node, where: str, known: dict[str, object], what: str) -> str:
    value = yn.text(node, where, MAX_NAME_LEN, "names")
    if value not in known:
        have = yn.preview(list(known)) if known else "none: cluster.topology defines no " + what
        raise yn.Invalid.at(node, f"{where}: unknown {what} '{yn.short(value)}' (known: {have})")
    return value


def topology_action(
    key: str,
    view: yn.MapView,
    where: str,
    node_ref: Callable[[Node, str], NodeId],
    names: TopologyNames,
    factor: Callable[[Node, str], tuple[int, int]],
) -> TopologyFault:
    """One topology fault; `factor` reads a slowdown factor as `slow_node`'s."""

    def need(sub: str) -> tuple[Node, str]:
        return view.require(sub), f"{where}.{sub}"

    match key:
        case "leaf_down":
            leaf = _named(*need("leaf"), dict(names.leaves), "leaf")
            return LeafDown(leaf, names.leaves[leaf], yn.duration(*need("for"), positive=True))
        case "spine_down":
            spine = _named(*need("spine"), dict(names.spines), "spine")
            leaves = tuple((leaf, names.leaves[leaf]) for leaf in names.spines[spine])
            return SpineDown(spine, leaves, yn.duration(*need("for"), positive=True))
        case "nvlink_domain_down":
            domain = _named(*need("domain"), dict(names.domains), "NVLink domain")
            for_node = view.get("for")
            for_ms = None if for_node is None else yn.duration(for_node, f"{where}.for", True)
            return NvlinkDomainDown(domain, names.domains[domain], for_ms)
        case "nvlink_degraded":
            node = node_ref(*need("node"))
            factor_node = view.get("factor")
            num, den = (
                (DEFAULT_DEGRADED_FACTOR, 1)
                if factor_node is None
                else factor(factor_node, f"{where}.factor")
            )
            return NvlinkDegraded(node, num, den, yn.duration(*need("for"), positive=True))
    raise AssertionError(key)
