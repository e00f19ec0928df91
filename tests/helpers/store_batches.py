"""Deterministic batches of durable writes, shared by the store tests and the writer process."""

from __future__ import annotations

import random

from llmgw_twin.control.durable import (
    DeleteReplica,
    PutDeployment,
    PutNode,
    PutProfile,
    PutReplica,
    PutSeq,
    ReplicaRow,
    Write,
)
from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaId,
    ShardSpec,
)


def replica_row(i: int, nodes: tuple[str, ...], gpus: tuple[int, ...]) -> ReplicaRow:
    rid, model = ReplicaId(f"m{i % 3}-r{i}"), ModelName(f"m{i % 3}")
    node_ids = tuple(NodeId(n) for n in nodes)
    specs = tuple(
        ShardSpec(
            replica=rid,
            model=model,
            profile=ProfileName("p"),
            engine=EngineName("sim"),
            model_path="/models/m",
            rank=rank,
            shard_count=len(nodes),
            node=n,
            gpus=gpus,
            leader=node_ids[0],
            nodes=node_ids,
            rendezvous_port=29500 + gpus[0],
            load_time_ms=1500,
            args=("--x", str(i)),
        )
        for rank, n in enumerate(node_ids)
    )
    return ReplicaRow(rid, model, ProfileName("p"), i, i * 10, FabricId("ib-a"), len(nodes), specs)


def batches(seed: int, count: int) -> list[list[Write]]:
    """`count` batches of 1-6 writes: every kind, updates and deletes of earlier records."""
    rng = random.Random(seed)
    out: list[list[Write]] = []
    live: list[ReplicaId] = []
    for i in range(count):
        batch: list[Write] = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.randrange(6)
            if kind == 0:
                batch.append(
                    PutProfile(
                        Profile(ProfileName("p"), EngineName("sim"), 2, rng.randint(1, 8), "/m")
                    )
                )
            elif kind == 1:
                batch.append(
                    PutDeployment(
                        Deployment(
                            ModelName(f"m{rng.randrange(3)}"), ProfileName("p"), rng.randrange(5)
                        )
                    )
                )
            elif kind == 2:
                n = rng.randrange(6)
                batch.append(
                    PutNode(
                        NodeInfo(
                            NodeId(f"node{n}"), FabricId("ib-a"), 8, 81920, (EngineName("sim"),)
                        )
                    )
                )
            elif kind == 3 or not live:
                row = replica_row(
                    i, (f"node{rng.randrange(6)}", f"node{rng.randrange(6)}"), (rng.randrange(4), 4)
                )
                live.append(row.id)
                batch.append(PutReplica(row))
            elif kind == 4:
                batch.append(DeleteReplica(live.pop(rng.randrange(len(live)))))
            else:
                batch.append(PutSeq(ModelName(f"m{rng.randrange(3)}"), i))
        out.append(batch)
    return out
