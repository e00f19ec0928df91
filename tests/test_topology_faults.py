"""Faults per topology level: read by the loader, carried out by the twin, refused by real mode
where it cannot carry them out."""

from __future__ import annotations

import pytest

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.realmode.refusals import check_real_supported
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario_text
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.scenario.topo_actions import (
    LeafDown,
    NvlinkDegraded,
    NvlinkDomainDown,
    SpineDown,
)
from llmgw_twin.twin.world.runner import run_scenario

FLEET = """\
name: t
duration: 5m
cluster:
  fabrics: {ib-a: [n1, n2, n3, n4]}
  topology:
    leaves: {l1: [n1, n2], l2: [n3, n4]}
    spines: {s1: [l1], s2: [l2]}
    nvlink_domains: {d1: [n1, n2], d2: [n3, n4]}
profiles:
  wide: {engine: sim, nodes: 2, gpus_per_node: 8, load_time: 20s, model: /m}
deployments:
  - {model: m, profile: wide, replicas: 1}
faults:
"""


def scenario(*faults: str, fleet: str = FLEET) -> Scenario:
    return load_scenario_text(fleet + "".join(f"  - {f}\n" for f in faults), "t.yaml")


def trace(s: Scenario) -> list[TraceEvent]:
    result = run_scenario(s)
    assert not any(i.enabled and i.violations for i in result.invariants)
    return list(result.trace)


def kinds(events: list[TraceEvent], kind: str) -> list[TraceEvent]:
    return [e for e in events if e.kind == kind]


