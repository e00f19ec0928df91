"""What the controller service shows and forwards: the fleet's state, the model list, and the
router's forwarding of an OpenAI request to a ready replica.

Role: read-only over the controller core and the router (they decide; this only renders and
moves bytes). `fleet_state` is `GET /v1/admin/state`; `model_list` is `GET /v1/models`;
`forward` is `POST /v1/chat/completions` and `/v1/completions`.

Invariants:
- `forward` sends a request only to an endpoint the router picked (a replica the controller
  called ready, round-robin); it passes the body through unchanged and streams the answer back
  as it comes (server-sent events included), tagged `x-llmgw-replica`.
- A request it cannot serve gets a `Refused` with a message: 422 without a model name, 404 for a
  model that is not deployed, 503 when no replica of it is ready, 502 when the replica fails.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from llmgw_twin.core.controller import Controller
from llmgw_twin.core.model import ModelName, NodeId, ReplicaState
from llmgw_twin.core.routing import Router
from llmgw_twin.service.wire import DeploymentW, NodeInfoW, Refused


def fleet_state(core: Controller, agent_urls: dict[NodeId, str], t_ms: int) -> dict[str, Any]:
    """Nodes (health, fabric, each GPU and the shard holding it), fabrics, live replicas (state,
    fabric, nodes, endpoint, each shard as its agent last reported it) and deployments."""
    nodes: list[dict[str, Any]] = []
    fabrics: dict[str, list[str]] = {}
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
                "shards": shards,
            }
        )
    return {
        "t_ms": t_ms,
        "mass_loss_hold": core.held(),
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


def model_list(core: Controller, router: Router) -> dict[str, Any]:
    """The deployed models, OpenAI style, each with how many replicas the router can pick."""
    data = [
        {
            "id": d.model,
            "object": "model",
            "owned_by": "llmgw-twin",
            "ready_replicas": len(router.routes(d.model)),
        }
        for d in core.deployments()
    ]
    return {"object": "list", "data": data}


async def forward(
    client: httpx.AsyncClient, core: Controller, router: Router, request: Request, path: str
) -> Response:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        raise Refused("invalid request: the body is not JSON") from None
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not model:
        raise Refused("invalid request: body.model: the name of a deployed model is required")
    deployed = [d.model for d in core.deployments()]
    if model not in deployed:
        raise Refused(f"model {model!r} is not deployed (deployed: {deployed})", 404)
    route = router.pick(ModelName(model))
    if route is None:
        raise Refused(f"no ready replica of model {model!r}; try again once one is ready", 503)
    upstream_request = client.build_request(
        "POST", route.endpoint + path, content=raw, headers={"content-type": "application/json"}
    )
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.HTTPError as e:
        raise Refused(f"replica {route.replica} at {route.endpoint} failed: {e}", 502) from None
    headers: dict[str, str] = {"x-llmgw-replica": route.replica}
    if "content-type" in upstream.headers:
        headers["content-type"] = upstream.headers["content-type"]
    return StreamingResponse(
        upstream.aiter_bytes(),
        status_code=upstream.status_code,
        headers=headers,
        background=BackgroundTask(upstream.aclose),
    )
