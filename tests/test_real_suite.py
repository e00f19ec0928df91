"""Every scenario file on real processes: `llmgw-twin run --real --compare` at time scale 0.1
passes, with the twin's control decisions, and leaves no process of its own behind.

This is the whole suite in real mode, about half an hour of wall time with two workers on two
cores, so it is not part of the default run (`-m "not real_suite"` in the project's pytest
options); run it with

    make test-real        (= pytest -m real_suite -n 2)

With `LLMGW_REAL_REPORTS=DIR` set, each file's JSON report is also written to `DIR/NAME.json`,
and `benchmarks/real_fidelity.py --reports DIR` prints the fidelity table of that run.

Each file runs in a TMPDIR of its own (its processes carry it, and only they are looked at), so
two workers, or another run of the project on the machine, keep apart. A failure prints the
expectations that failed, the differences in decisions and the fidelity table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers.real_runs import marked

ROOT = Path(__file__).resolve().parents[1]
REFUSED = {
    "autoscale-diurnal": "the autoscaler runs in the twin only",
    "autoscale-from-zero": "the autoscaler runs in the twin only",
    "controller-clock-skew": "without a per-process clock (faketime)",
}
"""Files whose faults real mode has no means for yet: refused up front, exit 2, with the reason
(`realmode/refusals.py`, `REFUSED`)."""
FILES = [f for f in sorted((ROOT / "scenarios").glob("*.yaml")) if f.stem not in REFUSED]
TIME_SCALE = "0.1"
MAX_S = 420.0
"""The longest file (16 virtual minutes) takes about 100 s at 0.1; this bounds a stuck run."""


def run_real(path: Path, tmp: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "llmgw_twin.cli", "run", "--real", "--compare", "--json"]
    argv += ["--time-scale", TIME_SCALE, str(path)]
    done = subprocess.run(  # our own interpreter, a fixed argv
        argv,
        capture_output=True,
        text=True,
        timeout=MAX_S,
        env={**os.environ, "TMPDIR": str(tmp)},
        check=False,
    )
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"exit {done.returncode}, no report:\n{done.stderr[-3000:]}")
    return report


def explain(report: dict[str, Any]) -> str:
    fid = report.get("fidelity", {})
    lines = [
        f"line {e['line']} {e['text']}: {e['message']}"
        for e in report["expectations"]
        if not e["passed"]
    ]
    lines += [f"invariant {i['name']}: {v}" for i in report["invariants"] for v in i["violations"]]
    lines += [f"left running: {g}" for g in report.get("left_running", [])]
    lines += [f"differs: {d}" for d in fid.get("differences", [])]
    lines += [f"fidelity: {row}" for row in fid.get("rows", [])]
    return "\n".join(lines)


@pytest.mark.real_suite
@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_the_scenario_passes_on_real_processes_with_the_twins_decisions(
    path: Path, tmp_path: Path
) -> None:
    report = run_real(path, tmp_path)
    if keep := os.environ.get("LLMGW_REAL_REPORTS"):
        Path(keep).mkdir(parents=True, exist_ok=True)
        report["file"] = path.stem
        (Path(keep) / f"{path.stem}.json").write_text(json.dumps(report))
    assert report["passed"], explain(report)
    assert not report["left_running"], explain(report)
    assert report["fidelity"]["same_decisions"], explain(report)
    assert not marked(tmp_path), "processes of this run are still running"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_file_real_mode_has_no_means_for_is_refused_with_its_reason(name: str) -> None:
    """Checked before anything starts: quick, so part of the default run."""
    done = subprocess.run(  # our own interpreter, a fixed argv
        [
            sys.executable,
            "-m",
            "llmgw_twin.cli",
            "run",
            "--real",
            str(ROOT / "scenarios" / f"{name}.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"{name}.yaml:" in done.stderr
    assert "not supported in real mode yet" in done.stderr
    assert REFUSED[name] in done.stderr
