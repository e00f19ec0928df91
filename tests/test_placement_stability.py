"""Placement prefers nodes with a stable recent history when the packing ties: each node's
losses, reboots and unheard spells decay with `node_history_half_life`, break ties before the
name, never beat a packing criterion, and show in `explain`."""

from __future__ import annotations

import pytest

from conftest import T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.explain import explain
from llmgw_twin.control.model import Deployment, NodeId, NodeState, ProfileName, ShardState
from llmgw_twin.control.placement import CapacityIndex, Placement
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Heartbeat,
    NodeRegistered,
)
from llmgw_twin.control.stability import FLOOR, Stability
from llmgw_twin.service.ops.ctl_fleet import render_explain
from test_defrag import report

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
HALF = 600_000


def fleet(*names: str, gpus: int = 8) -> CapacityIndex:
    idx = CapacityIndex()
    for name in names:
        idx.add_node(node(name, "ib-a", gpus))
        idx.set_schedulable(NodeId(name), True)
    return idx


def placed(idx: CapacityIndex, gpus: int = 8, nodes: int = 1) -> tuple[NodeId, ...]:
    p = idx.place(profile(nodes=nodes, gpus=gpus), {})
    assert isinstance(p, Placement)
    return p.nodes


# --- the score ----------------------------------------------------------------------------------


def test_the_score_adds_weights_and_halves_every_half_life() -> None:
    st = Stability(HALF)
    st.mark(N1, "unheard", 0)
    st.mark(N1, "lost", 30_000)
    assert st.score(N1, 30_000) == pytest.approx(0.5 * 2 ** (-30_000 / HALF) + 1.0)
    assert st.score(N1, 30_000 + HALF) == pytest.approx(st.score(N1, 30_000) / 2)
    assert st.score(N2, 30_000) == 0.0
    text = st.describe(N1, 30_000)
    assert text is not None and "1 loss(es)" in text and "1 unheard spell(s)" in text
    assert "last lost at 30.0 s" in text


def test_a_history_below_the_floor_is_forgotten() -> None:
    st = Stability(HALF)
    st.mark(N1, "rebooted", 0)
    st.advance(4 * HALF)  # 1/16 of a reboot: still remembered
    assert N1 in st.risk and st.remembered() == [N1]
    st.advance(5 * HALF)  # 1/32 < FLOOR
    assert FLOOR > 2**-5
    assert N1 not in st.risk and st.remembered() == []
    assert st.describe(N1, 5 * HALF) is None


# --- placement ----------------------------------------------------------------------------------


def test_an_unstable_node_is_passed_over_when_the_packing_ties() -> None:
    idx = fleet("n1", "n2", "n3")
    assert placed(idx) == (N1,)  # no history: the name decides
    idx.stability.mark(N1, "lost", 0)
    assert placed(idx) == (N2,)
    idx.stability.mark(N2, "unheard", 0)
    assert placed(idx) == (N3,)
    assert placed(idx, nodes=3) == (N3, N2, N1)  # the steadiest first, the leader among them


def test_the_less_unstable_of_two_unstable_nodes_wins() -> None:
    idx = fleet("n1", "n2")
    idx.stability.mark(N1, "lost", 0)
    idx.stability.mark(N2, "lost", 0)
    idx.stability.mark(N2, "unheard", 0)
    assert placed(idx) == (N1,)


def test_instability_never_beats_the_tightest_fit() -> None:
    idx = fleet("n1", "n2")
    idx.book(N1, (0, 1, 2, 3))  # n1 has 4 free, n2 8
    idx.stability.mark(N1, "lost", 0)
    assert placed(idx, gpus=4) == (N1,)


def test_instability_never_beats_spreading_a_deployment() -> None:
    idx = fleet("n1", "n2")
    idx.stability.mark(N1, "lost", 0)
    p = idx.place(profile(nodes=1, gpus=2), {}, per_node={N2: 1})
    assert isinstance(p, Placement) and p.nodes == (N1,)


def test_a_decayed_history_lets_the_name_decide_again() -> None:
    idx = fleet("n1", "n2")
    idx.stability.mark(N1, "lost", 0)
    idx.stability.advance(10 * HALF)
    assert placed(idx) == (N1,)


