"""Progress of long runs goes to stderr and only there: stdout (a report, JSON) stays the same.

`llmgw-twin fuzz` (docs/fuzzing.md, "Progress"): a tqdm bar when stderr is a terminal (a real
pseudo-terminal here), plain lines otherwise, nothing with --quiet; the benchmarks' step lines;
real mode's lines while nothing happens and while it stops its processes.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from helpers.real_runs import marked
from llmgw_twin.cli import main
from llmgw_twin.realmode import runner
from llmgw_twin.twin.fuzz import cli as fuzz_cli
from llmgw_twin.twin.fuzz.judge import check_batch
from test_fuzz import _plant
from test_real_mode import own_tmp

__all__ = ["own_tmp"]  # a fixture, used by name

ROOT = Path(__file__).resolve().parent.parent
PROGRESS_LINE = re.compile(r"^fuzz: (\d+)/(\d+) seeds \((\d+)%\), (.*); (\S+) elapsed, ETA (\S+), ")
FUZZ = [sys.executable, "-m", "llmgw_twin.cli", "fuzz", "--seeds", "1..4", "--jobs", "1"]


def _run(argv: list[str], tmp: Path) -> tuple[int, str, str]:
    """stdout and stderr both piped (stderr is no terminal)."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False, cwd=tmp)
    return done.returncode, done.stdout, done.stderr


def _run_on_a_terminal(argv: list[str], tmp: Path) -> tuple[int, str, str]:
    """stdout piped, stderr a pseudo-terminal of 120 columns, as an interactive shell's."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, cwd=tmp) as proc:
        os.close(follower)
        seen = b""
        while True:  # until the child's end closes (EIO on Linux)
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        code = proc.wait(timeout=180)
    os.close(leader)
    return code, out, seen.decode(errors="replace")


def test_fuzz_progress_is_on_stderr_and_stdout_is_the_same_report_with_or_without_it(
    tmp_path: Path,
) -> None:
    code, out, err = _run(FUZZ, tmp_path)
    assert code == 0, err
    lines = err.splitlines()
    first, last = PROGRESS_LINE.match(lines[0]), PROGRESS_LINE.match(lines[-1])
    assert first is not None and last is not None, err
    assert first.group(1, 2, 4, 6) == ("0", "4", "0 failed", "?")  # no rate yet: no ETA
    assert last.group(1, 2, 3, 4, 6) == ("4", "4", "100", "0 failed", "00:00")
    assert all(PROGRESS_LINE.match(line) for line in lines), err  # nothing else on stderr
    assert out.startswith("fuzz: 4 seeds, 0 failed; liveness asserted in ")
    assert "seeds (" not in out

    code_tty, out_tty, err_tty = _run_on_a_terminal(FUZZ, tmp_path)
    assert code_tty == 0, err_tty
    assert out_tty == out  # the same seeds, the same report: progress left no trace in it
    # a bar redrawn in place (tqdm draws at most every 0.1 s, so which counts show varies)
    assert "\r" in err_tty and re.search(r"fuzz: +\d+%\|.*\| \d/4 seeds, 0 failed \[", err_tty)

    code_q, out_q, err_q = _run([*FUZZ, "--quiet"], tmp_path)
    assert (code_q, err_q) == (0, "")
    assert out_q.splitlines() == [out.splitlines()[0]]  # the summary's first line alone
    code_qt, _, err_qt = _run_on_a_terminal([*FUZZ, "-q"], tmp_path)
    assert (code_qt, err_qt) == (0, "")


def test_fuzz_lines_come_as_often_as_asked_and_count_failures_as_they_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fuzz_cli, "PLAIN_EVERY_S", 0.0)  # a line after every batch
    _plant(monkeypatch, "placement-spans-fabrics")  # seed 5 fails with it, seed 4 does not
    assert main(["fuzz", "--seeds", "4..5", "--jobs", "1", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    matches = [PROGRESS_LINE.match(line) for line in captured.err.splitlines()]
    assert all(matches), captured.err
    got = [m.group(1, 4) for m in matches if m is not None]
    assert got == [("0", "0 failed"), ("1", "0 failed"), ("2", "1 failed (5)")]
    assert "FAIL seed 5 [invariant:single_fabric]" in captured.out
    assert "seeds (" not in captured.out


def test_a_sweep_stopped_early_says_how_far_it_got() -> None:
    class Stream:
        def __init__(self) -> None:
            self.text = ""

        def write(self, s: str) -> int:
            self.text += s
            return len(s)

        def flush(self) -> None:
            return None

        def isatty(self) -> bool:
            return False

    stream = Stream()
    progress = fuzz_cli.Progress(10, stream)  # type: ignore[arg-type]
    progress.advance(check_batch([1]))
    progress.close()
    lines = stream.text.splitlines()
    assert [PROGRESS_LINE.match(line).group(1, 2, 3) for line in lines] == [  # type: ignore[union-attr]
        ("0", "10", "0"),
        ("1", "10", "10"),
    ]


def test_a_benchmarks_steps_go_to_stderr_and_its_rows_to_stdout(tmp_path: Path) -> None:
    # a tiny fleet: the smoke size, not a measurement
    script = ROOT / "benchmarks" / "fleet.py"
    code, out, err = _run(
        [sys.executable, str(script), "--nodes", "100", "--minutes", "1"], tmp_path
    )
    assert code == 0, err
    steps = err.splitlines()
    assert [re.sub(r"^\[fleet +[\d.]+s\] ", "", s).split(" (")[0] for s in steps] == [
        "building a fleet of 100 nodes",
        "the twin: 100 nodes, 1 min virtual",
        "bare SimPy on the same heartbeat pattern",
    ]
    assert out.splitlines()[0] == "fleet: 100 nodes, 800 GPUs, 1 min virtual"
    assert not any(line.startswith("[fleet") for line in out.splitlines())


def test_real_mode_says_it_is_still_running_and_stopping_on_stderr_and_json_stays_clean(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, own_tmp: Path
) -> None:
    monkeypatch.setattr(runner, "QUIET_S", 0.0)  # a line whenever nothing else was said
    before = set(marked(own_tmp))
    path = own_tmp / "one.yaml"
    path.write_text(ONE_REPLICA)
    assert main(["run", "--real", "--json", "--time-scale", "0.1", str(path)]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout is the one JSON report, nothing else
    assert report["passed"] and report["left_running"] == []
    assert set(marked(own_tmp)) - before == set()
    lines = captured.err.splitlines()
    assert all(line.startswith("[one-replica] ") for line in lines), captured.err
    assert any("replica.ready" in line for line in lines)
    assert any(line.endswith(" of 3.000s, running, nothing new") for line in lines), lines
    assert lines[-1] == "[one-replica] stopping every process the run started"


ONE_REPLICA = """\
name: one-replica
duration: 30s
cluster:
  fabrics:
    ib-a: [node01]
profiles:
  p:
    engine: sim
    nodes: 1
    gpus_per_node: 1
    load_time: 2s
    model: /m
deployments:
  - {model: m, profile: p, replicas: 1}
expect:
  - event: replica.ready
    within: [start, 25s]
"""
