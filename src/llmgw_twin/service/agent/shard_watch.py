"""What the agent keeps watching of one shard: its sidecar until it answers, its engine until it
ends.

Role: the shard runner (`shards.py`) starts and stops a shard's processes; a `ShardWatch` is what
runs, as the shard's task, in between, and turns what it observes into the agent core's events.
`await_sidecar` polls the sidecar's `GET /health` until it answers (`SidecarUp`). `watch_engine`
follows a started (or adopted) engine: until it is ready, by the readiness rule in `app.py`
(through its sidecar, or for a rank probed by its process after `worker_settle`), then
`EngineServing` for a leader or `EngineJoined` for a worker; after that, every rank is probed
every `probe_interval` (`EngineUnresponsive` after `PROBE_FAILURES` misses, `EngineServing` or
`EngineJoined` again on an answer): a leader through its sidecar, a worker by its process's state
(a stopped process answers nothing); `EngineExited` with the process's code when it ends.

Invariants:
- Every wait is bounded: the sidecar's start (`sidecar_timeout`), an engine's readiness
  (`ready_timeout`); each probe by the client's timeout. A shard that cannot go on is handed to
  the runner's `fail` (its processes stopped, `EngineExited` with one of `launcher`'s codes).
- Events are fed from the shard's task, never from inside the core call that started it.
- The watch ends with the shard's first `EngineExited` (or its failure), and is cancelled when
  the runner stops the shard; the engine's exit wakes it at once (`ExitWatch`).
- A watch changes only its shard's `ready` and `endpoint`, and has the runner rewrite the
  run-state file (`save`) when it does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import httpx

from llmgw_twin.control.model import ShardSpec
from llmgw_twin.control.protocol import (
    AgentEvent,
    EngineExited,
    EngineJoined,
    EngineServing,
    EngineUnresponsive,
    SidecarUp,
)
from llmgw_twin.service.agent.config import AgentSettings
from llmgw_twin.service.agent.launcher import EXIT_NOT_READY, EXIT_SIDECAR_FAILED
from llmgw_twin.service.agent.processes import ExitWatch, peek_exit, stopped
from llmgw_twin.service.agent.runstate import ShardProcs

POLL_S = 0.05
"""Sidecar start polling."""
WATCH_S = 0.1
"""Readiness polling; an engine's exit wakes the watch at once (`ExitWatch`)."""
PROBE_FAILURES = 1
"""Consecutive failed probes (each bounded by the client's 2 s timeout) that make a leader
`unresponsive`; one answer makes it `serving` again. One, as the twin models it (a leader that
misses its probe is out of routing until it answers; the controller fails it only after
`unresponsive_grace`)."""
SIDECAR_HOST = "127.0.0.1"
"""Where sidecars listen (`launcher.sidecar_argv`): one of the addresses a port must be free on."""


class Note(Protocol):
    """The runner's history (`ShardRunner._note`): one step in a shard's life."""

    def __call__(
        self, what: str, spec: ShardSpec, pid: int | None = None, detail: str | None = None
    ) -> None: ...


