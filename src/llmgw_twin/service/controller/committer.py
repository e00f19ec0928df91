"""Group commit: the controller's steps made durable off the event loop, many per transaction.

Role: the runtime hands each step the core made to `Committer.submit`. A step with nothing to
write and no event, and nothing queued before it, is carried out at once (its commands sent).
Otherwise it waits in a queue; one task takes everything queued, commits all their writes and
their events (the store's event log) in one transaction in a worker thread (SQLite with
`synchronous=FULL` waits for the disk, and the event loop must not), then carries the steps out
in the order they were made and resolves each one's future, which the request that made it
awaits before it answers.

Invariants:
- Nothing of a step leaves the process (no event, no command) before its writes and events
  are durable, and steps are carried out in the order the core made them, so the event log in
  memory and the store's number the same events alike.
- Every use of the store goes through `run` (one at a time, in the worker thread), so no two
  transactions interleave on its one connection.
- A failed commit calls `fatal` (the process ends); none of its steps is carried out, and their
  futures fail.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from llmgw_twin.control.durable import Write
from llmgw_twin.control.model import NodeId, TraceEvent
from llmgw_twin.control.protocol import Step
from llmgw_twin.store.base import SqlStore

log = logging.getLogger("llmgw_twin.controller")

T = TypeVar("T")
CLOSE_GRACE_S = 10.0


@dataclass(slots=True)
class _Queued:
    step: Step
    in_band: NodeId | None
    done: asyncio.Future[None]


class Committer:
    def __init__(
        self,
        store: SqlStore,
        carry_out: Callable[[Step, NodeId | None], None],
        fatal: Callable[[str], None],
        epoch: Callable[[], int | None] = lambda: None,
    ) -> None:
        """`epoch`: the leader's; every commit is conditional on it (`Store.commit`), so a
        deposed leader's commit fails, and `fatal` ends the process before it acts."""
        self.store = store
        self._epoch = epoch
        self._carry_out = carry_out
        self._fatal = fatal
        self._queue: collections.deque[_Queued] = collections.deque()
        self._wake = asyncio.Event()
        self._store_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.transactions = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._work())

    async def close(self) -> None:
        """Commit and carry out what is queued (bounded), then stop."""
        deadline = asyncio.get_running_loop().time() + CLOSE_GRACE_S
        while self._queue and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        if self._task is not None:
            # never while the worker thread is inside the store: the store closes next
            async with self._store_lock:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def submit(self, step: Step, in_band: NodeId | None = None) -> asyncio.Future[None] | None:
        """Carry `step` out once durable; never awaits. None: carried out already."""
        if not step.writes and not step.events and not self._queue:
            self._carry_out(step, in_band)
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Queued(step, in_band, done))
        self._wake.set()
        return done

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the store, in the worker thread, alone."""
        async with self._store_lock:
            work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                # the caller is gone, but the thread is still in the store: hold the lock
                # until it is out, so that no other use of the store overlaps it
                await asyncio.wait({work})
                raise

    async def _work(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            batch = list(self._queue)
            self._queue.clear()
            writes: tuple[Write, ...] = tuple(w for q in batch for w in q.step.writes)
            events: tuple[TraceEvent, ...] = tuple(e for q in batch for e in q.step.events)
            if writes or events:
                try:
                    await self.run(self.store.commit, writes, events, self._epoch())
                except Exception as e:
                    log.exception("committing %d steps failed", len(batch))
                    for q in batch:
                        q.done.set_exception(RuntimeError(f"the commit failed: {e!r}"))
                        q.done.exception()  # retrieved: the awaiting request may be gone
                    try:
                        self._fatal(f"committing a step to {self.store.path} failed: {e!r}")
                    except Exception:
                        log.exception("after a failed commit")
                    continue
                self.transactions += 1
            for q in batch:
                self._carry_out(q.step, q.in_band)
                if not q.done.done():
                    q.done.set_result(None)
