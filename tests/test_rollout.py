"""A deployment's profile changed, on the controller core: its replicas are replaced by replicas
of the new profile make-before-break, one move in flight per model; a copy with no room retires
its original with a reason; a replica that serves nothing yet is reaped at once; scale-down takes
outdated replicas first; the rollout goes on across a restart from what the store holds."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.explain import explain
from llmgw_twin.control.model import (
    Deployment,
    ProfileName,
    ReplicaId,
    ReplicaState,
    ShardState,
    TraceEvent,
)
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Heartbeat,
    NodeRegistered,
    Step,
)
from llmgw_twin.service.controller.metrics import reason_class
from llmgw_twin.store.sqlite import Store
from llmgw_twin.twin.fuzz import gen
from llmgw_twin.twin.fuzz.gen import generate, heal_faults, scenario_text
from llmgw_twin.twin.fuzz.shrink import without_model
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario_text
from llmgw_twin.twin.scenario.model import SetProfile
from test_defrag import heartbeat_all, kinds, report

CHAT = model("chat")
A, B, C = ProfileName("chat-a"), ProfileName("chat-b"), ProfileName("chat-c")


def fleet(replicas: int = 2, gpus: int = 4, nodes: int = 3) -> Controller:
    """ib-a: n1..n`nodes` (8 GPUs each); `replicas` of 1 x `gpus` on profile chat-a, ready.
    Profiles chat-b and chat-c have the same shape."""
    ctl = Controller(T)
    for name in (A, B, C):
        ctl.handle(ApplyProfile(profile(name, nodes=1, gpus=gpus)), 0)
    for i in range(1, nodes + 1):
        ctl.handle(NodeRegistered(node(f"n{i}", "ib-a")), 0)
    ctl.handle(ApplyDeployment(Deployment(CHAT, A, replicas)), 0)
    ctl.tick(1_000)
    heartbeat_all(ctl, 2_000)
    ctl.tick(3_000)
    assert len(ctl.ready_replicas(CHAT)) == min(replicas, nodes * 8 // gpus)
    return ctl


def set_profile(ctl: Controller, p: ProfileName, now: int, replicas: int = 2) -> Step:
    return ctl.handle(ApplyDeployment(Deployment(CHAT, p, replicas)), now)


def profiles(ctl: Controller) -> list[str]:
    return sorted(r.profile.name for r in ctl.live_replicas(CHAT))


def run(ctl: Controller, start: int, end: int) -> list[TraceEvent]:
    """Heartbeat and reconcile every second from `start` to `end`; every event, and after each
    second the rollout's invariants: never fewer than two ready, at most one move."""
    events: list[TraceEvent] = []
    for t in range(start, end, 1_000):
        events += heartbeat_all(ctl, t)
        events += ctl.tick(t + 500).events
        assert len(ctl.ready_replicas(CHAT)) >= 2
        moving = [r for r in ctl.live_replicas(CHAT) if ctl.rollout.copy_of(r.id) is not None]
        assert len(moving) <= 1 and len(ctl.live_replicas(CHAT)) <= 3
    return events


def test_each_replica_is_replaced_make_before_break_one_at_a_time() -> None:
    ctl = fleet()
    first, second = (r.id for r in ctl.live_replicas(CHAT))
    step = set_profile(ctl, B, 4_000)
    assert kinds(step) == ["deployment.profile_changed"]
    assert step.events[0].get("profile") == B and step.events[0].get("was") == A
    step = ctl.tick(4_000)
    assert kinds(step) == ["replica.moving", "replica.placed"]
    assert step.events[0].get("replica") == first
    assert step.events[0].get("reason") == "profile changed to chat-b"
    copy = ctl.rollout.copy_of(first)
    assert copy is not None and ctl.replica(copy).profile.name == B  # type: ignore[union-attr]
    assert explain(ctl, first)["moving_to"] == copy  # type: ignore[index]
    assert explain(ctl, copy)["copy_of"] == first  # type: ignore[index]
    # while the copy loads both originals serve, and the deployment asks for nothing more
    ctl.tick(5_000)
    assert len(ctl.ready_replicas(CHAT)) == 2 and profiles(ctl) == [A, A, B]
    heartbeat_all(ctl, 6_000)
    step = ctl.tick(7_000)
    assert kinds(step) == [
        "replica.ready",
        "replica.moved",
        "replica.reaped",
        "replica.moving",
        "replica.placed",
    ]
    moved, reaped, moving = step.events[1:4]
    assert (moved.get("replica"), moved.get("to")) == (first, copy)
    assert moved.get("reason") == "profile changed to chat-b"
    assert reaped.get("replica") == first
    assert reaped.get("reason") == f"moved to {copy} (profile changed to chat-b)"
    assert moving.get("replica") == second  # the next move starts once the first is done
    events = run(ctl, 8_000, 12_000)
    assert [e.kind for e in events].count("deployment.rolled_out") == 1
    assert profiles(ctl) == [B, B] and ctl.rollout.rolling() == frozenset()
    assert kinds(ctl.tick(13_000)) == []  # done: nothing more


