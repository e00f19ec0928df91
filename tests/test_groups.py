"""Role groups (`control/groups.py`): a deployment of prefill and decode roles, as the loader
reads it, as the controller places, fails over, scales and dissolves its groups, and as the
routing core picks prefill then decode within one group.

The scenario files `scenarios/role-group-*.yaml` show the same behaviours end to end (they run
as cases of `test_scenarios.py`); these tests pin each rule on its own, on literal inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    Profile,
    ProfileName,
    ReplicaId,
    ReplicaState,
    Role,
    ShardSpec,
    TraceEvent,
)
from llmgw_twin.control.replicas import ReplicaRecord
from llmgw_twin.control.routing import Ejection, NoRoute, Router
from llmgw_twin.control.routing_feed import SnapshotEntry, SnapshotState
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario_text
from llmgw_twin.twin.world.checks import group_orphans
from llmgw_twin.twin.world.runner import run_scenario

FLEET = """
name: groups
seed: 1
duration: {duration}
timings: {{heartbeat_interval: 10s, node_lost_after: 60s, reconcile_interval: 1s}}
cluster:
  fabrics:
{fabrics}
  nodes:
    default: {{gpus: 8, gpu_memory: 80GiB, engines: [sim]}}
profiles:
  pre: {{engine: sim, nodes: 1, gpus_per_node: 8, load_time: 10s, model: /m}}
  dec: {{engine: sim, nodes: 1, gpus_per_node: 8, load_time: 10s, model: /m}}
  plain: {{engine: sim, nodes: 1, gpus_per_node: 8, load_time: 10s, model: /m}}
deployments:
  - model: chat
    replicas: {groups}
    roles:
      prefill: {{profile: pre}}
      decode: {{profile: dec, count: {decodes}}}
{extra}
"""


def scenario(
    fabrics: str = "    ib-a: [n1, n2, n3]\n    ib-b: [n4, n5, n6]",
    groups: int = 1,
    decodes: int = 2,
    duration: str = "2m",
    extra: str = "",
) -> str:
    return FLEET.format(
        fabrics=fabrics, groups=groups, decodes=decodes, duration=duration, extra=extra
    )


def events_of(text: str, kind: str) -> list[TraceEvent]:
    result = run_scenario(load_scenario_text(text))
    assert all(not inv.violations for inv in result.invariants), result.invariants
    return [e for e in result.trace if e.kind == kind]


# --- the scenario file --------------------------------------------------------------------------


def test_a_deployment_of_roles_loads_with_each_roles_profile_and_count() -> None:
    sc = load_scenario_text(scenario(decodes=3))
    (dep,) = sc.deployments
    assert dep.roles == (
        Role("prefill", ProfileName("pre"), 1),
        Role("decode", ProfileName("dec"), 3),
    )
    assert dep.profile == "pre" and dep.replicas == 1


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        ("{prefill: {profile: pre}}", "missing role 'decode'"),
        ("{prefill: {profile: pre}, decode: {profile: nope}}", "unknown profile 'nope'"),
        ("{prefill: {profile: pre}, decode: {profile: dec}, encode: {profile: dec}}", "encode"),
        ("{prefill: {profile: pre}, decode: {profile: dec, count: 0}}", "count"),
        ("{prefill: {profile: pre, size: 2}, decode: {profile: dec}}", "unknown key 'size'"),
    ],
)
def test_a_bad_roles_section_is_refused_with_where_and_why(roles: str, message: str) -> None:
    text = scenario().replace(
        "    roles:\n      prefill: {profile: pre}\n      decode: {profile: dec, count: 2}\n",
        f"    roles: {roles}\n",
    )
    with pytest.raises(ScenarioError, match=message):
        load_scenario_text(text)


def test_a_deployment_names_a_profile_or_roles_not_both() -> None:
    text = scenario().replace("    replicas: 1\n", "    replicas: 1\n    profile: plain\n")
    with pytest.raises(ScenarioError, match="names a profile per role"):
        load_scenario_text(text)


def test_the_core_refuses_a_group_without_both_roles() -> None:
    with pytest.raises(ValueError, match="prefill, decode"):
        Deployment(ModelName("m"), ProfileName("p"), 1, (Role("prefill", ProfileName("p")),))
    with pytest.raises(ValueError, match="prefill role's"):
        Deployment(
            ModelName("m"),
            ProfileName("q"),
            1,
            (Role("prefill", ProfileName("p")), Role("decode", ProfileName("d"))),
        )


# --- placement: together, whole, spread ---------------------------------------------------------


def test_a_group_is_placed_in_one_fabric_its_members_on_different_nodes() -> None:
    placed = events_of(scenario(), "replica.placed")
    assert len(placed) == 3
    assert {e.get("fabric") for e in placed} == {"ib-a"}
    assert len({e.get("nodes") for e in placed}) == 3
    assert sorted(str(e.get("role")) for e in placed) == ["decode", "decode", "prefill"]
    assert len({e.get("group") for e in placed}) == 1


def test_a_group_that_fits_no_fabric_whole_holds_nothing() -> None:
    # four nodes free in all, two a fabric: a prefill and a decode would fit, the group not
    text = scenario(fabrics="    ib-a: [n1, n2]\n    ib-b: [n3, n4]")
    assert events_of(text, "replica.placed") == []
    reasons = {str(e.get("reason")) for e in events_of(text, "replica.unplaceable")}
    assert len(reasons) == 1 and "in one fabric: no fabric has room" in reasons.pop()


def test_groups_fill_fabrics_one_group_each_when_each_fits_one() -> None:
    placed = events_of(scenario(groups=2), "replica.placed")
    by_group: dict[str, set[str]] = {}
    for e in placed:
        by_group.setdefault(str(e.get("group")), set()).add(str(e.get("fabric")))
    assert sorted(sorted(fabrics) for fabrics in by_group.values()) == [["ib-a"], ["ib-b"]]


# --- failover per role, and no role left holding GPUs -------------------------------------------

KILL = """faults:
  - {{id: kill, at: 30s, kill_node: {node}}}
