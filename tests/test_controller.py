"""The controller core on literal snapshots: no SimPy, just events, times and commands."""

from __future__ import annotations

from conftest import FOUR, T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import (
    Deployment,
    NodeId,
    NodeState,
    ReplicaId,
    ReplicaState,
    ShardReport,
    ShardSpec,
    ShardState,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    AssignShards,
    Heartbeat,
    NodeRegistered,
    Step,
)

M = model("llama")


def kinds(step: Step) -> list[str]:
    return [e.kind for e in step.events]


def cluster(
    *nodes: tuple[str, str], replicas: int = 2, nodes_per: int = 2, gpus_per: int = 4
) -> Controller:
    ctl = Controller(T)
    ctl.handle(ApplyProfile(profile("p", nodes=nodes_per, gpus=gpus_per)), 0)
    ctl.handle(ApplyDeployment(Deployment(M, profile("p").name, replicas)), 0)
    for name, fabric in nodes:
        ctl.handle(NodeRegistered(node(name, fabric)), 0)
    return ctl


def report(spec: ShardSpec, state: ShardState) -> ShardReport:
    endpoint = f"http://{spec.node}:8000" if state is ShardState.SERVING else None
    return ShardReport(spec, state, endpoint, None, ("engine", str(spec.rank)))


def bring_up(ctl: Controller, now: int) -> None:
    """Every assigned shard reports up: workers running, leaders serving."""
    for n in ctl.nodes():
        shards = tuple(
            report(s, ShardState.SERVING if s.rank == 0 else ShardState.RUNNING)
            for s in ctl.assigned(n)
        )
        ctl.handle(Heartbeat(n, shards), now)


def test_tick_places_one_replica_per_fabric_and_assigns_each_node_its_shards() -> None:
    ctl = cluster(*FOUR)
    step = ctl.tick(1_000)
    assert kinds(step) == ["replica.placed", "replica.placed"]
    placed = {e.get("replica"): (e.get("fabric"), e.get("nodes")) for e in step.events}
    assert placed == {
        "llama-r1": ("ib-a", ("n1", "n2")),
        "llama-r2": ("ib-b", ("n3", "n4")),
    }
    assigned = {
        c.node: [(s.replica, s.rank) for s in c.shards]
        for c in step.commands
        if isinstance(c, AssignShards)
    }
    assert assigned == {
        "n1": [("llama-r1", 0)],
        "n2": [("llama-r1", 1)],
        "n3": [("llama-r2", 0)],
        "n4": [("llama-r2", 1)],
    }
    assert step.wake_at_ms == 2_000


def test_ready_only_when_every_rank_is_up_and_the_leader_serves() -> None:
    ctl = cluster(*FOUR, replicas=1)
    ctl.tick(1_000)
    leader, worker = ctl.replica(ReplicaId("llama-r1")).specs  # type: ignore[union-attr]
    step = ctl.handle(Heartbeat(leader.node, (report(leader, ShardState.STARTING),)), 1_100)
    assert kinds(step) == ["shard.started"]
    assert step.events[0].get("argv") == ("engine", "0")
    ctl.handle(Heartbeat(worker.node, (report(worker, ShardState.RUNNING),)), 1_100)
    assert kinds(ctl.tick(2_000)) == []
    assert ctl.replica(ReplicaId("llama-r1")).state is ReplicaState.STARTING  # type: ignore[union-attr]
    ctl.handle(Heartbeat(leader.node, (report(leader, ShardState.SERVING),)), 21_000)
    step = ctl.tick(22_000)
    assert kinds(step) == ["replica.ready"]
    assert [r.endpoint for r in ctl.ready_replicas(M)] == ["http://n1:8000"]


