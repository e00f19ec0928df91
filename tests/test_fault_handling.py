"""The controller core under a fleet's faults, on literal snapshots: the mass-loss guard,
durable failed GPUs, back-off and quarantine, start deadlines, degraded leaders, suspect nodes
out of routing, scale-down order and link state. Each test fails without its behaviour."""

from __future__ import annotations

import pytest

from conftest import T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.durable import DurableState
from llmgw_twin.control.failures import FailureBook
from llmgw_twin.control.model import (
    Deployment,
    NodeId,
    NodeState,
    ProfileName,
    ReplicaState,
    ShardReport,
    ShardState,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    ClearFailedGpu,
    ClearQuarantine,
    Heartbeat,
    NodeRegistered,
    Step,
)
from llmgw_twin.control.routing import Router

M = model("m")


def kinds(step: Step) -> list[str]:
    return [e.kind for e in step.events]


class Run:
    """A controller, its store as data, and a router fed by its events."""

    def __init__(self, nodes: list[tuple[str, str]], replicas: int, nodes_per: int = 1) -> None:
        self.ctl = Controller(T)
        self.state = DurableState()
        self.router = Router()
        self.events: list[str] = []
        self.nodes = nodes
        p = profile("p", nodes=nodes_per, gpus=8)
        self.apply(self.ctl.handle(ApplyProfile(p), 0))
        self.apply(self.ctl.handle(ApplyDeployment(Deployment(M, p.name, replicas)), 0))
        for name, fabric in nodes:
            self.apply(self.ctl.handle(NodeRegistered(node(name, fabric)), 0))

    def apply(self, step: Step) -> Step:
        self.state = self.state.apply(step.writes)
        for ev in step.events:
            self.router.follow(ev)
            self.events.append(ev.kind)
        return step

    def tick(self, t: int) -> Step:
        return self.apply(self.ctl.tick(t))

    def beat(self, name: str, t: int, state: dict[int, ShardState] | None = None) -> Step:
        n = NodeId(name)
        reports = []
        for s in self.ctl.assigned(n):
            up = ShardState.SERVING if s.rank == 0 else ShardState.RUNNING
            st = (state or {}).get(s.rank, up)
            endpoint = f"http://{s.node}:8000" if st is ShardState.SERVING else None
            reports.append(ShardReport(s, st, endpoint, 1 if st is ShardState.EXITED else None))
        return self.apply(self.ctl.handle(Heartbeat(n, tuple(reports)), t))

    def up(self, t: int) -> None:
        """Place, then every node reports its shards up, then reconcile."""
        self.tick(t)
        for name, _ in self.nodes:
            self.beat(name, t + 10)
        self.tick(t + 1_000)


EIGHT = [(f"n{i}", "ib-a" if i <= 4 else "ib-b") for i in range(1, 9)]


def test_most_of_the_fleet_silent_at_once_is_held_not_reaped() -> None:
    run = Run(EIGHT, replicas=8)
    run.up(1_000)
    assert len(run.ctl.ready_replicas(M)) == 8
    heard = ["n8"]
    t = 2_000
    while t <= 200_000:  # n1..n7 silent for over three lost windows
        if t % 10_000 == 0:
            for name in heard:
                run.beat(name, t)
        step = run.tick(t)
        assert "node.lost" not in kinds(step) and "replica.failed" not in kinds(step)
        t += 1_000
    assert run.ctl.held() and "fleet.hold" in run.events
    assert len(run.router.routes(M)) == 8  # routes kept while held
    assert len(run.ctl.ready_replicas(M)) == 8
    # the link returns: the quorum is heard, judgement resumes, silence counts from then
    for name, _ in EIGHT[:4]:
        run.beat(name, 201_000)
    step = run.tick(201_000)
    assert "fleet.resumed" in kinds(step) and not run.ctl.held()
    assert run.ctl.node_state(NodeId("n5")) is NodeState.SUSPECT
    for t in range(202_000, 261_000, 1_000):
        if t % 10_000 == 0:
            for name in ["n1", "n2", "n3", "n4", "n8"]:
                run.beat(name, t)
        assert "node.lost" not in kinds(run.tick(t))
    # n5..n7 were really gone: lost one window after the resume, not during the hold
    step = run.tick(261_000)
    lost = [e.get("node") for e in step.events if e.kind == "node.lost"]
    assert lost == ["n5", "n6", "n7"]


def test_a_small_fleet_is_never_held() -> None:
    run = Run([("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-a")], replicas=3)
    run.up(1_000)
    for t in range(2_000, 70_000, 1_000):
        if t % 10_000 == 0:
            run.beat("n3", t)
        run.tick(t)
    assert not run.ctl.held()
    assert run.ctl.node_state(NodeId("n1")) is NodeState.LOST


