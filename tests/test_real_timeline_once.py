"""`run --real --compare` prints its timeline once: the progress lines (stderr) give each event
as it happens, and the report at the end (stdout) counts them instead of listing them again,
then gives the requests, the results, the fidelity table and the verdict. The run itself is
stood in for by the twin's (the same events, reported the same way), so no process starts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw_twin.cli import main
from llmgw_twin.realmode import runner
from llmgw_twin.realmode.runner import RealResult
from llmgw_twin.twin.report.text import describe
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.twin.scenario.timescale import scale_scenario
from llmgw_twin.twin.world.runner import run_scenario
from llmgw_twin.units import fmt_offset

ROOT = Path(__file__).resolve().parent.parent


def _as_if_real(
    scenario: Scenario,
    time_scale: float,
    tolerance_ms: int,
    progress: Callable[[str], None] | None = None,
) -> RealResult:
    """The twin's run of the scaled file, each event said as real mode's runner says it."""
    twin = run_scenario(scale_scenario(scenario, time_scale))
    for ev in twin.trace:
        if progress is not None:
            progress(f"{fmt_offset(ev.t_ms)} {ev.kind} {describe(ev)}")
    return RealResult(
        twin.scenario,
        time_scale,
        tolerance_ms,
        list(twin.trace),
        list(twin.expectations),
        list(twin.invariants),
        wall_ms=1,
    )


def test_the_timeline_is_printed_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "run_real", _as_if_real)
    path = str(ROOT / "scenarios" / "node-loss.yaml")
    assert main(["run", "--real", "--time-scale", "0.1", "--compare", path]) == 0
    out, err = capsys.readouterr()
    lost = [line for line in err.splitlines() if " node.lost " in line]
    assert len(lost) == 1, err  # each event once, as it happened
    # no event line (an offset, then the kind) in the report at the end
    assert not re.search(r"^ +[+-][0-9m.]+s +node\.(lost|joined) ", out, re.M), out
    assert "events, each printed above as it happened" in out
    assert "fidelity (twin vs real, same scaled file)" in out
    assert "PASS node-loss (real)" in out
