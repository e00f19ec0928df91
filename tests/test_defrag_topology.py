"""Defragmentation under topology rules (`control/defrag_plan.py`): room made for a replica that
must sit in one NVLink domain (or under one leaf), and the moved replicas' own copies kept
inside their rules; on the plan alone and through the controller core."""

from __future__ import annotations

from dataclasses import replace

from conftest import T, model, node, profile
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.defrag_plan import Movable, plan_moves
from llmgw_twin.control.model import (
    Deployment,
    FabricId,
    NodeId,
    Profile,
    ProfileName,
    ReplicaId,
    ShardReport,
    ShardState,
)
from llmgw_twin.control.placement import CapacityIndex
from llmgw_twin.control.protocol import ApplyDeployment, ApplyProfile, Heartbeat, NodeRegistered
from llmgw_twin.control.topology import DomainId, LeafId, NodeTopology, TopologyRules

IB_A = FabricId("ib-a")
SAME_DOMAIN = TopologyRules(nvlink="same_domain")
SAME_LEAF = TopologyRules(leaves="same")


def ruled(p: Profile, rules: TopologyRules) -> Profile:
    return replace(p, topology=rules)


def placed(name: str, domain: str | None = None, leaf: str | None = None) -> object:
    topo = NodeTopology(
        leaf=LeafId(leaf) if leaf else None,
        nvlink_domain=DomainId(domain) if domain else None,
    )
    return replace(node(name, "ib-a"), topology=topo)


def index(**domains: str) -> CapacityIndex:
    """Nodes of ib-a (8 GPUs each), each in the NVLink domain (and leaf of the same name)
    given for it."""
    idx = CapacityIndex()
    for name, group in domains.items():
        idx.add_node(placed(name, domain=group, leaf=group))  # type: ignore[arg-type]
        idx.set_schedulable(NodeId(name), True)
    return idx


def running(idx: CapacityIndex, p: Profile, rid: str, *nodes: str) -> Movable:
    """A replica of `p` named `rid` on the first GPUs of `nodes`, booked."""
    where = []
    for n in nodes:
        gpus = idx.free_gpus(NodeId(n))[: p.gpus_per_node]
        idx.book(NodeId(n), gpus)
        where.append((NodeId(n), gpus))
    return Movable(ReplicaId(rid), p, IB_A, tuple(where), frozenset())


def test_room_for_a_replica_of_one_domain_is_made_inside_one_domain() -> None:
    # d1: n1, n2; d2: n3, n4. A 1x4 on n1 and one on n3: two free halves in each domain. A
    # 2x8 of one domain fits nowhere; moving the 1x4 of n1 beside the one on n3 frees d1
    idx = index(n1="d1", n2="d1", n3="d2", n4="d2")
    small = profile("small", nodes=1, gpus=4)
    movable = [running(idx, small, "s1", "n1"), running(idx, small, "s3", "n3")]
    big = profile("big", nodes=2, gpus=8)
    # unruled, n2 and n4 are free already: nothing to move for it
    assert idx.place(big, {}, frozenset(), {}) is not None
    plan = plan_moves(idx, ruled(big, SAME_DOMAIN), frozenset(), movable, 2, [IB_A])
    assert plan is not None and len(plan.moves) == 1
    target = set(plan.target.nodes)
    assert target in ({"n1", "n2"}, {"n3", "n4"})
    (move,) = plan.moves
    # the copy leaves the target's domain, to the other one's free GPUs
    assert not set(move.to.nodes) & target


def test_no_plan_when_no_domain_can_hold_the_replica() -> None:
    # three domains of one node each: a 2x8 of one domain can never fit, whatever moves
    idx = index(n1="d1", n2="d2", n3="d3")
    small = profile("small", nodes=1, gpus=4)
    movable = [running(idx, small, "s1", "n1")]
    big = ruled(profile("big", nodes=2, gpus=8), SAME_DOMAIN)
    assert plan_moves(idx, big, frozenset(), movable, 3, [IB_A]) is None


