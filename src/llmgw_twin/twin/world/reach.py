"""What a request sent to a replica meets in the twin: the world's ground truth, not the
controller's view of it.

Role: the twin's router (`traffic.py`) asks `reach` how a replica it picked would take a
request, as a client would find it: answered, refused at once (nothing listens: the leader's
process is gone, or it fails its peer), unreachable until the connect timeout (its node off or
cut off from the management network), or stalled until the first-byte timeout (a hung engine,
a worker node powered off). `broken` says whether a replica that accepted a request went silent
since, so that the request waits its timeout out rather than failing at once.

Invariants:
- Read-only: nothing here changes the world or the controller.
- A replica is judged by every one of its shards' engines, the leader's serving port included.
"""

from __future__ import annotations

from enum import Enum

from llmgw_twin.control.model import ShardKey
from llmgw_twin.control.replicas import ReplicaRecord
from llmgw_twin.twin.world.node import SimEngine, SimNode
from llmgw_twin.twin.world.sim import World


class Answer(Enum):
    OK = "ok"
    REFUSED = "refused"  # nothing listens: the leader's process is gone
    UNREACHABLE = "unreachable"  # the node is off or cut off: the connect times out
    STALLED = "stalled"  # accepted, never answered


Engines = tuple[tuple[SimNode, int, SimEngine], ...]
"""A replica's engines as a request it accepted depends on them: each with its node and that
node's generation then (a node restarted since is not the one that took the request)."""


def reach(world: World, rec: ReplicaRecord | None) -> tuple[Engines, Answer]:
    """How the replica `rec` takes a request now, and the engines an accepted one rides on."""
    if rec is None or not rec.specs:
        return (), Answer.REFUSED
    leader_node = world.nodes[rec.specs[0].node]
    if not leader_node.up or world.network.control_latency_ms(leader_node.name) is None:
        return (), Answer.UNREACHABLE
    engines: list[tuple[SimNode, int, SimEngine]] = []
    for spec in rec.specs:
        node = world.nodes[spec.node]
        engine = node.engines.get(ShardKey(rec.id, spec.rank))
        if not node.up:
            return (), Answer.STALLED  # a worker powered off: the leader's collective hangs
        if engine is None or engine.stopped or (spec.rank == 0 and not engine.serving):
            return (), Answer.REFUSED  # the leader is gone, or fails its peer at once
        if engine.hung:
            return (), Answer.STALLED
        engines.append((node, node.generation, engine))
    return tuple(engines), Answer.OK


def broken(engines: Engines, world: World) -> bool:
    """Whether a replica that accepted a request went silent since (its node powered off or cut
    off, an engine hung); engines that died with their connections closed were told apart."""
    for node, generation, engine in engines:
        if not (node.up and node.generation == generation) or engine.stopped or engine.hung:
            return True
    return world.network.control_latency_ms(engines[0][0].name) is None