def test_a_copy_with_no_room_retires_its_original_with_a_reason() -> None:
    ctl = fleet(replicas=2, gpus=8, nodes=2)  # both nodes full
    first, second = (r.id for r in ctl.live_replicas(CHAT))
    set_profile(ctl, B, 4_000)
    step = ctl.tick(4_000)
    assert kinds(step) == ["replica.moving", "replica.unplaceable"]
    copy = ctl.rollout.copy_of(first)
    assert copy is not None
    step = ctl.tick(5_000)
    assert kinds(step) == ["replica.reaped", "replica.placed"]
    reason = step.events[0].get("reason")
    assert step.events[0].get("replica") == first
    assert reason == "profile changed to chat-b: no room for a copy"
    assert reason_class(reason) == "profile_changed"
    assert step.events[1].get("replica") == copy  # the copy takes the room its original left
    # one replica down at a time: the second waits until the new one is ready
    for t in (6_000, 7_000):
        ctl.tick(t)
        assert ctl.replica(second).state is ReplicaState.READY  # type: ignore[union-attr]
        assert ctl.rollout.copy_of(second) is None
    heartbeat_all(ctl, 8_000)
    assert kinds(ctl.tick(8_000)) == ["replica.ready", "replica.moving", "replica.unplaceable"]
    assert len(ctl.ready_replicas(CHAT)) == 2
    for t in range(9_000, 14_000, 1_000):
        heartbeat_all(ctl, t)
        ctl.tick(t)
    assert profiles(ctl) == [B, B] and len(ctl.ready_replicas(CHAT)) == 2


def test_a_wider_profile_takes_the_room_of_as_many_outdated_replicas_as_it_needs() -> None:
    """Two fabrics of two 8-GPU nodes, each node running a 1x8 replica; the new profile is
    2x8, so a copy fits only where two outdated replicas of one fabric were. Only what makes
    room is retired, and only when it does."""
    ctl = Controller(T)
    ctl.handle(ApplyProfile(profile(A, nodes=1, gpus=8)), 0)
    ctl.handle(ApplyProfile(profile(B, nodes=2, gpus=8)), 0)
    for name, fabric in (("n1", "ib-a"), ("n2", "ib-a"), ("n3", "ib-b"), ("n4", "ib-b")):
        ctl.handle(NodeRegistered(node(name, fabric)), 0)
    ctl.handle(ApplyDeployment(Deployment(CHAT, A, 4)), 0)
    ctl.tick(1_000)
    heartbeat_all(ctl, 2_000)
    ctl.tick(3_000)
    assert len(ctl.ready_replicas(CHAT)) == 4
    ctl.handle(ApplyDeployment(Deployment(CHAT, B, 4)), 4_000)
    step = ctl.tick(4_000)
    assert kinds(step) == ["replica.moving", "replica.unplaceable"]
    first = ReplicaId(str(step.events[0].get("replica")))
    step = ctl.tick(5_000)
    reaped = [e for e in step.events if e.kind == "replica.reaped"]
    assert len(reaped) == 2 and {e.get("reason") for e in reaped} == {
        "profile changed to chat-b: no room for a copy"
    }
    assert first in {e.get("replica") for e in reaped}
    (placed,) = [e for e in step.events if e.kind == "replica.placed"]
    assert placed.get("fabric") == ctl.replica(first).fabric  # type: ignore[union-attr]
    # two outdated replicas serve on while the new one loads; its room was theirs alone
    assert len(ctl.ready_replicas(CHAT)) == 2
    for t in range(6_000, 12_000, 1_000):
        heartbeat_all(ctl, t)
        ctl.tick(t)
    # four of the new profile never fit: the other fabric's two make room for one more, and
    # the rest wait, pending, with nothing more retired for them
    assert profiles(ctl) == [B, B, B, B]
    assert len(ctl.ready_replicas(CHAT)) == 2
    assert kinds(ctl.tick(13_000)) == []