def test_lost_node_fails_and_reaps_its_replica_and_places_the_replacement_in_one_step() -> None:
    ctl = cluster(*FOUR, ("n5", "ib-b"), ("n6", "ib-b"))
    ctl.tick(1_000)
    bring_up(ctl, 20_000)
    ctl.tick(21_000)
    assert len(ctl.ready_replicas(M)) == 2
    # everyone but n2 keeps heartbeating
    for t in range(30_000, 71_000, 10_000):
        for n in ("n1", "n3", "n4", "n5", "n6"):
            shards = tuple(
                report(s, ShardState.SERVING if s.rank == 0 else ShardState.RUNNING)
                for s in ctl.assigned(NodeId(n))
            )
            ctl.handle(Heartbeat(NodeId(n), shards), t)
        ctl.tick(t)
    assert ctl.node_state(NodeId("n2")) is NodeState.SUSPECT
    step = ctl.tick(80_000)  # n2 last heard at 20s: 60s of silence
    assert kinds(step) == ["node.lost", "replica.failed", "replica.reaped", "replica.placed"]
    failed = step.events[1]
    assert failed.get("replica") == "llama-r1" and failed.get("reason") == "node n2 lost"
    assert step.events[3].get("fabric") == "ib-b"
    # n3 and n4 hold the deployment's other replica: spread across nodes beats the tighter fit
    assert step.events[3].get("nodes") == ("n5", "n6")
    # n1's shard is dropped from its assignment, its GPUs freed; n2 is not told anything
    cmds = {c.node: c.shards for c in step.commands if isinstance(c, AssignShards)}
    assert cmds[NodeId("n1")] == ()
    assert NodeId("n2") not in cmds
    assert ctl.node_state(NodeId("n2")) is NodeState.LOST
    assert ctl.replica(ReplicaId("llama-r1")).state is ReplicaState.REAPED  # type: ignore[union-attr]


def test_unplaceable_is_reported_once_and_retried_when_capacity_appears() -> None:
    ctl = cluster(("n1", "ib-a"), ("n3", "ib-b"), replicas=1)
    step = ctl.tick(1_000)
    assert kinds(step) == ["replica.unplaceable"]
    assert "ib-a has 1" in str(step.events[0].get("reason"))
    assert kinds(ctl.tick(2_000)) == []  # same reason: not reported again
    ctl.handle(NodeRegistered(node("n2", "ib-a")), 2_500)
    step = ctl.tick(3_000)
    assert kinds(step) == ["replica.placed"]
    assert step.events[0].get("nodes") == ("n1", "n2")


def test_exited_shard_fails_the_replica() -> None:
    ctl = cluster(*FOUR, replicas=1)
    ctl.tick(1_000)
    bring_up(ctl, 20_000)
    ctl.tick(21_000)
    worker = ctl.replica(ReplicaId("llama-r1")).specs[1]  # type: ignore[union-attr]
    dead = ShardReport(worker, ShardState.EXITED, None, 137, ())
    step = ctl.handle(Heartbeat(worker.node, (dead,)), 30_000)
    # out of service the moment the exit is reported, not at the next tick
    assert kinds(step) == ["replica.failed", "replica.reaped"]
    assert step.events[0].get("reason") == "shard 1 exited with code 137 on n2"
    assert ctl.ready_replicas(M) == []
    assert kinds(ctl.tick(31_000)) == ["replica.placed"]


def test_a_shard_that_vanishes_from_its_nodes_report_fails_the_replica() -> None:
    ctl = cluster(*FOUR, replicas=1)
    ctl.tick(1_000)
    bring_up(ctl, 20_000)
    ctl.tick(21_000)
    rebooted = NodeRegistered(node("n2", "ib-a"), (), incarnation=1)  # a new agent, runs nothing
    step = ctl.handle(rebooted, 25_000)
    assert kinds(step) == ["node.joined", "replica.failed", "replica.reaped"]
    # gone with its node's reboot: not the engine's failure
    reason = "shard 1 vanished from n2 (node rebooted: not the engine's failure)"
    assert step.events[1].get("reason") == reason


def test_a_ready_replica_whose_leader_stops_serving_leaves_ready_at_once() -> None:
    ctl = cluster(*FOUR, replicas=1)
    ctl.tick(1_000)
    bring_up(ctl, 20_000)
    ctl.tick(21_000)
    leader = ctl.replica(ReplicaId("llama-r1")).specs[0]  # type: ignore[union-attr]
    step = ctl.handle(Heartbeat(leader.node, (report(leader, ShardState.STARTING),)), 30_000)
    assert kinds(step) == ["replica.failed", "replica.reaped"]
    assert step.events[0].get("reason") == "shard 0 on n1 went starting"


