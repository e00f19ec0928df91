"""The fault shapes real fleets show: `cut_fabric_link`, `slow_node`, `delay_heartbeats` and
`add_node` -- the loader's errors, what each does in the twin, the report versions that keep a
late report from undoing a newer one, the fuzzer's draws, and what real mode takes."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import FOUR, T, node
from llmgw_twin.control.agent import AgentCore
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import (
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeState,
    ProfileName,
    ReplicaId,
    ShardReport,
    ShardSpec,
    ShardState,
)
from llmgw_twin.control.protocol import FabricLink, Heartbeat, NodeRegistered
from llmgw_twin.realmode.refusals import check_real_supported
from llmgw_twin.service.common.wire import HeartbeatW, NodeRegisteredW
from llmgw_twin.twin.fuzz import gen, shapes
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.scenario.model import (
    AddNode,
    CutFabricLink,
    DelayHeartbeats,
    Scenario,
    SlowNode,
)
from llmgw_twin.twin.world.checks import Invariants
from llmgw_twin.twin.world.network import Network
from llmgw_twin.twin.world.runner import run_scenario

ROOT = Path(__file__).resolve().parents[1]
SHAPE_FILES = ("cut-fabric-link", "slow-node", "delay-heartbeats", "add-node")

BASE = """\
name: t
duration: 5m
cluster:
  fabrics:
    ib-a: [n1, n2]
    ib-b: [n3]
  nodes:
    default: {gpus: 4, engines: [sim]}
profiles:
  p: {engine: sim, nodes: 2, gpus_per_node: 4, load_time: 20s, model: /m}
deployments:
  - {model: m, profile: p, replicas: 1}
