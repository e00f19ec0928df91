"""The controller service's lease: it leads only while it holds the store's lease, in its epoch.

Role: `claim` waits, as a standby, until the store gives this controller the lease (a new epoch
each time: `control.lease`), asking every fifth of a lease; `start` then renews it every third
of a lease in a background task. A renewal the store refuses (`Fenced`: another controller took
the lease) or one that could not be made in time on this process's own monotonic clock (four
fifths of a lease after the last good one began: before the store's lease could expire) calls
`fatal`, which ends the process: a deposed controller stops before anyone else may act, and its
supervisor starts it again as a standby. Every commit is conditional on `epoch` (`Committer`),
and every command carries it (`Delivery`), so even a process frozen past its deadline (SIGSTOP,
a VM pause) acts on nothing when it wakes: its commits are refused, its commands too.

Each controller also says in the store where it is reached (`url`) at every claim it tries and
every renewal; a standby keeps what it last read of the lease and of those addresses
(`LeaderView`), so that it can answer every call with where the leader is (`standby.py`) and
the leader can list the standbys that are alive (`controllers`).

The store's time is the store's own (`SqlStore.now_ms`): PostgreSQL's server clock, or for
SQLite the wall clock of the machine that holds the file; expiry is the store's to decide, never
a controller's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from llmgw_twin.control.lease import Lease, LeaseTimes
from llmgw_twin.store.base import Fenced, SqlStore

log = logging.getLogger("llmgw_twin.controller")

T = TypeVar("T")
Run = Callable[..., Awaitable[object]]


@dataclass(frozen=True, slots=True)
class LeaderView:
    """Who leads, as a standby last read it from the store."""

    name: str
    epoch: int
    url: str | None
    """Where it said it is reached (None: it has not said)."""


@dataclass(frozen=True, slots=True)
class Peer:
    """A controller sharing the store, as the store last heard of it."""

    name: str
    url: str
    seen_ms: int
    """When it last claimed or renewed, in the store's time."""


class Leadership:
    def __init__(
        self,
        store: SqlStore,
        name: str,
        lease_ms: int,
        run: Run,
        fatal: Callable[[str], None],
        url: str = "",
    ) -> None:
        """`run(fn, *args)` calls the store alone, off the event loop (`Committer.run`);
        `url`: where the other controllers' clients reach this one."""
        self.name = name
        self.url = url
        self.leader: LeaderView | None = None
        """While a standby: the leader as last read (None: none yet, or this one leads)."""
        self.standing_by = False
        """True while `claim` waits for the lease (a standby), False before and after."""
        self.times = LeaseTimes(lease_ms)
        self._store = store
        self._run = run
        self._fatal = fatal
        self.epoch: int | None = None
        """None until this controller leads."""
        self._renewed = 0.0
        self._task: asyncio.Task[None] | None = None

    async def claim(self) -> int:
        """Wait until this controller leads; its epoch."""
        self.standing_by = True
        try:
            return await self._claim()
        finally:
            self.standing_by = False

    async def _claim(self) -> int:
        lease_ms = self.times.lease_ms
        waited = False
        while True:
            started = time.monotonic()
            got = await self._claim_now(lease_ms)
            if isinstance(got, Lease):
                self.epoch, self._renewed = got.epoch, started
                self.leader = None
                log.info("controller %s leads, in epoch %d", self.name, got.epoch)
                return got.epoch
            if isinstance(got, LeaderView):
                self.leader = got
            if not waited:
                holder = self.leader.name if self.leader is not None else "another controller"
                where = f" at {self.leader.url}" if self.leader and self.leader.url else ""
                log.info("controller %s is a standby: %s leads%s", self.name, holder, where)
                waited = True
            await asyncio.sleep(self.times.retry_every_ms / 1000)

    def _claim_now(self, lease_ms: int) -> Awaitable[object]:
        """The lease if it is ours now, else who holds it (in the worker thread)."""
        store = self._store

        def claim() -> Lease | LeaderView | None:
            if self.url:
                store.put_controller(self.name, self.url)
            got = store.claim_lease(self.name, store.now_ms(), lease_ms)
            if got is not None:
                return got
            held = store.lease()
            if held is None:
                return None
            urls = {name: url for name, url, _ in store.controllers()}
            return LeaderView(held.holder, held.epoch, urls.get(held.holder))

        return self._run(claim)

    def _renew_now(self, lease_ms: int) -> Lease:
        """Renew at the store's time (read from the store, in the worker thread)."""
        assert self.epoch is not None
        got = self._store.renew_lease(self.name, self.epoch, self._store.now_ms(), lease_ms)
        if self.url:
            self._store.put_controller(self.name, self.url)
        return got

    def peers(self) -> list[Peer]:
        """Every controller that said where it is reached, and when (a blocking read)."""
        return [Peer(*row) for row in self._store.controllers()]

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renew_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _renew_loop(self) -> None:
        times = self.times
        while True:
            await asyncio.sleep(times.renew_every_ms / 1000)
            started = time.monotonic()
            if (started - self._renewed) * 1000 >= times.step_down_after_ms:
                self._fatal(f"controller {self.name} could not renew its lease in time")
                return
            try:
                await self._run(self._renew_now, times.lease_ms)
            except Fenced as e:
                self._fatal(f"controller {self.name} was deposed: {e}")
                return
            except Exception as e:  # the store is away for now: try again before the deadline
                log.warning("renewing the lease failed: %r", e)
                continue
            self._renewed = started
