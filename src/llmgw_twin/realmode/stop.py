"""Stop signals during a real run (`runner.run_real`).

SIGINT, SIGTERM and SIGHUP while a run is on do not kill the harness outright (that would leave
its cluster running and its temporary folder behind): the first cancels the run's task, whose
clean-up ends every process the run started; the folder is removed; then `Interrupted` is
raised, which the command turns into one line and exit status 128 + the signal's number. Every
process the run starts leads its own session, so a terminal's Ctrl-C, sent to the foreground
process group, reaches the harness alone, never its children before their clean-up.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

T = TypeVar("T")


class Interrupted(Exception):
    """A signal stopped the run; every process it started was ended and its temporary folder
    removed before this was raised."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class Stopper:
    """SIGINT, SIGTERM and SIGHUP while a run is on: the first cancels the run's task (from the
    loop, as a callback, so never inside the loop's own code), the run then ends its processes;
    any signal after it, or once the run is stopping, is only noted."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    def watch(self, task: asyncio.Task[Any]) -> None:
        self._loop, self._task = asyncio.get_running_loop(), task

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        first = self.received is None
        self.received = self.received or signum
        if first and self._loop is not None and not self.stopping:
            self._loop.call_soon_threadsafe(self._cancel)

    async def guard(
        self, work: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[T]]
    ) -> T:
        """Run `work` (not started if a signal came first) where a stop signal cancels it, then
        `stop` whatever happened, signals during it only noted; `stop`'s result. A cancellation
        by the signal ends `work` quietly; any other error goes on once `stop` has run."""
        task = asyncio.current_task()
        assert task is not None
        self.watch(task)
        try:
            if self.received is None:
                await work()
        except asyncio.CancelledError:
            if self.received is None:
                raise
        finally:
            self.stopping = True  # from here on a signal is only noted
            stopped = await stop()
        return stopped

    def _cancel(self) -> None:
        if not self.stopping and self._task is not None:
            self._task.cancel()


Handler = Callable[[int, FrameType | None], None]


def raise_interrupted(signum: int, _frame: FrameType | None) -> None:
    """Outside a run (loading a file, the twin's run for `--compare`, printing a report) no
    process of a cluster exists: a stop signal raises `Interrupted` where the command is."""
    raise Interrupted(signum)


@contextmanager
def signals_to(handler: Handler) -> Iterator[None]:
    """The stop signals go to `handler` inside the block, and back to their handlers after
    (off the main thread signals cannot be taken: they are left to the caller's handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before if before is not None else signal.SIG_DFL)
