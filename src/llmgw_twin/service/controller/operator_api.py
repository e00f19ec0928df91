"""The admin routes of the fleet's upkeep: cordon, uncordon and drain a node, delete a
deployment, explain a replica. What `llmgw-twin ctl cordon|uncordon|drain|deployment
delete|explain` call (`service/ops/ctl_fleet.py`).

Role: each route hands the core one operator event (`control/operator.py`) through the runtime, so
it is decided, made durable and published like any other step; reads (`explain`, a drain's
progress) render the core's views (`control/explain.py`). An unknown node, deployment or replica is
404; a known one is never refused: cordoning a cordoned node changes nothing and says so.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import FastAPI, Path
from pydantic import Field, StringConstraints

from llmgw_twin.control.explain import explain, fit_warnings
from llmgw_twin.control.model import Deployment, ModelName, NodeId, ReplicaId, TraceEvent
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
        named = {d.profile for d in deps} | {r.profile for d in deps for r in d.roles}
        unknown = sorted(p for p in named if core.profile(p) is None)
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
        answer = explain_one(runtime, replica)
        if answer is None:
            hint = ""
            if _is_model(runtime, replica):
                hint = f": {replica} is a model, GET /v1/admin/models/{replica}/explain explains it"
            raise Refused(f"no replica {replica} in the controller's memory or log{hint}", 404)
        return answer

    @app.get("/v1/admin/models/{model}/explain", dependencies=admin, responses=NOT_FOUND)
    async def explain_model(model: PathName) -> dict[str, Any]:
        if not _is_model(runtime, model):
            raise Refused(f"no deployment and no replica of model {model}", 404)
        return explain_of_model(runtime, ModelName(model))


CAUSES = ("replica.failed", "replica.reaped")
"""The events that say why a replica left: its failure (with the node that failed), its reap."""
RECENT_ENDS = 10
"""How many of a model's recent failures and reaps its explanation lists."""


def _ends(runtime: ControllerRuntime) -> Iterator[TraceEvent]:
    """The failures and reaps in the controller's event log, newest first."""
    for ev in reversed(runtime._events):
        if ev.kind in CAUSES:
            yield ev


def _end(ev: TraceEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"event": ev.kind, "t_ms": ev.t_ms, "replica": ev.get("replica")}
    for key in ("reason", "node", "fabric"):
        if (value := ev.get(key)) is not None:
            out[key] = value
    return out


def cause(runtime: ControllerRuntime, replica: str) -> dict[str, Any] | None:
    """Why `replica` left, from the log: its failure (reason, the node that failed) if it
    failed, else its reap's reason; None when the log no longer holds either."""
    found = [_end(ev) for ev in _ends(runtime) if ev.get("replica") == replica]
    if not found:
        return None
    failed = [e for e in found if e["event"] == "replica.failed"]
    return failed[0] if failed else found[0]


def explain_one(runtime: ControllerRuntime, replica: str) -> dict[str, Any] | None:
    """The core's explanation, with the cause of a failed or reaped replica's end; a replica
    the core forgot but the log remembers is explained from the log."""
    answer = explain(runtime.core, ReplicaId(replica))
    if answer is not None and answer["state"] not in ("failed", "reaped"):
        return answer
    why = cause(runtime, replica)
    if answer is None:
        if why is None:
            return None
        answer = {"replica": replica, "state": "reaped", "forgotten": True}
        for ev in _ends(runtime):
            if ev.get("replica") == replica and ev.get("model") is not None:
                answer["model"] = ev.get("model")
                break
    if why is not None:
        answer["cause"] = why
        where = f" on {why['node']}" if why.get("node") else ""
        verb = "failed" if why["event"] == "replica.failed" else "reaped"
        answer["why"] = f"{verb}{where}: {why.get('reason') or 'no reason logged'}"
    return answer


def _deployment(runtime: ControllerRuntime, model: str) -> Deployment | None:
    return next((d for d in runtime.core.deployments() if d.model == model), None)


def _is_model(runtime: ControllerRuntime, name: str) -> bool:
    return _deployment(runtime, name) is not None or bool(
        runtime.core.live_replicas(ModelName(name))
    )


def explain_of_model(runtime: ControllerRuntime, model: ModelName) -> dict[str, Any]:
    """A model's deployment, each live replica's explanation, and its recent failures and reaps
    with their causes (newest first)."""
    core = runtime.core
    dep = _deployment(runtime, model)
    replicas = [explain(core, r.id) for r in core.live_replicas(model)]
    ends = [_end(ev) for ev in _ends(runtime) if ev.get("model") == model][:RECENT_ENDS]
    return {
        "model": model,
        "deployment": {"profile": dep.profile, "replicas": dep.replicas} if dep else None,
        "replicas": [r for r in replicas if r is not None],
        "recent_ends": ends,
    }
