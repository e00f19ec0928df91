"""The fuzzer's topology: about a third of the seeds get leaves, spines and NVLink domains from
a random source of their own, and draw faults per level; the rest are what they were."""

from __future__ import annotations

from llmgw_twin.twin.fuzz.gen import FAULT_KINDS, generate, scenario_text
from llmgw_twin.twin.fuzz.judge import judge_plan
from llmgw_twin.twin.fuzz.shrink import without_nodes
from llmgw_twin.twin.fuzz.topo import TOPOLOGY_KINDS
from llmgw_twin.twin.scenario.loader import load_scenario_text
from llmgw_twin.twin.world.runner import run_scenario

SEEDS = range(1, 121)


def test_a_third_of_the_seeds_get_a_topology_and_only_they_draw_its_faults() -> None:
    with_topology = 0
    for seed in SEEDS:
        plan = generate(seed)
        kinds = {f.kind for f in plan.faults} & set(TOPOLOGY_KINDS)
        if plan.topology is None:
            assert not kinds and not set(plan.enabled) & set(TOPOLOGY_KINDS)
            assert "topology:" not in scenario_text(plan)
            continue
        with_topology += 1
        topo = plan.topology
        members = [n for _, group in topo.leaves for n in group]
        assert sorted(members) == sorted(n.name for n in plan.nodes)  # each node under one leaf
        names = {name for groups in (topo.leaves, topo.spines, topo.domains) for name, _ in groups}
        for f in plan.faults:
            if f.kind in TOPOLOGY_KINDS:
                assert f.kind in plan.enabled
                assert f.end_ms <= plan.heal_at_ms
                assert f.group in names or f.kind == "nvlink_degraded"
        load_scenario_text(scenario_text(plan), "gen.yaml")
    assert 25 <= with_topology <= 55
    assert set(TOPOLOGY_KINDS) <= set(FAULT_KINDS)


def test_the_shrinker_keeps_the_topology_consistent() -> None:
    for seed in SEEDS:
        plan = generate(seed)
        if plan.topology is None:
            continue
        for node in plan.nodes[:3]:
            smaller = without_nodes(plan, {node.name})
            load_scenario_text(scenario_text(smaller), "shrunk.yaml")  # refuses a dangling name


def test_seeds_with_a_topology_pass() -> None:
    ran = 0
    for seed in SEEDS:
        plan = generate(seed)
        if plan.topology is None or not {f.kind for f in plan.faults} & set(TOPOLOGY_KINDS):
            continue
        verdict = judge_plan(plan)
        assert verdict.passed, (seed, verdict.messages)
        ran += 1
        if ran == 12:
            break
    assert ran == 12


def test_ruled_profiles_under_random_faults_keep_their_rules_and_every_invariant() -> None:
    """The generator gives its profiles no rules (its liveness rule reads fabrics only); here
    the topology seeds' profiles get some, the liveness expectation is left out, and every
    placement is held to its rules against the plan's topology, with every invariant on."""
    ran = 0
    for seed in SEEDS:
        plan = generate(seed)
        if plan.topology is None:
            continue
        rules = ("nvlink: same_domain", "leaves: same", "leaves: fewest")
        text = scenario_text(plan).split("\nexpect:")[0]
        for p in plan.profiles:  # one rule for all: a rollout keeps it
            old = f"model: /models/{p.name}}}"
            text = text.replace(old, f"model: /models/{p.name}, {rules[seed % 3]}}}")
        scenario = load_scenario_text(text, f"ruled-{seed}.yaml")
        result = run_scenario(scenario)
        bad = [(i.name, i.violations[:2]) for i in result.invariants if i.violations]
        assert not bad, (seed, bad)
        where = {n.node: n.topology for n in scenario.all_nodes}
        ruled = {str(d.model): scenario.profile(d.profile).topology for d in scenario.deployments}
        for ev in result.trace:
            if ev.kind != "replica.placed":
                continue
            nodes = ev.get("nodes")
            assert isinstance(nodes, tuple)
            topo = [where[n] for n in nodes]
            rule = ruled[str(ev.get("model"))]
            if len(nodes) > 1 and rule.nvlink == "same_domain":
                assert len({t.nvlink_domain for t in topo if t}) == 1 and all(topo), (seed, ev)
            if len(nodes) > 1 and rule.leaves == "same":
                assert len({t.leaf for t in topo if t}) == 1 and all(topo), (seed, ev)
        ran += 1
        if ran == 15:
            break
    assert ran == 15
