"""The controller's own lag: how late its event loop runs, told to the core so that its lag
is never counted as node silence.

Role: `LagMonitor` sleeps `PROBE_S` at a time and measures how much later than asked it wakes.
A loop that is overloaded (a queue of requests ahead of every callback) or paused (a blocking
call, the collector) wakes late by about as long as a heartbeat arriving then waits to be
heard. Past `TOLERANCE_MS`, the monitor reports the lateness (`on_lag(ms)`: the runtime hands
the core a `ControllerLagged`, and the core moves every node's last heartbeat that much later),
counts it, and marks the controller behind for `BEHIND_FOR_S`, in which it sheds what can wait
(state views and event reads answer 503 with `Retry-After`) before heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw_twin.service.controller.timings import Buckets

log = logging.getLogger("llmgw_twin.controller")

PROBE_S = 0.1
TOLERANCE_MS = 1000
"""Lateness below this is ordinary scheduling noise (a busy host, the collector), not lag."""
BEHIND_FOR_S = 5.0
"""How long after its last lag the controller counts as behind (and sheds state views)."""
LOG_EVERY_S = 10.0


class LagMonitor:
    def __init__(
        self,
        on_lag: Callable[[int], Awaitable[None]],
        lateness: Buckets | None = None,
    ) -> None:
        self._on_lag = on_lag
        self._lateness = lateness
        """Every probe's lateness goes here (`/metrics`), the small ones too."""
        self.episodes = 0
        self.forgiven_ms = 0
        self.last_ms = 0
        self._last_at: float | None = None
        self._logged_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._due: float | None = None
        """When the probe asked to wake (monotonic seconds)."""
        self._told_until = 0.0
        """Lateness up to this instant has been told to the core."""
        self.watching = False
        """True once the monitor has started measuring."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def behind(self) -> bool:
        """Whether the controller lagged in the last `BEHIND_FOR_S`."""
        return self._last_at is not None and time.monotonic() - self._last_at < BEHIND_FOR_S

    def view(self) -> dict[str, Any]:
        return {
            "behind": self.behind(),
            "lag_episodes": self.episodes,
            "lag_forgiven_ms": self.forgiven_ms,
            "last_lag_ms": self.last_ms,
        }

    async def _watch(self) -> None:
        self.watching = True
        while True:
            self._due = time.monotonic() + PROBE_S
            await asyncio.sleep(PROBE_S)
            late_s = max(0.0, time.monotonic() - self._due)
            if self._lateness is not None:
                self._lateness.observe(late_s)
            await self.catch_up()

    async def catch_up(self) -> None:
        """Tell the core of the lateness not yet told: called by the probe when it wakes, and
        by the reconcile loop before each tick, so that a tick after a long step, a pause or a
        starved loop judges no silence before the core knows how late it runs (the probe, woken
        in the same instant, could come after the tick). Each stretch of lateness is told once,
        by whichever comes first."""
        if self._due is None:
            return
        now = time.monotonic()
        late_ms = int((now - max(self._due, self._told_until)) * 1000)
        if late_ms > TOLERANCE_MS:
            self._told_until = now
            await self.lagged(late_ms)

    async def lagged(self, late_ms: int) -> None:
        """Count a lateness of `late_ms` and tell the core."""
        self.episodes += 1
        self.forgiven_ms += late_ms
        self.last_ms = late_ms
        now = time.monotonic()
        self._last_at = now
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning(
                "the controller runs %d ms behind (%d times, %d ms in all): its own lag is not "
                "counted as node silence; state views are shed while it is behind",
                late_ms,
                self.episodes,
                self.forgiven_ms,
            )
        await self._on_lag(late_ms)
