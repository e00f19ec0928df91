"""The fault shapes real fleets show, in the twin: a node's own fabric link cut, a straggler,
heartbeats that arrive late, a node added at run time.

- `cut_fabric_link`: the node's link to its fabric switch goes down for a while. Its management
  link is untouched, so the controller hears it (and its inventory reports the port down); every
  multi-node replica with a shard on it loses the peer across the link, on both sides, as a
  fabric outage does to all of a fabric. Outages of one link overlap and end with the last, and a
  link also under a `fabric_down` comes back only when both have ended (`network.Network`).
- `slow_node`: the node's engines run `factor` times slower for a while: an engine started
  meanwhile loads in `factor` times its load time, and a request a replica with a shard there
  accepts meanwhile takes `factor` times as long (`traffic.py`); the heartbeats still arrive.
  Overlapping slowdowns: the slowest counts. Exact: the factor is a fraction of integers, times
  are rounded up to whole milliseconds.
- `delay_heartbeats`: each heartbeat the nodes send during the window arrives `by` late, in the
  order sent (`heartbeats.Heartbeats.send`); none is dropped. The agent's own reports of a change
  are not held back, so a late heartbeat can arrive after a newer report: the controller hears
  the node alive by it and ignores its contents (its report version is older).
- `add_node`: the node (in the world, powered off, from the start) boots and registers.
"""

from __future__ import annotations

from fractions import Fraction

from llmgw_twin.control.model import NodeId
from llmgw_twin.twin.scenario.model import AddNode, CutFabricLink, DelayHeartbeats, SlowNode
from llmgw_twin.twin.world.sim import World

Shape = CutFabricLink | SlowNode | DelayHeartbeats | AddNode


def shape_fault(world: World, action: Shape) -> None:
    match action:
        case CutFabricLink(node=node, for_ms=for_ms):
            cut_link(world, node)
            world.later(for_ms, lambda: heal_link(world, node))
        case SlowNode(node=node, factor_num=num, factor_den=den, for_ms=for_ms):
            sim = world.nodes[node]
            factor = Fraction(num, den)
            sim.slow.append(factor)
            world.later(for_ms, lambda: sim.slow.remove(factor))
        case DelayHeartbeats(nodes=nodes, by_ms=by_ms, for_ms=for_ms):
            world.heartbeats.delay(nodes, by_ms)
            world.later(for_ms, lambda: world.heartbeats.undelay(nodes, by_ms))
        case AddNode(info=info):
            world.nodes[info.node].boot()


def cut_link(world: World, node: NodeId) -> None:
    """The node's own fabric link goes down (`cut_fabric_link`, a leaf switch down)."""
    sim = world.nodes[node]
    if world.network.cut_link(node):
        sim.fabric_link(False)  # the inventory sees its port go down
    # every multi-node replica with a shard here spans the link: its peers lose it, on both sides
    replicas = {e.spec.replica for e in sim.engines.values() if e.spec.shard_count > 1}
    sim.lose_peers()
    world.peers_lost(replicas, node)


def heal_link(world: World, node: NodeId) -> None:
    """An outage of the node's own link ends (it is back with the last)."""
    if world.network.restore_link(node):
        world.nodes[node].fabric_link(True)