class ShardWatch:
    """One shard's watch, for the runner's task of it (see the module)."""

    def __init__(
        self,
        procs: ShardProcs,
        settings: AgentSettings,
        client: httpx.AsyncClient | None,
        feed: Callable[[AgentEvent], object],
        note: Note,
        save: Callable[[], None],
        fail: Callable[[ShardProcs, str, int], Awaitable[None]],
    ) -> None:
        self.procs = procs
        self.settings = settings
        self._client = client
        self._feed = feed
        self._note = note
        self._save = save
        self._fail = fail
        """Stop what runs of the shard and report it exited (`ShardRunner._fail`)."""

    async def await_sidecar(self) -> None:
        procs = self.procs
        assert procs.sidecar is not None and self._client is not None
        url = f"http://{SIDECAR_HOST}:{procs.sidecar_port}/health"
        deadline = time.monotonic() + self.settings.sidecar_timeout_ms / 1000
        while True:
            code = peek_exit(procs.sidecar)
            if code is not None:
                await self._fail(procs, f"sidecar exited with code {code}", EXIT_SIDECAR_FAILED)
                return
            try:
                if (await self._client.get(url)).status_code == 200:
                    break
            except httpx.HTTPError:
                pass  # not listening yet
            if time.monotonic() >= deadline:
                timeout_ms = self.settings.sidecar_timeout_ms
                await self._fail(
                    procs, f"sidecar not up within {timeout_ms} ms", EXIT_SIDECAR_FAILED
                )
                return
            await asyncio.sleep(POLL_S)
        self._note("sidecar-up", procs.spec, procs.sidecar.pid)
        self._feed(SidecarUp(procs.spec.key))

    async def watch_engine(self) -> None:
        assert self.procs.engine is not None
        exits = ExitWatch(self.procs.engine)
        try:
            await self._watch_until_done(exits)
        finally:
            exits.close()

    async def _engine_up(self) -> bool:
        """Ask the sidecar whether the engine is ready (one bounded request)."""
        assert self._client is not None
        try:
            reply = await self._client.get(
                f"http://{SIDECAR_HOST}:{self.procs.sidecar_port}/engine"
            )
            return reply.status_code == 200 and reply.json().get("up") is True
        except (httpx.HTTPError, ValueError):
            return False

    async def _answers(self) -> bool:
        """A ready rank's probe: a leader through its sidecar, a worker (or a rank that opens
        no port) by its process's state: it answers its leader, not the agent, and a stopped
        one stalls its leader; a port a worker serves its leader on is left alone."""
        procs = self.procs
        assert procs.engine is not None and procs.probe is not None
        if procs.probe.by_process or procs.spec.rank > 0:
            return not stopped(procs.engine.pid)
        return await self._engine_up()

    async def _watch_until_done(self, exits: ExitWatch) -> None:
        procs = self.procs
        assert procs.engine is not None and procs.probe is not None and procs.sidecar is not None
        spec, settings = procs.spec, self.settings
        started = time.monotonic()
        if procs.engine_started_ms is not None:  # an adopted engine's time goes on
            started -= max(0, time.time_ns() // 1_000_000 - procs.engine_started_ms) / 1000
        ready = procs.ready  # an adopted leader that was serving is probed at once
        next_probe = 0.0
        failures = 0
        while True:
            code = peek_exit(procs.engine)
            if code is not None:
                self._note("engine-exited", spec, procs.engine.pid, f"exit code {code}")
                why = "an adopted engine ended; its status is unknown" if procs.adopted else None
                self._feed(EngineExited(spec.key, code, why))
                return
            if not ready:
                elapsed_ms = (time.monotonic() - started) * 1000
                if peek_exit(procs.sidecar) is not None:
                    await self._fail(
                        procs, "sidecar died before the engine was ready", EXIT_SIDECAR_FAILED
                    )
                    return
                if procs.probe.by_process:
                    ready = elapsed_ms >= settings.worker_settle_ms
                else:
                    ready = await self._engine_up()
                if ready:
                    self._note("engine-ready", spec, procs.engine.pid)
                    event = self._ready_event()
                    procs.ready = True
                    procs.endpoint = event.endpoint if isinstance(event, EngineServing) else None
                    self._save()
                    self._feed(event)
                    next_probe = time.monotonic() + settings.probe_interval_ms / 1000
                elif elapsed_ms >= settings.ready_timeout_ms:
                    message = f"engine not ready within {settings.ready_timeout_ms} ms"
                    await self._fail(procs, message, EXIT_NOT_READY)
                    return
            elif time.monotonic() >= next_probe:
                next_probe = time.monotonic() + settings.probe_interval_ms / 1000
                if await self._answers():
                    if failures >= PROBE_FAILURES:
                        self._note("engine-answers", spec, procs.engine.pid)
                        self._feed(self._ready_event())
                    failures = 0
                else:
                    failures += 1
                    if failures == PROBE_FAILURES:
                        self._note("engine-unresponsive", spec, procs.engine.pid)
                        self._feed(EngineUnresponsive(spec.key))
            await exits.wait(WATCH_S)

    def _ready_event(self) -> AgentEvent:
        procs = self.procs
        spec = procs.spec
        if spec.rank == 0:
            endpoint = procs.endpoint or f"http://{self.settings.engine_host}:{procs.engine_port}"
            return EngineServing(spec.key, endpoint)
        return EngineJoined(spec.key)
