"""The services' error replies: every error a JSON `{"detail": message}` (plain text where the
route answers in text), bad input 422, a refusal its own status, never a 500 page.

Role: `install_error_handlers(app)` is every service app's (the controller's, the agent's, the
router's); it also puts `openapi.install` on the app. `Refused` is what the shells raise for a
request they or the core turned down; `describe_errors` says which fields failed. Re-exported by
`wire.py`, where they were first.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmgw_twin.service.common import openapi
from llmgw_twin.service.common.replies import error_content

log = logging.getLogger("llmgw_twin.service.common.wire")


def describe_errors(errors: Sequence[Any]) -> str:
    """One clause per failed field: `body.info.gpus: Input should be a valid integer`."""
    parts = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "json_invalid" and len(loc) == 2:
            reason = (err.get("ctx") or {}).get("error", "invalid")
            parts.append(f"{loc[0]}: not valid JSON at character {loc[1]} ({reason})")
            continue
        where = ".".join(str(x) for x in loc) or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


class Refused(Exception):
    """A request the shell or the core turned down (an unknown profile, a node mismatch): the
    reply is `status` with this message."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def error_reply(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    """Every error a JSON `{"detail": message}`; bad input 422, never a 500. On the routes
    OpenAI clients call, the body also carries OpenAI's `error` object (`replies.error_content`),
    so those clients show the message."""

    def reply(
        request: Request,
        status: int,
        message: str,
        headers: Mapping[str, str] | None = None,
        code: str | None = None,
    ) -> Response:
        if request.url.path in openapi.TEXT_PATHS:  # as their answers are: plain text
            return PlainTextResponse(message, status_code=status, headers=headers)
        content = error_content(request.url.path, status, message, code)
        return JSONResponse(content, status_code=status, headers=headers)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        message = "invalid request: " + describe_errors(exc.errors())
        content_type = request.headers.get("content-type", "")
        if request.method in ("POST", "PUT") and "json" not in content_type:
            message += " (send the body as JSON, with content-type: application/json)"
        return reply(request, 422, message)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = getattr(exc, "code", None)
        headers = exc.headers
        if exc.status_code == 405:  # every method of the path, not the first route's only
            headers = {**(headers or {}), "Allow": openapi.allowed(request)}
        return reply(request, exc.status_code, str(exc.detail), headers, code)

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        return reply(request, exc.status, str(exc))

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return reply(request, 500, f"internal error: {type(exc).__name__}: {exc}")

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Refused, refused)
    app.add_exception_handler(Exception, unexpected)
    openapi.install(app)  # integer bounds published as integers
