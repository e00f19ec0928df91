"""What the controller service shows: the fleet's state and the model list.

Role: read-only over the controller core and the router (they decide; this only renders).
`fleet_state` is `GET /v1/admin/state`; `model_list` is `GET /v1/models` (of the controller and,
from its feed, of the router service). Forwarding is `forwarding.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import ModelName, NodeId, NodeState, ReplicaState
from llmgw_twin.control.routing import Router
from llmgw_twin.service.common.wire import DeploymentW, NodeInfoW


def fleet_state(core: Controller, agent_urls: dict[NodeId, str], t_ms: int) -> dict[str, Any]:
    """Nodes (health, fabric, each GPU and the shard holding it), fabrics, live replicas (state,
    fabric, nodes, endpoint, each shard as its agent last reported it) and deployments."""
    nodes: list[dict[str, Any]] = []
    fabrics: dict[str, list[str]] = {}
    cordoned, draining = core.drains.cordoned(), core.drains.draining()
    for node in core.nodes():
        info = core.node_info(node)
        assert info is not None
        health = core.node_state(node)
        held = {g: spec for spec in core.assigned(node) for g in spec.gpus}
        gpus = [
            {"index": g, "replica": held[g].replica, "rank": held[g].rank}
            if g in held
            else {"index": g, "replica": None, "rank": None}
            for g in range(info.gpus)
        ]
        nodes.append(
            NodeInfoW.from_core(info).model_dump(mode="json")
            | {
                "state": health.value if health is not None else None,
                "agent_url": agent_urls.get(node),
                "gpus": gpus,
                "gpu_count": info.gpus,
                "failed_gpus": list(core.failed_gpus(node)),
                "fabric_link_up": core.link_up(node),
                # what the node reported last, not heard since: not alive means its link and
                # shard states are the last values heard, shown as such
                "stale": health is not NodeState.ALIVE,
                "cordoned": node in cordoned,
                "draining": node in draining,
            }
        )
        fabrics.setdefault(info.fabric, []).append(node)
    replicas: list[dict[str, Any]] = []
    for rec in core.replicas():
        if not rec.state.live:
            continue
        shards = []
        for spec in rec.specs:
            report = rec.reports.get(spec.rank)
            shards.append(
                {
                    "rank": spec.rank,
                    "node": spec.node,
                    "gpus": list(spec.gpus),
                    "state": report.state.value if report is not None else None,
                    "endpoint": report.endpoint if report is not None else None,
                    "exit_code": report.exit_code if report is not None else None,
                }
            )
        replicas.append(
            {
                "replica": rec.id,
                "model": rec.model,
                "profile": rec.profile.name,
                "state": rec.state.value,
                "routable": rec.state is ReplicaState.READY and not rec.unroutable,
                "fabric": rec.fabric,
                "nodes": list(rec.nodes),
                "endpoint": rec.endpoint,
                "reason": rec.unplaceable_reason,
                "shards": shards,
                **rec.tags,
            }
        )
    return {
        "t_ms": t_ms,
        "mass_loss_hold": core.held(),
        "mass_loss_accepted": core.loss_accepted(),
        "loss_paced": core.paced(),
        "quarantines": [
            {"node": n, "profile": p, "until_ms": until, "reason": reason}
            for n, p, until, reason in core.quarantines()
        ],
        "nodes": nodes,
        "fabrics": [{"fabric": f, "nodes": fabrics[f]} for f in sorted(fabrics)],
        "replicas": replicas,
        "deployments": [
            {"model": d.model, **DeploymentW.from_core(d).model_dump(mode="json")}
            for d in core.deployments()
        ],
    }


def model_list(models: Iterable[str], router: Router) -> dict[str, Any]:
    """The deployed `models`, OpenAI style, each with how many replicas the router can pick."""
    data = [
        {
            "id": model,
            "object": "model",
            "owned_by": "llmgw-twin",
            "ready_replicas": len(router.routes(ModelName(model))),
        }
        for model in models
    ]
    return {"object": "list", "data": data}
