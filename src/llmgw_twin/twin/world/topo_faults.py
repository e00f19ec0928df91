"""Faults per topology level, in the twin (docs/topology.md): what a leaf switch, a spine, an
NVLink domain or one node's NVLink failing does to the world.

- `leaf_down`: the leaf carries its nodes' fabric links and their management links, so each
  node under it is cut as `cut_fabric_link` cuts one (its inventory sees the port go down, every
  multi-node replica with a shard on it loses the peer across the link) and as `partition` cuts
  one (heartbeats and commands dropped both ways, engines running on). Both heal after `for`,
  each with the last of overlapping outages of that link.
- `spine_down`: the fabric splits (`network.Network.split`): the nodes under each leaf of the
  spine reach only one another, the rest of the fabric stays joined. Every link stays up, so no
  agent sees anything; every multi-node replica with shards on two sides of the split loses its
  peers at once (its engines exit, as a fabric outage makes them), and a worker started meanwhile
  cannot join a leader across the split. The controller learns of it only from those exits.
- `nvlink_domain_down`: every node of the domain crashes at the same instant (one node's NVLink
  error takes the domain's GPUs down together): processes gone, sockets closed; with `for`, each
  boots again after it.
- `nvlink_degraded`: the node's engines run `factor` times slower for `for` (`slow_node`).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from llmgw_twin.control.model import NodeId, ReplicaId
from llmgw_twin.twin.scenario.topo_actions import (
    LeafDown,
    NvlinkDegraded,
    NvlinkDomainDown,
    SpineDown,
    TopologyFault,
)
from llmgw_twin.twin.world.shapes import cut_link, heal_link
from llmgw_twin.twin.world.sim import World

Cut = Callable[[NodeId], None]


def topology_fault(world: World, action: TopologyFault, cut: Cut, heal: Cut) -> None:
    """Carry out one topology fault; `cut` and `heal` cut a node from the controller and heal
    it, counted with the scenario's partitions (overlaps heal with the last)."""
    match action:
        case LeafDown(nodes=nodes, for_ms=for_ms):
            for node in nodes:  # the leaf carries the management links too: no report
                cut(node)  # of what follows gets out, from any node under it
            for node in nodes:
                cut_link(world, node)

            def back() -> None:
                for node in nodes:
                    heal(node)
                    heal_link(world, node)

            world.later(for_ms, back)
        case SpineDown(spine=spine, leaves=leaves, for_ms=for_ms):
            islands = {node: leaf for leaf, members in leaves for node in members}
            world.network.split(spine, islands)
            world.peers_lost(_spanning(world, islands), NodeId(""))
            world.later(for_ms, lambda: world.network.join_split(spine))
        case NvlinkDomainDown(nodes=nodes, for_ms=for_ms):
            up = [n for n in nodes if world.nodes[n].up]
            # all at one instant: no node of the domain outlives another to report its loss
            spanning = {
                e.spec.replica
                for n in up
                for e in world.nodes[n].engines.values()
                if e.spec.shard_count > 1
            }
            for node in up:
                world.nodes[node].kill(sockets_close=True)
            world.peers_lost(spanning, NodeId(""))
            if for_ms is not None:
                world.later(for_ms, lambda: _boot(world, up))
        case NvlinkDegraded(node=node, factor_num=num, factor_den=den, for_ms=for_ms):
            sim = world.nodes[node]
            factor = Fraction(num, den)
            sim.slow.append(factor)
            world.later(for_ms, lambda: sim.slow.remove(factor))


def _spanning(world: World, islands: dict[NodeId, str]) -> set[ReplicaId]:
    """The multi-node replicas running with shards on two sides of the split."""
    out: set[ReplicaId] = set()
    for name in sorted(islands):
        for engine in world.nodes[name].engines_sorted():
            spec = engine.spec
            if spec.shard_count > 1:
                sides = {islands.get(n, "") for n in spec.nodes or (spec.node, spec.leader)}
                if len(sides) > 1:
                    out.add(spec.replica)
    return out


def _boot(world: World, nodes: list[NodeId]) -> None:
    for node in nodes:
        if not world.nodes[node].up:  # not booted again meanwhile by a restart_node
            world.nodes[node].boot()