def test_a_copy_that_fails_leaves_its_original_serving_and_is_made_again() -> None:
    ctl = fleet()
    set_profile(ctl, B, 4_000)
    ctl.tick(4_000)
    (original,) = [r.id for r in ctl.live_replicas(CHAT) if ctl.rollout.copy_of(r.id)]
    copy = ctl.rollout.copy_of(original)
    events = heartbeat_all(ctl, 5_000, exited=frozenset({copy}))  # type: ignore[arg-type]
    aborted = [e for e in events if e.kind == "replica.move_aborted"]
    assert [(e.get("replica"), e.get("to")) for e in aborted] == [(original, copy)]
    assert ctl.replica(original).state is ReplicaState.READY  # type: ignore[union-attr]
    again = None
    for t in range(6_000, 120_000, 1_000):  # past the deployment's back-off
        ctl.tick(t)
        again = ctl.rollout.copy_of(original)
        if again is not None:
            break
    assert again is not None and again != copy
    assert len(ctl.ready_replicas(CHAT)) == 2


def test_an_original_that_fails_mid_move_leaves_the_copy_as_its_replacement() -> None:
    ctl = fleet()
    set_profile(ctl, B, 4_000)
    ctl.tick(4_000)
    (original,) = [r.id for r in ctl.live_replicas(CHAT) if ctl.rollout.copy_of(r.id)]
    copy = ctl.rollout.copy_of(original)
    heartbeat_all(ctl, 5_000, exited=frozenset({original}))  # the copy serves by now
    ctl.tick(5_000)
    live = {r.id for r in ctl.live_replicas(CHAT)}
    assert copy in live and original not in live
    # nothing replaced the original but its copy: the one more is the next move's copy
    (second,) = [r for r in live if r != copy and ctl.rollout.copy_of(r) is not None]
    assert live == {copy, second, ctl.rollout.copy_of(second)}


def test_nothing_is_started_or_retired_while_the_mass_loss_guard_holds() -> None:
    ctl = fleet()
    held = [True]
    ctl.rollout._may_run = lambda: not held[0]  # what the controller asks of its guard
    set_profile(ctl, B, 4_000)
    assert kinds(ctl.tick(4_000)) == [] and ctl.rollout.rolling() == {CHAT}
    held[0] = False
    assert kinds(ctl.tick(5_000)) == ["replica.moving", "replica.placed"]


def test_rollout_moves_spend_from_the_eviction_budget() -> None:
    ctl = Controller(dataclasses.replace(T, eviction_budget=1, eviction_window_ms=60_000))
    for name in (A, B):
        ctl.handle(ApplyProfile(profile(name, nodes=1, gpus=4)), 0)
    for i in (1, 2, 3):
        ctl.handle(NodeRegistered(node(f"n{i}", "ib-a")), 0)
    ctl.handle(ApplyDeployment(Deployment(CHAT, A, 2)), 0)
    ctl.tick(1_000)
    heartbeat_all(ctl, 2_000)
    ctl.tick(3_000)
    set_profile(ctl, B, 4_000)
    started = []
    for t in range(4_000, 70_000, 1_000):
        heartbeat_all(ctl, t)
        step = ctl.tick(t)
        started += [t for e in step.events if e.kind == "replica.moving"]
    # the second move waits for the window of the first to pass, though its turn came at 5 s
    assert started == [4_000, 64_000]


