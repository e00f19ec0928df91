"""`llmgw-twin sweep`: one scenario over a grid of settings and seeds (docs/sweep.md).

What the figures must show is the trade-off the command is for, on
`scenarios/lost-timeout-tradeoff.yaml`: a lost timeout shorter than the late heartbeats' gap
declares a healthy node lost (a false loss), a longer one detects the real loss later; the
detection time follows the timeout. The grid's scenarios are checked before anything runs, and
the figures are the same whether the runs go over processes or in this one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmgw_twin.cli import main
from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.sweep.measure import measure, silences
from llmgw_twin.twin.world.runner import run_scenario

ROOT = Path(__file__).resolve().parent.parent
TRADEOFF = str(ROOT / "scenarios" / "lost-timeout-tradeoff.yaml")


def _sweep(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    assert main(["sweep", *argv, "--json"]) == 0
    out: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return out


def test_the_lost_timeout_trades_false_losses_for_detection_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plot = tmp_path / "sweep.svg"
    argv = [TRADEOFF, "--grid", "node_lost_after=15s,30s,60s", "--seeds", "2", "--jobs", "2"]
    rows = _sweep(capsys, *argv, "--plot", str(plot))
    by = {r["point"]["node_lost_after"]: r for r in rows}
    assert list(by) == ["15s", "30s", "60s"]
    # node02's heartbeats come 20 s late: a 15 s timeout declares it lost, 30 s and 60 s do not
    assert by["15s"]["false_losses"]["least"] == 1
    assert by["30s"]["false_losses"]["most"] == 0 and by["60s"]["false_losses"]["most"] == 0
    # node05 really dies: found within each timeout, later as the timeout grows
    detect = [by[k]["detection_ms"] for k in ("15s", "30s", "60s")]
    for d, limit in zip(detect, (15_000, 30_000, 60_000), strict=True):
        assert d["seeds_without"] == 0 and d["most"] <= limit
    assert detect[0]["most"] < detect[1]["least"] and detect[1]["most"] < detect[2]["least"]
    assert by["30s"]["passed"]["mean"] == 1.0  # the file's own timings pass its expectations
    text = plot.read_text()
    assert text.startswith("<svg") and "false losses" in text and "node_lost_after" in text


def test_processes_and_this_process_give_the_same_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [TRADEOFF, "--grid", "heartbeat_interval=2s,5s", "--grid", "replicas.chat=3,4"]
    here = _sweep(capsys, *argv, "--seeds", "2", "--jobs", "1")
    over = _sweep(capsys, *argv, "--seeds", "2", "--jobs", "2")
    assert here == over
    assert [tuple(r["point"].values()) for r in here] == [
        ("2s", "3"),
        ("2s", "4"),
        ("5s", "3"),
        ("5s", "4"),
    ]


def test_a_table_is_printed_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", TRADEOFF, "--grid", "node_lost_after=15s,30s", "--seeds", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["point", "detection", "(ms)"]
    assert [line.split()[0] for line in out[1:]] == ["node_lost_after=15s", "node_lost_after=30s"]


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ("nonsense=1,2", "not a key a sweep varies"),
        ("node_lost_after", "expected KEY=V1,V2"),
        ("replicas.nope=1,2", "the file deploys no model 'nope'"),
        ("node_lost_after=4s,30s", "node_lost_after=4s: timings: heartbeat_interval"),
        ("heartbeat_interval=1s,1s", "listed twice"),
    ],
)
def test_a_bad_grid_is_one_line_and_runs_nothing(
    capsys: pytest.CaptureFixture[str], grid: str, message: str
) -> None:
    assert main(["sweep", TRADEOFF, "--grid", grid]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_true_and_false_losses_are_told_apart() -> None:
    scenario = load_scenario(TRADEOFF)
    assert silences(scenario) == {"node05": [(300_000, 1 << 62)]}
    m = measure(run_scenario(scenario))
    assert m.false_losses == 0 and m.detection_ms is not None and m.detection_ms <= 30_000
    assert m.passed


def test_an_autoscaler_target_trades_replica_hours_for_latency(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(ROOT / "scenarios" / "autoscale-from-zero.yaml")
    rows = _sweep(capsys, path, "--grid", "target.llama-8b=4,24", "--seeds", "1", "--jobs", "1")
    low, high = rows
    assert low["point"] == {"target.llama-8b": "4"}
    assert low["replica_hours"]["mean"] > high["replica_hours"]["mean"]
    assert low["ttft_p99_ms"]["mean"] <= high["ttft_p99_ms"]["mean"]
    assert low["slo_met"]["mean"] is not None