"""


def test_a_lost_decode_with_a_spare_keeps_the_group_and_is_replaced_in_its_fabric() -> None:
    text = scenario(fabrics="    ib-a: [n1, n2, n3, n4]\n    ib-b: [n5, n6, n7]")
    text += KILL.format(node="n2")  # n2 runs a decode (n1 the prefill: largest first, by seq)
    result = run_scenario(load_scenario_text(text))
    failed = [e for e in result.trace if e.kind == "replica.failed"]
    assert [(e.get("role"), e.get("node")) for e in failed] == [("decode", "n2")]
    later = [e for e in result.trace if e.kind == "replica.placed" and e.t_ms > 30_000]
    assert [(e.get("role"), e.get("fabric"), e.get("group")) for e in later] == [
        ("decode", "ib-a", failed[0].get("group"))
    ]
    assert not [e for e in result.trace if e.kind == "group.dissolved"]


def test_a_role_that_fits_nowhere_in_its_fabric_dissolves_the_group_at_once() -> None:
    text = scenario(duration="3m") + KILL.format(node="n1")  # the prefill; ib-a is full
    result = run_scenario(load_scenario_text(text))
    lost = next(e for e in result.trace if e.kind == "node.lost")
    dissolved = [e for e in result.trace if e.kind == "group.dissolved"]
    assert [(e.t_ms, e.get("role"), e.get("fabric")) for e in dissolved] == [
        (lost.t_ms, "prefill", "ib-a")
    ]
    reaped = [e for e in result.trace if e.kind == "replica.reaped" and e.t_ms == lost.t_ms]
    # the failed prefill, its replacement that fits nowhere, and both decodes
    assert sorted(str(e.get("role")) for e in reaped) == ["decode", "decode", "prefill", "prefill"]
    after = [e for e in result.trace if e.kind == "replica.placed" and e.t_ms > lost.t_ms]
    assert {e.get("fabric") for e in after} == {"ib-b"} and len(after) == 3


def member(seq: int, role: str, node: str, fabric: str = "ib-a") -> ReplicaRecord:
    rid = ReplicaId(f"chat-r{seq}")
    profile = Profile(ProfileName(role), EngineName("sim"), 1, 8, "/m")
    rec = ReplicaRecord(rid, ModelName("chat"), profile, seq, 0, ReplicaState.READY)
    rec.fabric, rec.group, rec.role = FabricId(fabric), "chat-g1", role
    rec.specs = (
        ShardSpec(
            rid, rec.model, profile.name, EngineName("sim"), "/m", 0, 1, NodeId(node), (0,),
            NodeId(node),
        ),
    )  # fmt: skip
    return rec


def test_the_orphan_check_names_a_group_holding_gpus_without_a_role() -> None:
    prefill, decode = member(1, "prefill", "n1"), member(2, "decode", "n2")
    assert group_orphans([prefill, decode]) == []
    prefill.state = ReplicaState.REAPED  # reaped, and neither replaced nor dissolved
    assert group_orphans([prefill, decode]) == ["group chat-g1 holds chat-r2 but no prefill"]
    prefill.state = ReplicaState.READY
    far = member(3, "decode", "n9", "ib-b")
    assert group_orphans([prefill, decode, far]) == ["group chat-g1 has members in ib-a, ib-b"]


# --- scaling -----------------------------------------------------------------------------------


def test_scaling_removes_whole_groups_and_a_roles_count_changes_in_place() -> None:
    text = scenario(groups=2, duration="2m") + (
        "faults:\n  - {id: down, at: 40s, set_replicas: {model: chat, replicas: 1}}\n"
    )
    result = run_scenario(load_scenario_text(text))
    reaped = [e for e in result.trace if e.kind == "replica.reaped"]
    assert len(reaped) == 3 and len({e.get("group") for e in reaped}) == 1
    placed = [e for e in result.trace if e.kind == "replica.placed"]
    kept = {e.get("replica") for e in placed} - {e.get("replica") for e in reaped}
    assert len(kept) == 3
    assert len({e.get("group") for e in placed if e.get("replica") in kept}) == 1


def test_a_scenario_may_not_change_a_groups_profile_in_place() -> None:
    text = scenario() + (
        "faults:\n  - {id: swap, at: 20s, set_profile: {model: chat, profile: plain}}\n"
    )
    with pytest.raises(ScenarioError, match="deployed in roles"):
        load_scenario_text(text)


# --- routing: prefill then decode, within a group -----------------------------------------------

CHAT = ModelName("chat")


def join(router: Router, rid: str, group: str, role: str) -> None:
    router.follow(
        TraceEvent.of(
            0,
            "replica.ready",
            model="chat",
            replica=rid,
            endpoint=f"http://{rid}:8000",
            group=group,
            role=role,
        )
    )


def leave(router: Router, rid: str) -> None:
    router.follow(TraceEvent.of(0, "replica.failed", model="chat", replica=rid))


def test_a_pick_is_a_decode_with_a_prefill_of_its_own_group() -> None:
    router = Router(outstanding_limit=4)
    join(router, "p1", "g1", "prefill")
    join(router, "d1", "g1", "decode")
    join(router, "p2", "g2", "prefill")
    join(router, "d2", "g2", "decode")
    assert router.models() == [CHAT]
    assert [r.replica for r in router.routes(CHAT)] == ["d1", "d2"]  # decodes answer
    pairs = set()
    for _ in range(4):
        route = router.pick(CHAT)
        assert route is not None and route.prefill is not None
        pairs.add((route.replica, route.prefill.replica))
    assert pairs == {("d1", "p1"), ("d2", "p2")}
    assert router.outstanding(ReplicaId("p1")) == 2 and router.outstanding(ReplicaId("d2")) == 2


def test_a_decode_whose_group_lost_its_prefill_is_passed_over() -> None:
    router = Router(outstanding_limit=4)
    for g in ("g1", "g2"):
        join(router, f"p-{g}", g, "prefill")
        join(router, f"d-{g}", g, "decode")
    leave(router, "p-g1")
    for _ in range(3):
        route = router.pick(CHAT)
        assert route is not None and route.replica == "d-g2"
    leave(router, "p-g2")
    assert router.pick(CHAT) is None
    assert router.why_none(CHAT) is NoRoute.NO_REPLICA


def test_a_busy_prefill_makes_its_group_busy_and_its_finish_frees_it() -> None:
    router = Router(outstanding_limit=1)
    join(router, "p1", "g1", "prefill")
    join(router, "d1", "g1", "decode")
    join(router, "d2", "g1", "decode")
    first = router.pick(CHAT)
    assert first is not None and first.prefill is not None
    assert router.pick(CHAT) is None  # d2 is free, but the group's only prefill is not
    router.finished(first.prefill.replica, True)
    second = router.pick(CHAT)
    assert second is not None and second.replica == "d2"


def test_a_resync_keeps_each_replicas_group_and_role() -> None:
    router = Router(outstanding_limit=4)
    router.resync(
        [
            SnapshotEntry(CHAT, ReplicaId("d1"), SnapshotState.READY, "http://d1", "g1", "decode"),
            SnapshotEntry(CHAT, ReplicaId("p1"), SnapshotState.READY, "http://p1", "g1", "prefill"),
        ]
    )
    route = router.pick(CHAT)
    assert route is not None and route.replica == "d1"
    assert route.prefill is not None and route.prefill.replica == "p1"


def test_a_plain_model_routes_as_before_beside_a_grouped_one() -> None:
    router = Router(outstanding_limit=4)
    join(router, "p1", "g1", "prefill")
    join(router, "d1", "g1", "decode")
    router.follow(TraceEvent.of(0, "replica.ready", model="m", replica="m-r1", endpoint="http://x"))
    route = router.pick(ModelName("m"))
    assert route is not None and route.replica == "m-r1" and route.prefill is None
    assert router.models() == [CHAT, ModelName("m")]


def test_an_autoscaled_count_keeps_the_roles() -> None:
    dep = Deployment(
        ModelName("m"),
        ProfileName("p"),
        1,
        (Role("prefill", ProfileName("p")), Role("decode", ProfileName("d"), 2)),
    )
    assert replace(dep, replicas=3).roles == dep.roles


def test_a_retry_that_excludes_a_prefill_replica_takes_another() -> None:
    router = Router(outstanding_limit=4)
    join(router, "p1", "g1", "prefill")
    join(router, "p2", "g1", "prefill")
    join(router, "d1", "g1", "decode")
    first = router.pick(CHAT)
    assert first is not None and first.prefill is not None and first.prefill.replica == "p1"
    again = router.pick(CHAT, exclude=[ReplicaId("p1")])
    assert again is not None and again.prefill is not None and again.prefill.replica == "p2"
    assert router.pick(CHAT, exclude=[ReplicaId("p1"), ReplicaId("p2")]) is None


INITIAL = """initial:
  replicas:
    - {{id: chat-r1, model: chat, profile: pre, state: ready, {member}
       shards: [{{rank: 0, node: n1, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}}]}}