def test_a_moved_replica_under_a_rule_is_copied_inside_one_group() -> None:
    # leaves L1: n1, n2; L2: n3, n4, n5. A 2x4 of one leaf runs on n1 and n2 (half of each);
    # a 1x8 needs a whole node: n1 or n2 emptied, or any of L2 once something moves there.
    # The pair's copy must go under one leaf: n3 and n4 (or n4 and n5), never n2 and n3
    idx = index(n1="L1", n2="L1", n3="L2", n4="L2", n5="L2")
    for n in ("n3", "n4", "n5"):  # L2 half full
        idx.book(NodeId(n), idx.free_gpus(NodeId(n))[:4])
    pair = ruled(profile("pair", nodes=2, gpus=4), SAME_LEAF)
    movable = [running(idx, pair, "p1", "n1", "n2")]
    whole = profile("whole", nodes=1, gpus=8)
    plan = plan_moves(idx, whole, frozenset(), movable, 1, [IB_A])
    assert plan is not None and len(plan.moves) == 1
    copy_nodes = set(plan.moves[0].to.nodes)
    assert copy_nodes <= {"n3", "n4", "n5"} and len(copy_nodes) == 2
    assert set(plan.target.nodes) <= {"n1", "n2"}


def test_the_controller_moves_a_replica_to_make_room_for_one_of_one_domain() -> None:
    ctl = Controller(T)
    chat, big = model("chat"), model("big")
    ctl.handle(ApplyProfile(profile("chat-1n", nodes=1, gpus=4)), 0)
    ctl.handle(ApplyProfile(ruled(profile("big-2n", nodes=2, gpus=8), SAME_DOMAIN)), 0)
    ctl.handle(ApplyDeployment(Deployment(chat, ProfileName("chat-1n"), 3)), 0)
    ctl.handle(ApplyDeployment(Deployment(big, ProfileName("big-2n"), 0)), 0)
    for name, domain in (("n1", "d1"), ("n2", "d1"), ("n3", "d2"), ("n4", "d2")):
        ctl.handle(NodeRegistered(placed(name, domain=domain)), 0)  # type: ignore[arg-type]
    ctl.tick(1_000)

    def beat(now: int) -> None:
        for n in ctl.nodes():
            shards = tuple(
                ShardReport(
                    s,
                    ShardState.SERVING if s.rank == 0 else ShardState.RUNNING,
                    f"http://{s.node}:{8000 + s.gpus[0]}" if s.rank == 0 else None,
                    None,
                    ("engine", str(s.rank)),
                )
                for s in ctl.assigned(n)
            )
            ctl.handle(Heartbeat(n, shards), now)

    beat(2_000)
    ctl.tick(3_000)
    domain_of = {"n1": "d1", "n2": "d1", "n3": "d2", "n4": "d2"}
    chat_nodes = sorted(r.nodes[0] for r in ctl.ready_replicas(chat))
    # spread over nodes: n4 alone is free, so no domain has two free nodes
    assert chat_nodes == ["n1", "n2", "n3"]
    ctl.handle(ApplyDeployment(Deployment(big, ProfileName("big-2n"), 1)), 10_000)
    step = ctl.tick(10_000)
    kinds = [e.kind for e in step.events]
    assert kinds[:2] == ["replica.unplaceable", "replica.moving"]
    for now in range(11_000, 30_000, 1_000):
        beat(now)
        ctl.tick(now)
        if ctl.live_replicas(big):
            break
    (replica,) = ctl.live_replicas(big)
    assert len({domain_of[n] for n in replica.nodes}) == 1 and len(replica.nodes) == 2
    assert set(replica.nodes) == {"n3", "n4"}  # d2, once n3's replica joined d1's nodes
    assert len(ctl.ready_replicas(chat)) == 3 and ctl.moves() == {}
