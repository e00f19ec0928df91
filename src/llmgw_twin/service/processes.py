"""Child processes of the agent: spawned in their own process groups, watched, stopped as groups.

Role: the only place the production shell starts or signals a process. `spawn` runs an argv
(never through a shell) as the leader of a new session, so the process and everything it starts
share one process group that `stop_group` can end at once. `peek_exit` learns of an exit
without reaping it, so the group's id cannot be reused before the group has been killed.

Invariants:
- `spawn` takes an argv list and never a command string; `shell=True` appears nowhere.
- `stop_group` sends SIGTERM to the whole group, waits at most `grace_s` for the leader, then
  sends SIGKILL to whatever is left of the group (the leader still unreaped, so its id still
  names this group), and only then reaps the leader. It returns in bounded time.
- Ports handed out by `PortPool` are within the configured range, free to bind when handed out,
  and never handed out twice until released.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

POLL_S = 0.05
KILL_WAIT_S = 5.0
"""How long to wait for a SIGKILLed leader to be reaped before giving up on it (logged)."""


def spawn(
    argv: Sequence[str], env: Mapping[str, str] | None = None, log_path: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session (its own process group); output to `log_path` if given,
    else inherited. Raises OSError when the program cannot be started."""
    out = log_path.open("ab") if log_path is not None else None
    try:
        return subprocess.Popen(  # noqa: S603  (an argv list, never a shell)
            list(argv),
            start_new_session=True,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            close_fds=True,
        )
    finally:
        if out is not None:
            out.close()  # the child holds its own descriptor


def peek_exit(proc: subprocess.Popen[bytes]) -> int | None:
    """The exit code if the process ended (negative: killed by that signal), without reaping."""
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.poll()
    if info is None:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return info.si_status


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> int | None:
    """End the process group led by `proc`: SIGTERM, at most `grace_s`, then SIGKILL."""
    pgid = proc.pid  # a session leader's group id is its pid
    if proc.returncode is None:
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while peek_exit(proc) is None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
    if proc.returncode is None:
        _signal_group(pgid, signal.SIGKILL)  # the leader is unreaped: pgid is still this group
    deadline = time.monotonic() + KILL_WAIT_S
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    return proc.returncode


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still runs (zombies do not count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class PortPool:
    """Ports from one inclusive range, each handed out to one user at a time."""

    def __init__(self, first: int, last: int, host: str) -> None:
        self.first, self.last, self.host = first, last, host
        self._taken: set[int] = set()

    def take(self) -> int | None:
        for port in range(self.first, self.last + 1):
            if port not in self._taken and self._bindable(port):
                self._taken.add(port)
                return port
        return None

    def release(self, port: int | None) -> None:
        if port is not None:
            self._taken.discard(port)

    def _bindable(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((self.host, port))
            except OSError:
                return False
        return True
