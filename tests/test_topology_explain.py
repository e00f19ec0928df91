"""A placed replica's blast radius per topology level, in the core's explain and ctl's text."""

from __future__ import annotations

from dataclasses import replace

from conftest import T, model, node
from llmgw_twin.control.blast import blast_radius
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.explain import explain
from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
)
from llmgw_twin.control.protocol import ApplyDeployment, ApplyProfile, NodeRegistered
from llmgw_twin.control.topology import DomainId, LeafId, NodeTopology, SpineId, TopologyRules
from llmgw_twin.service.ops.ctl_fleet import render_explain


def placed(leaf: dict[str, str], domain: dict[str, str], rules: TopologyRules) -> Controller:
    ctl = Controller(T)
    prof = Profile(ProfileName("tp2"), EngineName("sim"), 2, 8, "/m", topology=rules)
    ctl.handle(ApplyProfile(prof), 0)
    for name in ("n1", "n2", "n3", "n4"):
        topo = NodeTopology(LeafId(leaf[name]), SpineId(f"s-{leaf[name]}"), DomainId(domain[name]))
        ctl.handle(NodeRegistered(replace(node(name, "ib-a"), topology=topo), incarnation=1), 0)
    ctl.handle(ApplyDeployment(Deployment(model("chat"), ProfileName("tp2"), 1)), 0)
    ctl.tick(1_000)
    return ctl


def test_one_leaf_one_domain_spares_every_spine() -> None:
    ctl = placed(
        {"n1": "l1", "n2": "l2", "n3": "l1", "n4": "l2"},
        {"n1": "d1", "n2": "d2", "n3": "d1", "n4": "d2"},
        TopologyRules("same_domain", "same"),
    )
    (rec,) = ctl.replicas()
    assert rec.nodes == ("n1", "n3")
    why = explain(ctl, rec.id)
    assert why is not None
    assert why["needs"]["nvlink"] == "same_domain" and why["needs"]["leaves"] == "same"
    radius = why["blast_radius"]
    assert radius["leaves"] == ["l1"] and radius["spines"] == []
    assert radius["nvlink_domains"] == ["d1"] and radius["fabric"] == "ib-a"
    text = render_explain(why)
    assert "blast radius: down if any of its 2 node(s); leaf l1; NVLink domain d1" in text
    assert "nvlink same_domain, leaves same" in text


def test_a_replica_across_leaves_is_in_reach_of_their_spines() -> None:
    ctl = placed(
        {"n1": "l1", "n2": "l2", "n3": "l3", "n4": "l4"},
        {"n1": "d1", "n2": "d1", "n3": "d2", "n4": "d2"},
        TopologyRules("same_domain", "any"),
    )
    (rec,) = ctl.replicas()
    why = explain(ctl, rec.id)
    assert why is not None
    assert why["blast_radius"]["spines"] == ["s-l1", "s-l2"]
    assert "spine s-l1, s-l2 (it spans leaves)" in why["blast_radius"]["summary"]


def test_no_topology_no_blast_radius() -> None:
    infos = {NodeId("a"): NodeInfo(NodeId("a"), "f", 8, 1, ())}  # type: ignore[arg-type]
    assert blast_radius((NodeId("a"),), "f", infos.get) is None