def test_a_failed_gpu_fails_its_replica_and_stays_failed_until_cleared() -> None:
    run = Run([("n1", "ib-a")], replicas=1)
    run.up(1_000)
    (rec,) = run.ctl.ready_replicas(M)
    gpu = rec.specs[0].gpus[0]
    shards = tuple(
        ShardReport(s, ShardState.SERVING, "http://n1:8000") for s in run.ctl.assigned(NodeId("n1"))
    )
    step = run.apply(run.ctl.handle(Heartbeat(NodeId("n1"), shards, (gpu,)), 5_000))
    assert kinds(step)[:3] == ["gpu.failed", "replica.failed", "replica.reaped"]
    assert run.state.failed_gpus == ((NodeId("n1"), gpu),)
    restarted = Controller(T, restored=run.state)
    restarted.start(6_000)
    assert restarted.failed_gpus(NodeId("n1")) == (gpu,)
    with pytest.raises(ValueError, match="is not marked failed"):
        restarted.handle(ClearFailedGpu(NodeId("n1"), 7), 7_000)
    cleared = restarted.handle(ClearFailedGpu(NodeId("n1"), gpu), 7_000)
    assert kinds(cleared) == ["gpu.cleared"]
    assert restarted.failed_gpus(NodeId("n1")) == ()


def test_back_off_doubles_from_the_second_failure_and_is_capped() -> None:
    book = FailureBook(T)
    delays = []
    for i in range(12):
        book.replica_failed(M, ProfileName("p"), (), (), 1_000 * i, crash=True)
        delays.append(book.backoff_ms(M, 1_000 * i))
    assert delays[:6] == [0, 10_000, 20_000, 40_000, 80_000, 160_000]
    assert delays[-1] == T.restart_backoff_max_ms
    # failures age out of the window
    assert book.backoff_ms(M, 11_000 + T.failure_window_ms) == 0


def test_three_crashes_on_a_node_quarantine_it_and_the_operator_can_lift_it() -> None:
    run = Run([("n1", "ib-a"), ("n2", "ib-a")], replicas=1)
    run.up(1_000)
    t = 10_000
    for _ in range(3):
        (rec,) = run.ctl.live_replicas(M)
        assert rec.nodes == (NodeId("n1"),)  # tightest fit, by name
        run.beat("n1", t, {0: ShardState.EXITED})
        run.beat("n2", t + 1)  # answers the report request
        run.beat("n1", t + 2)
        run.tick(t + 1_000)
        t = t + 61_000  # past the back-off (10 s, then 20 s)
        run.tick(t)
        run.up(t)
        t += 10_000
    assert "node.quarantined" in run.events
    quarantines = run.ctl.quarantines()
    assert [(n, p) for n, p, *_ in quarantines] == [(NodeId("n1"), ProfileName("p"))]
    (rec,) = run.ctl.live_replicas(M)
    assert rec.nodes == (NodeId("n2"),)  # the replacement went elsewhere
    lifted = run.apply(run.ctl.handle(ClearQuarantine(NodeId("n1")), t))
    assert kinds(lifted) == ["node.unquarantined"] and run.ctl.quarantines() == []
    assert run.state.quarantines == ()
    with pytest.raises(ValueError, match="not quarantined"):
        run.ctl.handle(ClearQuarantine(NodeId("n1")), t)


def test_a_replica_not_ready_by_its_deadline_is_failed_and_its_nodes_avoided() -> None:
    run = Run([("n1", "ib-a"), ("n2", "ib-a")], replicas=1)
    run.tick(1_000)
    (rec,) = run.ctl.live_replicas(M)
    deadline = 1_000 + T.start_deadline_ms(rec.profile)
    for t in range(2_000, deadline, 1_000):
        if t % 10_000 == 0:
            for name in ("n1", "n2"):
                run.beat(name, t, {0: ShardState.STARTING})
        assert "replica.failed" not in kinds(run.tick(t))
    step = run.tick(deadline)
    assert kinds(step)[:2] == ["replica.failed", "replica.reaped"]
    assert "not ready within 100s" in str(step.events[0].get("reason"))
    assert "node.quarantined" in kinds(step)
    run.beat("n2", deadline + 5)
    run.tick(deadline + 1_000)
    (new,) = run.ctl.live_replicas(M)
    assert new.nodes == (NodeId("n2"),)


