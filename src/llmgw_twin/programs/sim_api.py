"""The sim engine's OpenAI-compatible HTTP API, as a FastAPI app the leader serves.

    GET  /health                 {"status": "ok"}
    GET  /metrics                the queue and KV-cache use, Prometheus text (`sim_metrics`)
    GET  /v1/models              the one served model
    POST /v1/chat/completions    chat; `stream: true` answers server-sent events
    POST /v1/completions         text completion, one choice per prompt; streaming too

Invariants:
- The generated text is `sim_text.generate(served model name, prompt, max_tokens)`: a pure
  function of the model name and the prompt. Sampling parameters are accepted and ignored.
- `max_tokens` (or chat's `max_completion_tokens`) caps the tokens; absent, the engine's default
  cap applies. Usage counts what was generated and what was prompted.
- A stream is OpenAI's chunk format: one `data: {json}` event per token, a last chunk with the
  finish reason, a usage chunk when `stream_options.include_usage` asks for it, then
  `data: [DONE]`. Concatenating the deltas gives exactly the non-streamed text.
- Each token costs `token_latency_ms` of wall time, streamed or not; unless the engine has a
  batch (`--perf-model`, `sim_batcher.py`): then every prompt is a request of the twin's engine
  model, answered when the model says (a streamed answer's first token when its prefill ends, the
  rest when it is done), and one too large for the KV cache is refused with 400. Either way at
  the replica's pace when the request is accepted (`SimModel.pace`, a straggler: `sim_pace`).
- Errors use OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 404 for a model
  this engine does not serve, 400 for a malformed request.
- The app holds no mutable state but its batch (none without `--perf-model`): serving it twice,
  or in-process through `httpx.ASGITransport`, behaves the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from llmgw_twin.programs.sim_batcher import Batcher, Ticket, TooLarge
from llmgw_twin.programs.sim_metrics import add_metrics
from llmgw_twin.programs.sim_pacing import Pacing, paced, released
from llmgw_twin.programs.sim_text import Generation, count_prompt_tokens, generate, render_chat

DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True, slots=True)
class SimModel:
    """What the leader serves, and how fast."""

    served_name: str
    model_path: str
    token_latency_ms: int = 0
    max_tokens_default: int = DEFAULT_MAX_TOKENS
    clock: Callable[[], float] = time.time
    """Wall clock for the `created` fields only; never for the text."""
    batcher: Batcher | None = None
    """The engine model's batch (`--perf-model`); None: `token_latency_ms` a token."""
    pace: Callable[[], Fraction] | None = None
    """The replica's pace now: a token takes this many times `token_latency_ms` (the batch
    reads it itself); None: always 1."""


class _Lenient(BaseModel):
    # Unknown OpenAI fields (temperature, seed, tools, ...) are accepted and ignored.
    model_config = ConfigDict(extra="allow")


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text or "" for p in self.content if p.type == "text")


class StreamOptions(_Lenient):
    include_usage: bool = False


class _GenerationRequest(_Lenient):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    stream: bool = False
    ignore_eos: bool = False
    """Generate exactly the cap (vLLM's, SGLang's and llama-server's extension)."""
    stream_options: StreamOptions | None = None


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[str]


