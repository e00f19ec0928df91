"""Engine processes for tests: start one in its own group, watch its log, see what it listens
on, and always clean it up (shared by the sim engine and llama-server tests)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

DEADLINE_S = 20.0


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process `pid` listens on: its socket inodes among /proc/net's LISTEN rows."""
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def refuses(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


class Engine:
    """One engine process in its own session, its stderr collected line by line as it comes."""

    def __init__(self, argv: tuple[str, ...], name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            argv,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<eof>")
            self._changed.notify_all()

    @property
    def log(self) -> str:
        with self._changed:
            return f"--- {self.name} ({' '.join(self.argv)})\n" + "\n".join(self.lines)

    def wait_log(self, fragment: str, within_s: float = DEADLINE_S) -> str:
        """The first log line containing `fragment`; fails if the process ends or time runs out."""

        def found() -> str | None:
            return next((line for line in self.lines if fragment in line), None)

        with self._changed:
            self._changed.wait_for(
                lambda: found() is not None or "<eof>" in self.lines, timeout=within_s
            )
            line = found()
        if line is None:
            raise AssertionError(f"{self.name} never logged {fragment!r}\n{self.log}")
        return line

    def wait_exit(self, within_s: float = DEADLINE_S) -> int:
        try:
            return self.proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {within_s}s\n{self.log}"
            ) from None

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.signal(signal.SIGKILL)  # anything the engine left in its group
        self._reader.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
