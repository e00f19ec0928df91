"""The sim engine's waits: a shard's concurrent tasks, awaited together by name, and the stop
signals it heeds (`sim_server`'s leader, `sim_worker`'s worker).

Invariants: whatever task is left when a shard ends is cancelled (`cancel_all`); SIGTERM and
SIGINT only set the stop event, the shard's own loop decides what a stop means.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("llmgw_twin.sim_engine")


def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        log.info("received %s", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    return stop


class Tasks:
    """Named tasks awaited together; whatever is left is cancelled on exit."""

    def __init__(self) -> None:
        self._names: dict[asyncio.Task[Any], str] = {}

    def add(self, name: str, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.create_task(coro)
        self._names[task] = name
        return task

    def __contains__(self, name: str) -> bool:
        return name in self._names.values()

    async def next(self, timeout_s: float | None = None) -> list[tuple[str, asyncio.Task[Any]]]:
        """The tasks that finished first, by name (none once `timeout_s` passed), now removed."""
        done, _ = await asyncio.wait(
            set(self._names), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        ordered = sorted(done, key=lambda t: self._names[t])
        return [(self._names.pop(t), t) for t in ordered]

    async def cancel_all(self) -> None:
        for task in self._names:
            task.cancel()
        await asyncio.gather(*self._names, return_exceptions=True)
        self._names.clear()
