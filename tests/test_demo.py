"""`llmgw-twin demo` as a user runs it: started, a request sent with the curl line it prints,
a node killed with the `kill` line it prints, the failover awaited in its own event lines (the
replica ready again on the other fabric), then stopped with SIGTERM, leaving nothing running
and no folder behind. Its processes are told from any other run's by a TMPDIR of the test's own,
which each of them inherits (`helpers/real_runs.py`)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from helpers.real_runs import alive_groups, cmdlines, marked

START_S = 120.0
"""Four agents, a controller and a router started, and the replica ready, on a busy machine."""
FAILOVER_S = 60.0
STOP_S = 30.0


class Demo:
    """The demo in a session of its own; its standard output read line by line as it comes."""

    def __init__(self, tmpdir: Path, *extra_env: tuple[str, str]) -> None:
        tmpdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TMPDIR": str(tmpdir), **dict(extra_env)}
        self.proc = subprocess.Popen(  # our own interpreter, a fixed argv
            [sys.executable, "-m", "llmgw_twin.cli", "demo"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._lock:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def output(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, within_s: float, after: int = 0) -> re.Match[str]:
        """The first line from line `after` on that matches `pattern`."""
        deadline = time.monotonic() + within_s
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            with self._lock:
                for line in self.lines[after:]:
                    if m := regex.search(line):
                        return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"the demo ended ({self.proc.returncode}):\n{self.output}")
            time.sleep(0.05)  # a line still to come from the demo
        raise AssertionError(f"no line matching {pattern!r} within {within_s}s:\n{self.output}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=STOP_S)
            raise AssertionError(f"the demo did not stop on SIGTERM:\n{self.output}") from None


def printed_argv(line: str) -> list[str]:
    """A command line as the demo printed it, its comment dropped, split as a shell splits it."""
    return shlex.split(line.split("  #", 1)[0].strip())


def send_as_curl(line: str) -> httpx.Response:
    """What the printed `curl -s URL -H HEADER -d BODY` sends, sent (curl itself may not be
    installed where the tests run; the words are read exactly as curl reads them)."""
    argv = printed_argv(line)
    assert argv[:2] == ["curl", "-s"] and argv[3] == "-H" and argv[5] == "-d", argv
    name, _, value = argv[4].partition(": ")
    return httpx.post(argv[2], headers={name: value}, content=argv[6], timeout=30)


def test_the_demo_serves_fails_over_when_told_and_stops_clean(tmp_path: Path) -> None:
    tmpdir = tmp_path / "tmp"
    demo = Demo(tmpdir)
    groups: set[int] = set()
    try:
        ready = demo.wait_for(
            r"^ready: replica (\S+) of tiny on (\S+), (\S+) \((ib-[ab])\)", START_S
        )
        fabric = ready.group(4)
        other = "ib-b" if fabric == "ib-a" else "ib-a"
        groups = set(marked(tmpdir).values())
        assert groups, "the demo's processes carry its TMPDIR"

        curl = demo.wait_for(r"send a request: +(curl .*)$", 5).group(1)
        answer = send_as_curl(curl)
        assert answer.status_code == 200 and answer.json()["object"] == "chat.completion"

        page = demo.wait_for(r"watch the page: +(http://127\.0\.0\.1:\d+/status#token=\S+)", 5)
        ctl = demo.wait_for(r"see the fleet: +llmgw-twin (ctl status .*)$", 5).group(1)
        status = subprocess.run(
            [sys.executable, "-m", "llmgw_twin.cli", *shlex.split(ctl)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert status.returncode == 0 and "tiny" in status.stdout, status
        assert page.group(1).startswith("http://127.0.0.1:")

        kill = demo.wait_for(r"kill a node: +(kill -9 \d+ .*)$", 5)
        victim = re.search(r"# (node\d+)'s agent", kill.group(1))
        assert victim is not None and victim.group(1) in (ready.group(2), ready.group(3))
        mark = len(demo.lines)
        argv = printed_argv(kill.group(1))
        assert argv[:2] == ["kill", "-9"] and len(argv) == 3, argv
        os.kill(int(argv[2]), signal.SIGKILL)  # what `kill -9 PID` does
        demo.wait_for(rf"node\.lost +node={victim.group(1)}", FAILOVER_S, after=mark)
        demo.wait_for(rf"replica\.ready .*fabric={other} model=tiny", FAILOVER_S, after=mark)
        groups |= set(marked(tmpdir).values())
    finally:
        code = demo.stop()
    assert code == 0, demo.output
    assert "stopped; nothing is left running" in demo.output
    left = marked(tmpdir)
    assert not left, cmdlines(set(left))
    assert not alive_groups(groups)
    assert not list(tmpdir.glob("llmgw-demo-*")), "the demo's folder is removed"


def test_two_demos_at_once_choose_their_own_ports(tmp_path: Path) -> None:
    """Every port is chosen at run time: a second demo beside the first starts as well."""
    first, second = Demo(tmp_path / "a"), Demo(tmp_path / "b")
    try:
        urls = []
        for demo in (first, second):
            demo.wait_for(r"^ready: replica", START_S)
            urls.append(demo.wait_for(r"watch the page: +(http://\S+)/status", 5).group(1))
        assert urls[0] != urls[1]
    finally:
        codes = [first.stop(), second.stop()]
    assert codes == [0, 0], first.output + "\n" + second.output
    assert not marked(tmp_path)
