"""What the controller service shows and forwards: the fleet's state, the model list, and the
router's forwarding of an OpenAI request to a ready replica.

Role: read-only over the controller core and the router (they decide; this only renders and
moves bytes). `fleet_state` is `GET /v1/admin/state`; `model_list` is `GET /v1/models`;
`forward` is `POST /v1/chat/completions` and `/v1/completions`.

Invariants:
- `forward` sends a request only to an endpoint the router picked (a replica the controller
  called ready, round-robin); it passes the body through unchanged and streams the answer back
  as it comes (server-sent events included), tagged `x-llmgw-replica`.
- A replica has at most `Outstanding.limit` of its requests in flight: a request the picked
  replica has no room for goes to the next ready one; when none has room it is answered 503
  with `Retry-After` and an OpenAI-style error. A request's slot is given back when its answer
  has been streamed, or has failed, or its client went away.
- A request it cannot serve gets a `Refused` with a message: 422 without a model name (or a
  body that is not JSON, or nested too deep to read), 404 for a model that is not deployed,
  503 when no replica of it is ready, 502 when the replica fails.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from llmgw_twin.core.controller import Controller
from llmgw_twin.core.model import ModelName, NodeId, ReplicaState
from llmgw_twin.core.routing import Route, Router
from llmgw_twin.service.limits import RETRY_AFTER_S, Outstanding, Slot
from llmgw_twin.service.replies import openai_error
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
    client: httpx.AsyncClient,
    core: Controller,
    router: Router,
    outstanding: Outstanding,
    request: Request,
    path: str,
) -> Response:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        raise Refused("invalid request: the body is not JSON") from None
    except RecursionError:
        raise Refused("invalid request: the body's JSON is nested too deep to read") from None
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not model:
        raise Refused("invalid request: body.model: the name of a deployed model is required")
    deployed = [d.model for d in core.deployments()]
    if model not in deployed:
        raise Refused(f"model {model!r} is not deployed (deployed: {deployed})", 404)
    if not router.routes(ModelName(model)):
        raise Refused(f"no ready replica of model {model!r}; try again once one is ready", 503)
    picked = _pick(router, outstanding, ModelName(model))
    if picked is None:
        return openai_error(
            503,
            f"every ready replica of model {model!r} has {outstanding.limit} requests in "
            f"flight; try again in {RETRY_AFTER_S}s",
            "server_error",
            "replicas_busy",
            headers={"retry-after": str(RETRY_AFTER_S)},
        )
    route, slot = picked
    try:
        upstream_request = client.build_request(
            "POST", route.endpoint + path, content=raw, headers={"content-type": "application/json"}
        )
        upstream = await client.send(upstream_request, stream=True)
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        slot.release()
        raise Refused(f"replica {route.replica} at {route.endpoint} failed: {e}", 502) from None
    except BaseException:
        slot.release()
        raise
    headers: dict[str, str] = {"x-llmgw-replica": route.replica}
    if "content-type" in upstream.headers:
        headers["content-type"] = upstream.headers["content-type"]
    return _Relay(upstream, slot, headers)


def _pick(router: Router, outstanding: Outstanding, model: ModelName) -> tuple[Route, Slot] | None:
    """The next replica in the router's turn that has room, and its slot; None when every ready
    replica is at its limit."""
    for _ in range(len(router.routes(model))):
        route = router.pick(model)
        if route is None:
            return None
        slot = outstanding.acquire(route.replica)
        if slot is not None:
            return route, slot
    return None


class _Relay(StreamingResponse):
    """A replica's answer, streamed back as it comes; however the stream ends (done, failed, the
    client gone), the replica's connection is closed and the request's slot given back."""

    def __init__(self, upstream: httpx.Response, slot: Slot, headers: dict[str, str]) -> None:
        super().__init__(upstream.aiter_bytes(), status_code=upstream.status_code, headers=headers)
        self._upstream = upstream
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slot.release()
            await self._upstream.aclose()
