"""Bugs a reading of the cores found, each pinned by a literal snapshot that failed before its
fix: a node registering again with other facts, a profile edited under running replicas, a
shard spec that gains a field, and a node that is gone for good."""

from __future__ import annotations

from dataclasses import replace

from conftest import T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.durable import DurableState
from llmgw_twin.control.model import (
    Deployment,
    FabricId,
    NodeId,
    NodeState,
    ReplicaState,
    ShardReport,
    ShardState,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Heartbeat,
    NodeRegistered,
    Step,
)

M = model("m")


class Fleet:
    def __init__(self, nodes: list[tuple[str, str]], nodes_per: int = 2) -> None:
        self.ctl = Controller(T)
        self.state = DurableState()
        self.nodes = nodes
        p = profile("p", nodes=nodes_per, gpus=4)
        self.apply(self.ctl.handle(ApplyProfile(p), 0))
        self.apply(self.ctl.handle(ApplyDeployment(Deployment(M, p.name, 1)), 0))
        for name, fabric in nodes:
            self.apply(self.ctl.handle(NodeRegistered(node(name, fabric)), 0))

    def apply(self, step: Step) -> Step:
        self.state = self.state.apply(step.writes)
        return step

    def reports(self, name: str) -> tuple[ShardReport, ...]:
        return tuple(
            ShardReport(
                s,
                ShardState.SERVING if s.rank == 0 else ShardState.RUNNING,
                f"http://{name}:8000" if s.rank == 0 else None,
            )
            for s in self.ctl.assigned(NodeId(name))
        )

    def up(self, t: int) -> None:
        self.apply(self.ctl.tick(t))
        for name, _ in self.nodes:
            n = NodeId(name)
            shards = tuple(
                ShardReport(
                    s,
                    ShardState.SERVING if s.rank == 0 else ShardState.RUNNING,
                    f"http://{name}:8000" if s.rank == 0 else None,
                )
                for s in self.ctl.assigned(n)
            )
            self.apply(self.ctl.handle(Heartbeat(n, shards), t + 10))
        self.apply(self.ctl.tick(t + 1_000))


def test_a_node_registering_in_another_fabric_fails_its_replica() -> None:
    fleet = Fleet([("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-b"), ("n4", "ib-b")])
    fleet.up(1_000)
    (rec,) = fleet.ctl.ready_replicas(M)
    moved = rec.nodes[1]
    # it registers again, still running its shard, but now in the other fabric
    step = fleet.ctl.handle(NodeRegistered(node(moved, "ib-b"), fleet.reports(moved)), 5_000)
    failed = [e for e in step.events if e.kind == "replica.failed"]
    assert failed and "now in fabric ib-b" in str(failed[0].get("reason"))
    assert rec.state is ReplicaState.REAPED


def test_a_node_registering_with_fewer_gpus_is_not_stuck() -> None:
    fleet = Fleet([("n1", "ib-a"), ("n2", "ib-a")], nodes_per=1)
    fleet.up(1_000)
    (rec,) = fleet.ctl.ready_replicas(M)
    n = rec.nodes[0]
    assert max(rec.specs[0].gpus) >= 2
    # it registers again with 2 GPUs, still reporting its shard on GPUs it no longer has
    fleet.ctl.handle(NodeRegistered(node(n, "ib-a", gpus=2), fleet.reports(n)), 5_000)
    assert rec.state is ReplicaState.REAPED
    fleet.ctl.handle(Heartbeat(NodeId("n2"), ()), 5_001)
    fleet.ctl.handle(Heartbeat(n, ()), 5_002)
    fleet.ctl.tick(6_000)
    (new,) = fleet.ctl.live_replicas(M)
    assert new.placed and all(g < 8 for s in new.specs for g in s.gpus)


def test_a_profile_edited_under_running_replicas_does_not_fail_them_after_a_restart() -> None:
    fleet = Fleet([("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-a")])
    fleet.up(1_000)
    fleet.apply(fleet.ctl.handle(ApplyProfile(profile("p", nodes=3, gpus=4)), 3_000))
    old = fleet.ctl
    ctl = Controller(T, restored=fleet.state)
    ctl.start(4_000)
    for name, fabric in fleet.nodes:
        n = NodeId(name)
        shards = tuple(
            ShardReport(
                s,
                ShardState.SERVING if s.rank == 0 else ShardState.RUNNING,
                f"http://{name}:8000" if s.rank == 0 else None,
            )
            for s in old.assigned(n)
        )
        ctl.handle(NodeRegistered(node(name, fabric), shards), 4_002)
    kinds = [e.kind for e in ctl.tick(5_000).events]
    assert "replica.adopted" in kinds and "replica.failed" not in kinds
    assert len(ctl.ready_replicas(M)) == 1


def test_a_shard_reported_with_a_newer_spec_field_is_still_recognised() -> None:
    fleet = Fleet([("n1", "ib-a")], nodes_per=1)
    fleet.apply(fleet.ctl.tick(1_000))
    (spec,) = fleet.ctl.assigned(NodeId("n1"))
    newer = replace(spec, load_time_ms=spec.load_time_ms + 1, args=("--extra",))
    report = ShardReport(newer, ShardState.SERVING, "http://n1:8000")
    fleet.ctl.handle(Heartbeat(NodeId("n1"), (report,)), 2_000)
    fleet.ctl.tick(3_000)
    assert [r.state for r in fleet.ctl.live_replicas(M)] == [ReplicaState.READY]


def test_a_node_lost_for_long_is_forgotten_everywhere() -> None:
    fleet = Fleet([("n1", "ib-a"), ("n2", "ib-a")], nodes_per=1)
    fleet.up(1_000)
    t = 3_000
    forgotten = []
    while t < 3_000 + T.node_lost_after_ms + T.forget_lost_after_ms + 700_000:
        if t % 10_000 == 0:
            n2 = NodeId("n2")
            shards = tuple(
                ShardReport(s, ShardState.SERVING, "http://n2:8000") for s in fleet.ctl.assigned(n2)
            )
            fleet.apply(fleet.ctl.handle(Heartbeat(n2, shards), t))
        step = fleet.apply(fleet.ctl.tick(t))
        forgotten += [e.get("node") for e in step.events if e.kind == "node.forgotten"]
        t += 1_000 if t < 200_000 else 600_000
    assert forgotten == ["n1"]
    assert fleet.ctl.nodes() == [NodeId("n2")]
    assert fleet.ctl.node_state(NodeId("n1")) is None
    assert [n.node for n in fleet.state.nodes] == ["n2"]
    # it comes back: a new node
    step = fleet.ctl.handle(NodeRegistered(node("n1", "ib-a")), t)
    assert [e.kind for e in step.events] == ["node.joined"]
    assert fleet.ctl.node_state(NodeId("n1")) is NodeState.ALIVE
    assert FabricId("ib-a") == fleet.ctl.node_info(NodeId("n1")).fabric  # type: ignore[union-attr]