"""


@pytest.mark.parametrize(
    ("member", "message"),
    [
        ("role: prefill,", "missing required key 'group'"),
        ("group: chat-g1,", "missing required key 'role'"),
        ("group: other-g1, role: prefill,", "is not 'chat-gN'"),
        ("group: chat-g1, role: encode,", "role"),
        ("group: chat-g2, role: prefill,", "numbered after this replica"),
        ("", "names its group and role"),
        ("group: chat-g1, role: decode,", "a decode replica of 'chat' runs its role's profile dec"),
    ],
)
def test_the_initial_section_takes_a_members_group_and_role_both_or_neither(
    member: str, message: str
) -> None:
    with pytest.raises(ScenarioError, match=message):
        load_scenario_text(scenario() + INITIAL.format(member=member))


def test_an_initial_group_is_adopted_as_it_is() -> None:
    text = scenario(fabrics="    ib-a: [n1, n2, n3]", groups=1, decodes=1) + INITIAL.format(
        member="group: chat-g1, role: prefill,"
    ).replace(
        "]}\n",
        "]}\n    - {id: chat-r2, model: chat, profile: dec, state: ready, group: chat-g1,"
        " role: decode,\n       shards: [{rank: 0, node: n2, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}]}\n",
    )
    result = run_scenario(load_scenario_text(text))
    adopted = [e for e in result.trace if e.kind == "replica.adopted"]
    assert sorted((str(e.get("role")), e.get("group")) for e in adopted) == [
        ("decode", "chat-g1"),
        ("prefill", "chat-g1"),
    ]
    assert [e for e in result.trace if e.kind == "replica.placed"] == []


def test_a_model_deployed_anew_without_roles_routes_plainly_again() -> None:
    router = Router(outstanding_limit=4)
    join(router, "chat-r1", "chat-g1", "prefill")
    join(router, "chat-r2", "chat-g1", "decode")
    leave(router, "chat-r1")
    leave(router, "chat-r2")  # the deployment deleted, then deployed as a plain one
    router.follow(
        TraceEvent.of(0, "replica.ready", model="chat", replica="chat-r3", endpoint="http://x")
    )
    route = router.pick(CHAT)
    assert route is not None and route.replica == "chat-r3" and route.prefill is None


def test_why_none_says_ejected_when_every_prefill_replica_is() -> None:
    router = Router(ejection=Ejection(failures=1), outstanding_limit=4)
    join(router, "p1", "g1", "prefill")
    join(router, "d1", "g1", "decode")
    route = router.pick(CHAT, now_ms=0)
    assert route is not None and route.prefill is not None
    router.finished(route.replica, True, 0)
    assert router.finished(route.prefill.replica, False, 0)  # ejected
    assert router.pick(CHAT, now_ms=1) is None
    assert router.why_none(CHAT, now_ms=1) is NoRoute.EJECTED


def test_a_deployment_of_roles_is_not_autoscaled_yet() -> None:
    text = scenario().replace(
        "    replicas: 1\n",
        "    replicas: 1\n    autoscale: {min: 1, max: 3, signal: outstanding, target: 4}\n",
    )
    with pytest.raises(ScenarioError, match="a deployment of roles is not autoscaled yet"):
        load_scenario_text(text)


def test_an_initial_member_of_a_plain_deployment_or_across_fabrics_is_refused() -> None:
    plain = scenario().replace(
        "deployments:\n", "deployments:\n  - {model: solo, profile: plain, replicas: 1}\n"
    )
    tagged = INITIAL.format(member="group: solo-g1, role: decode,").replace(
        "chat-r1, model: chat, profile: pre", "solo-r1, model: solo, profile: plain"
    )
    with pytest.raises(ScenarioError, match="'solo' is not deployed in roles"):
        load_scenario_text(plain + tagged)
    two = INITIAL.format(member="group: chat-g1, role: prefill,").replace(
        "]}\n",
        "]}\n    - {id: chat-r2, model: chat, profile: dec, state: ready, group: chat-g1,"
        " role: decode,\n       shards: [{rank: 0, node: n4, gpus: [0, 1, 2, 3, 4, 5, 6, 7]}]}\n",
    )
    with pytest.raises(ScenarioError, match="a group is in one fabric"):
        load_scenario_text(scenario() + two)
