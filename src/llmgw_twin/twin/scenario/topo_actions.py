"""Fault actions per topology level (the project's addition, docs/topology.md): a leaf switch
down, a spine down, an NVLink domain failing as one, one node's NVLink degraded. Plain values;
`topo_faults.py` reads them, `twin/world/topo_faults.py` carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw_twin.control.model import NodeId


@dataclass(frozen=True, slots=True)
class LeafDown:
    """The leaf switch fails for `for_ms`: every node under it loses its fabric link and its
    management link (the leaf carries both), as a cut link and a partition do."""

    leaf: str
    nodes: tuple[NodeId, ...]
    for_ms: int


@dataclass(frozen=True, slots=True)
class SpineDown:
    """The spine fails for `for_ms`: the fabric splits; the nodes under each of its leaves reach
    only one another, the rest of the fabric stays joined. Links stay up: agents see nothing."""

    spine: str
    leaves: tuple[tuple[str, tuple[NodeId, ...]], ...]
    """Each leaf under the spine, with its nodes."""
    for_ms: int


@dataclass(frozen=True, slots=True)
class NvlinkDomainDown:
    """Every node of the NVLink domain fails together (crashes: processes gone, sockets closed);
    with `for_ms`, they boot again after it, else they stay down (`restart_node` boots one)."""

    domain: str
    nodes: tuple[NodeId, ...]
    for_ms: int | None = None


@dataclass(frozen=True, slots=True)
class NvlinkDegraded:
    """One node's NVLink runs degraded for `for_ms`: its engines run `factor` times slower, as
    `slow_node` makes them (exact: a fraction of integers)."""

    node: NodeId
    factor_num: int
    factor_den: int
    for_ms: int


TopologyFault = LeafDown | SpineDown | NvlinkDomainDown | NvlinkDegraded

TOPOLOGY_FAULT_KEYS: dict[str, type] = {
    "leaf_down": LeafDown,
    "spine_down": SpineDown,
    "nvlink_domain_down": NvlinkDomainDown,
    "nvlink_degraded": NvlinkDegraded,
}
