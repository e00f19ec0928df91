"""The services' HTTP surface true to what they accept and answer, where FastAPI and Starlette
leave it short.

Role: `install(app)` (called by `wire.install_error_handlers`, so every service's app has it):
- the OpenAPI schema's integer bounds are integers, as the server checks them: FastAPI's
  OpenAPI models hold every bound as a float, so `le=2**63 - 1` was published as
  9.223372036854776e18 (which is 2**63, a value the server refuses) and `le=64` as 64.0;
- `allowed(request)`: every method a path takes, for the `Allow` header of a 405 (Starlette
  names only the methods of the first route whose path matched);
- every operation that takes a body may answer 413 (`too_large`): the limits refuse an
  oversized body before any route sees it;
- `TEXT_PATHS`: the paths whose errors are plain text, as their answers are (`GET /metrics`
  speaks Prometheus's text format: a scraper shows a 401's text as it is), declared so in their
  OpenAPI entries (`TEXT_ERRORS`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from llmgw_twin.service.common.limits import MAX_INT

BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
EXACT = (MAX_INT, -MAX_INT, MAX_INT - 1)
"""The bounds beyond a float's exact integers (2**53) that the models use."""
TEXT_PATHS = frozenset({"/metrics"})
TEXT_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {
        "description": f"{what} (plain text, as the metrics are).",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    for status, what in (
        (400, "The body could not be parsed"),
        (401, "No credentials, or ones that match nothing (`WWW-Authenticate: Bearer`)"),
        (403, "Credentials of another kind"),
        (413, "The body is over the size limit"),
        (422, "The request does not validate"),
        (500, "An unexpected error, logged with its traceback"),
    )
}
"""The error replies of a `TEXT_PATHS` route, for its `responses=`."""


def install(app: FastAPI) -> None:
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = too_large(exact(build()))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def exact(schema: Any) -> Any:
    """`schema` with each integer schema's bounds as integers (in place; returned)."""
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if node.get("type") == "integer":
                for key in BOUNDS:
                    value = node.get(key)
                    if isinstance(value, float) and value.is_integer():
                        node[key] = _integer(value)
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return schema


TOO_LARGE = {
    "description": "The body is over the size limit (refused before it is read or checked)",
    "content": {"application/json": {"schema": {"type": "object"}}},
}


def too_large(schema: Any) -> Any:
    """`schema` with a 413 answer on every operation that takes a body (in place; returned):
    the listener refuses an oversized body before any route sees it (`limits.py`), so every
    such operation may answer it."""
    for item in (schema.get("paths") or {}).values():
        for op in item.values():
            if isinstance(op, dict) and "requestBody" in op:
                op.setdefault("responses", {}).setdefault("413", TOO_LARGE)
    return schema


def _integer(value: float) -> int:
    for bound in EXACT:
        if float(bound) == value:
            return bound
    return int(value)


def allowed(request: Request) -> str:
    """Every method the request's path takes, as an `Allow` header lists them."""
    path = request.scope["path"]
    methods: set[str] = set()
    for route in request.app.routes:
        regex = getattr(route, "path_regex", None)
        if regex is not None and regex.match(path) and getattr(route, "methods", None):
            methods |= set(route.methods)
    return ", ".join(sorted(methods))
