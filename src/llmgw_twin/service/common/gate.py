"""Credentials checked from a request's headers, before any byte of its body is read.

Role: `AuthGate` is the outermost ASGI layer of the controller's, the router's and the agent's
apps (`guard` puts it, and the body limit inside it, on an app). A request to a guarded path
(`guarded`, by default the API under `/v1/` and `/metrics`) is checked with the service's own
check (`check`: the same one the routes' dependencies make, from the headers alone); a caller it
refuses (no credential, or one that matches nothing: 401) is answered by the app's own handler
of HTTP errors, exactly as the route would have answered, and its body is never read: the reply
says `Connection: close` when a body was announced, so the server drops the rest. An anonymous
client therefore makes the services hold no body at all, whatever it sends.

Which kind of credential a route wants (an admin's, a node's: 403) stays the route's dependency's
to say: the gate only keeps out who is nobody.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from llmgw_twin.service.common.limits import BodyLimit

Check = Callable[[Request], object]
"""Raises an `HTTPException` (401) for a caller to keep out; returns for anyone else (or
returns an awaitable that does: a route's own async dependency)."""


def under_api(path: str) -> bool:
    """The paths that ask for credentials whenever the service asks any: its API and metrics
    (not `/health`, `/status`, the OpenAPI schema and its pages)."""
    return path.startswith("/v1/") or path == "/metrics"


class AuthGate:
    def __init__(
        self, app: ASGIApp, *, check: Check, guarded: Callable[[str], bool] = under_api
    ) -> None:
        self.app = app
        self.check = check
        self.guarded = guarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        request = Request(scope)  # no `receive`: nothing of the body can be read here
        try:
            checked = self.check(request)
            if inspect.isawaitable(checked):
                await checked
        except HTTPException as e:
            reply = await _rendered(scope, request, e)
            if _announces_body(scope):
                reply.headers["connection"] = "close"
            await reply(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _rendered(scope: Scope, request: Request, e: HTTPException) -> Response:
    """The refusal as the app's own handler of HTTP errors renders it."""
    app = scope.get("app")
    handlers = getattr(app, "exception_handlers", {})
    handler = handlers.get(HTTPException)
    if handler is not None:
        reply = await handler(request, e)
        if isinstance(reply, Response):
            return reply
    return JSONResponse({"detail": e.detail}, status_code=e.status_code, headers=e.headers)


def _announces_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def guard(
    app: FastAPI,
    check: Check,
    *,
    guarded: Callable[[str], bool] = under_api,
    limit: int | None = None,
    inference_limit: int | None = None,
) -> None:
    """Put the body limit (`limits.BodyLimit`, with these limits where given) on `app`, and the
    gate outside it: credentials first, then the body, streamed and counted."""
    limits: dict[str, int] = {}
    if limit is not None:
        limits["limit"] = limit
    if inference_limit is not None:
        limits["inference_limit"] = inference_limit
    app.add_middleware(BodyLimit, **limits)  # type: ignore[arg-type]
    app.add_middleware(AuthGate, check=check, guarded=guarded)
