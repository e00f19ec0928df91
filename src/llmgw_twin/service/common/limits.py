"""Bounds on what a caller can make the services hold: request bodies, and requests in flight.

Role: every size bound of the services, in one place. `BodyLimit` is the ASGI middleware of
the controller's, the router's and the agent's apps: a request whose body is over its limit is
answered 413 before any handler sees it. The requests in flight per replica are counted by the
routing core (`Router`'s `outstanding_limit`, default `MAX_OUTSTANDING_PER_REPLICA`),
which skips a replica at its limit. The `MAX_*` bounds are the wire models' (`wire.py`).
Defaults are module constants; `BodyLimit` takes others as arguments.

Invariants:
- A body is refused once it is known to be over the limit: at once when its declared
  `Content-Length` says so, otherwise as soon as the bytes read pass the limit (a chunked body
  is never read to its end). `BodyLimit` holds none of it: it counts the bytes as the app
  reads them (streamed, `_Counted`), and a route that reads no body reads none; the app holds
  at most the limit, plus the one chunk that passed it. Credentials are checked before any of
  it is read (`gate.py`, the layer outside this one). The refusal is a JSON
  `{"detail": ...}` with status 413 and `Connection: close` (the rest of the body is not
  read, so the connection cannot carry another request).
- Inference routes (`INFERENCE_PATHS`) have a limit of their own: prompts are large, control
  messages are not.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmgw_twin import units
from llmgw_twin.service.common.replies import error_content

log = logging.getLogger("llmgw_twin.limits")

MiB = 1024 * 1024
CONTROL_BODY_LIMIT = 8 * MiB
"""Admin and agent messages, both ways. Not 1 MiB: the largest heartbeat the wire bounds allow
(64 shards, every field at its bound, ASCII text) is about 6.6 MB, and a node whose heartbeats
were refused would be declared lost; a typical one (8 shards) is a few KB."""
INFERENCE_BODY_LIMIT = 16 * MiB
"""An OpenAI request to the router (long prompts, base64 images)."""
INFERENCE_PATHS: frozenset[str] = frozenset({"/v1/chat/completions", "/v1/completions"})
MAX_OUTSTANDING_PER_REPLICA = 64
"""Requests a router has in flight to one replica; one more goes to another ready replica,
or is answered 503 when every one is at its limit."""


# --- the wire models' bounds (`wire.py`) --------------------------------------------------

MAX_INT = 2**63 - 1
"""The largest integer a message may carry: what SQLite stores (a larger one fails its commit)."""
MAX_GPUS_PER_NODE = units.MAX_GPUS_PER_NODE
"""A node's GPUs, and so the GPU indices any message may name (below this)."""
MAX_SHARDS_PER_MESSAGE = MAX_GPUS_PER_NODE
"""Shards in one heartbeat, registration or assignment: each shard holds a GPU of its own."""
MAX_REPLICA_NODES = units.MAX_REPLICA_NODES
"""Nodes one replica spans: a profile's `nodes`, a shard's `shard_count`, `nodes`, ports."""
MAX_ENGINES = 16
"""Engines a node may list (they must be known ones: see `ENGINES`)."""
MAX_ARGS = 256
"""Extra flags in a profile (and so in each of its shards' specs)."""
MAX_ARGS_CHARS = 16 * 1024
"""The text of a profile's extra flags, all together; with its model path (`Text`, 4 KiB) a
whole profile is at most about 21 KiB of text."""
MAX_ARGV = MAX_ARGS + 256
MAX_ARGV_CHARS = MAX_ARGS_CHARS + 48 * 1024
"""An engine's argv as its agent reports it: the profile's flags and the adapter's own words
(binary, model path, addresses, ports; a llama.cpp leader's `--rpc` names every worker)."""
MAX_REPLICAS = 10_000
"""Replicas one deployment may ask for."""


class BodyLimit:
    """Refuse request bodies over `limit` bytes (`inference_limit` on `inference_paths`)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit: int = CONTROL_BODY_LIMIT,
        inference_limit: int = INFERENCE_BODY_LIMIT,
        inference_paths: Collection[str] = INFERENCE_PATHS,
    ) -> None:
        if limit < 0 or inference_limit < 0:
            raise ValueError("a body limit is a number of bytes, at least 0")
        self.app = app
        self.limit = limit
        self.inference_limit = inference_limit
        self.inference_paths = frozenset(inference_paths)

    def limit_for(self, path: str) -> int:
        return self.inference_limit if path in self.inference_paths else self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        declared = content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(scope, receive, send, limit, f"declared {declared} bytes")
            return
        counted = _Counted(receive, limit, scope["path"])
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        # answered below, unless the response had started (the connection then ends)
        with contextlib.suppress(BodyTooLarge):
            await self.app(scope, counted.receive, watched)
        if counted.over and not started:  # the app gave up on the body without answering
            await _refuse(scope, receive, send, limit, f"over {limit} bytes sent")
        elif counted.over:  # answered by the app's own handler of `BodyTooLarge` (413)
            _log_refusal(scope, f"over {limit} bytes sent")


class BodyTooLarge(HTTPException):
    """Raised by a counted `receive` once the bytes read pass the limit: a 413 wherever it is
    raised (FastAPI's handler of HTTP errors answers it, `BodyLimit` when it gets past it)."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(
            413,
            f"request body too large: {path} takes at most {limit} bytes (over {limit} bytes sent)",
            headers={"connection": "close"},
        )


class _Counted:
    """A `receive` that counts the body's bytes as the app reads them, and raises
    `BodyTooLarge` once they pass `limit`: the body is streamed to whoever reads it, never
    held here."""

    def __init__(self, receive: Receive, limit: int, path: str) -> None:
        self._receive = receive
        self.limit = limit
        self.path = path
        self.size = 0
        self.over = False

    async def receive(self) -> Message:
        if self.over:
            raise BodyTooLarge(self.path, self.limit)
        message = await self._receive()
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self.limit:
                self.over = True
                raise BodyTooLarge(self.path, self.limit)
        return message


def _log_refusal(scope: Scope, why: str) -> None:
    client = scope.get("client")
    log.warning(
        "refused %s %s from %s: body too large (%s)",
        scope.get("method", "?"),
        scope["path"],
        client[0] if client else "?",
        why,
    )


def replaying(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` (read already) as one message, then what `receive` gives."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def content_length(scope: Scope) -> int | None:
    """The declared length (the largest, if several), or None when none can be read: the server
    refuses a malformed one before the app is called."""
    lengths = []
    for name, value in scope.get("headers", ()):
        if len(name) == 14 and name.lower() == b"content-length":  # (only such names lowered)
            try:
                lengths.append(int(value))
            except ValueError:
                return None
    return max(lengths) if lengths else None


async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int, why: str) -> None:
    path = scope["path"]
    client = scope.get("client")
    log.warning(
        "refused %s %s from %s: body too large (%s)",
        scope.get("method", "?"),
        path,
        client[0] if client else "?",
        why,
    )
    message = f"request body too large: {path} takes at most {limit} bytes ({why})"
    reply = JSONResponse(
        error_content(path, 413, message),
        status_code=413,
        headers={"connection": "close"},
    )
    await reply(scope, receive, send)
