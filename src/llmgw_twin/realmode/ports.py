"""The ports of a real-mode run's processes, leased per run: its agents' (their own, their
sidecars' and engines'), its controllers' and its router's.

Each node of a run gets `PORTS_PER_NODE` consecutive ports, a *unit*; a run takes as many
consecutive units as it has nodes, and one more for its controllers and router
(`cluster.RealCluster`). The units lie in `PORTS_FROM`..`PORTS_TO`, below Linux's default
ephemeral range (32768..60999): the kernel hands ports from there to every outgoing connection
and to every bind of port 0, so a port chosen there could be taken by any client between its
choice and the bind of the process it is for (a controller that then exits 1 at start).

Two runs at once on one machine (two test workers, a developer's run beside CI) never share a
unit: each unit is leased by an exclusive `flock` on its own file in one folder for the whole
machine (`/tmp/llmgw-twin-ports/UNIT.lock`; not under `TMPDIR`, which a test or a harness may
set per run, and which then kept two runs' leases apart), held until the run closes its lease
or its process ends (the kernel drops the lock with the process, so a killed run leaks
nothing). The first unit tried is drawn from the pid, so runs seldom even contend for one.
Sidecars and agents all listen on 127.0.0.1, so without the lease two runs whose ranges
overlapped would race for the same ports.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

PORTS_PER_NODE = 100
PORTS_FROM = 10_000
PORTS_TO = 32_700
"""The last unit ends at or before this port (exclusive), below the ephemeral range."""
UNITS = (PORTS_TO - PORTS_FROM) // PORTS_PER_NODE
LOCK_DIR = Path("/tmp/llmgw-twin-ports")  # noqa: S108 (machine-wide by design: lock files only)
"""Where every run on the machine leases its units, whatever its `TMPDIR`."""


class PortLeaseError(RuntimeError):
    """No block of free units: too many nodes, or too many runs at once."""


class PortLease:
    """`nodes` consecutive units, held until `close`: node i's ports are `range_of(i)`."""

    def __init__(self, first_unit: int, fds: list[int]) -> None:
        self.first_unit = first_unit
        self._fds = fds

    def range_of(self, index: int) -> tuple[int, int]:
        """Node `index`'s first and last port (inclusive)."""
        first = PORTS_FROM + (self.first_unit + index) * PORTS_PER_NODE
        return first, first + PORTS_PER_NODE - 1

    def close(self) -> None:
        _close(self._fds)
        self._fds = []


def lease_ports(nodes: int, lock_dir: Path | None = None) -> PortLease:
    """Lease `nodes` consecutive units no other live run holds; raises `PortLeaseError`."""
    if not 1 <= nodes <= UNITS:
        raise PortLeaseError(
            f"real mode gives each node {PORTS_PER_NODE} ports from {PORTS_FROM} to {PORTS_TO}: "
            f"{nodes} nodes do not fit (at most {UNITS})"
        )
    folder = lock_dir or LOCK_DIR
    folder.mkdir(mode=0o777, exist_ok=True)
    starts = UNITS - nodes + 1
    first = os.getpid() % starts
    for k in range(starts):
        start = (first + k) % starts
        fds = _lock_units(folder, range(start, start + nodes))
        if fds is not None:
            return PortLease(start, fds)
    raise PortLeaseError(
        f"no {nodes} consecutive port ranges are free: other real-mode runs on this machine "
        f"hold them (their locks are in {folder})"
    )


def _lock_units(folder: Path, units: range) -> list[int] | None:
    """Every unit locked (their descriptors), or none of them (None)."""
    fds: list[int] = []
    try:
        for unit in units:
            fds.append(os.open(folder / f"{unit}.lock", os.O_RDWR | os.O_CREAT, 0o666))
            fcntl.flock(fds[-1], fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _close(fds)
        return None
    except OSError:  # a lock file that cannot be opened: nothing of this lease stays held
        _close(fds)
        raise
    return fds


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)  # the lock goes with the descriptor
