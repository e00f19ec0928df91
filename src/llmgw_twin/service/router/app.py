"""The router service: OpenAI-compatible inference routes in front of the replicas, fed by the
controller's routing feed.

Role: `RouterRuntime` owns a core `Router` (least outstanding, passive ejection), the
`FeedFollower` that keeps its table from the controller's feed, and the `Forwarder` that
serves each request (docs/router.md); `create_router_app` puts it behind FastAPI. Any number of
routers may run: they share nothing, each follows the feed and judges the replicas by its own
requests.

Invariants:
- The router decides nothing about the fleet: which replicas exist and are routable is the
  controller's word (the feed); which of them takes a request, and which is ejected for a
  while, is the core's. A controller that is down or restarting leaves the table as it was.
- `/v1/models` lists the models the latest feed page named, each with its routable replicas;
  before any page the inference routes answer 503 with `Retry-After` (nothing is known yet).
- With `auth.api_keys` set, every route but `/health` asks for one; `/health` then says only
  that the process is up.
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
from fastapi import Depends, Request, Security
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from llmgw_twin.control.model import ModelName
from llmgw_twin.control.routing import Router
from llmgw_twin.service.common.auth import ApiKeys
from llmgw_twin.service.common.gate import guard
from llmgw_twin.service.common.limits import CONTROL_BODY_LIMIT
from llmgw_twin.service.common.metrics import add_metrics_route
from llmgw_twin.service.common.replies import ERRORS, OPENAI_REQUEST, PROXIED
from llmgw_twin.service.common.serving import NO_TELEMETRY, lifespan_of
from llmgw_twin.service.common.views import model_list
from llmgw_twin.service.common.wire import install_error_handlers
from llmgw_twin.service.router.config import RouterSettings
from llmgw_twin.service.router.fastpath import FastPath, RouterApp
from llmgw_twin.service.router.follower import FeedFollower
from llmgw_twin.service.router.forwarding import Forwarder, monotonic_ms
from llmgw_twin.service.router.holding import Holds
from llmgw_twin.service.router.metrics import RouterMetrics


class RouterRuntime:
    def __init__(
        self,
        settings: RouterSettings,
        *,
        controller_transport: httpx.AsyncBaseTransport | None = None,
        engine_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.router = Router(
            ejection=settings.ejection, outstanding_limit=settings.outstanding_per_replica
        )
        self.forwarder = Forwarder(
            self.router,
            timeouts=settings.timeouts,
            max_answer_bytes=settings.answer_bytes,
            transport=engine_transport,
            holds=Holds(
                lambda: self.follower.holding,
                hold_ms=settings.hold_at_zero_ms,
                on_first=lambda model: self.follower.push_now(),
            ),
        )
        self.follower = FeedFollower(
            self.router,
            settings.controller_url,
            token_file=settings.controller_token_file,
            tls=settings.controller_tls,
            wait_ms=settings.feed_wait_ms,
            reconnect_max_ms=settings.reconnect_max_ms,
            transport=controller_transport,
            others=settings.other_controllers,
            push_load_s=settings.load_push_ms / 1000,
        )
        self.follower.held = self.forwarder.holds.counts
        self.keys = ApiKeys(settings.api_key_hashes)
        self.metrics = RouterMetrics(self)

    async def start(self) -> None:
        self.forwarder.open()
        self.follower.start()

    async def stop(self) -> None:
        await self.follower.stop()
        await self.forwarder.aclose()

    def deployed(self) -> list[str] | None:
        return self.follower.models

    def models(self) -> dict[str, Any]:
        return model_list(self.follower.models or [], self.router)

    def state(self) -> dict[str, Any]:
        """What this router knows and has seen: the feed, each model's routable replicas (in
        flight, ejected for how much longer), and its forwarding counts."""
        now = monotonic_ms()
        ejected = self.router.ejected(now)
        models = []
        for model in sorted(set(self.follower.models or []) | set(self.router.models())):
            replicas = [
                {
                    "replica": r.replica,
                    "outstanding": self.router.outstanding(r.replica),
                    "ejected_for_ms": ejected[r.replica] - now if r.replica in ejected else None,
                }
                for r in self.router.routes(ModelName(model))
            ]
            models.append({"model": model, "replicas": replicas})
        f = self.forwarder
        return {
            "feed": self.follower.view(),
            "models": models,
            "holds": f.holds.view(),
            "ejections": self.router.ejections,
            "retried": f.retried,
            "failed_attempts": f.failed,
            "cut_streams": f.cut,
            # requests per second by model, over the last five minutes (`llmgw-twin snapshot`)
            "request_rates": f.metrics.recent.per_second(),
        }


_scheme = HTTPBearer(auto_error=False, description="an API key")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(_scheme)]


async def _as_client(request: Request, _token: Bearer) -> None:
    runtime: RouterRuntime = request.app.state.runtime
    runtime.keys.require(request)


def create_router_app(runtime: RouterRuntime) -> RouterApp:
    app = RouterApp(
        title="llmgw-twin router",
        lifespan=lifespan_of(runtime),
        responses=ERRORS,
        telemetry=NO_TELEMETRY,
    )
    install_error_handlers(app)
    # credentials from the headers first, then the body, counted as it streams (`gate.py`)
    guard(
        app,
        runtime.keys.require,
        limit=CONTROL_BODY_LIMIT,
        inference_limit=runtime.settings.inference_body_bytes,
    )
    app.state.runtime = runtime
    # the inference routes below, served ahead of the framework when its checks admit the
    # request (`fastpath.py`); the routes stay for the rest, and for the API's schema
    app.fast = FastPath(
        runtime.forwarder,
        runtime.deployed,
        runtime.keys.require if runtime.keys.hashes else None,  # none listed: anyone
        runtime.settings.inference_body_bytes,
    )
    client = [Depends(_as_client)]

    @app.get("/health")
    async def health() -> dict[str, Any]:
        if runtime.keys.hashes:
            return {"status": "ok"}
        return {"status": "ok", "controller_connected": runtime.follower.connected}

    @app.get("/v1/models", dependencies=client)
    async def models() -> dict[str, Any]:
        return runtime.models()

    add_metrics_route(app, runtime.metrics, client)  # an API key, when any is listed

    @app.get("/v1/router/state", dependencies=client)
    async def state() -> dict[str, Any]:
        return runtime.state()

    @app.post(
        "/v1/chat/completions", dependencies=client, responses=PROXIED, openapi_extra=OPENAI_REQUEST
    )
    async def chat(request: Request) -> Response:
        return await runtime.forwarder.forward(request, "/v1/chat/completions", runtime.deployed)

    @app.post(
        "/v1/completions", dependencies=client, responses=PROXIED, openapi_extra=OPENAI_REQUEST
    )
    async def completions(request: Request) -> Response:
        return await runtime.forwarder.forward(request, "/v1/completions", runtime.deployed)

    return app
