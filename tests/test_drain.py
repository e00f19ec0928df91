"""Cordon, drain, deployment delete and explain on the controller core: make-before-break moves
off a drained node, what a cordon keeps and refuses, a drain copy that fails or has no room, an
original that fails or is scaled down, and the store that keeps it all across a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.durable import DurableState
from llmgw_twin.control.explain import explain, never_fits
from llmgw_twin.control.model import Deployment, NodeId, ProfileName, ReplicaId, ReplicaState
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Cordon,
    DeleteDeployment,
    Drain,
    NodeRegistered,
    Step,
)
from llmgw_twin.store.sqlite import Store
from test_defrag import heartbeat_all, kinds

CHAT = model("chat")
N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def fleet(replicas: int = 2, gpus: int = 8) -> Controller:
    """ib-a: n1, n2, n3 (8 GPUs each); `replicas` of 1 x `gpus` ready, on n1 and n2 first."""
    ctl = Controller(T)
    ctl.handle(ApplyProfile(profile("chat-1n", nodes=1, gpus=gpus)), 0)
    for name in ("n1", "n2", "n3"):
        ctl.handle(NodeRegistered(node(name, "ib-a")), 0)
    ctl.handle(ApplyDeployment(Deployment(CHAT, ProfileName("chat-1n"), replicas)), 0)
    ctl.tick(1_000)
    heartbeat_all(ctl, 2_000)
    ctl.tick(3_000)
    assert len(ctl.ready_replicas(CHAT)) == replicas
    return ctl


def on(ctl: Controller, n: NodeId) -> list[ReplicaId]:
    return [r for r in ctl.replicas_on(n) if ctl.replica(r).state.live]  # type: ignore[union-attr]


def moving(step: Step) -> tuple[ReplicaId, ReplicaId]:
    ev = next(e for e in step.events if e.kind == "replica.moving")
    return ReplicaId(str(ev.get("replica"))), ReplicaId(str(ev.get("to")))


def test_a_drained_node_is_emptied_make_before_break() -> None:
    ctl = fleet()
    (original,) = on(ctl, N1)
    assert kinds(ctl.handle(Drain(N1), 4_000)) == ["node.draining"]
    step = ctl.tick(4_000)
    assert kinds(step) == ["replica.moving", "replica.placed"]
    assert moving(step) == (original, ctl.drains.copy_of(original))
    copy = ctl.drains.copy_of(original)
    assert copy is not None and ctl.replica(copy).nodes == (N3,)  # type: ignore[union-attr]
    # while the copy loads the original serves, and the deployment asks for nothing more
    ctl.tick(5_000)
    assert len(ctl.ready_replicas(CHAT)) == 2 and len(ctl.live_replicas(CHAT)) == 3
    heartbeat_all(ctl, 6_000)
    step = ctl.tick(7_000)
    assert kinds(step) == ["replica.ready", "replica.moved", "replica.reaped", "node.drained"]
    assert step.events[1].get("reason") == "drain of n1"
    assert ctl.replica(original).state is ReplicaState.REAPED  # type: ignore[union-attr]
    assert on(ctl, N1) == [] and len(ctl.ready_replicas(CHAT)) == 2
    # drained once: said once, and the node stays out of placement
    assert "node.drained" not in kinds(ctl.tick(8_000))
    assert ctl.drains.drained(N1) and N1 in ctl.drains.cordoned()


def test_a_cordoned_node_keeps_what_it_runs_and_takes_nothing_new() -> None:
    ctl = fleet(replicas=1, gpus=4)  # on n1, with 4 GPUs left there
    (held,) = on(ctl, N1)
    assert kinds(ctl.handle(Cordon(N1), 4_000)) == ["node.cordoned"]
    assert ctl.handle(Cordon(N1), 4_000).events == ()  # not news
    ctl.handle(ApplyDeployment(Deployment(CHAT, ProfileName("chat-1n"), 6)), 5_000)
    ctl.tick(5_000)
    per_node = {n: len(on(ctl, n)) for n in (N1, N2, N3)}
    assert per_node == {N1: 1, N2: 2, N3: 2} and on(ctl, N1) == [held]
    (pending,) = [r for r in ctl.live_replicas(CHAT) if not r.placed]
    assert "ib-a has 0" in str(pending.unplaceable_reason)
    step = ctl.handle(Cordon(N1, cordoned=False), 6_000)
    assert kinds(step) == ["node.uncordoned"]
    assert kinds(ctl.tick(6_000)) == ["replica.placed"]
    assert ctl.replica(pending.id).nodes == (N1,)  # type: ignore[union-attr]


def test_a_cordon_holds_a_free_node_out_of_placement_until_uncordoned() -> None:
    ctl = fleet(replicas=2)
    ctl.handle(Cordon(N3), 4_000)
    ctl.handle(ApplyDeployment(Deployment(CHAT, ProfileName("chat-1n"), 3)), 4_000)
    step = ctl.tick(4_000)
    assert kinds(step) == ["replica.unplaceable"]
    (pending,) = [r for r in ctl.live_replicas(CHAT) if not r.placed]
    why = explain(ctl, pending.id)
    assert why is not None and why["state"] == "pending"
    (fabric,) = why["fabrics"]
    assert fabric == {
        "fabric": "ib-a",
        "fits": False,
        "candidates": 0,
        "needs": 1,
        "candidate_nodes": [],
        "blocked": {"cordoned": 1, "too few free GPUs": 2},
    }
    assert "never_fits" not in why
    ctl.handle(Cordon(N3, cordoned=False), 5_000)
    step = ctl.tick(5_000)
    assert kinds(step) == ["replica.placed"] and ctl.replica(pending.id).nodes == (N3,)  # type: ignore[union-attr]


def test_a_drain_copy_with_no_room_waits_and_the_original_keeps_serving() -> None:
    ctl = fleet(replicas=3)  # every node full
    (original,) = on(ctl, N1)
    ctl.handle(Drain(N1), 4_000)
    step = ctl.tick(4_000)
    assert kinds(step) == ["replica.moving", "replica.unplaceable"]
    copy = ctl.drains.copy_of(original)
    assert copy is not None
    why = explain(ctl, copy)
    assert why is not None and why["fabrics"][0]["blocked"] == {
        "draining": 1,
        "too few free GPUs": 2,
    }
    assert explain(ctl, original)["moving_to"] == copy  # type: ignore[index]
    for t in (5_000, 6_000, 30_000):
        heartbeat_all(ctl, t)
        ctl.tick(t)
    assert ctl.replica(original).state is ReplicaState.READY  # type: ignore[union-attr]
    assert len(ctl.ready_replicas(CHAT)) == 3
    # uncordoning ends the drain: the copy that never found room goes
    step = ctl.handle(Cordon(N1, cordoned=False), 31_000)
    assert kinds(step) == ["replica.reaped", "node.uncordoned"]
    assert step.events[0].get("reason") == "drain of n1 ended"
    assert ctl.drains.draining() == frozenset() and ctl.drains.copy_of(original) is None


def test_a_drain_copy_that_fails_is_tried_again_while_the_original_serves() -> None:
    ctl = fleet()
    (original,) = on(ctl, N1)
    ctl.handle(Drain(N1), 4_000)
    _, copy = moving(ctl.tick(4_000))
    events = heartbeat_all(ctl, 5_000, exited=frozenset({copy}))
    assert "replica.move_aborted" in [e.kind for e in events]
    assert ctl.replica(original).state is ReplicaState.READY  # type: ignore[union-attr]
    for t in range(6_000, 120_000, 1_000):  # past the deployment's back-off
        ctl.tick(t)
        again = ctl.drains.copy_of(original)
        if again is not None and again != copy:
            break
    assert again is not None and again != copy


def test_an_original_that_fails_during_its_drain_leaves_the_copy_as_its_replacement() -> None:
    ctl = fleet()
    (original,) = on(ctl, N1)
    ctl.handle(Drain(N1), 4_000)
    _, copy = moving(ctl.tick(4_000))
    heartbeat_all(ctl, 5_000, exited=frozenset({original}))
    assert "node.drained" in kinds(ctl.tick(5_000))  # n1 is empty now
    live = {r.id for r in ctl.live_replicas(CHAT)}
    assert copy in live and original not in live and len(live) == 2  # nothing else created


def test_scaling_down_during_a_drain_takes_the_draining_replica_and_its_copy() -> None:
    ctl = fleet(replicas=2)
    heartbeat_all(ctl, 3_500)
    (original,) = on(ctl, N1)
    ctl.handle(Drain(N1), 4_000)
    _, copy = moving(ctl.tick(4_000))
    ctl.handle(ApplyDeployment(Deployment(CHAT, ProfileName("chat-1n"), 1)), 5_000)
    ctl.tick(5_000)
    gone = {r: ctl.replica(r).state for r in (original, copy)}  # type: ignore[union-attr]
    assert gone == {original: ReplicaState.REAPED, copy: ReplicaState.REAPED}
    assert len(ctl.ready_replicas(CHAT)) == 1 and on(ctl, N1) == []


def test_deleting_a_deployment_retires_every_replica_and_forgets_it() -> None:
    ctl = fleet()
    with pytest.raises(ValueError, match="no deployment of model nope"):
        ctl.handle(DeleteDeployment(model("nope")), 4_000)
    step = ctl.handle(DeleteDeployment(CHAT), 4_000)
    assert kinds(step) == ["deployment.deleted", "replica.reaped", "replica.reaped"]
    assert {e.get("reason") for e in step.events[1:]} == {"deployment deleted"}
    assert ctl.live_replicas(CHAT) == [] and ctl.deployments() == []
    assert kinds(ctl.tick(5_000)) == []  # nothing replaces them
    assert DurableState().apply(step.writes).deployments == ()


def test_never_fits_names_the_closest_fabric() -> None:
    ctl = fleet()
    big = profile("big", nodes=4, gpus=8)
    assert never_fits(ctl, big) == (
        "needs 4 node(s) with 8 working GPU(s) and engine sim in one fabric: "
        "the most in one fabric is 3 (ib-a)"
    )
    assert never_fits(ctl, profile("wide", nodes=1, gpus=9)) is not None
    assert never_fits(ctl, profile("ok", nodes=3, gpus=8)) is None  # busy now, not never


def test_cordons_and_drains_survive_a_restart_through_the_store(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    ctl = Controller(T)
    with Store(path) as store:

        def run(step: Step) -> Step:
            store.commit(step.writes)
            return step

        run(ctl.handle(ApplyProfile(profile("chat-1n", nodes=1, gpus=8)), 0))
        for name in ("n1", "n2", "n3"):
            run(ctl.handle(NodeRegistered(node(name, "ib-a")), 0))
        run(ctl.handle(ApplyDeployment(Deployment(CHAT, ProfileName("chat-1n"), 1)), 0))
        run(ctl.tick(1_000))
        run(ctl.handle(Drain(N1), 2_000))
        run(ctl.handle(Cordon(N2), 2_000))
        run(ctl.handle(Cordon(N3), 2_000))
        run(ctl.handle(Cordon(N3, cordoned=False), 2_000))
        restored = store.load()
    assert restored.cordons == ((N1, True), (N2, False))
    again = Controller(T, restored=restored)
    again.start(10_000)
    assert again.drains.cordoned() == {N1, N2} and again.drains.draining() == {N1}
