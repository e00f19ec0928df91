"""The state tables: illegal moves raise, every scenario's trace moves replicas only along the
replica table, and docs/architecture.md shows exactly the tables."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llmgw_twin.control import states
from llmgw_twin.control.agent import AgentCore
from llmgw_twin.control.model import (
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    NodeState,
    ProfileName,
    ReplicaId,
    ReplicaState,
    ShardSpec,
)
from llmgw_twin.control.protocol import (
    Assigned,
    EngineExited,
    EngineStarted,
    SidecarUp,
    StartSidecar,
)
from llmgw_twin.control.states import Phase
from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.world.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("**/*.yaml"))
R = ReplicaState


def test_an_illegal_move_raises_and_names_the_legal_ones() -> None:
    assert states.transition(states.REPLICA, R.PLACED, R.STARTING) is R.STARTING
    with pytest.raises(states.IllegalTransition, match=r"reaped -> ready .*terminal"):
        states.transition(states.REPLICA, R.REAPED, R.READY)
    with pytest.raises(states.IllegalTransition, match=r"pending -> ready .*placed, reaped"):
        states.transition(states.REPLICA, R.PENDING, R.READY)
    with pytest.raises(states.IllegalTransition):
        states.transition(states.SHARD_PHASE, Phase.WAITING, Phase.EXITED)
    with pytest.raises(states.IllegalTransition):
        states.transition(states.NODE_HEALTH, NodeState.ALIVE, NodeState.ALIVE)


def test_every_state_has_a_row_and_terminal_states_have_no_way_out() -> None:
    assert set(states.REPLICA) == set(ReplicaState)
    assert set(states.SHARD_PHASE) == set(Phase)
    assert set(states.NODE_HEALTH) == set(NodeState)
    assert states.REPLICA[R.REAPED] == frozenset()
    assert states.SHARD_PHASE[Phase.EXITED] == frozenset()
    for state in ReplicaState:
        assert state.live or state in (R.FAILED, R.REAPED)


def _replica_moves(trace: list[dict[str, object]]) -> list[tuple[str, R, R]]:
    """Each replica's state sequence as its trace events show it."""
    state: dict[str, R] = {}
    moves: list[tuple[str, R, R]] = []

    def move(rid: str, new: R) -> None:
        old = state.get(rid, R.PENDING)
        moves.append((rid, old, new))
        state[rid] = new

    for ev in trace:
        kind, rid = ev["kind"], ev.get("replica")
        if kind == "fault.injected" and ev.get("action") == "restart_controller":
            for r, s in state.items():
                if s.live:  # a restarted controller restores every live placed replica
                    state[r] = R.ADOPTING
            continue
        if not isinstance(rid, str):
            continue
        if kind == "replica.placed":
            move(rid, R.PLACED)
        elif kind == "shard.started" and state.get(rid) is R.PLACED:
            move(rid, R.STARTING)  # the next reconcile moves it; no event of its own
        elif kind == "replica.ready":
            move(rid, R.READY)
        elif kind == "replica.adopted":
            # a restored replica: a controller restart that has no fault event at this instant
            # (the later end of two overlapping outages) restored it too
            state[rid] = R.ADOPTING
            move(rid, R.READY if ev.get("ready") else R.STARTING)
        elif kind == "replica.failed":
            move(rid, R.FAILED)
        elif kind == "replica.reaped":
            move(rid, R.REAPED)
    return moves


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_replica_move_in_a_scenario_trace_is_in_the_table(path: Path) -> None:
    result = run_scenario(load_scenario(path))
    moves = _replica_moves([ev.as_dict() for ev in result.trace])
    # a regression file may be shrunk past moving anything (its bug is elsewhere)
    assert moves or path.parent.name == "regressions", "the scenario moved no replica"
    illegal = [m for m in moves if not states.can_move(states.REPLICA, m[1], m[2])]
    assert illegal == []


def test_a_late_exit_notice_does_not_touch_a_new_waiting_shard_of_the_same_key() -> None:
    info = NodeInfo(NodeId("n1"), FabricId("f"), 2, 1024, (EngineName("sim"),))
    old = ShardSpec(
        ReplicaId("m-r1"),
        ModelName("m"),
        ProfileName("p"),
        EngineName("sim"),
        "/m",
        0,
        1,
        NodeId("n1"),
        (0,),
        NodeId("n1"),
    )
    new = replace(old, args=("--changed",))  # same key, another spec: stop old, start new
    agent = AgentCore(info)
    agent.handle(Assigned((old,)))
    agent.handle(SidecarUp(old.key))
    agent.handle(EngineStarted(old.key, ("engine",)))
    agent.handle(Assigned((new,)))  # the old shard is stopping; the new one waits for GPU 0
    assert [(s.spec, s.phase) for s in agent.shards()] == [(new, Phase.WAITING)]
    # the old process's exit is not the new shard's: it keeps waiting, nothing starts
    step = agent.handle(EngineExited(old.key, 1))
    assert [(s.spec, s.phase) for s in agent.shards()] == [(new, Phase.WAITING)]
    assert not any(isinstance(c, StartSidecar) for c in step.commands)


def test_the_architecture_doc_shows_the_tables() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    diagrams = [
        states.diagram(states.REPLICA, states.REPLICA_INITIAL),
        states.diagram(states.SHARD_PHASE, frozenset({Phase.WAITING})),
        states.diagram(states.NODE_HEALTH, frozenset({NodeState.ALIVE})),
    ]
    for diagram in diagrams:
        assert f"```mermaid\n{diagram}\n```" in doc
