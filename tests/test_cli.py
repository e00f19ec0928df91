"""The command line: timeline, JSON report, exit codes 0/1/2, several files in one call."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_twin.cli import main

ROOT = Path(__file__).resolve().parent.parent
NODE_LOSS = str(ROOT / "scenarios" / "node-loss.yaml")

FAILING = """\
name: too-hopeful
duration: 2m
cluster:
  fabrics:
    ib-a: [node01, node02]
profiles:
  p:
    engine: sim
    nodes: 2
    gpus_per_node: 4
    load_time: 20s
    model: /m
deployments:
  - {model: m, profile: p, replicas: 1}
expect:
  - event: replica.ready
    within: [start, 10s]
"""


def test_run_prints_a_timeline_and_a_passing_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", NODE_LOSS]) == 0
    out = capsys.readouterr().out
    assert "node.lost" in out and "node=node02" in out
    assert "$ llmgw-twin sim-engine --model /models/llama-70b" in out
    assert out.strip().splitlines()[-1].startswith("PASS node-loss: 4/4 expectations")


def test_json_report_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", NODE_LOSS]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("scenario", "seed", "passed", "trace_sha256", "virtual_ms", "wall_ms", "events"):
        assert key in report
    assert report["scenario"] == "node-loss" and report["seed"] == 1 and report["passed"]
    assert report["virtual_ms"] == 360_000
    lost = [e for e in report["events"] if e["kind"] == "node.lost"]
    assert lost[0]["node"] == "node02" and 170_000 <= lost[0]["t_ms"] <= 181_000
    assert all(e["passed"] and e["message"] for e in report["expectations"])
    assert {i["name"] for i in report["invariants"]} == {
        "single_fabric",
        "gpu_exclusive",
        "ready_is_whole",
        "routes_to_ready",
        "no_orphans",
        "one_epoch_acts",
    }


def test_failed_expectation_exits_1_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "too-hopeful.yaml"
    path.write_text(FAILING)
    assert main(["run", str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  line 16" in out
    assert "none in [0.000s, 10.000s]; nearest at 22.000s" in out
    assert out.strip().splitlines()[-1].startswith("FAIL too-hopeful: 0/1 expectations")


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("name: x\nduration: 1m\ncluster: {fabrics: {f: [a]}\n", ":4:1:", "invalid YAML"),
        ("name: x\nduration: 1m\nbogus: 1\ncluster: {fabrics: {f: [a]}}\n", ":3:1:", "bogus"),
        ("name: x\nduration: 1 minute\ncluster: {fabrics: {f: [a]}}\n", ":2:11:", "duration"),
        (
            "name: x\nduration: 1m\ncluster: {fabrics: {f: [a]}}\nfaults:\n"
            "  - {at: 10s, kill_node: nope}\n",
            ":5:",
            "nope",
        ),
    ],
    ids=["bad-yaml", "unknown-key", "bad-duration", "unknown-node"],
)
def test_invalid_scenario_exits_2_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str, what: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}{where}" in err
    assert what in err
    assert "Traceback" not in err


def test_several_files_worst_exit_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [\n")
    failing = tmp_path / "failing.yaml"
    failing.write_text(FAILING)
    assert main(["run", "-q", NODE_LOSS, str(failing)]) == 1
    assert main(["run", "-q", NODE_LOSS, str(bad), str(failing)]) == 2
    out = capsys.readouterr().out
    assert out.count("PASS node-loss") == 2 and out.count("FAIL too-hopeful") == 2


def test_installed_console_script_runs_the_main_job() -> None:
    beside = Path(sys.executable).parent / "llmgw-twin"  # the venv's, else the one on PATH
    exe = str(beside) if beside.exists() else shutil.which("llmgw-twin")
    assert exe is not None, "llmgw-twin is not installed"
    done = subprocess.run(
        [exe, "run", "-q", NODE_LOSS], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("PASS node-loss")