def test_a_leader_that_stops_answering_leaves_routing_and_fails_after_the_grace() -> None:
    run = Run([("n1", "ib-a"), ("n2", "ib-a")], replicas=1)
    run.up(1_000)
    assert len(run.router.routes(M)) == 1
    run.beat("n1", 10_000, {0: ShardState.UNRESPONSIVE})
    assert [r.state for r in run.ctl.live_replicas(M)] == [ReplicaState.DEGRADED]
    assert run.router.routes(M) == []
    run.beat("n1", 12_000)  # it answers again
    assert [r.state for r in run.ctl.live_replicas(M)] == [ReplicaState.READY]
    assert len(run.router.routes(M)) == 1
    run.beat("n1", 20_000, {0: ShardState.UNRESPONSIVE})
    for t in range(21_000, 20_000 + T.unresponsive_grace_ms, 1_000):
        assert "replica.failed" not in kinds(run.tick(t))
    step = run.tick(20_000 + T.unresponsive_grace_ms)
    assert kinds(step)[:2] == ["replica.failed", "replica.reaped"]
    assert "not answering" in str(step.events[0].get("reason"))


def test_a_suspect_node_takes_its_replicas_out_of_routing_and_back() -> None:
    run = Run([("n1", "ib-a"), ("n2", "ib-a")], replicas=2)
    run.up(1_000)
    assert len(run.router.routes(M)) == 2
    for t in range(3_000, 33_000, 1_000):
        if t % 10_000 == 0:
            run.beat("n2", t)
        run.tick(t)
    assert run.ctl.node_state(NodeId("n1")) is NodeState.SUSPECT
    assert [r.replica for r in run.router.routes(M)] == [
        r.id for r in run.ctl.live_replicas(M) if r.nodes == (NodeId("n2"),)
    ]
    run.beat("n1", 33_500)
    assert len(run.router.routes(M)) == 2


def test_scale_down_retires_the_replica_on_a_silent_node_first() -> None:
    run = Run([("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-a")], replicas=3)
    run.up(1_000)
    for t in range(3_000, 35_000, 1_000):
        if t % 10_000 == 0:
            run.beat("n1", t)
            run.beat("n3", t)
        run.tick(t)
    assert run.ctl.node_state(NodeId("n2")) is NodeState.SUSPECT
    run.apply(run.ctl.handle(ApplyDeployment(Deployment(M, ProfileName("p"), 2)), 35_000))
    run.tick(35_000)
    assert sorted(n for r in run.ctl.live_replicas(M) for n in r.nodes) == ["n1", "n3"]


def test_a_node_whose_fabric_link_is_down_takes_no_multi_node_shard() -> None:
    run = Run([("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-b"), ("n4", "ib-b")], 1, nodes_per=2)
    step = run.apply(run.ctl.handle(Heartbeat(NodeId("n1"), (), (), False), 500))
    assert kinds(step) == ["node.link_down"]
    for name in ("n2", "n3", "n4"):
        run.beat(name, 500)
    run.tick(1_000)
    (rec,) = run.ctl.live_replicas(M)
    assert rec.fabric == "ib-b"


def test_a_restored_replica_waiting_on_a_silent_node_counts_until_the_node_is_lost() -> None:
    """As a ready replica on a suspect node does: a restart is no reason to replace it sooner."""
    run = Run([("n1", "ib-a"), ("n2", "ib-a")], replicas=1)
    run.up(1_000)
    ctl = Controller(T, restored=run.state)
    ctl.start(5_000)
    ctl.handle(NodeRegistered(node("n2", "ib-a")), 5_002)  # n1 never answers
    placed: list[tuple[int, object]] = []
    suspect = lost = None
    for t in range(6_000, 80_000, 1_000):
        if t % 10_000 == 0:
            ctl.handle(Heartbeat(NodeId("n2"), ()), t)
        for e in ctl.tick(t).events:
            if e.kind == "replica.placed":
                placed.append((t, e.get("nodes")))
            suspect = t if e.kind == "node.suspect" and suspect is None else suspect
            lost = t if e.kind == "node.lost" else lost
    assert suspect is not None and lost is not None and suspect < lost
    # the replacement is made when n1 is declared lost, not when it turned suspect (not on n1)
    assert placed == [(lost, ("n2",))]


def test_a_node_cannot_report_another_nodes_shard() -> None:
    run = Run([("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-a")], replicas=1, nodes_per=2)
    run.tick(1_000)
    (rec,) = run.ctl.live_replicas(M)
    forged = tuple(
        ShardReport(
            s,
            ShardState.SERVING if s.rank == 0 else ShardState.RUNNING,
            "http://evil:8000" if s.rank == 0 else None,
        )
        for s in rec.specs
    )
    run.apply(run.ctl.handle(Heartbeat(NodeId("n3"), forged), 2_000))
    run.tick(3_000)
    assert rec.state is ReplicaState.PLACED and rec.reports == {}
    assert run.router.routes(M) == []