"""


def load(faults: str, expect: str = "") -> Scenario:
    return load_scenario_text(BASE + "faults:\n" + faults + expect, "t.yaml")


def error(faults: str, expect: str = "") -> ScenarioError:
    with pytest.raises(ScenarioError) as got:
        load(faults, expect)
    return got.value


# --- the loader --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "line", "words"),
    [
        ("  - {at: 1m, cut_fabric_link: {node: n9, for: 1m}}\n", 14, "unknown node 'n9'"),
        ("  - {at: 1m, cut_fabric_link: {node: n1}}\n", 14, "for"),
        ("  - {at: 1m, slow_node: {node: n1, factor: 0.5, for: 1m}}\n", 14, "at least 1"),
        ("  - {at: 1m, slow_node: {node: n1, factor: 101, for: 1m}}\n", 14, "at most 100"),
        ("  - {at: 1m, slow_node: {node: n1, factor: fast, for: 1m}}\n", 14, "a factor such"),
        ("  - {at: 1m, delay_heartbeats: {nodes: [], by: 5s, for: 1m}}\n", 14, "at least one"),
        ("  - {at: 1m, delay_heartbeats: {nodes: [n1, n1], by: 5s, for: 1m}}\n", 14, "twice"),
        ("  - {at: 1m, delay_heartbeats: {nodes: [n1], by: 0s, for: 1m}}\n", 14, "by"),
        ("  - {at: 1m, add_node: {node: n1, fabric: ib-a}}\n", 14, "already a node"),
        ("  - {at: 1m, add_node: {node: n7, fabric: ib-z}}\n", 14, "unknown fabric 'ib-z'"),
        ("  - {at: 1m, add_node: {node: n7, fabric: ib-a, gpus: -1}}\n", 14, "gpus"),
        ("  - {at: 1m, add_node: {node: n7, fabric: ib-a, engines: [gpt]}}\n", 14, "engine"),
        ("  - {at: 1m, add_node: {node: n7, fabric: ib-a, colour: red}}\n", 14, "colour"),
    ],
)
def test_each_shape_is_refused_with_file_line_and_what_is_wrong(
    fault: str, line: int, words: str
) -> None:
    err = error(fault)
    assert err.path == "t.yaml"
    assert err.line == line
    assert words in err.message


def test_an_added_node_has_the_fleets_defaults_unless_its_fault_says() -> None:
    sc = load(
        "  - {at: 1m, add_node: {node: n7, fabric: ib-b}}\n"
        "  - {at: 2m, add_node: {node: n8, fabric: ib-a, gpus: 8, engines: [sim, vllm]}}\n"
    )
    added = [f.action.info for f in sc.faults if isinstance(f.action, AddNode)]
    assert [(n.node, n.fabric, n.gpus, n.engines) for n in added] == [
        ("n7", "ib-b", 4, ("sim",)),
        ("n8", "ib-a", 8, ("sim", "vllm")),
    ]
    assert [n.node for n in sc.nodes] == ["n1", "n2", "n3"]
    assert [n.node for n in sc.all_nodes] == ["n1", "n2", "n3", "n7", "n8"]
    assert dict(sc.all_fabrics)[FabricId("ib-b")] == ("n3", "n7")


def test_an_added_nodes_name_may_be_used_anywhere_in_the_file() -> None:
    """Faults written before the `add_node` (but acting after it) and expectations name it."""
    sc = load(
        "  - {at: 3m, kill_node: n7}\n  - {id: add, at: 1m, add_node: {node: n7, fabric: ib-b}}\n",
        "expect:\n  - event: node.joined\n    node: n7\n    within: [add, add+1s]\n"
        "  - at: end\n    node_state: {n7: lost}\n",
    )
    assert [type(f.action).__name__ for f in sc.faults] == ["AddNode", "KillNode"]


def test_a_fault_on_an_added_node_before_it_is_added_is_refused() -> None:
    err = error(
        "  - {at: 1m, slow_node: {node: n7, factor: 2, for: 1m}}\n"
        "  - {at: 2m, add_node: {node: n7, fabric: ib-b}}\n"
    )
    assert err.line == 14
    assert "before it is added" in err.message


def test_a_slowdown_factor_is_kept_exact() -> None:
    sc = load("  - {at: 1m, slow_node: {node: n1, factor: 2.5, for: 1m}}\n")
    assert sc.faults[0].action == SlowNode(NodeId("n1"), 5, 2, 60_000)
    sc = load("  - {at: 1m, delay_heartbeats: {nodes: [n3, n1], by: 20s, for: 1m}}\n")
    action = sc.faults[0].action
    assert action == DelayHeartbeats((NodeId("n3"), NodeId("n1")), 20_000, 60_000)


# --- the twin ----------------------------------------------------------------------------------


def test_overlapping_link_cuts_and_fabric_outages_heal_with_the_last() -> None:
    net = Network(((FabricId("ib-a"), (NodeId("n1"), NodeId("n2"))),))
    n1, n2 = NodeId("n1"), NodeId("n2")
    assert net.cut_link(n1)
    assert not net.cut_link(n1)  # already down
    net.cut_fabric(FabricId("ib-a"))
    assert net.fabric_latency_ms(n1, n2) is None
    net.restore_fabric(FabricId("ib-a"))
    assert not net.fabric_link_up(n1)  # its own link is still cut (twice)
    assert net.fabric_link_up(n2)
    assert not net.restore_link(n1)
    net.cut_fabric(FabricId("ib-a"))
    assert not net.restore_link(n1)  # the last cut ended, but the fabric is down
    assert not net.fabric_link_up(n1)
    net.restore_fabric(FabricId("ib-a"))
    assert net.fabric_link_up(n1)
    assert net.fabric_latency_ms(n1, n2) == 2
    assert net.control_latency_ms(n1) == 2  # the management side was never touched


def scenario(name: str) -> Scenario:
    return load_scenario(ROOT / "scenarios" / f"{name}.yaml")


@pytest.mark.parametrize("name", SHAPE_FILES)
def test_each_shape_file_passes_the_same_way_every_time_and_in_bulk_or_not(name: str) -> None:
    sc = scenario(name)
    first = run_scenario(sc)
    assert first.passed
    assert run_scenario(sc).trace_sha256 == first.trace_sha256
    assert run_scenario(sc, bulk=False).trace_sha256 == first.trace_sha256


@pytest.mark.parametrize("name", SHAPE_FILES)
def test_each_shape_files_expectations_fail_without_its_fault(name: str) -> None:
    sc = scenario(name)
    shapes_ = CutFabricLink | SlowNode | DelayHeartbeats | AddNode
    kept = tuple(f for f in sc.faults if not isinstance(f.action, shapes_))
    assert len(kept) < len(sc.faults)
    without = replace(sc, faults=kept)
    assert not run_scenario(without).passed


def test_a_straggler_loads_exactly_factor_times_slower() -> None:
    sc = scenario("slow-node")
    slow = replace(sc.faults[0], action=SlowNode(NodeId("node02"), 5, 2, 120_000))
    result = run_scenario(replace(sc, faults=(slow,), expectations=()))
    joined = [e.t_ms for e in result.trace if e.kind == "replica.ready"]
    started = [e.t_ms for e in result.trace if e.kind == "shard.started"]
    # the worker on node02 loads 20 s x 2.5 = 50 s after it started; ready at the next reconcile
    assert joined and joined[0] - max(started) >= 50_000
    assert joined[0] - max(started) < 51_000


def test_a_request_slower_than_its_first_byte_budget_gives_up_and_is_not_counted_died() -> None:
    sc = scenario("slow-node")
    # slowed from 1m, once the replica serves: 2 s of work takes 200 s, past the 120 s budget
    slow = replace(sc.faults[0], at_ms=60_000, action=SlowNode(NodeId("node02"), 100, 1, 120_000))
    traffic = (replace(sc.traffic[0], tokens=1000),)
    result = run_scenario(replace(sc, faults=(slow,), traffic=traffic, expectations=()))
    assert result.requests is not None
    counts = result.requests["llama-70b"]
    assert counts["failed"] > 0
    assert counts["failed_in_flight"] == 0  # given up on, not on a replica that died
    assert counts["retried"] > 0
    assert not any(e.kind == "replica.failed" for e in result.trace)


def test_late_heartbeats_arrive_in_order_and_the_node_is_suspect_not_lost() -> None:
    result = run_scenario(scenario("delay-heartbeats"))
    kinds = [(e.kind, e.get("node")) for e in result.trace]
    assert ("node.suspect", "node02") in kinds
    assert ("node.lost", "node02") not in kinds


def test_an_added_node_is_powered_off_until_its_fault() -> None:
    result = run_scenario(scenario("add-node"))
    joined = [e.t_ms for e in result.trace if e.kind == "node.joined" and e.get("node") == "node04"]
    assert joined == [120_002]


# --- report versions: a late report never undoes a newer one ----------------------------------


def test_the_agent_bumps_its_report_version_when_the_report_changes_only() -> None:
    core = AgentCore(node("n1", "ib-a"), incarnation=3)
    first = core.heartbeat()
    assert first.version == 1
    assert core.heartbeat() is first  # a quiet heartbeat repeats it
    core.handle(FabricLink(False))
    assert core.heartbeat().version == 2
    assert core.registration().version == 2


def test_an_older_report_of_the_same_agent_is_heard_as_liveness_only() -> None:
    ctl = Controller(T)
    for name, fabric in FOUR:
        ctl.handle(NodeRegistered(node(name, fabric), incarnation=1, version=1), 0)
    n1 = NodeId("n1")
    ctl.handle(Heartbeat(n1, fabric_up=False, incarnation=1, version=3), 10_000)
    assert not ctl.capacity.link_up(n1)
    # sent before the link went down, delayed on the way: it would say the link is up
    ctl.handle(Heartbeat(n1, fabric_up=True, incarnation=1, version=2), 40_000)
    assert not ctl.capacity.link_up(n1)
    ctl.tick(55_000)
    assert ctl.node_state(n1) is NodeState.ALIVE  # heard at 40 s: not suspect at 55 s
    # a new agent process starts its versions again
    ctl.handle(Heartbeat(n1, fabric_up=True, incarnation=2, version=1), 60_000)
    assert ctl.capacity.link_up(n1)


def test_a_report_without_a_version_is_taken_as_before() -> None:
    ctl = Controller(T)
    ctl.handle(NodeRegistered(node("n1", "ib-a"), incarnation=1, version=5), 0)
    ctl.handle(Heartbeat(NodeId("n1"), fabric_up=False, incarnation=1), 10_000)
    assert not ctl.capacity.link_up(NodeId("n1"))


def test_the_invariant_checker_ignores_a_late_report_too() -> None:
    sc = scenario("add-node")
    checks = Invariants(sc, None)  # type: ignore[arg-type]
    n1 = NodeId("node01")
    spec = ShardSpec(
        ReplicaId("m-r1"), ModelName("m"), ProfileName("p"), EngineName("sim"), "/m", 0, 1, n1,
        (0,), n1,
    )  # fmt: skip
    serving = (ShardReport(spec, ShardState.SERVING, "http://node01:8000"),)
    starting = (ShardReport(spec, ShardState.STARTING),)
    assert checks.delivered(Heartbeat(n1, serving, incarnation=1, version=3))
    # a late report of the same process, sent while the shard was starting: not ground truth
    assert not checks.delivered(Heartbeat(n1, starting, incarnation=1, version=2))
    assert checks.delivered(Heartbeat(n1, starting, incarnation=2, version=1))


def test_the_wire_carries_the_version_and_an_old_agent_says_none() -> None:
    old = HeartbeatW.model_validate({"node": "n1", "incarnation": 2}).to_core()
    assert old.version == 0
    new = HeartbeatW.model_validate({"node": "n1", "incarnation": 2, "version": 7}).to_core()
    assert new.version == 7
    beat = Heartbeat(NodeId("n1"), incarnation=3, version=9)
    assert HeartbeatW.from_core(beat).to_core() == beat
    reg = NodeRegistered(node("n1", "ib-a"), incarnation=3, version=4)
    assert NodeRegisteredW.from_core(reg, "http://127.0.0.1:1").to_core().version == 4


# --- the fuzzer --------------------------------------------------------------------------------


def test_the_fuzzer_draws_shapes_in_about_a_third_of_the_seeds_from_their_own_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plans = [gen.generate(seed) for seed in range(1, 61)]
    drawing = [p for p in plans if any(f.kind in shapes.SHAPE_KINDS for f in p.faults)]
    assert 10 <= len(drawing) <= 35
    monkeypatch.setattr(gen, "shape_faults", lambda *_: ([], ()))
    for plan in drawing:
        without = gen.generate(plan.seed)
        assert without.faults == tuple(f for f in plan.faults if f.kind not in shapes.SHAPE_KINDS)


def test_every_drawn_shape_is_over_by_the_heal_and_its_file_loads() -> None:
    for seed in range(1, 61):
        plan = gen.generate(seed)
        for f in plan.faults:
            if f.kind in shapes.SHAPE_KINDS:
                assert f.end_ms <= plan.heal_at_ms, (seed, f)
        load_scenario_text(gen.scenario_text(plan), f"seed-{seed}.yaml")


def test_a_shape_seed_runs_clean() -> None:
    from llmgw_twin.twin.fuzz.judge import judge_plan

    rng = random.Random(7)
    seeds = [
        s
        for s in range(1, 200)
        if gen.generate(s).enabled[-1:] in [(k,) for k in shapes.SHAPE_KINDS]
    ]
    for seed in rng.sample(seeds, 3):
        assert judge_plan(gen.generate(seed)).passed, seed


# --- real mode ---------------------------------------------------------------------------------


def test_real_mode_takes_every_shape() -> None:
    check_real_supported(scenario("add-node"))
    check_real_supported(scenario("cut-fabric-link"))  # tests/test_real_links.py
    check_real_supported(scenario("slow-node"))  # tests/test_real_pace.py
    check_real_supported(scenario("delay-heartbeats"))  # tests/test_real_late.py


def test_real_mode_slows_only_the_sim_engine_and_says_so() -> None:
    sc = scenario("slow-node")
    llamacpp = replace(sc.profiles[0], engine=EngineName("llamacpp"))
    with pytest.raises(ValueError, match="only the sim engine reads a pace") as got:
        check_real_supported(replace(sc, profiles=(llamacpp,)))
    assert "slow-node.yaml:" in str(got.value) and "(slow_node)" in str(got.value)


def test_every_smaller_plan_the_shrinker_tries_of_a_shape_seed_loads() -> None:
    from llmgw_twin.twin.fuzz.shrink import candidates

    seed = next(
        s
        for s in range(1, 200)
        if {"add_node", "delay_heartbeats"} <= {f.kind for f in gen.generate(s).faults}
    )
    plan = gen.generate(seed)
    for i, smaller in enumerate(candidates(plan)):
        load_scenario_text(gen.scenario_text(smaller), f"seed-{seed}-candidate-{i}.yaml")
        for f in smaller.faults:
            assert f.end_ms <= smaller.heal_at_ms or f.kind not in shapes.SHAPE_KINDS


def test_without_report_versions_a_late_heartbeat_fails_a_ready_replacement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llmgw_twin.control.nodes import NodeRegistry

    sc = scenario("delay-heartbeats")
    assert run_scenario(sc).passed
    monkeypatch.setattr(NodeRegistry, "stale", lambda *_: False)
    result = run_scenario(sc)
    assert not result.passed
    late = [
        e for e in result.trace if e.kind == "replica.failed" and "vanished" in str(e.get("reason"))
    ]
    assert late, "a late report without the replacement made it look vanished"
