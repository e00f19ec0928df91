"""What ends a real run's processes when the run itself cannot: a SIGKILL of `run --real`.

A stop signal the run can catch (SIGINT, SIGTERM, SIGHUP: `stop.py`) ends every process it
started and removes its temporary folder. SIGKILL cannot be caught, and every process the run
starts leads its own session (so a terminal's Ctrl-C reaches the harness alone), so nothing dies
with the harness on its own: an agent's engines are meant to outlive their agent (adoption).

So each run starts a keeper first: a small process in a session of its own that holds the read
end of a pipe whose write end only the run holds. Every process the run starts carries the run's
mark in its environment (`MARK`, a random value per run), and the agents hand their environment
on to the engines and sidecars they start, so the mark names every process of the run and no
other. When the run ends its clean-up it writes `done` and the keeper leaves. When the pipe
closes without `done`, the run died: the keeper kills every process carrying the mark (scanning
/proc until a scan finds none), then removes the run's folder.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

MARK = "LLMGW_REAL_RUN"
"""The environment variable that marks a run's processes; its value is the run's own."""

DONE = b"done"
SWEEP_ROUNDS = 200
"""Scans at most, 50 ms apart: a process started by one being killed (an agent replacing an
engine) is found by a later scan, and the sweep ends after ~10 s whatever happens."""


class Keeper:
    """The run's side: the mark to give every process, and the pipe to its keeper."""

    def __init__(self, workdir: Path) -> None:
        self.mark = secrets.token_hex(12)
        env = {k: v for k, v in os.environ.items() if k != MARK}
        self._proc = subprocess.Popen(  # noqa: S603 - our own interpreter, a fixed argv
            [sys.executable, "-m", "llmgw_twin.realmode.keeper", self.mark, str(workdir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        assert self._proc.stdin is not None
        self._pipe: IO[bytes] = self._proc.stdin

    def env(self) -> dict[str, str]:
        """The environment a process of this run starts with: ours, and the mark."""
        return {**os.environ, MARK: self.mark}

    def release(self) -> None:
        """The run has ended its processes itself: the keeper leaves without touching any."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self._pipe.write(DONE)
            self._pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)


def marked(mark: str) -> list[int]:
    """Pids of the live processes whose environment carries `mark` (never this process)."""
    needle = f"{MARK}={mark}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if environ.startswith(needle) or b"\0" + needle in environ:
            found.append(int(entry.name))
    return found


def sweep(mark: str) -> int:
    """Kill every process carrying `mark` until a scan finds none; returns how many were
    killed. A stopped (frozen) process dies of SIGKILL too."""
    killed: set[int] = set()
    for _ in range(SWEEP_ROUNDS):
        pids = marked(mark)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.05)  # a killed process leaves /proc once its parent (or init) reaps it
    return len(killed)


def main(argv: list[str]) -> int:
    mark, workdir = argv
    said = sys.stdin.buffer.read()  # until the run closes the pipe, or dies and the kernel does
    if said == DONE:
        return 0
    sweep(mark)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