def test_a_forgotten_node_forgets_its_history() -> None:
    idx = fleet("n1", "n2")
    idx.stability.mark(N1, "lost", 0)
    idx.remove_node(N1)
    assert idx.stability.remembered() == []


# --- on the controller --------------------------------------------------------------------------


def beat(ctl: Controller, now: int, *nodes: NodeId) -> None:
    """These nodes report their assigned shards up."""
    for n in nodes:
        shards = tuple(
            report(s, ShardState.SERVING if s.rank == 0 else ShardState.RUNNING)
            for s in ctl.assigned(n)
        )
        ctl.handle(Heartbeat(n, shards, incarnation=2 if n == N1 else 1), now)


def run(ctl: Controller, start: int, end: int, *heard: NodeId) -> int:
    t = start
    while t < end:
        t += 5_000
        beat(ctl, t, *heard)
        ctl.tick(t)
    return t


def test_a_replacement_avoids_the_node_that_was_lost_and_explain_says_why() -> None:
    """n1 is lost and comes back; n2 is lost later: n1 and n3 tie on packing, n3 is taken."""
    chat = model("chat")
    ctl = Controller(T)
    assert T.node_history_half_life_ms == HALF
    ctl.handle(ApplyProfile(profile("chat-1n", nodes=1, gpus=8)), 0)
    for name in ("n1", "n2", "n3"):
        ctl.handle(NodeRegistered(node(name, "ib-a"), incarnation=1), 0)
    ctl.handle(ApplyDeployment(Deployment(chat, ProfileName("chat-1n"), 1)), 0)
    t = run(ctl, 0, 10_000, N1, N2, N3)
    assert [r.nodes for r in ctl.ready_replicas(chat)] == [(N1,)]
    t = run(ctl, t, t + 80_000, N2, N3)  # n1 silent: suspect, lost; replaced on n2
    assert ctl.node_state(N1) is NodeState.LOST
    assert [r.nodes for r in ctl.ready_replicas(chat)] == [(N2,)]
    second = ctl.ready_replicas(chat)[0].id
    ctl.handle(NodeRegistered(node("n1", "ib-a"), incarnation=2), t)  # rebooted, empty
    t = run(ctl, t, t + 80_000, N1, N3)  # n2 silent: lost; replaced
    assert ctl.node_state(N2) is NodeState.LOST
    live = [r for r in ctl.replicas() if r.state.live]
    assert [r.nodes for r in live] == [(N3,)]  # not n1, the first by name
    assert live[0].id != second
    why = explain(ctl, live[0].id)
    assert why is not None
    verdicts = {h["node"]: h for h in why["stability"]}
    assert verdicts[N3]["verdict"].startswith("preferred")
    assert verdicts[N1]["verdict"].startswith("passed over")
    assert "1 loss(es)" in verdicts[N1]["history"] and "1 reboot(s)" in verdicts[N1]["history"]
    assert 1.4 < verdicts[N2]["instability"] <= 1.5  # unheard, then lost, just now
    text = render_explain(why)  # what `ctl explain` prints
    assert "n1: passed over when the packing ties" in text and "1 reboot(s)" in text
    assert "n3: preferred: a stable recent history" in text


def test_explain_names_the_unstable_candidates_of_a_pending_replica() -> None:
    ctl = Controller(T)
    ctl.handle(ApplyProfile(profile("wide", nodes=3, gpus=8)), 0)
    for name in ("n1", "n2"):
        ctl.handle(NodeRegistered(node(name, "ib-a"), incarnation=1), 0)
    ctl.handle(ApplyDeployment(Deployment(model("wide"), ProfileName("wide"), 1)), 0)
    ctl.tick(1_000)
    ctl.capacity.stability.mark(N2, "lost", 1_000)
    (pending,) = ctl.pending_ids()
    why = explain(ctl, pending)
    assert why is not None
    (fabric,) = why["fabrics"]
    assert fabric["candidate_nodes"] == [N1, N2]
    assert list(fabric["unstable"]) == [N2]
    assert fabric["unstable"][N2].startswith("instability 1.00: 1 loss(es)")
    assert "n2 taken last on a tie: instability 1.00" in render_explain(why)
