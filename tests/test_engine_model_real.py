"""The engine model on real processes: a scenario with `engine_model` and shaped traffic runs in
real mode, its sim engine serving with `--perf-model`, its clients streaming and timing every
request, and its `slo` judged as in the twin."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from helpers.real_runs import marked
from llmgw_twin.realmode.runner import run_real
from llmgw_twin.twin.scenario.loader import load_scenario
from llmgw_twin.twin.scenario.timescale import scale_scenario
from llmgw_twin.twin.world.runner import run_scenario

LIGHT = Path(__file__).resolve().parents[1] / "scenarios" / "light-slo.yaml"


@pytest.fixture
def own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_modelled_engine_serves_and_is_timed_in_real_mode(own_tmp: Path) -> None:
    before = set(marked(own_tmp))
    scenario = load_scenario(LIGHT)
    result = run_real(scenario, time_scale=0.1)
    assert result.passed, [o.message for o in result.expectations if not o.passed]
    assert set(marked(own_tmp)) - before == set() and not result.left_running
    started = [e for e in result.trace if e.kind == "shard.started"]
    argv = started[0].get("argv") if started else None
    assert isinstance(argv, tuple) and "--perf-model" in argv
    assert result.requests is not None and result.latency is not None
    served = result.latency["llama-8b"]["served"]
    assert isinstance(served, int) and served == result.requests["llama-8b"]["served"] > 50
    # the twin on the same scaled file sends the same requests
    twin = run_scenario(scale_scenario(scenario, 0.1))
    assert twin.requests is not None
    assert twin.requests["llama-8b"]["sent"] == result.requests["llama-8b"]["sent"]
