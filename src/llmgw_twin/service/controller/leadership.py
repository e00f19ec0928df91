"""The controller service's lease: it leads only while it holds the store's lease, in its epoch.

Role: `claim` waits, as a standby, until the store gives this controller the lease (a new epoch
each time: `control.lease`), asking every fifth of a lease; `start` then renews it every third
of a lease in a background task. A renewal the store refuses (`Fenced`: another controller took
the lease) calls `fatal`, which ends the process: a deposed controller stops, and its supervisor
starts it again as a standby.

Its deadline: four fifths of a lease after the last good renewal began, on this process's own
monotonic clock (before the store's lease could expire). Past it, the controller may no longer
be the only one acting, so it sends nothing (`may_act` is false, and `Delivery` holds every
command until `acting` returns), and it asks the store at once: a lease still held in its own
epoch (no one took it while it was held up: an overloaded event loop, a long pause) is renewed,
and the controller goes on where it was, as the twin's does; a lease taken is `Fenced` and ends
the process; a store it cannot reach ends it too (it cannot know, and a standby may lead by
then). Every commit is conditional on `epoch` (`Committer`) and every command carries it
(`Delivery`), so even a process frozen past its deadline (SIGSTOP, a VM pause) acts on nothing
when it wakes: its commits are refused, its commands too.

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
        self._renewal = asyncio.Event()
        """Set (and replaced) at every renewal: what a sender held by the deadline waits on."""
        self.late_renewals = 0
        """Renewals made past the deadline: the controller was held up, and no one took over."""
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
                self.epoch = got.epoch
                self._renewed_at(started)
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

    def may_act(self) -> bool:
        """True while this controller leads within its deadline (see the module)."""
        if self.epoch is None:
            return False
        elapsed_ms = (time.monotonic() - self._renewed) * 1000
        return elapsed_ms < self.times.step_down_after_ms

    async def acting(self) -> None:
        """Return once this controller may act (at once while it may)."""
        while not self.may_act():
            await self._renewal.wait()

    def _renewed_at(self, started: float) -> None:
        self._renewed = started
        renewal, self._renewal = self._renewal, asyncio.Event()
        renewal.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renew_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _renew_loop(self) -> None:
        times = self.times
        late = False
        while True:
            if not late:
                await asyncio.sleep(times.renew_every_ms / 1000)
            started = time.monotonic()
            late = not self.may_act()
            if late:
                log.warning(
                    "controller %s is past its lease deadline (%.1f s since its last renewal "
                    "began, the deadline is %.1f s): it sends nothing until the store renews "
                    "its lease in epoch %s",
                    self.name,
                    started - self._renewed,
                    times.step_down_after_ms / 1000,
                    self.epoch,
                )
            try:
                await self._run(self._renew_now, times.lease_ms)
            except Fenced as e:
                self._fatal(f"controller {self.name} was deposed: {e}")
                return
            except Exception as e:
                if late:  # it cannot know whether another leads by now
                    self._fatal(f"controller {self.name} could not renew its lease in time: {e!r}")
                    return
                log.warning("renewing the lease failed: %r", e)  # try again before the deadline
                continue
            if late:
                self.late_renewals += 1
                log.warning(
                    "controller %s renewed its lease in epoch %s %.1f s after the last "
                    "renewal: no one took it over, it acts again",
                    self.name,
                    self.epoch,
                    time.monotonic() - self._renewed,
                )
                late = False
            self._renewed_at(started)
