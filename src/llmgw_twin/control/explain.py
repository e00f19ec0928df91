"""Why a replica is where it is, or why it is nowhere: what `ctl explain` shows, and the warning
a deployment that can never fit is answered with.

Pure reads over the controller's views; each call walks the fleet once (an operator's question,
not a per-heartbeat cost).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from llmgw_twin.control.blast import blast_radius
from llmgw_twin.control.model import Deployment, NodeId, NodeState, Profile, ReplicaId
from llmgw_twin.control.room import Shape

if TYPE_CHECKING:
    from llmgw_twin.control.controller import Controller

NODES_LISTED = 8
"""The most candidate nodes `explain` names per fabric."""


def blocker(core: Controller, node: NodeId, profile: Profile) -> str | None:
    """Why `node` cannot take one shard of `profile` now (None: it can)."""
    info = core.node_info(node)
    if info is None:
        return "not registered"
    shape = Shape.of(profile)
    if shape.engine not in info.engines:
        return f"not onboarded with engine {profile.engine}"
    if node in core.drains.cordoned():
        return "draining" if node in core.drains.draining() else "cordoned"
    state = core.node_state(node)
    if state is not NodeState.ALIVE:
        return f"node {state.value if state is not None else 'unknown'}"
    if not core.heard(node):
        return "not heard from since the controller started"
    if node in core.excluded(profile):
        return f"quarantined for profile {profile.name} (or not heard since a failure)"
    if shape.linked and not core.link_up(node):
        return "fabric link down (a multi-node replica needs it)"
    free = len(core.capacity.free_gpus(node))
    if free < profile.gpus_per_node:
        failed = len(core.failed_gpus(node))
        more = f", {failed} failed" if failed else ""
        return f"{free} free GPU(s) of {info.gpus}{more}; needs {profile.gpus_per_node}"
    return None


def fabrics_for(core: Controller, profile: Profile) -> list[dict[str, Any]]:
    """Per fabric: the nodes that could take a shard of `profile` now, whether a whole replica
    fits there, and why the other nodes cannot (counted by reason)."""
    per: dict[str, tuple[list[NodeId], Counter[str]]] = {}
    for node in core.nodes():
        info = core.node_info(node)
        assert info is not None
        ok, why = per.setdefault(info.fabric, ([], Counter()))
        reason = blocker(core, node, profile)
        if reason is None:
            ok.append(node)
        else:
            why[_kind(reason)] += 1
    st, now = core.capacity.stability, core.now_ms()
    out = []
    for fabric in sorted(per):
        ok, why = per[fabric]
        entry: dict[str, Any] = {
            "fabric": fabric,
            "fits": len(ok) >= profile.nodes,
            "candidates": len(ok),
            "needs": profile.nodes,
            "candidate_nodes": ok[:NODES_LISTED],
            "blocked": dict(sorted(why.items())),
        }
        unstable = {n: text for n in ok if (text := st.describe(n, now)) is not None}
        if unstable:  # candidates taken last when the packing ties
            entry["unstable"] = dict(list(unstable.items())[:NODES_LISTED])
        out.append(entry)
    return out


def stability(core: Controller, fabric: str, nodes: tuple[NodeId, ...]) -> list[dict[str, Any]]:
    """Why the replica's nodes were preferred to the recently unstable nodes of its fabric
    (empty: none of the fabric's nodes has a recent history). Placement takes the least
    unstable node when the packing ties (`stability.py`)."""
    st, now = core.capacity.stability, core.now_ms()
    out: list[dict[str, Any]] = []
    for node in st.remembered():
        info = core.node_info(node)
        text = st.describe(node, now)
        if info is None or info.fabric != fabric or text is None:
            continue
        verdict = (
            "holds a shard: no steadier node tied with it on packing"
            if node in nodes
            else "passed over when the packing ties: a steadier node goes first"
        )
        entry = {"node": node, "instability": round(st.score(node, now), 2), "history": text}
        out.append({**entry, "verdict": verdict})
    if not out:
        return []
    steady = [
        {
            "node": n,
            "instability": 0.0,
            "history": "no recent loss, reboot or unheard spell",
            "verdict": "preferred: a stable recent history",
        }
        for n in nodes
        if st.describe(n, now) is None
    ]
    return (steady + out)[: NODES_LISTED + len(nodes)]


def _kind(reason: str) -> str:
    """A blocker's reason without its numbers, for counting."""
    if "free GPU" in reason:
        return "too few free GPUs"
    return reason


def explain(core: Controller, rid: ReplicaId) -> dict[str, Any] | None:
    """What `ctl explain REPLICA` prints (None: no such replica)."""
    rec = core.replica(rid)
    if rec is None:
        return None
    out: dict[str, Any] = {
        "replica": rec.id,
        "model": rec.model,
        "profile": rec.profile.name,
        "state": rec.state.value,
        "fabric": rec.fabric,
        "nodes": list(rec.nodes),
        "needs": {
            "nodes": rec.profile.nodes,
            "gpus_per_node": rec.profile.gpus_per_node,
            "engine": rec.profile.engine,
            "one_fabric": True,
        },
    }
    if rec.group:  # a role group's member: its partners, by role (`groups.py`)
        members = [r for r in core.live_replicas(rec.model) if r.group == rec.group]
        out["group"] = {
            "group": rec.group,
            "role": rec.role,
            "members": {
                r.id: {"role": r.role, "state": r.state.value}
                for r in sorted(members, key=lambda r: r.seq)
            },
        }
    if rec.profile.topology.constrained:
        out["needs"] |= {
            "nvlink": rec.profile.topology.nvlink,
            "leaves": rec.profile.topology.leaves,
        }
    copy = core.drains.copy_of(rec.id) or core.rollout.copy_of(rec.id)
    if copy is not None:
        out["moving_to"] = copy
    original = core.moves().get(rec.id) or core.rollout.original_of(rec.id)
    if original is not None:
        out["copy_of"] = original
    if not rec.state.live:
        out["why"] = f"{rec.state.value}: no longer managed"
        return out
    if rec.placed:
        out["why"] = f"placed on {', '.join(rec.nodes)} in {rec.fabric}"
        out["shards"] = [
            {
                "rank": s.rank,
                "node": s.node,
                "gpus": list(s.gpus),
                "state": rep.state.value if (rep := rec.reports.get(s.rank)) else None,
            }
            for s in rec.specs
        ]
        history = stability(core, rec.fabric, rec.nodes) if rec.fabric is not None else []
        if history:
            out["stability"] = history
        radius = blast_radius(rec.nodes, rec.fabric, core.node_info)
        if radius is not None:
            out["blast_radius"] = radius
        return out
    fabrics = fabrics_for(core, rec.profile)
    out["fabrics"] = fabrics
    if rec.not_before_ms > 0:
        out["not_before_ms"] = rec.not_before_ms
    if core.held():
        out["why"] = "the mass-loss guard holds: nothing is placed until the fleet is heard"
    elif rec.unplaceable_reason is not None:
        out["why"] = rec.unplaceable_reason
    elif any(f["fits"] for f in fabrics):
        out["why"] = "it fits: it is placed at the next reconcile (or after its back-off)"
    else:
        out["why"] = "no fabric has room for it"
    warning = never_fits(core, rec.profile)
    if warning is not None:
        out["never_fits"] = warning
    return out


def never_fits(core: Controller, profile: Profile) -> str | None:
    """Why no replica of `profile` could ever be placed on the nodes registered now, even with
    every one of them alive, empty and uncordoned (None: one could)."""
    best: tuple[int, str] = (0, "")
    for fabric, count in _big_enough(core, profile).items():
        best = max(best, (count, fabric), key=lambda b: (b[0], [-ord(c) for c in b[1]]))
    if best[0] >= profile.nodes:
        return None
    need = (
        f"needs {profile.nodes} node(s) with {profile.gpus_per_node} working GPU(s) and engine "
        f"{profile.engine} in one fabric"
    )
    if best[0] == 0:
        return f"{need}: no registered node has that"
    return f"{need}: the most in one fabric is {best[0]} ({best[1]})"


def fit_warnings(core: Controller, deployments: list[Deployment]) -> list[str]:
    """The answer's `warnings` to deployments just applied: one for each that wants replicas
    and can never fit (`never_fits`)."""
    out = []
    for d in deployments:
        profile = core.profile(d.profile)
        never = never_fits(core, profile) if profile is not None and d.replicas else None
        if never is not None:
            out.append(f"deployment {d.model} can never fit: {never}")
    return out


def _big_enough(core: Controller, profile: Profile) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in core.nodes():
        info = core.node_info(node)
        assert info is not None
        working = info.gpus - len(core.failed_gpus(node))
        if profile.engine in info.engines and working >= profile.gpus_per_node:
            counts[info.fabric] = counts.get(info.fabric, 0) + 1
    return counts
