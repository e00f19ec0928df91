"""What the services' OpenAPI schemas declare beyond each route's own models: the error
replies, and the inference routes' request body.

Role: the routes of the controller and of the agent name these in `responses=`: `ERRORS` for
every route (the app's default), `NOT_FOUND`, `CONFLICT` and `PROXIED` where a route gives
them; the inference routes take `OPENAI_REQUEST` as `openapi_extra` (they read the raw body,
to pass it on unchanged). Every error reply is a JSON `ErrorW` (`wire.install_error_handlers`);
the errors of the forwarding itself (`forwarding.py`: a body it cannot read, an unknown model,
no replica to pick, a replica that failed) are also in the shape OpenAI clients read
(`OpenAIErrorW`). A schema fuzz (tests/test_api_schema.py) holds the services to all of it.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel


class ErrorW(BaseModel):
    """Every error reply of both services: what went wrong, in words."""

    detail: str


class OpenAIErrorBodyW(BaseModel):
    message: str
    type: str
    code: str | None
    param: str | None = None


class OpenAIErrorW(ErrorW):
    """An error of the router in the shape OpenAI clients read (`error.message`), with the
    `detail` every error reply here carries."""

    error: OpenAIErrorBodyW


def openai_error(
    status: int, message: str, kind: str, code: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = OpenAIErrorW(
        detail=message, error=OpenAIErrorBodyW(message=message, type=kind, code=code)
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


OPENAI_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models"})
"""The routes OpenAI clients call: every error reply there is an `OpenAIErrorW`, whoever makes
it (the forwarding, an auth check, a body limit, an unexpected error)."""
OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
"""OpenAI's error `type` per status; any other 4xx is an invalid request, a 5xx a server error."""
OPENAI_CODES = {413: "request_too_large", 429: "rate_limit_exceeded"}
"""A status's `code`, where the status alone says it (the auth checks give their own)."""


def error_content(path: str, status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """An error reply's body: `{"detail"}` everywhere, plus OpenAI's `error` object on the
    routes OpenAI clients call (`OPENAI_PATHS`)."""
    if path not in OPENAI_PATHS:
        return {"detail": message}
    kind = OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = OpenAIErrorW(
        detail=message,
        error=OpenAIErrorBodyW(message=message, type=kind, code=code or OPENAI_CODES.get(status)),
    )
    return body.model_dump(mode="json")


def _error(description: str, model: object = ErrorW) -> dict[str, Any]:
    return {"model": model, "description": description}


Responses = dict[int | str, dict[str, Any]]

ERRORS: Responses = {
    400: _error("The body could not be parsed (JSON nested too deep)."),
    401: _error("No credentials, or ones that match nothing (`WWW-Authenticate: Bearer`)."),
    403: _error("Credentials of another kind, or of another node."),
    413: _error("The body is over the size limit (`limits.py`)."),
    422: _error("The request does not validate, or was refused; `detail` says why."),
    500: _error("An unexpected error, logged with its traceback."),
}
"""What any route may answer besides its own replies."""
NOT_FOUND: Responses = {404: _error("Nothing of that name to act on.")}
CONFLICT: Responses = {409: _error("Not for this service: another node, or no credentials.")}
PROXIED: Responses = {
    200: {
        "description": "The replica's answer (a stream relayed as it comes), header "
        "`x-llmgw-replica`.",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    400: _error("The body is not JSON, or names no model.", OpenAIErrorW),
    401: _error("No API key, or one that matches none listed (`code` says which).", OpenAIErrorW),
    403: _error("A credential that is not an API key.", OpenAIErrorW),
    413: _error("The body is over the size limit (`limits.py`).", OpenAIErrorW),
    404: _error("The model is not deployed.", OpenAIErrorW),
    502: _error("The replica failed, and so did the one tried after it, if any.", OpenAIErrorW),
    503: _error(
        "No replica of the model is ready, every ready one is ejected or at its limit of "
        "requests in flight, or the router has not heard from the controller yet; with "
        "`Retry-After`.",
        OpenAIErrorW,
    ),
    504: _error("The replica did not answer in time.", OpenAIErrorW),
    "default": {"description": "Any other status is the replica's own, passed through."},
}
"""The inference routes, of the controller and of the router service."""
OPENAI_REQUEST: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["model"],
                    "properties": {"model": {"type": "string", "minLength": 1}},
                    "additionalProperties": True,
                    "description": "An OpenAI request; `model` names a deployed model. The "
                    "router reads only `model` and passes the body on unchanged.",
                }
            }
        },
    }
}
"""The inference routes' body, as far as the router reads it."""
