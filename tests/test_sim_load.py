"""The sim engine's load time counts from its process's start, as a real engine's load does.

A shard launched on a busy machine spends part of its load time starting Python and importing
its web stack; that part is not added on top, so the shard serves `--load-time-ms` after launch
(the twin's model of it) unless starting alone takes longer.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from typing import Any

import pytest

from llmgw_twin.programs import sim_server


def _config(load_time_ms: int) -> sim_server.EngineConfig:
    args = argparse.ArgumentParser()
    sim_server.add_arguments(args)
    return sim_server._config(
        args.parse_args(["--model", "/models/m", "--load-time-ms", str(load_time_ms)])
    )


@pytest.mark.parametrize(
    ("age_s", "load_ms", "slept_s"),
    [(0.5, 2000, 1.5), (0.0, 2000, 2.0), (3.0, 2000, 0.0), (0.2, 0, 0.0)],
)
def test_the_load_waits_only_what_the_start_up_left(
    monkeypatch: pytest.MonkeyPatch, age_s: float, load_ms: int, slept_s: float
) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float, *a: Any) -> None:
        slept.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(sim_server, "process_age_s", lambda: age_s)
    monkeypatch.setattr(asyncio, "sleep", sleep)
    asyncio.run(sim_server._load(_config(load_ms)))
    assert slept == [pytest.approx(slept_s)]


def test_the_process_age_is_read_from_the_process_start() -> None:
    # A child that waits 0.3 s before it asks must be at least that old (to the clock tick):
    # the age is the process's, not the time since the module was imported.
    code = (
        "import time; time.sleep(0.3); "
        "from llmgw_twin.programs.sim_server import process_age_s; print(process_age_s())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert float(out.stdout) >= 0.29
    assert sim_server.process_age_s() > 0.0
