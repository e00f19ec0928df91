"""A stop signal to `llmgw-twin run --real` ends every process the run started and removes its
temporary folder: one line says so, no traceback, exit status 128 + the signal's number."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from helpers.real_runs import RealRunProcess, alive_groups, cmdlines, marked

SCENARIO = """\
name: signalled
description: one two-node replica that keeps serving, the run stopped long before its end
duration: 20m
timings: {heartbeat_interval: 10s, node_lost_after: 60s, reconcile_interval: 1s}
cluster:
  fabrics:
    ib-a: [node01, node02]
  nodes:
    default: {gpus: 8, engines: [sim]}
profiles:
  p2: {engine: sim, nodes: 2, gpus_per_node: 4, load_time: 5s, model: /models/m}
deployments:
  - {model: m, profile: p2, replicas: 1}
expect:
  - at: end
    ready_replicas: {m: 1}
"""

UP_WITHIN_S = 90.0
"""Start-up of a controller, two agents and a replica's four processes, on a busy machine."""
STOP_WITHIN_S = 60.0


@pytest.mark.parametrize(
    ("sig", "status"),
    [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)],
    ids=["SIGTERM", "SIGINT", "SIGHUP"],
)
def test_a_stop_signal_ends_every_process_of_the_run_and_removes_its_folder(
    tmp_path: Path, sig: signal.Signals, status: int
) -> None:
    path = tmp_path / "signalled.yaml"
    path.write_text(SCENARIO)
    run = RealRunProcess(tmp_path / "tmp", "--time-scale", "0.1", str(path))
    try:
        folder = Path(run.wait_for_line(r"temporary folder (\S+)", UP_WITHIN_S)[1])
        assert folder.is_dir() and folder.is_relative_to(run.tmpdir)
        run.wait_for_line(r"replica\.ready .*replica=m-r1", UP_WITHIN_S)
        procs = marked(run.tmpdir)
        procs.pop(run.proc.pid, None)
        groups = set(procs.values())
        started = " | ".join(cmdlines(set(procs)))
        # a controller, two agents, and each shard's sidecar and engine, each in its own group,
        # none in the harness's: a terminal's Ctrl-C to the foreground group reaches it alone
        assert len(groups) >= 7, started
        assert run.proc.pid not in groups, started
        run.proc.send_signal(sig)
        code = run.finish(STOP_WITHIN_S)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.finish(STOP_WITHIN_S)
    err = run.stderr
    assert code == status, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"interrupted by {sig.name}: every process the run started is stopped and its "
        "temporary folder removed"
    )
    assert alive_groups(groups) == set(), cmdlines(set(marked(run.tmpdir)))
    assert marked(run.tmpdir) == {}
    assert not folder.exists()
    assert run.stdout == ""  # no report for a run that did not end


def _await_gone(tmpdir: Path, groups: set[int]) -> None:
    """Until nothing of the run is left (its keeper included), bounded."""
    deadline = time.monotonic() + STOP_WITHIN_S
    while (marked(tmpdir) or alive_groups(groups)) and time.monotonic() < deadline:
        time.sleep(0.05)  # the keeper sweeping, killed processes being reaped by init


def test_a_sigkilled_run_still_ends_every_process_it_started_and_removes_its_folder(
    tmp_path: Path,
) -> None:
    """SIGKILL cannot be caught: the run's keeper, which outlives it, ends its fleet."""
    path = tmp_path / "killed.yaml"
    path.write_text(SCENARIO)
    run = RealRunProcess(tmp_path / "tmp", "--time-scale", "0.1", str(path))
    try:
        folder = Path(run.wait_for_line(r"temporary folder (\S+)", UP_WITHIN_S)[1])
        run.wait_for_line(r"replica\.ready .*replica=m-r1", UP_WITHIN_S)
        procs = marked(run.tmpdir)
        procs.pop(run.proc.pid, None)
        groups = set(procs.values())
        started = " | ".join(cmdlines(set(procs)))
        assert len(groups) >= 7, started  # controller, agents, sidecars, engines, the keeper
        run.proc.kill()
        run.finish(STOP_WITHIN_S)
        _await_gone(run.tmpdir, groups)
    finally:
        for pid in marked(run.tmpdir):  # whatever a failed keeper left: ours alone
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert run.proc.returncode == -signal.SIGKILL
    assert alive_groups(groups) == set(), started
    assert marked(run.tmpdir) == {}
    assert not folder.exists()
