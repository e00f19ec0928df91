"""The collector's pauses, kept short in a long-lived service with a big heap.

Why: a controller holding a 10,000-node fleet keeps about half a million long-lived objects
(records, credentials, connections). Python's full collection walks all of them, about 0.4-0.6 s
on this machine, every few seconds under heartbeat load, and finds nothing to free: every
heartbeat waiting in that pause is late by as much (docs/performance.md). What survives a full
collection is the long-lived state; it is frozen (`gc.freeze`: moved where the collector no
longer looks), so later full collections walk only what is new. Every `THAW_EVERY_S` the frozen
objects are thawed once, so that the next full collection looks at everything and frees any
cycles among them: one long pause in that interval instead of one every few seconds.

`GcPauses.start()` registers a collector callback (which times each collection's pause and
notes that a full collection ended) and a task that freezes soon after, on the event loop;
`stop()` undoes both and thaws.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

from llmgw_twin.service.controller.timings import Buckets

THAW_EVERY_S = 600.0
TEND_EVERY_S = 1.0


class GcPauses:
    def __init__(
        self,
        thaw_every_s: float = THAW_EVERY_S,
        pauses: dict[int, Buckets] | None = None,
    ) -> None:
        self.thaw_every_s = thaw_every_s
        self._pauses = pauses
        """Each collection's pause, by generation (`/metrics`)."""
        self._began = 0.0
        self.freezes = 0
        self.thaws = 0
        self._full_done = False
        self._last_thaw = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def _noted(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        generation = info.get("generation")
        if self._pauses is not None and generation in self._pauses:
            self._pauses[generation].observe(time.perf_counter() - self._began)
        if generation == 2:
            self._full_done = True  # acted on in `tend`, outside the collector

    def tend(self) -> None:
        """After a full collection: freeze what survived it, or thaw once an interval."""
        if not self._full_done:
            return
        self._full_done = False
        now = time.monotonic()
        if now - self._last_thaw >= self.thaw_every_s:
            gc.unfreeze()  # the next full collection walks everything, once
            self._last_thaw = now
            self.thaws += 1
        else:
            gc.freeze()
            self.freezes += 1

    def start(self) -> None:
        gc.callbacks.append(self._noted)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TEND_EVERY_S)
            self.tend()

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._noted)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        gc.unfreeze()

    def view(self) -> dict[str, int]:
        return {
            "gc_freezes": self.freezes,
            "gc_thaws": self.thaws,
            "gc_frozen": gc.get_freeze_count(),
        }
