"""Failures blamed where they belong: a hung worker's rank and node, not the leader that stalled
with it; the infrastructure's failures (fabric down, a reboot, a peer lost with its node) kept
out of back-off and quarantine; a decaying failure score that catches a slow loop and survives a
controller's failover. Each test fails without its behaviour."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import T, model, node, profile
from llmgw_twin.control.agent import AgentCore, LocalShard
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.durable import DurableState
from llmgw_twin.control.failures import FailureBook, score
from llmgw_twin.control.model import (
    Deployment,
    NodeId,
    ProfileName,
    ReplicaId,
    ReplicaState,
    ShardReport,
    ShardState,
    Timings,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    EngineJoined,
    EngineUnresponsive,
    Heartbeat,
    NodeRegistered,
    SendReport,
    Step,
)
from llmgw_twin.control.states import Phase
from llmgw_twin.service.agent.processes import stopped
from llmgw_twin.service.controller.metrics import reason_class

M = model("m")
P = ProfileName("p")
N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
MINUTE = 60_000


class Run:
    """A controller on three nodes of one fabric, its store as data, and its events."""

    def __init__(
        self, nodes_per: int, replicas: int = 1, names: tuple[str, ...] = (), gpus: int = 8
    ) -> None:
        self.ctl = Controller(T)
        self.state = DurableState()
        self.events: list[tuple[int, str, dict[str, object]]] = []
        self.names = names or ("n1", "n2", "n3")
        p = profile("p", nodes=nodes_per, gpus=gpus)
        self.apply(self.ctl.handle(ApplyProfile(p), 0), 0)
        self.apply(self.ctl.handle(ApplyDeployment(Deployment(M, p.name, replicas)), 0), 0)
        for name in self.names:
            self.apply(self.ctl.handle(NodeRegistered(node(name, "ib-a"), (), 1), 0), 0)

    def apply(self, step: Step, t: int) -> Step:
        self.state = self.state.apply(step.writes)
        for ev in step.events:
            self.events.append((ev.t_ms, ev.kind, dict(ev.subjects)))
        return step

    def of(self, kind: str) -> list[dict[str, object]]:
        return [s for _, k, s in self.events if k == kind]

    def tick(self, t: int) -> Step:
        return self.apply(self.ctl.tick(t), t)

    def beat(
        self,
        name: str,
        t: int,
        state: dict[int, ShardState] | None = None,
        fabric_up: bool = True,
    ) -> Step:
        n = NodeId(name)
        reports = []
        for s in self.ctl.assigned(n):
            up = ShardState.SERVING if s.rank == 0 else ShardState.RUNNING
            st = (state or {}).get(s.rank, up)
            endpoint = f"http://{s.node}:8000" if st is ShardState.SERVING else None
            code = 1 if st is ShardState.EXITED else None
            reports.append(ShardReport(s, st, endpoint, code))
        hb = Heartbeat(n, tuple(reports), fabric_up=fabric_up, incarnation=1)
        return self.apply(self.ctl.handle(hb, t), t)

    def up(self, t: int) -> int:
        """Place, every node reports its shards up, reconcile; returns the time after."""
        self.tick(t)
        for name in self.names:
            self.beat(name, t + 10)
        self.tick(t + 1_000)
        return t + 1_000

    def node_history(self) -> dict[tuple[str, str], tuple[int, ...]]:
        return {(str(n), str(p)): times for (n, p), times in self.state.node_failures if times}


# --- the failure book ---------------------------------------------------------------------------


def test_a_slow_loop_is_quarantined_by_its_score_where_the_window_never_counts_three() -> None:
    """A crash every six minutes (defaults: a 10-minute window, half-life 1 h, score 4): at most
    two in any window, yet the fifth crash quarantines the node."""
    book = FailureBook(T)
    started = []
    for i in range(10):
        started.append(book.replica_failed(M, P, (N1,), (N1,), 6 * MINUTE * i, crash=True))
    assert [bool(s) for s in started] == [False] * 4 + [True] + [False] * 5
    (row,) = started[4]
    assert row.node == N1 and row.until_ms == 24 * MINUTE + T.quarantine_for_ms
    assert row.reason.startswith("failure score 4.37 of p on n1 reached 4")
    # the same loop with the score set out of reach: the window alone never quarantines it
    window_only = FailureBook(replace(T, quarantine_score=1_000.0))
    for i in range(10):
        assert not window_only.replica_failed(M, P, (N1,), (N1,), 6 * MINUTE * i, crash=True)


def test_the_window_still_catches_a_fast_loop_first() -> None:
    book = FailureBook(T)
    for i in range(2):
        assert not book.replica_failed(M, P, (N1,), (N1,), i * 1_000, crash=True)
    (row,) = book.replica_failed(M, P, (N1,), (N1,), 2_000, crash=True)
    assert row.reason == "3 failures of p on n1 within 600s"


def test_the_score_decays_by_half_every_half_life() -> None:
    h = T.failure_half_life_ms
    assert score((0,), h, h) == pytest.approx(0.5)
    assert score((0, h), 2 * h, h) == pytest.approx(0.75)
    book = FailureBook(T)
    book.replica_failed(M, P, (N1,), (N1,), 0, crash=True)
    assert book.node_score(N1, P, 3 * h) == pytest.approx(0.125)


def test_a_failure_the_infrastructure_caused_counts_toward_nothing() -> None:
    book = FailureBook(T)
    for i in range(6):
        assert not book.replica_failed(M, P, (N1,), (N1,), i, crash=False)
    assert book.backoff_ms(M, 10) == 0 and book.node_score(N1, P, 10) == 0
    assert book.excluded(P) == frozenset()


def test_forgiving_a_node_takes_back_only_the_failures_of_its_replicas_since_it_was_heard() -> None:
    book = FailureBook(T)
    r = [ReplicaId(f"m-r{i}") for i in range(4)]
    book.replica_failed(M, P, (N1,), (N1, N2), 1_000, True, replica=r[0])  # before n2 went
    book.replica_failed(M, P, (N1,), (N1, N2), 5_000, True, replica=r[1])  # n2's doing
    book.replica_failed(M, P, (N3,), (N3,), 6_000, True, replica=r[2])  # not on n2
    assert book.backoff_ms(M, 6_000) == 20_000
    forgiven = book.forgive(N2, 2_000, 60_000)
    assert [f.replica for f in forgiven] == ["m-r1"]
    assert book.backoff_ms(M, 6_000) == 10_000  # two failures left
    assert book.node_score(N1, P, 5_000) == pytest.approx(
        score((1_000,), 5_000, T.failure_half_life_ms)
    )
    assert book.forgive(N2, 2_000, 60_000) == []  # once only


def test_the_score_survives_a_failover_through_the_store() -> None:
    """The history written with each failure restores the same score and back-off in a
    successor, whose next failure quarantines as the first controller's would have."""
    timings = replace(T, quarantine_score=2.5, failure_window_ms=60_000)
    book = FailureBook(timings)
    state = DurableState()
    for i in range(2):
        t = 10 * MINUTE * i
        book.replica_failed(M, P, (N1,), (N1,), t, crash=True)
        state = state.apply(tuple(book.history(M, P, (N1,))))
    successor = FailureBook(timings)
    successor.restore_history(state.model_failures, state.node_failures)
    now = 20 * MINUTE
    assert successor.node_score(N1, P, now) == pytest.approx(book.node_score(N1, P, now))
    (row,) = successor.replica_failed(M, P, (N1,), (N1,), now, crash=True)
    assert row.reason.startswith("failure score ")
    assert book.replica_failed(M, P, (N1,), (N1,), now, crash=True) != []


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"failure_half_life_ms": 0}, "failure_half_life_ms must be positive"),
        ({"quarantine_score": 0}, "quarantine_score must be positive"),
    ],
)
def test_score_settings_are_checked(changes: dict[str, int], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        replace(T, **changes)


# --- a hung worker ------------------------------------------------------------------------------


def test_a_hung_worker_is_blamed_on_its_rank_and_node_not_on_the_leader() -> None:
    run = Run(nodes_per=2)
    t = run.up(1_000)
    (rec,) = run.ctl.ready_replicas(M)
    assert rec.nodes == (N1, N2)
    # the worker's agent finds it silent; its leader stalls with it
    run.beat("n2", t + 5_000, {1: ShardState.UNRESPONSIVE})
    (degraded,) = run.of("replica.degraded")
    assert degraded["reason"] == "worker rank 1 on n2 not answering its health probe"
    run.beat("n1", t + 5_100, {0: ShardState.UNRESPONSIVE})
    run.tick(t + 5_000 + T.unresponsive_grace_ms)
    (failed,) = run.of("replica.failed")
    assert failed["node"] == "n2"
    assert failed["reason"] == "worker rank 1 on n2 not answering for 20s"
    assert reason_class(failed["reason"]) == "worker_unresponsive"
    assert run.node_history() == {("n2", "p"): (t + 5_000 + T.unresponsive_grace_ms,)}


def test_a_worker_that_answers_again_brings_its_replica_back() -> None:
    run = Run(nodes_per=2)
    t = run.up(1_000)
    run.beat("n2", t + 5_000, {1: ShardState.UNRESPONSIVE})
    run.beat("n1", t + 5_100, {0: ShardState.UNRESPONSIVE})
    (rec,) = run.ctl.live_replicas(M)
    states = [rec.state]
    run.beat("n1", t + 8_000)  # the leader answers, the worker not yet: still degraded
    states.append(rec.state)
    assert not run.of("replica.recovered")
    run.beat("n2", t + 9_000)  # running again
    states.append(rec.state)
    assert states == [ReplicaState.DEGRADED, ReplicaState.DEGRADED, ReplicaState.READY]
    assert len(run.of("replica.recovered")) == 1
    run.tick(t + 5_000 + T.unresponsive_grace_ms)
    assert not run.of("replica.failed")


def test_the_agent_reports_a_worker_unresponsive_and_running_again() -> None:
    spec = Run(nodes_per=2)
    spec.tick(1_000)
    worker = next(s for s in spec.ctl.assigned(N2) if s.rank == 1)
    core = AgentCore(node("n2", "ib-a"), 1, (LocalShard(worker, Phase.RUNNING),))

    def reported(step: object) -> ShardState:
        (cmd,) = [c for c in step.commands if isinstance(c, SendReport)]  # type: ignore[attr-defined]
        (report,) = cmd.report.shards
        return report.state

    assert reported(core.handle(EngineUnresponsive(worker.key))) is ShardState.UNRESPONSIVE
    assert reported(core.handle(EngineJoined(worker.key))) is ShardState.RUNNING


def test_a_stopped_process_is_found_stopped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not stopped(proc.pid)
        os.kill(proc.pid, signal.SIGSTOP)
        for _ in range(200):  # the kernel stops it asynchronously: bounded
            if stopped(proc.pid):
                break
            os.sched_yield()
        assert stopped(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=10)


# --- the infrastructure's failures --------------------------------------------------------------


def test_an_exit_while_the_fabric_is_down_is_not_the_engines_failure() -> None:
    run = Run(nodes_per=2, replicas=2, names=("n1", "n2", "n3", "n4"))
    t = run.up(1_000)
    assert len(run.ctl.ready_replicas(M)) == 2
    # both replicas lose their peers as the links go down: the link state comes first
    for name in ("n1", "n2", "n3", "n4"):
        run.beat(name, t + 100, fabric_up=False)
    for name in ("n1", "n3"):
        run.beat(name, t + 200, {0: ShardState.EXITED}, fabric_up=False)
    failed = run.of("replica.failed")
    assert [f["reason"] for f in failed] == [
        "shard 0 exited with code 1 on n1 (fabric down: not the engine's failure)",
        "shard 0 exited with code 1 on n3 (fabric down: not the engine's failure)",
    ]
    assert all(reason_class(f["reason"]) == "shard_exited" for f in failed)
    run.tick(t + 1_000)
    assert not run.of("replica.backoff")
    assert run.state.model_failures == () and run.node_history() == {}


def test_a_replica_gone_with_its_rebooted_node_is_replaced_without_back_off() -> None:
    run = Run(nodes_per=1, replicas=2, names=("n1",), gpus=4)
    t = run.up(1_000)
    assert [r.nodes for r in run.ctl.ready_replicas(M)] == [(N1,), (N1,)]
    run.apply(run.ctl.handle(NodeRegistered(node("n2", "ib-a"), (), 1), t), t)
    # n1 boots again, empty: both shards vanished with it
    run.apply(run.ctl.handle(NodeRegistered(node("n1", "ib-a"), (), 2), t + 20_000), t)
    failed = run.of("replica.failed")
    assert [f["reason"] for f in failed] == [
        "shard 0 vanished from n1 (node rebooted: not the engine's failure)"
    ] * 2
    run.tick(t + 21_000)
    assert not run.of("replica.backoff") and len(run.of("replica.placed")) == 4
    assert run.state.model_failures == () and run.node_history() == {}


def test_a_peers_exit_is_forgiven_once_its_node_is_declared_lost() -> None:
    run = Run(nodes_per=2)
    t = run.up(1_000)
    (rec,) = run.ctl.ready_replicas(M)
    # n2 crashes: its sockets close, the leader on n1 exits at once (a failure like any other)
    run.beat("n1", t + 1_000, {0: ShardState.EXITED})
    assert run.node_history() == {("n1", "p"): (t + 1_000,)}
    now = t + 1_000
    while not run.of("node.lost") and now < t + 200_000:
        now += 1_000
        if now % 10_000 == 0:
            for name in ("n1", "n3"):
                run.beat(name, now)
        run.tick(now)
    (forgiven,) = run.of("replica.forgiven")
    assert forgiven["replica"] == rec.id and forgiven["node"] == "n2"
    assert forgiven["reason"] == "node n2 lost: not the engine's failure"
    assert run.node_history() == {}
    assert dict(run.state.model_failures).get(M, ()) == ()


def test_start_deadline_still_counts_as_the_engines() -> None:
    """Not every failure became the infrastructure's: a replica never ready is counted."""
    run = Run(nodes_per=1, names=("n1",))
    run.tick(1_000)
    (rec,) = run.ctl.live_replicas(M)
    deadline = 1_000 + Timings().start_deadline_ms(rec.profile)
    for t in range(2_000, deadline + 1_000, 1_000):
        if t % 10_000 == 0:
            run.beat("n1", t, {0: ShardState.STARTING})
        run.tick(t)
    assert run.of("replica.failed") and run.node_history() == {("n1", "p"): (deadline,)}
