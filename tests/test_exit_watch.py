"""An engine's exit wakes its shard's watch at once (a pidfd on the event loop), not at the
watch's next poll: the agent reports the exit as soon as the kernel knows it, as the twin's
agent does. A process that is not the agent's child is waited for by the timeout alone."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from llmgw_twin.service.agent.processes import Adopted, ExitWatch, peek_exit

LONG_S = 600.0
"""A wait far longer than the test is allowed: if it returns, the exit woke it."""
BOUND_S = 30.0


def test_a_childs_exit_ends_the_wait_long_before_its_timeout() -> None:
    async def go() -> None:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        watch = ExitWatch(child)
        try:
            waiting = asyncio.ensure_future(watch.wait(LONG_S))
            await asyncio.sleep(0)
            assert not waiting.done()  # running: nothing to wake it
            child.kill()
            await asyncio.wait_for(waiting, BOUND_S)  # woken by the exit, not the timeout
            assert peek_exit(child) == -9
            await asyncio.wait_for(watch.wait(LONG_S), BOUND_S)  # ended: no wait at all
        finally:
            watch.close()
            child.kill()
            child.wait()

    asyncio.run(go())


def test_an_adopted_process_is_waited_for_by_the_timeout() -> None:
    async def go() -> None:
        watch = ExitWatch(Adopted(pid=1, start_ticks=0))
        await asyncio.wait_for(watch.wait(0.01), BOUND_S)
        watch.close()

    asyncio.run(go())