def test_a_replica_that_serves_nothing_yet_is_reaped_at_once() -> None:
    ctl = fleet(replicas=3, gpus=8, nodes=2)  # the third is unplaceable
    (pending,) = [r.id for r in ctl.live_replicas(CHAT) if not r.placed]
    set_profile(ctl, B, 4_000, replicas=3)
    step = ctl.tick(4_000)
    reaped = [e for e in step.events if e.kind == "replica.reaped"]
    assert [(e.get("replica"), e.get("reason")) for e in reaped] == [
        (pending, "profile changed to chat-b")
    ]
    # its replacement runs the new profile; the ready ones wait for it (no room: it waits too)
    assert sorted(r.profile.name for r in ctl.live_replicas(CHAT) if not r.placed) == [B]
    assert len(ctl.ready_replicas(CHAT)) == 2


def test_scale_down_takes_an_outdated_replica_first() -> None:
    ctl = fleet(replicas=3)
    set_profile(ctl, B, 4_000, replicas=3)
    ctl.tick(4_000)
    heartbeat_all(ctl, 5_000)
    ctl.tick(5_000)  # the first move is done, the second under way
    assert profiles(ctl) == [A, A, B, B]
    ctl.handle(ApplyDeployment(Deployment(CHAT, B, 1)), 6_000)
    step = ctl.tick(6_000)
    assert [e.get("reason") for e in step.events if e.kind == "replica.reaped"] == [
        "scaled down",
        "scaled down",
        "scaled down",
    ]
    assert profiles(ctl) == [B]


def test_a_profile_changed_again_mid_move_reaps_the_outdated_copy() -> None:
    ctl = fleet()
    set_profile(ctl, B, 4_000)
    ctl.tick(4_000)
    (copy,) = [r.id for r in ctl.live_replicas(CHAT) if r.profile.name == B]
    step = set_profile(ctl, C, 5_000)
    assert kinds(step) == ["deployment.profile_changed", "replica.reaped"]
    assert (step.events[1].get("replica"), step.events[1].get("reason")) == (
        copy,
        "profile changed to chat-c",
    )
    run(ctl, 6_000, 12_000)
    assert profiles(ctl) == [C, C]


def test_the_defragmenter_leaves_outdated_replicas_to_the_rollout() -> None:
    ctl = fleet()
    first, second = (r.id for r in ctl.live_replicas(CHAT))
    assert {m.id for m in ctl._defrag._movable()} == {first, second}
    set_profile(ctl, B, 4_000)
    ctl.tick(4_000)
    heartbeat_all(ctl, 5_000)
    ctl.tick(5_000)  # the first move is done, the second under way
    copy = ctl.rollout.original_of
    # the defragmenter's candidates are the ready replicas of the deployment's profile only
    (moved,) = {m.id for m in ctl._defrag._movable()}
    assert ctl.replica(moved).profile.name == B  # type: ignore[union-attr]
    assert copy(moved) is None and ctl.rollout.copy_of(second) is not None


def test_the_rollout_goes_on_after_a_restart_from_the_store(tmp_path: Path) -> None:
    ctl = Controller(T)
    with Store(str(tmp_path / "s.db")) as store:

        def commit(step: Step) -> None:
            store.commit(step.writes)

        for name in (A, B):
            commit(ctl.handle(ApplyProfile(profile(name, nodes=1, gpus=4)), 0))
        for i in (1, 2, 3):
            commit(ctl.handle(NodeRegistered(node(f"n{i}", "ib-a")), 0))
        commit(ctl.handle(ApplyDeployment(Deployment(CHAT, A, 2)), 0))
        commit(ctl.tick(1_000))
        heartbeat_all(ctl, 2_000)  # heartbeats write nothing the restart needs
        commit(ctl.tick(3_000))
        originals = {r.id for r in ctl.ready_replicas(CHAT)}
        commit(set_profile(ctl, B, 4_000))
        commit(ctl.tick(4_000))  # the copy is placed and loading: the controller dies
        (copy,) = [r.id for r in ctl.live_replicas(CHAT) if r.profile.name == B]
        restored = store.load()
    again = Controller(T, restored=restored)
    again.start(10_000)
    assert again.rollout.rolling() == {CHAT}
    for n in again.nodes():  # every node answers: the copy still loading
        shards = tuple(
            report(s, ShardState.STARTING if s.replica == copy else ShardState.SERVING)
            for s in again.assigned(n)
        )
        again.handle(Heartbeat(n, shards), 10_500)
    step = again.tick(11_000)
    adopted = {e.get("replica"): e.get("ready") for e in step.events if e.kind == "replica.adopted"}
    assert adopted == {**dict.fromkeys(originals, True), copy: False}
    # the copy is paired with an original again, not scaled down as surplus
    assert [e.get("to") for e in step.events if e.kind == "replica.moving"] == [copy]
    assert "replica.reaped" not in kinds(step)
    assert len(again.ready_replicas(CHAT)) == 2 and again.rollout.copy_of(copy) is None
    events = run(again, 12_000, 20_000)
    reaped = [e for e in events if e.kind == "replica.reaped"]
    assert {e.get("replica") for e in reaped} == originals
    assert all(str(e.get("reason")).startswith("moved to ") for e in reaped)
    assert copy in {r.id for r in again.ready_replicas(CHAT)}
    assert profiles(again) == [B, B] and again.rollout.rolling() == frozenset()


