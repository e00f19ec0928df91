"""The admin routes of the fleet's upkeep: cordon, uncordon and drain a node, delete a
deployment, explain a replica. What `llmgw-twin ctl cordon|uncordon|drain|deployment
delete|explain` call (`service/ops/ctl_fleet.py`).

Role: each route hands the core one operator event (`control/operator.py`) through the runtime, so
it is decided, made durable and published like any other step; reads (`explain`, a drain's
progress) render the core's views (`control/explain.py`). An unknown node, deployment or replica is
404; a known one is never refused: cordoning a cordoned node changes nothing and says so.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Path
from pydantic import Field, StringConstraints

from llmgw_twin.control.explain import explain, fit_warnings
from llmgw_twin.control.model import ModelName, NodeId, ReplicaId
from llmgw_twin.control.protocol import ApplyDeployment, Cordon, DeleteDeployment, Drain
from llmgw_twin.service.common.replies import NOT_FOUND
from llmgw_twin.service.common.wire import NAME_PATTERN, DeploymentW, Refused, Wire
from llmgw_twin.service.controller.app import ControllerRuntime

PathName = Annotated[str, Path(pattern=NAME_PATTERN, max_length=128)]
ReplicaName = Annotated[str, Path(pattern=NAME_PATTERN, max_length=160)]
MAX_SET = 1_000
"""The most deployments one `PUT /v1/admin/deployments` carries."""


class DeploymentSetW(Wire):
    """`{"deployments": {MODEL: {profile, replicas}, ...}}`."""

    deployments: Annotated[
        dict[Annotated[str, StringConstraints(pattern=NAME_PATTERN, max_length=128)], DeploymentW],
        Field(min_length=1, max_length=MAX_SET),
    ]


def drain_status(runtime: ControllerRuntime, node: NodeId) -> dict[str, Any]:
    """A node's cordon and drain, and what is left on it (each replica, and its copy if any)."""
    core = runtime.core
    drains = core.drains
    left = []
    for rid in core.replicas_on(node):
        rec = core.replica(rid)
        if rec is None or not rec.state.live:
            continue
        copy = drains.copy_of(rid)
        copy_rec = core.replica(copy) if copy is not None else None
        left.append(
            {
                "replica": rid,
                "state": rec.state.value,
                "copy": copy,
                "copy_state": copy_rec.state.value if copy_rec is not None else None,
                "copy_reason": copy_rec.unplaceable_reason if copy_rec is not None else None,
            }
        )
    return {
        "node": node,
        "cordoned": node in drains.cordoned(),
        "draining": node in drains.draining(),
        "drained": drains.drained(node),
        "replicas": left,
    }


def _known_node(runtime: ControllerRuntime, node: str) -> NodeId:
    if runtime.core.node_info(NodeId(node)) is None:
        raise Refused(f"unknown node {node}", 404)
    return NodeId(node)


def add_operator_routes(app: FastAPI, runtime: ControllerRuntime, admin: list[Any]) -> None:
    """Register the routes on `app`, each behind `admin` (the admin credential check)."""

    @app.post("/v1/admin/nodes/{node}/cordon", dependencies=admin, responses=NOT_FOUND)
    async def cordon(node: PathName) -> dict[str, Any]:
        n = _known_node(runtime, node)
        was = n in runtime.core.drains.cordoned()
        await runtime.operate(Cordon(n, cordoned=True))
        return {"node": node, "cordoned": True, "changed": not was}

    @app.delete("/v1/admin/nodes/{node}/cordon", dependencies=admin, responses=NOT_FOUND)
    async def uncordon(node: PathName) -> dict[str, Any]:
        n = _known_node(runtime, node)
        was = n in runtime.core.drains.cordoned()
        await runtime.operate(Cordon(n, cordoned=False))
        return {"node": node, "cordoned": False, "changed": was}

    @app.post("/v1/admin/nodes/{node}/drain", dependencies=admin, responses=NOT_FOUND)
    async def drain(node: PathName) -> dict[str, Any]:
        n = _known_node(runtime, node)
        await runtime.operate(Drain(n))
        return drain_status(runtime, n)

    @app.get("/v1/admin/nodes/{node}/drain", dependencies=admin, responses=NOT_FOUND)
    async def drain_progress(node: PathName) -> dict[str, Any]:
        return drain_status(runtime, _known_node(runtime, node))

    @app.put("/v1/admin/deployments", dependencies=admin)
    async def put_deployments(body: DeploymentSetW) -> dict[str, Any]:
        """Several deployments at once, placed together (no reconcile between them): what a
        declarative apply of a whole fleet's deployments wants, and real mode's time zero."""
        core = runtime.core
        deps = [w.to_core(model) for model, w in sorted(body.deployments.items())]
        unknown = sorted({d.profile for d in deps if core.profile(d.profile) is None})
        if unknown:  # checked before anything changes
            raise Refused(f"unknown profile(s): {', '.join(unknown)}")
        await runtime.handle_all([ApplyDeployment(d) for d in deps])
        runtime.feed.touch()
        return {"deployments": sorted(body.deployments), "warnings": fit_warnings(core, deps)}

    @app.delete("/v1/admin/deployments/{model}", dependencies=admin, responses=NOT_FOUND)
    async def delete_deployment(model: PathName) -> dict[str, Any]:
        live = [r.id for r in runtime.core.live_replicas(ModelName(model))]
        try:
            await runtime.operate(DeleteDeployment(ModelName(model)))
        except Refused as e:
            raise Refused(str(e), 404) from None
        runtime.feed.touch()  # the routers' model lists change
        return {"model": model, "deleted": True, "replicas_retired": sorted(live)}

    @app.get("/v1/admin/replicas/{replica}/explain", dependencies=admin, responses=NOT_FOUND)
    async def explain_replica(replica: ReplicaName) -> dict[str, Any]:
        answer = explain(runtime.core, ReplicaId(replica))
        if answer is None:
            raise Refused(f"no replica {replica} (a reaped one is forgotten)", 404)
        return answer
