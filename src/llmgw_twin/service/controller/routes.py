"""The controller's HTTP face: its routes, and who may call each (docs/security.md).

Role: `create_controller_app(runtime)` puts a `ControllerRuntime` behind FastAPI. Each route
declares the credential it needs as a dependency (`_as_admin`, `_as_node`, `_as_client`,
`_as_router`), so the
OpenAPI schema shows it and no handler runs for a caller it would refuse; the handlers only
call the runtime. Bodies over the configured limits are refused (413) before any route sees
them, and every error is JSON (`wire.install_error_handlers`).
"""

from __future__ import annotations

from typing import Annotated, Any, get_args

from fastapi import Depends, FastAPI, Path, Query, Request, Security
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from llmgw_twin.service.common.auth import (
    Caller,
    ControllerKeys,
    CredentialRequestW,
    CredentialW,
    Kind,
)
from llmgw_twin.service.common.feed import FeedPageW
from llmgw_twin.service.common.gate import guard
from llmgw_twin.service.common.limits import MAX_INT
from llmgw_twin.service.common.metrics import add_metrics_route
from llmgw_twin.service.common.replies import CONFLICT, ERRORS, NOT_FOUND, OPENAI_REQUEST, PROXIED
from llmgw_twin.service.common.serving import NO_TELEMETRY
from llmgw_twin.service.common.spec_view import spec_state
from llmgw_twin.service.common.wire import (
    NAME_PATTERN,
    DeploymentW,
    HeartbeatW,
    NodeRegisteredW,
    ProfileW,
    ReportReplyW,
    install_error_handlers,
)
from llmgw_twin.service.controller import standby
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.autoscaling import LoadPushW
from llmgw_twin.service.controller.fastpath import HeartbeatFastPath
from llmgw_twin.service.controller.operator_api import add_operator_routes
from llmgw_twin.service.controller.reads import EVENTS_PAGE
from llmgw_twin.service.controller.status_page import status_response

PathName = Annotated[str, Path(pattern=NAME_PATTERN, max_length=128)]


# --- who may call: each route's dependency (the runtime is the app's `state.runtime`) ----------

_scheme = HTTPBearer(
    auto_error=False, description="an admin token, a node token, a router token or an API key"
)
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(_scheme)]


def _keys(request: Request) -> ControllerKeys | None:
    runtime: ControllerRuntime = request.app.state.runtime
    return runtime.keys


async def _as_admin(request: Request, _token: Bearer) -> None:
    keys = _keys(request)
    if keys is not None:
        keys.require(request, "admin")


async def _as_node(request: Request, _token: Bearer) -> Caller | None:
    keys = _keys(request)
    return keys.require(request, "node") if keys is not None else None


async def _as_client(request: Request, _token: Bearer) -> None:
    keys = _keys(request)
    if keys is not None and keys.api_key_hashes:
        keys.require(request, "api")


async def _as_router(request: Request, _token: Bearer) -> None:
    keys = _keys(request)
    if keys is not None:
        keys.require(request, "router", "admin")


KINDS: tuple[Kind, ...] = get_args(Kind)
CLIENT_PATHS = frozenset({"/v1/models", "/v1/chat/completions", "/v1/completions"})


def _gate(request: Request) -> None:
    """Who passes the gate (`gate.py`), from the headers, before any body is read: a caller
    with a credential this controller knows, of any kind (the kind each route wants is its
    dependency's to check); on the client routes anyone, when no API key is listed."""
    keys = _keys(request)
    if keys is None:
        return
    if request.url.path in CLIENT_PATHS:
        if keys.api_key_hashes:
            keys.require(request, "api", *KINDS)  # refused in an OpenAI client's words
        return
    keys.require(request, "admin", *KINDS)


AsNode = Annotated[Caller | None, Depends(_as_node)]
Epoch = Annotated[str | None, Query(pattern="^[0-9a-f]{1,64}$")]


def _shed_when_behind(runtime: ControllerRuntime) -> None:
    """While the controller runs behind, what can wait waits: heartbeats come first."""
    if runtime.lag.behind():
        raise HTTPException(
            503,
            "the controller is behind (overloaded); retry shortly",
            headers={"Retry-After": str(SHED_RETRY_AFTER_S)},
        )


SHED_RETRY_AFTER_S = 5


