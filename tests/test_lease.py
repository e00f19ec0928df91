"""The leader lease and fencing: the store's decisions, a file shared by two connections, the
agent's refusal of a deposed leader's commands, and the twin's controllers under their faults.

The scenario files in `scenarios/controller-*.yaml` show each fault end to end; here each
mechanism is taken away in turn, to show that the expectations they carry depend on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw_twin.control.agent import AgentCore
from llmgw_twin.control.durable import PutClock, PutSeq, Write
from llmgw_twin.control.failures import FailureBook
from llmgw_twin.control.lease import Lease, LeaseTimes, claim, renew
from llmgw_twin.control.model import EngineName, FabricId, ModelName, NodeId, NodeInfo
from llmgw_twin.control.protocol import Assigned, AssignShards, ReportRequested, Step
from llmgw_twin.store.sqlite import Fenced, Store
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.world import controller as shell_module
from llmgw_twin.twin.world import leader as leader_module
from llmgw_twin.twin.world.runner import RunResult, run_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
LEASE_MS = 15_000


def test_a_free_or_expired_lease_is_taken_in_a_higher_epoch() -> None:
    first = claim(None, "c1", 0, LEASE_MS)
    assert first == Lease("c1", 1, LEASE_MS)
    assert claim(first, "c2", LEASE_MS - 1, LEASE_MS) is None  # live: c1 keeps it
    taken = claim(first, "c2", LEASE_MS, LEASE_MS)
    assert taken == Lease("c2", 2, 2 * LEASE_MS)
    # a new process of the holder takes its own name's lease at once, in a new epoch
    assert claim(taken, "c2", LEASE_MS + 1, LEASE_MS) == Lease("c2", 3, 2 * LEASE_MS + 1)


def test_only_the_holder_in_its_epoch_renews() -> None:
    held = Lease("c1", 4, 10_000)
    assert renew(held, "c1", 4, 9_000, LEASE_MS) == Lease("c1", 4, 24_000)
    assert renew(held, "c1", 3, 9_000, LEASE_MS) is None  # an older epoch of c1: deposed
    assert renew(held, "c2", 4, 9_000, LEASE_MS) is None
    # expired but not taken: nobody acted meanwhile, so the epoch may go on
    assert renew(held, "c1", 4, 20_000, LEASE_MS) == Lease("c1", 4, 35_000)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["c1", "c2", "c3"]), st.booleans(), st.integers(0, 20_000)),
        max_size=40,
    )
)
def test_epochs_only_grow_and_a_live_lease_is_never_taken(
    asks: list[tuple[str, bool, int]],
) -> None:
    lease: Lease | None = None
    now = 0
    for who, renewing, step in asks:
        now += step
        if renewing and lease is not None:
            got = renew(lease, who, lease.epoch, now, LEASE_MS)
            if got is not None:
                assert (got.holder, got.epoch) == (lease.holder, lease.epoch)
                lease = got
            continue
        got = claim(lease, who, now, LEASE_MS)
        if lease is not None and lease.holder != who and now < lease.expires_ms:
            assert got is None
        if got is not None:
            assert lease is None or got.epoch == lease.epoch + 1
            lease = got


def test_the_timings_stop_a_leader_before_its_lease_can_expire() -> None:
    times = LeaseTimes(LEASE_MS)
    assert times.renew_every_ms * 2 < times.step_down_after_ms < LEASE_MS
    # a leader whose clock runs a fifth slow still steps down inside the store's lease
    assert times.step_down_after_ms / 0.8 <= LEASE_MS


def test_a_deposed_leaders_commit_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    with Store(path) as first, Store(path) as second:  # two controllers, one database file
        one = first.claim_lease("c1", 0, LEASE_MS)
        assert one is not None
        first.commit([PutSeq(ModelName("m"), 1)], epoch=one.epoch)
        first.commit([PutClock(5)], epoch=one.epoch)  # a quiet leader's lone write: one statement
        assert second.claim_lease("c2", LEASE_MS - 1, LEASE_MS) is None
        two = second.claim_lease("c2", LEASE_MS, LEASE_MS)
        assert two is not None and two.epoch == one.epoch + 1
        with pytest.raises(Fenced):
            first.commit([PutSeq(ModelName("m"), 9)], epoch=one.epoch)
        with pytest.raises(Fenced):
            first.commit([PutClock(9)], epoch=one.epoch)
        with pytest.raises(Fenced):
            first.renew_lease("c1", one.epoch, LEASE_MS + 1, LEASE_MS)
        second.commit([PutSeq(ModelName("m"), 2)], epoch=two.epoch)
        assert dict(first.load().seqs) == {ModelName("m"): 2}
        assert first.load().clock_ms == 5
        second.commit([PutClock(7)], epoch=two.epoch)
        assert first.load().clock_ms == 7


def test_an_agent_refuses_a_command_of_an_older_epoch() -> None:
    agent = AgentCore(NodeInfo(NodeId("n1"), FabricId("f"), 8, 81_920, (EngineName("sim"),)))
    assert agent.handle(Assigned((), epoch=3)).refused is None
    assert agent.handle(Assigned((), epoch=2)).refused == 2
    assert agent.handle(ReportRequested(epoch=1)).refused == 1
    assert agent.handle(ReportRequested(epoch=3)).commands  # the leader's: answered
    assert agent.leader_epoch == 3


def test_every_controller_scenario_passes_with_one_leader_at_the_end() -> None:
    files = sorted(SCENARIOS.glob("controller-*.yaml"))
    multi = [f for f in files if load_scenario(str(f)).controllers > 1]
    assert len(multi) >= 4
    for f in multi:
        result = run_scenario(load_scenario(str(f)))
        assert result.passed, f.name
        violations = {i.name: i.violations for i in result.invariants}
        assert violations["one_epoch_acts"] == ()


class _WakesWithAStaleOrder:
    """The stalled c1, as it wakes, tries to tell node01 to run nothing (what a stale core might
    decide): the step a deposed leader must not carry out."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original = leader_module.ControllerProcess._resume

        def resume(proc: leader_module.ControllerProcess, until: int) -> None:
            if proc.name == "c1" and proc.core is not None:
                stale = Step(commands=(AssignShards(NodeId("node01"), ()),))
                proc.stalled_until = None
                proc.group.step(proc, stale)
                proc.stalled_until = until
            original(proc, until)

        monkeypatch.setattr(leader_module.ControllerProcess, "_resume", resume)