def test_orphan_shards_get_an_assignment_without_them() -> None:
    ctl = cluster(*FOUR, replicas=1)
    ctl.tick(1_000)
    stray = ShardSpec(
        ReplicaId("old-r9"),
        M,
        profile().name,
        profile().engine,
        "/m",
        0,
        1,
        NodeId("n4"),
        (0,),
        NodeId("n4"),
    )
    ctl.handle(Heartbeat(NodeId("n4"), (report(stray, ShardState.SERVING),)), 2_000)
    step = ctl.tick(3_000)
    assert AssignShards(NodeId("n4"), ()) in step.commands


def test_scale_up_and_down_keeps_the_fabric_spread() -> None:
    ctl = cluster(*FOUR, ("n5", "ib-a"), ("n6", "ib-a"), replicas=1)
    ctl.tick(1_000)
    bring_up(ctl, 20_000)
    ctl.tick(21_000)
    ctl.handle(ApplyDeployment(Deployment(M, profile().name, 3)), 30_000)
    step = ctl.tick(31_000)
    assert [e.get("fabric") for e in step.events] == ["ib-b", "ib-a"]
    bring_up(ctl, 52_000)
    ctl.tick(53_000)
    assert len(ctl.ready_replicas(M)) == 3
    ctl.handle(ApplyDeployment(Deployment(M, profile().name, 1)), 60_000)
    step = ctl.tick(61_000)
    reaped = [(e.get("replica"), e.get("reason")) for e in step.events]
    # ib-a holds two: one of them goes first (the newest), then the newest overall
    assert reaped == [("llama-r3", "scaled down"), ("llama-r2", "scaled down")]
    assert [r.fabric for r in ctl.live_replicas(M)] == ["ib-a"]


def test_reaped_replicas_are_forgotten_beyond_a_bound() -> None:
    from llmgw_twin.control.replicas import REAPED_KEPT

    ctl = cluster(*FOUR, replicas=1, nodes_per=1)
    for i in range(2 * (REAPED_KEPT + 5)):  # scale 0 -> 1 -> 0 ...: a reap every other round
        ctl.handle(ApplyDeployment(Deployment(M, profile().name, i % 2)), i)
        ctl.tick(i * 1_000)
    reaped = [r for r in ctl.replicas() if r.state is ReplicaState.REAPED]
    assert len(reaped) == REAPED_KEPT
    assert ctl.replica(ReplicaId("llama-r1")) is None  # the oldest went first


def test_a_node_that_registers_again_with_new_facts_stays_schedulable() -> None:
    ctl = cluster(("n1", "f"), replicas=0, nodes_per=1)
    ctl.tick(1_000)
    ctl.handle(NodeRegistered(node("n1", "f", gpus=4), (), incarnation=1), 2_000)  # new GPUs
    ctl.handle(ApplyDeployment(Deployment(M, profile().name, 1)), 2_000)
    assert kinds(ctl.tick(3_000)) == ["replica.placed"]


def test_scaling_down_retires_an_unplaced_replica_before_a_placed_one() -> None:
    ctl = cluster(("n1", "f"), replicas=2, nodes_per=1, gpus_per=8)
    ctl.tick(1_000)  # one replica fits on n1's 8 GPUs, the other stays pending
    live = {r.id: r.placed for r in ctl.live_replicas(M)}
    assert sorted(live.values()) == [False, True]
    ctl.handle(ApplyDeployment(Deployment(M, profile().name, 1)), 2_000)
    ctl.tick(3_000)
    assert [r.placed for r in ctl.live_replicas(M)] == [True]


def test_a_failed_gpu_reported_by_its_agent_is_never_placed_on_again() -> None:
    ctl = cluster(("n1", "f"), replicas=1, nodes_per=1, gpus_per=4)
    ctl.tick(1_000)
    (first,) = ctl.assigned(NodeId("n1"))
    assert first.gpus == (0, 1, 2, 3)
    dead = ShardReport(first, ShardState.EXITED, None, 1, ())
    ctl.handle(Heartbeat(NodeId("n1"), (dead,), failed_gpus=(2,)), 2_000)
    step = ctl.tick(3_000)
    assert kinds(step) == ["replica.placed"]
    (second,) = ctl.assigned(NodeId("n1"))
    assert second.gpus == (0, 1, 3, 4)
    # and with only three healthy GPUs left free after this one, nothing more fits there
    ctl.handle(ApplyDeployment(Deployment(M, profile().name, 2)), 4_000)
    assert kinds(ctl.tick(5_000)) == ["replica.unplaceable"]