# --- the scenario file's `set_profile` ---------------------------------------------------------

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "set-profile.yaml"


def test_the_loader_reads_set_profile_and_names_what_is_wrong() -> None:
    text = SCENARIO.read_text(encoding="utf-8")
    (fault,) = load_scenario_text(text, "s.yaml").faults
    assert fault.action == SetProfile(CHAT, ProfileName("chat-v2"))
    bad = {
        "{model: chat, profile: chat-v3}": "faults[0].set_profile.profile: unknown profile "
        "'chat-v3' (defined: chat-v1, chat-v2, code-2n)",
        "{model: chats, profile: chat-v2}": "faults[0].set_profile.model: 'chats' is not a "
        "deployed model (deployed: chat, code)",
        "{model: chat}": "faults[0].set_profile",
        "{model: chat, profile: chat-v2, replicas: 3}": "replicas",
    }
    for value, message in bad.items():
        wrong = text.replace("{model: chat, profile: chat-v2}", value)
        with pytest.raises(ScenarioError) as info:
            load_scenario_text(wrong, "s.yaml")
        assert message in info.value.message, (value, info.value.message)
        assert info.value.line == text[: text.index("set_profile:")].count("\n") + 1


# --- the fuzzer's `set_profile` ----------------------------------------------------------------


def test_the_fuzzer_draws_set_profile_apart_and_its_heal_sets_every_profile_back() -> None:
    seeds = [s for s in range(1, 60) if "set_profile" in generate(s).enabled]
    assert len(seeds) > 10
    for seed in seeds:
        plan = generate(seed)
        names = {p.name for p in plan.profiles}
        models = {d.model for d in plan.deployments}
        changes = [f for f in plan.faults if f.kind == "set_profile"]
        assert changes and all(f.profile in names and f.model in models for f in changes)
        current = {d.model: d.profile for d in plan.deployments}
        for f in (*changes, *(h for h in heal_faults(plan) if h.kind == "set_profile")):
            current[f.model] = f.profile
        assert current == {d.model: d.profile for d in plan.deployments}
        scenario = load_scenario_text(scenario_text(plan), "gen.yaml")
        assert sum(isinstance(f.action, SetProfile) for f in scenario.faults) >= len(changes)


def test_the_other_draws_of_a_seed_are_those_it_had_without_set_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plans = {s: generate(s) for s in range(1, 60)}
    monkeypatch.setattr(gen, "profile_faults", lambda *_: ([], (), ()))
    for seed, plan in plans.items():
        without = generate(seed)
        assert [f for f in plan.faults if f.kind != "set_profile"] == list(without.faults)
        # (the profile a set_profile adds is `NAME-v2`; a role group's come after it)
        assert [p for p in plan.profiles if not p.name.endswith("-v2")] == list(without.profiles)
        assert replace(plan, faults=without.faults, profiles=without.profiles) == replace(
            without, enabled=plan.enabled
        )


def test_shrinking_keeps_the_profiles_a_set_profile_names() -> None:
    plan = next(
        p
        for s in range(1, 200)
        if len((p := generate(s)).deployments) > 1
        and any(f.kind == "set_profile" for f in p.faults)
    )
    for d in plan.deployments:
        smaller = without_model(plan, d.model)
        load_scenario_text(scenario_text(smaller), "shrunk.yaml")  # every name it uses exists
