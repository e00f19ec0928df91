"""Real-mode runs as a test sees them: the processes of one run only (never another run's on the
same machine), and `llmgw-twin run --real` started as a process of its own.

A run is told apart by its temporary folder: the test gives each run a TMPDIR of its own, which
every process the run starts inherits (and the run's folder, inside it, is in their command
lines), so two runs at once, or another engineer's, are never counted as this test's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

POLL_S = 0.05


def _stat(pid: str) -> list[str] | None:
    try:
        return (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def marked(marker: Path) -> dict[int, int]:
    """Live processes (pid -> process group) that carry `marker` in their command line, working
    directory or environment; this test process itself aside."""
    found: dict[int, int] = {}
    mark = str(marker).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cwd = os.readlink(entry / "cwd").encode()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        fields = _stat(entry.name)
        if fields is None or fields[0] == "Z":
            continue
        if mark in cmdline or cwd.startswith(mark) or mark in environ:
            found[int(entry.name)] = int(fields[2])
    return found


def alive_groups(groups: set[int] | list[int]) -> set[int]:
    """Those of `groups` that still have a member that is not a zombie."""
    wanted = set(groups)
    alive = set()
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields is not None and fields[0] != "Z" and int(fields[2]) in wanted:
            alive.add(int(fields[2]))
    return alive


def cmdlines(pids: set[int] | list[int]) -> list[str]:
    out = []
    for pid in sorted(pids):
        try:
            out.append((Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:
            continue
    return [c.decode(errors="replace") for c in out]


class RealRunProcess:
    """`llmgw-twin run --real ARGS` in a session of its own (a signal the test sends reaches it
    alone), with TMPDIR set to `tmpdir`; its standard error read line by line as it comes."""

    def __init__(self, tmpdir: Path, *args: str) -> None:
        tmpdir.mkdir(parents=True, exist_ok=True)
        self.tmpdir = tmpdir
        env = {**os.environ, "TMPDIR": str(tmpdir)}
        self.proc = subprocess.Popen(  # our own interpreter, a fixed argv
            [sys.executable, "-m", "llmgw_twin.cli", "run", "--real", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._out: list[bytes] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_out, daemon=True)
        self._out_reader.start()
        self.stdout = ""

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._lock:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self._out.append(self.proc.stdout.read())

    @property
    def stderr(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, within_s: float) -> re.Match[str]:
        """The first stderr line matching `pattern`; fails if the run ends or time runs out."""
        deadline = time.monotonic() + within_s
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            with self._lock:
                for line in self.lines:
                    if m := regex.search(line):
                        return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"the run ended ({self.proc.returncode}):\n{self.stderr}")
            time.sleep(POLL_S)  # a line still to come from another process
        raise AssertionError(f"no line matching {pattern!r} within {within_s}s:\n{self.stderr}")

    def finish(self, within_s: float) -> int:
        """Wait for the run to end (bounded; killed if it does not) and read its stdout."""
        try:
            self.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"the run did not end within {within_s}s:\n{self.stderr}"
            ) from None
        self._reader.join(within_s)
        self._out_reader.join(within_s)
        self.stdout = b"".join(self._out).decode(errors="replace")
        return self.proc.returncode
