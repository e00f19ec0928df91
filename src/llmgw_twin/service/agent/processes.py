"""Child processes of the agent: spawned in their own process groups, watched, stopped as groups.

Role: the only place the production shell starts or signals a process. `spawn` runs an argv
(never through a shell) as the leader of a new session, so the process and everything it starts
share one process group that `stop_group` can end at once. `peek_exit` learns of an exit
without reaping it, so the group's id cannot be reused before the group has been killed.
`Adopted` is a process an earlier agent started and this one found alive (the same pid with
the same start time, `proc_stat`): not a child, so it is watched through /proc, its exit status
is never known (`UNKNOWN_EXIT`), and its group is signalled only while `group_is_ours`.

Invariants:
- `spawn` takes an argv list and never a command string; `shell=True` appears nowhere.
- `stop_group` sends SIGTERM to the whole group, waits at most `grace_s` for the leader, then
  sends SIGKILL to whatever is left of the group (the leader still unreaped, so its id still
  names this group), and only then reaps the leader. It returns in bounded time.
- An adopted group is signalled only while its leader is the very process recorded (same start
  time) or no process has that pid any more: a pid still in use as a group id is never given to
  a new process, so the group's members are then the leader's own. A pid reused by another
  process is never signalled.
- Ports handed out by `PortPool` are within the configured range, free to bind on every address
  the pool checks (the sidecar's and the engine's) when handed out, never reserved ones, and never
  handed out twice until released.
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
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.05
KILL_WAIT_S = 5.0
"""How long to wait for a SIGKILLed leader to be reaped before giving up on it (logged)."""
UNKNOWN_EXIT = 1007
"""The exit code reported for an adopted process that ended: it is not this agent's child, so
its exit status cannot be read. Like the launcher's codes, outside what a program returns."""


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, process group, start time in clock ticks after boot) of process `pid`, read
    from /proc/PID/stat; None when there is no such process. Other OSErrors (a /proc that
    hides the process) propagate: the caller cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command's name, which may hold ")"
    return fields[0], int(fields[2]), int(fields[19])


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (by a signal or a tracer): alive, making no progress
    and answering nothing. What an agent can tell of a rank that opens no port."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] in ("T", "t")


def start_ticks(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks after boot), None if it is gone or unreadable:
    with the pid, it names one process of this boot, whatever pids are reused later."""
    try:
        stat = proc_stat(pid)
    except OSError:
        return None
    return stat[2] if stat is not None else None


@dataclass(slots=True)
class Adopted:
    """A process an earlier agent started, found alive: the same pid with the same start time.
    Not this process's child, so it cannot be waited for; `returncode` stays None while it runs
    and becomes `UNKNOWN_EXIT` once it is gone (or a zombie, or its pid names another process)."""

    pid: int
    start_ticks: int
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                stat = proc_stat(self.pid)
            except OSError:
                return None  # cannot tell: taken as still running
            if stat is None or stat[0] in "ZX" or stat[2] != self.start_ticks:
                self.returncode = UNKNOWN_EXIT
        return self.returncode


Proc = subprocess.Popen[bytes] | Adopted
"""A shard process: one this agent started, or one it adopted."""


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


def peek_exit(proc: Proc) -> int | None:
    """The exit code if the process ended (negative: killed by that signal), without reaping;
    `UNKNOWN_EXIT` for an adopted process that ended."""
    if isinstance(proc, Adopted):
        return proc.poll()
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


class ExitWatch:
    """Wakes a watcher the moment a child process ends, not at its next poll: a pidfd (Linux
    5.3 and later) read on the event loop. A process that is not this one's child (an adopted
    one), or a host without pidfds, is waited for by the timeout alone."""

    def __init__(self, proc: Proc) -> None:
        self._fd: int | None = None
        if isinstance(proc, subprocess.Popen) and proc.returncode is None:
            with contextlib.suppress(OSError, AttributeError):
                self._fd = os.pidfd_open(proc.pid)

    async def wait(self, timeout_s: float) -> None:
        """Until the process has ended (at once if it has), at most `timeout_s`."""
        if self._fd is None:
            await asyncio.sleep(timeout_s)
            return
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(self._fd, readable)
        try:
            await asyncio.wait_for(ended, timeout_s)
        except TimeoutError:
            pass
        finally:
            loop.remove_reader(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def stop_group(proc: Proc, grace_s: float) -> int | None:
    """End the process group led by `proc`: SIGTERM (and SIGCONT, so that a stopped member
    handles it rather than sit out the grace), at most `grace_s`, then SIGKILL; returns once
    the leader is reaped and no member of the group runs (a SIGKILL takes effect when the
    kernel next schedules its process, which on a busy machine is not at once), or after
    `KILL_WAIT_S`."""
    if isinstance(proc, Adopted):
        return await _stop_adopted(proc, grace_s)
    pgid = proc.pid  # a session leader's group id is its pid
    if proc.returncode is None:
        _signal_group(pgid, signal.SIGTERM)
        _signal_group(pgid, signal.SIGCONT)
        deadline = time.monotonic() + grace_s
        while peek_exit(proc) is None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
    if proc.returncode is None:
        _signal_group(pgid, signal.SIGKILL)  # the leader is unreaped: pgid is still this group
    deadline = time.monotonic() + KILL_WAIT_S
    while (proc.poll() is None or group_alive(pgid)) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    return proc.returncode


def group_is_ours(pgid: int, leader_start_ticks: int) -> bool:
    """Whether signalling group `pgid` reaches only what its recorded leader (pid `pgid`, started
    at `leader_start_ticks`) left: the leader is that very process, or no process has its pid
    any more (a pid in use as a group id is never given to a new process, so the members left
    are the leader's own). A pid that now names another process: False."""
    try:
        stat = proc_stat(pgid)
    except OSError:
        return False
    return stat is None or stat[2] == leader_start_ticks


async def _stop_adopted(proc: Adopted, grace_s: float) -> int | None:
    """`stop_group` for a group this agent did not start: signalled only while it is still the
    recorded one's, waited for through /proc."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if not group_alive(pgid) or not group_is_ours(pgid, proc.start_ticks):
            break
        _signal_group(pgid, sig)
        if sig is signal.SIGTERM:
            _signal_group(pgid, signal.SIGCONT)
        deadline = time.monotonic() + wait_s
        while group_alive(pgid) and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
    proc.poll()
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
    """Ports from one inclusive range, each handed out to one user at a time: one that is free
    to bind on every address in `hosts` (a process listening on any of them, or on all
    interfaces, holds it), not reserved (a process that will listen there has not yet), and
    not in `skip` (ports other processes are told to use, so free now but not for long)."""

    def __init__(self, first: int, last: int, hosts: Sequence[str], skip: range = range(0)) -> None:
        self.first, self.last = first, last
        self.hosts = tuple(dict.fromkeys(hosts))
        self._skip = skip
        self._taken: set[int] = set()

    def reserve(self, port: int | None) -> None:
        """Count `port` as taken until it is released (an adopted shard's, say)."""
        if port is not None:
            self._taken.add(port)

    def take(self) -> int | None:
        for port in range(self.first, self.last + 1):
            if port not in self._taken and port not in self._skip and self._bindable(port):
                self._taken.add(port)
                return port
        return None

    def release(self, port: int | None) -> None:
        if port is not None:
            self._taken.discard(port)

    def _bindable(self, port: int) -> bool:
        for host in self.hosts:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))  # no SO_REUSEADDR: any socket on the port counts
                except OSError:
                    return False
        return True
