"""A scenario's `initial` state after loading (`initial.py` reads it; docs/scenarios.md)."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw_twin.control.model import (
    RENDEZVOUS_PORT_BASE,
    FabricId,
    ModelName,
    NodeId,
    Profile,
    ProfileName,
    ReplicaId,
    ShardSpec,
)


@dataclass(frozen=True, slots=True)
class InitialNode:
    node: NodeId
    state: str = "alive"
    failed_gpus: tuple[int, ...] = ()
    cordoned: bool = False
    draining: bool = False


@dataclass(frozen=True, slots=True)
class InitialQuarantine:
    node: NodeId
    profile: ProfileName
    for_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class InitialReplica:
    id: ReplicaId
    model: ModelName
    profile: ProfileName
    seq: int
    state: str
    """`ready` (every shard's engine serving or joined), `starting` (engines started at the run's
    start, loading), or `pending` (wanted, placed nowhere: the twin's controller places it)."""
    fabric: FabricId | None
    specs: tuple[ShardSpec, ...]
    group: str = ""
    """A role group's member: its group and role (docs/topology.md); empty: a plain replica."""
    role: str = ""


@dataclass(frozen=True, slots=True)
class Initial:
    nodes: tuple[InitialNode, ...] = ()
    quarantines: tuple[InitialQuarantine, ...] = ()
    replicas: tuple[InitialReplica, ...] = ()

    def node(self, name: NodeId) -> InitialNode:
        for n in self.nodes:
            if n.node == name:
                return n
        return InitialNode(name)

    def placed(self) -> tuple[InitialReplica, ...]:
        return tuple(r for r in self.replicas if r.specs)


def shard_specs(
    rid: ReplicaId,
    model: ModelName,
    profile: Profile,
    layout: list[tuple[NodeId, tuple[int, ...]]],
    role: str = "",
) -> tuple[ShardSpec, ...]:
    """The specs the controller hands a replica placed on `layout` (node and GPUs by rank), as
    its placement (`control/lifecycle.py`, `bind`) writes them (a role group's `role` too)."""
    nodes = tuple(n for n, _ in layout)
    return tuple(
        ShardSpec(
            replica=rid,
            model=model,
            profile=profile.name,
            engine=profile.engine,
            model_path=profile.model,
            rank=rank,
            shard_count=profile.nodes,
            node=node,
            gpus=gpus,
            leader=nodes[0],
            nodes=nodes,
            rendezvous_port=RENDEZVOUS_PORT_BASE + layout[0][1][0],
            rank_ports=tuple(RENDEZVOUS_PORT_BASE + g[0] for _, g in layout),
            load_time_ms=profile.load_time_ms,
            args=profile.args,
            role=role,
        )
        for rank, (node, gpus) in enumerate(layout)
    )