def test_the_loader_reads_each_action_with_its_members() -> None:
    s = scenario(
        "{at: 1m, leaf_down: {leaf: l1, for: 30s}}",
        "{at: 1m, spine_down: {spine: s2, for: 30s}}",
        "{at: 1m, nvlink_domain_down: {domain: d2}}",
        "{at: 1m, nvlink_domain_down: {domain: d1, for: 1m}}",
        "{at: 1m, nvlink_degraded: {node: n3, for: 30s}}",
        "{at: 1m, nvlink_degraded: {node: n3, factor: 2.5, for: 30s}}",
    )
    actions = [f.action for f in s.faults]
    assert actions == [
        LeafDown("l1", ("n1", "n2"), 30_000),  # type: ignore[arg-type]
        SpineDown("s2", (("l2", ("n3", "n4")),), 30_000),  # type: ignore[arg-type]
        NvlinkDomainDown("d2", ("n3", "n4")),  # type: ignore[arg-type]
        NvlinkDomainDown("d1", ("n1", "n2"), 60_000),  # type: ignore[arg-type]
        NvlinkDegraded("n3", 2, 1, 30_000),  # type: ignore[arg-type]
        NvlinkDegraded("n3", 5, 2, 30_000),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("{at: 1m, leaf_down: {leaf: l9, for: 30s}}", "unknown leaf 'l9' (known: l1, l2)"),
        ("{at: 1m, spine_down: {spine: s9, for: 30s}}", "unknown spine 's9'"),
        ("{at: 1m, nvlink_domain_down: {domain: d9}}", "unknown NVLink domain 'd9'"),
        ("{at: 1m, leaf_down: {leaf: l1}}", "for"),
        ("{at: 1m, leaf_down: {leaf: l1, for: 0}}", "for"),
        ("{at: 1m, nvlink_degraded: {node: n3, factor: 0.5, for: 1s}}", "at least 1"),
    ],
)
def test_bad_references_are_refused(fault: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        scenario(fault)
    assert message in str(err.value)


def test_without_a_topology_a_leaf_fault_names_none() -> None:
    bare = FLEET.replace(
        "  topology:\n    leaves: {l1: [n1, n2], l2: [n3, n4]}\n    spines: {s1: [l1], s2: [l2]}\n"
        "    nvlink_domains: {d1: [n1, n2], d2: [n3, n4]}\n",
        "",
    )
    with pytest.raises(ScenarioError) as err:
        scenario("{at: 1m, leaf_down: {leaf: l1, for: 30s}}", fleet=bare)
    assert "cluster.topology defines no leaf" in str(err.value)


def test_a_domain_fails_as_one_and_its_replica_moves_to_the_other() -> None:
    events = trace(scenario("{id: d, at: 1m, nvlink_domain_down: {domain: d1}}"))
    assert kinds(events, "replica.placed")[0].get("nodes") == ("n1", "n2")
    lost = {e.get("node") for e in kinds(events, "node.lost")}
    assert lost == {"n1", "n2"}
    # no node of the domain outlives the others to report: the loss is found by silence
    assert not [e for e in kinds(events, "replica.failed") if e.t_ms < 100_000]
    ready = kinds(events, "replica.ready")
    assert ready[-1].get("nodes") == ("n3", "n4")


def test_a_domain_with_for_boots_again() -> None:
    events = trace(scenario("{at: 1m, nvlink_domain_down: {domain: d1, for: 2m}}"))
    joined = [e.get("node") for e in kinds(events, "node.joined") if e.t_ms >= 180_000]
    assert sorted(joined) == ["n1", "n2"]  # type: ignore[type-var]


def test_a_leaf_down_silences_its_nodes_and_cuts_their_replicas() -> None:
    events = trace(scenario("{at: 1m, leaf_down: {leaf: l1, for: 40s}}"))
    suspects = {e.get("node") for e in kinds(events, "node.suspect")}
    assert suspects == {"n1", "n2"}  # the leaf carries their management links too
    failed = kinds(events, "replica.failed")
    assert failed and all(e.t_ms >= 100_000 for e in failed)  # heard only once it is back
    assert kinds(events, "replica.ready")[-1].t_ms > 100_000


def test_a_spine_down_splits_replicas_across_it_and_spares_the_rest() -> None:
    across = FLEET.replace("{l1: [n1, n2], l2: [n3, n4]}", "{l1: [n1, n3], l2: [n2, n4]}")
    events = trace(scenario("{at: 1m, spine_down: {spine: s1, for: 30s}}", fleet=across))
    failed = kinds(events, "replica.failed")
    assert len(failed) == 1 and failed[0].t_ms < 61_000
    assert not kinds(events, "node.suspect")  # links up: no agent sees anything
    assert not kinds(events, "node.link_down")
    inside = trace(scenario("{at: 1m, spine_down: {spine: s1, for: 30s}}"))
    assert not kinds(inside, "replica.failed")  # n1 and n2 share leaf l1: nothing crosses


def test_a_degraded_nvlink_slows_what_starts_on_the_node() -> None:
    events = trace(
        scenario(
            "{at: 1m, nvlink_domain_down: {domain: d1}}",
            "{at: 30s, nvlink_degraded: {node: n3, factor: 3, for: 5m}}".replace("5m", "4m"),
        )
    )
    placed = kinds(events, "replica.placed")[-1]
    ready = kinds(events, "replica.ready")[-1]
    assert ready.t_ms - placed.t_ms >= 60_000  # 20s of load, three times as long


def test_real_mode_refuses_what_it_cannot_carry_out() -> None:
    with pytest.raises(ValueError, match="not supported in real mode"):
        check_real_supported(scenario("{at: 1m, nvlink_domain_down: {domain: d1, for: 30s}}"))
    check_real_supported(scenario("{at: 1m, nvlink_degraded: {node: n1, for: 30s}}"))  # a pace
    check_real_supported(scenario("{at: 1m, nvlink_domain_down: {domain: d1}}"))
    for fault in (  # tests/test_real_links.py carries them out
        "{at: 1m, leaf_down: {leaf: l1, for: 30s}}",
        "{at: 1m, spine_down: {spine: s1, for: 30s}}",
    ):
        check_real_supported(scenario(fault))
    ruled = FLEET.replace("model: /m}", "model: /m, nvlink: same_domain}")
    check_real_supported(scenario("{at: 1m, kill_node: n1}", fleet=ruled))  # agents get theirs