def _kinds_after(result: RunResult, t_ms: int) -> list[str]:
    return [e.kind for e in result.trace if e.t_ms >= t_ms]


def test_a_woken_leader_is_fenced_by_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """With fencing, c1's stale step ends at its refused commit: it is deposed and sends
    nothing, and the file's expectations all hold."""
    _WakesWithAStaleOrder(monkeypatch)
    result = run_scenario(load_scenario(str(SCENARIOS / "controller-stall-failover.yaml")))
    assert result.passed
    assert "command.refused" not in _kinds_after(result, 0)


def test_without_the_store_fence_the_agent_refuses_the_old_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Take the conditional commit away: c1's stale command goes out in epoch 1, and node01's
    agent, which has seen epoch 2, refuses it (`command.refused`): still nothing is stopped."""
    _WakesWithAStaleOrder(monkeypatch)

    def unfenced(
        self: shell_module.ControllerShell, proc: Any, step: Step, writes: tuple[Write, ...]
    ) -> None:
        self.store.commit(writes)

    monkeypatch.setattr(shell_module.ControllerShell, "_commit", unfenced)
    result = run_scenario(load_scenario(str(SCENARIOS / "controller-stall-failover.yaml")))
    refused = [e for e in result.trace if e.kind == "command.refused"]
    assert [(e.get("node"), e.get("epoch")) for e in refused] == [("node01", 1)]
    assert not any(e.kind == "replica.failed" for e in result.trace)


def test_without_either_fence_the_stale_order_stops_a_serving_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Take the agent's check away too: node01 stops its shard on the deposed leader's word,
    a ready replica fails, and the file's expectations fail: they depend on fencing."""
    _WakesWithAStaleOrder(monkeypatch)

    def unfenced(
        self: shell_module.ControllerShell, proc: Any, step: Step, writes: tuple[Write, ...]
    ) -> None:
        self.store.commit(writes)

    monkeypatch.setattr(shell_module.ControllerShell, "_commit", unfenced)
    original = AgentCore.handle

    def trusting(agent: AgentCore, event: Any) -> Any:
        agent.leader_epoch = 0
        return original(agent, event)

    monkeypatch.setattr(AgentCore, "handle", trusting)
    result = run_scenario(load_scenario(str(SCENARIOS / "controller-stall-failover.yaml")))
    assert not result.passed
    assert "replica.failed" in _kinds_after(result, 160_000)


BASE = """\
name: t
duration: 1m
cluster:
  controllers: 2
  fabrics: {ib-a: [node01]}
faults:
"""


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("kill_controller: c3", "unknown controller 'c3' (known: c1, c2, leader)"),
        ("stall_controller: {controller: c1}", "for"),
        ("partition_controller: {controller: c1, from: disk, for: 5s}", "'disk' is not a side"),
        ("clock_skew: {controller: c2, rate: 0}", "a rate must be above 0"),
        ("clock_skew: {controller: c2, rate: fast}", "expected a rate such as 1.05"),
        ("store_down: {for: 0s}", "for"),
    ],
)
def test_a_bad_controller_fault_names_its_place(fault: str, says: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(BASE + f"  - {{at: 10s, {fault}}}\n", "t.yaml")
    assert says in str(err.value)
    assert "t.yaml:7:" in str(err.value)


def test_too_many_controllers_is_an_error_at_the_key() -> None:
    text = (
        BASE.replace("controllers: 2", "controllers: 10") + "  - {at: 1s, store_down: {for: 1s}}\n"
    )
    with pytest.raises(ScenarioError, match=r"t.yaml:4:\d+: cluster.controllers"):
        load_scenario_text(text, "t.yaml")


def test_a_successor_counts_failures_on_from_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash loop across restarts quarantines node01 at the third crash because the history
    is in the store; a successor that forgets it starts the loop over: no quarantine, and the
    replacement after the restart goes back at once."""
    path = str(SCENARIOS / "crash-loop-across-restarts.yaml")
    assert run_scenario(load_scenario(path)).passed
    monkeypatch.setattr(FailureBook, "restore_history", lambda self, by_model, by_node: None)
    forgetful = run_scenario(load_scenario(path))
    failed = [o.text for o in forgetful.expectations if not o.passed]
    assert any("node.quarantined" in text for text in failed)
    assert not any(e.kind == "node.quarantined" for e in forgetful.trace)