def create_controller_app(runtime: ControllerRuntime) -> FastAPI:
    app = FastAPI(
        title="llmgw-twin controller",
        lifespan=standby.lifespan(runtime),
        responses=ERRORS,
        telemetry=NO_TELEMETRY,
    )
    install_error_handlers(app)
    limits = runtime.settings.limits
    # inside the body limit, in front of FastAPI: the heartbeat's short way (controller/fastpath.py)
    app.add_middleware(HeartbeatFastPath, runtime=runtime)
    # outside it, credentials from the headers, before any body is read (`gate.py`)
    guard(app, _gate, limit=limits.body_bytes, inference_limit=limits.inference_body_bytes)
    # outermost: a controller that does not lead answers every call with where the leader is
    app.add_middleware(standby.StandbyGate, runtime=runtime)
    app.state.runtime = runtime
    admin = [Depends(_as_admin)]
    client = [Depends(_as_client)]

    @app.post("/v1/agents/register")
    async def register(body: NodeRegisteredW, caller: AsNode) -> ReportReplyW:
        return await runtime.register(body, caller)

    @app.post("/v1/agents/heartbeat")
    async def heartbeat(body: HeartbeatW, caller: AsNode) -> ReportReplyW:
        return await runtime.heartbeat(body, caller)

    @app.post("/v1/admin/nodes/{node}/credential", dependencies=admin, responses=CONFLICT)
    async def issue_credential(node: PathName, body: CredentialRequestW) -> CredentialW:
        return await runtime.issue_credential(node, body)

    @app.delete(
        "/v1/admin/nodes/{node}/credential", dependencies=admin, responses=NOT_FOUND | CONFLICT
    )
    async def revoke_credential(node: PathName) -> dict[str, Any]:
        return await runtime.revoke_credential(node)

    @app.put("/v1/admin/profiles/{name}", dependencies=admin)
    async def put_profile(name: PathName, body: ProfileW) -> dict[str, Any]:
        return await runtime.put_profile(name, body)

    @app.put("/v1/admin/deployments/{model}", dependencies=admin)
    async def put_deployment(model: PathName, body: DeploymentW) -> dict[str, Any]:
        return await runtime.put_deployment(model, body)

    @app.delete("/v1/admin/nodes/{node}/failed-gpus/{gpu}", dependencies=admin, responses=NOT_FOUND)
    async def clear_failed_gpu(
        node: PathName, gpu: Annotated[int, Path(ge=0, le=4096)]
    ) -> dict[str, Any]:
        return await runtime.clear_failed_gpu(node, gpu)

    @app.delete("/v1/admin/nodes/{node}/quarantine", dependencies=admin, responses=NOT_FOUND)
    async def clear_quarantine(
        node: PathName,
        profile: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)] = None,
    ) -> dict[str, Any]:
        return await runtime.clear_quarantine(node, profile)

    add_operator_routes(app, runtime, admin)

    @app.get("/v1/admin/state", dependencies=admin)
    async def state() -> dict[str, Any]:
        _shed_when_behind(runtime)
        # with the profiles and timings, for `llmgw-twin snapshot` (docs/live-twin.md)
        return runtime.state() | spec_state(runtime.core)

    @app.get("/v1/admin/events", dependencies=admin)
    async def events(
        after: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=EVENTS_PAGE)] = EVENTS_PAGE,
    ) -> dict[str, Any]:
        return runtime.events(after, limit)

    @app.post("/v1/router/load", dependencies=[Depends(_as_router)])
    async def router_load(body: LoadPushW) -> dict[str, Any]:
        """A router's load for the autoscaler (docs/autoscale.md); kept while fresh."""
        runtime.router_loads.put(body.router, body.outstanding, body.held)
        return {"accepted": True, "routers": runtime.router_loads.routers()}

    # never shed, as heartbeats are not: a router's table is how requests find replicas
    @app.get(
        "/v1/router/feed",
        dependencies=[Depends(_as_router)],
        response_model=None,
        responses={200: {"model": FeedPageW, "description": "A page of the routing feed."}},
    )
    async def router_feed(
        after: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
        epoch: Epoch = None,
        wait_ms: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
    ) -> JSONResponse:
        return JSONResponse(await runtime.router_feed(after, epoch, wait_ms))

    # the page is static and open (no fleet data in it); its script reads the admin routes above
    @app.get("/status", include_in_schema=False)
    async def status() -> Response:
        return status_response(runtime.keys is not None)

    add_metrics_route(app, runtime.metrics, admin)  # an admin token (docs/metrics.md)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        # open to anyone: says the process is up, and nothing about the fleet once it asks
        # for credentials
        if runtime.keys is not None:
            return {"status": "ok"}
        return {"status": "ok", "t_ms": runtime.now_ms(), "nodes": len(runtime.core.nodes())}

    @app.get("/v1/models", dependencies=client)
    async def models() -> dict[str, Any]:
        return runtime.models()

    @app.post(
        "/v1/chat/completions", dependencies=client, responses=PROXIED, openapi_extra=OPENAI_REQUEST
    )
    async def chat(request: Request) -> Response:
        return await runtime.proxy(request, "/v1/chat/completions")

    @app.post(
        "/v1/completions", dependencies=client, responses=PROXIED, openapi_extra=OPENAI_REQUEST
    )
    async def completions(request: Request) -> Response:
        return await runtime.proxy(request, "/v1/completions")

    return app
