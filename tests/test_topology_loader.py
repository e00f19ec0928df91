"""`cluster.topology` and a profile's `nvlink` / `leaves` rules in scenario files."""

from __future__ import annotations

import pytest

from llmgw_twin.control.topology import NodeTopology, TopologyRules
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario_text

BASE = """\
name: t
duration: 1m
cluster:
  fabrics: {ib-a: [n1, n2, n3], ib-b: [n4]}
  topology:
TOPO
profiles:
  p: {engine: sim, nodes: 2, gpus_per_node: 4, model: /m, nvlink: same_domain, leaves: fewest}
"""


def load(topo: str) -> object:
    text = BASE.replace("TOPO", "\n".join(f"    {line}" for line in topo.splitlines()))
    return load_scenario_text(text, "t.yaml")


def test_each_node_gets_its_place() -> None:
    s = load(
        "leaves: {l1: [n1, n2], l2: [n3], l4: [n4]}\n"
        "spines: {s1: [l1, l2]}\n"
        "nvlink_domains: {d1: [n1, n3]}"
    )
    topo = {n.node: n.topology for n in s.nodes}  # type: ignore[attr-defined]
    assert topo["n1"] == NodeTopology("l1", "s1", "d1")  # type: ignore[arg-type]
    assert topo["n2"] == NodeTopology("l1", "s1", None)  # type: ignore[arg-type]
    assert topo["n4"] == NodeTopology("l4", None, None)  # type: ignore[arg-type]
    assert s.profiles[0].topology == TopologyRules("same_domain", "fewest")  # type: ignore[attr-defined]


def test_no_topology_leaves_nodes_and_profiles_as_they_were() -> None:
    text = BASE.replace("  topology:\nTOPO\n", "").replace(
        ", nvlink: same_domain, leaves: fewest", ""
    )
    s = load_scenario_text(text, "t.yaml")
    assert all(n.topology is None for n in s.nodes)
    assert s.profiles[0].topology == TopologyRules()


@pytest.mark.parametrize(
    ("topo", "message"),
    [
        ("leaves: {l1: [n1], l2: [n1]}", "node 'n1' is already under leaf 'l1'"),
        ("leaves: {l1: [n1, n4]}", "a leaf switch belongs to one fabric"),
        ("leaves: {l1: [n9]}", "unknown node 'n9'"),
        ("leaves: {l1: []}", "must list at least one node"),
        ("leaves: {l1: [n1], l4: [n4]}\nspines: {s1: [l1, l4]}", "a spine switch belongs"),
        ("leaves: {l1: [n1]}\nspines: {s1: [l9]}", "unknown leaf 'l9'"),
        ("leaves: {l1: [n1]}\nspines: {s1: [l1], s2: [l1]}", "already under spine 's1'"),
        ("nvlink_domains: {d1: [n1], d2: [n1]}", "already under NVLink domain 'd1'"),
        ("racks: {}", "racks"),
    ],
)
def test_errors_point_at_the_value(topo: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load(topo)
    assert message in str(err.value)


def test_an_unknown_rule_is_refused() -> None:
    text = BASE.replace("TOPO", "    leaves: {l1: [n1]}").replace("fewest", "most")
    with pytest.raises(ScenarioError) as err:
        load_scenario_text(text, "t.yaml")
    assert "leaves" in str(err.value) and "fewest" in str(err.value)