def _error(status: int, message: str, kind: str, param: str | None, code: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def create_app(sim: SimModel) -> FastAPI:
    app = FastAPI(title=f"llmgw-twin sim engine: {sim.served_name}", docs_url=None, redoc_url=None)
    latency_s = sim.token_latency_ms / 1000

    pacing = Pacing(sim.batcher, latency_s, sim.pace)
    release, work, latency = pacing.release, pacing.work, pacing.latency

    def tickets(jobs: Sequence[tuple[int, int]]) -> list[Ticket | None] | JSONResponse:
        try:
            return pacing.tickets(jobs)
        except TooLarge as e:
            return _error(
                400, str(e), "invalid_request_error", "messages", "context_length_exceeded"
            )

    def unknown_model(req: _GenerationRequest) -> JSONResponse | None:
        if req.model is None or req.model in (sim.served_name, sim.model_path):
            return None
        return _error(
            404,
            f"The model `{req.model}` does not exist; this engine serves `{sim.served_name}`.",
            "invalid_request_error",
            "model",
            "model_not_found",
        )

    def cap(req: _GenerationRequest, *alternatives: int | None) -> int:
        for value in (*alternatives, req.max_tokens):
            if value is not None:
                return value
        return sim.max_tokens_default

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return _error(400, problems, "invalid_request_error", None, "invalid_request")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    add_metrics(app, sim.served_name, sim.batcher)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": sim.served_name,
            "object": "model",
            "created": 0,
            "owned_by": "llmgw-twin",
            "root": sim.model_path,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        if (refusal := unknown_model(req)) is not None:
            return refusal
        prompt = render_chat([(m.role, m.text()) for m in req.messages])
        gen = generate(sim.served_name, prompt, cap(req, req.max_completion_tokens), req.ignore_eos)
        prompt_tokens = count_prompt_tokens(prompt)
        token_s = latency()  # the pace it is accepted at
        held = tickets([(prompt_tokens, len(gen.tokens))])
        if isinstance(held, JSONResponse):
            return held
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(sim.clock()),
            "model": sim.served_name,
        }
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            chunks = _chat_chunks(head, gen, prompt_tokens, include_usage, token_s, held[0])
            return StreamingResponse(
                released(chunks, held, release), media_type="text/event-stream"
            )
        await work(held, len(gen.tokens), token_s)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": gen.text},
            "logprobs": None,
            "finish_reason": gen.finish_reason,
        }
        usage = _usage(prompt_tokens, len(gen.tokens))
        return JSONResponse(
            {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> JSONResponse | StreamingResponse:
        if (refusal := unknown_model(req)) is not None:
            return refusal
        prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
        if not prompts:
            return _error(400, "prompt is empty", "invalid_request_error", "prompt", "invalid")
        gens = [generate(sim.served_name, p, cap(req), req.ignore_eos) for p in prompts]
        prompt_tokens = sum(count_prompt_tokens(p) for p in prompts)
        token_s = latency()
        held = tickets(
            [(count_prompt_tokens(p), len(g.tokens)) for p, g in zip(prompts, gens, strict=True)]
        )
        if isinstance(held, JSONResponse):
            return held
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "created": int(sim.clock()),
            "model": sim.served_name,
        }
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            chunks = _completion_chunks(head, gens, prompt_tokens, include_usage, token_s, held)
            return StreamingResponse(
                released(chunks, held, release), media_type="text/event-stream"
            )
        await work(held, sum(len(g.tokens) for g in gens), token_s)
        choices = [
            {"index": i, "text": g.text, "logprobs": None, "finish_reason": g.finish_reason}
            for i, g in enumerate(gens)
        ]
        usage = _usage(prompt_tokens, sum(len(g.tokens) for g in gens))
        return JSONResponse(
            {**head, "object": "text_completion", "choices": choices, "usage": usage}
        )

    return app


async def _chat_chunks(
    head: dict[str, Any],
    gen: Generation,
    prompt_tokens: int,
    include_usage: bool,
    latency_s: float,
    ticket: Ticket | None = None,
) -> AsyncIterator[bytes]:
    def chunk(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    yield _sse(chunk({"role": "assistant", "content": ""}, None))
    for i, token in enumerate(gen.tokens):
        await paced(ticket, i, latency_s)
        yield _sse(chunk({"content": token}, None))
    yield _sse(chunk({}, gen.finish_reason))
    if include_usage:
        usage = _usage(prompt_tokens, len(gen.tokens))
        yield _sse({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
    yield SSE_DONE


async def _completion_chunks(
    head: dict[str, Any],
    gens: Sequence[Generation],
    prompt_tokens: int,
    include_usage: bool,
    latency_s: float,
    held: Sequence[Ticket | None] = (),
) -> AsyncIterator[bytes]:
    kind = "text_completion"
    for index, gen in enumerate(gens):
        ticket = held[index] if index < len(held) else None
        for i, token in enumerate(gen.tokens):
            await paced(ticket, i, latency_s)
            choice = {"index": index, "text": token, "logprobs": None, "finish_reason": None}
            yield _sse({**head, "object": kind, "choices": [choice]})
        last = {"index": index, "text": "", "logprobs": None, "finish_reason": gen.finish_reason}
        yield _sse({**head, "object": kind, "choices": [last]})
    if include_usage:
        usage = _usage(prompt_tokens, sum(len(g.tokens) for g in gens))
        yield _sse({**head, "object": kind, "choices": [], "usage": usage})
    yield SSE_DONE


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers (the engine's loop owns SIGTERM and SIGINT), told
    to stop by `stop()`, which it heeds at once rather than at its next 100 ms tick."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stop = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop(self) -> None:
        self.should_exit = True
        self._stop.set()

    async def main_loop(self) -> None:
        # uvicorn's own loop, its tick (the Date header, request limits) kept, but woken by
        # `stop()` instead of sleeping the tick out
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.1)
            should_exit = await self.on_tick(counter)


def http_server(sim: SimModel, log_level: str, graceful_shutdown_s: int) -> _Server:
    """A uvicorn server for `sim`; serve it on sockets the caller has bound."""
    config = uvicorn.Config(
        create_app(sim),
        log_config=None,  # log through the engine's root logger and format
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=graceful_shutdown_s,
    )
    return _Server(config)
