"""The controller's reconciles keep one phase: a late reconcile (a busy host) does not move
the later ones, one later than a whole interval skips what it missed, and the first comes a
whole interval after the controller's start (agents have that long to answer). In the twin
every reconcile runs on time, so its traces are what they were; real mode starts its clock on
this grid (`docs/real-mode.md`). Each core here has a replica it cannot place (no node), so
every reconcile of the grid is needed; an idle core skips to a later one of the same grid
(`tests/test_idle_reconciles.py`)."""

from __future__ import annotations

from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    ModelName,
    Profile,
    ProfileName,
    Timings,
)
from llmgw_twin.control.protocol import ApplyDeployment, ApplyProfile

INTERVAL = 1_000


def core() -> Controller:
    """A core with one replica pending for good: busy at every reconcile."""
    c = Controller(Timings(reconcile_interval_ms=INTERVAL))
    profile = Profile(ProfileName("p"), EngineName("sim"), 1, 1, "m")
    c.handle(ApplyProfile(profile), 0)
    c.handle(ApplyDeployment(Deployment(ModelName("m"), profile.name, 1)), 0)
    return c


def test_late_reconciles_do_not_move_the_grid() -> None:
    c = core()
    assert c.reconcile_due_ms is None
    assert c.start(0).wake_at_ms == 1_000
    assert c.tick(1_003).wake_at_ms == 2_000  # 3 ms late: the next is still on the grid
    assert c.tick(2_000).wake_at_ms == 3_000
    assert c.tick(5_500).wake_at_ms == 6_000  # 2.5 intervals late: the missed ones skipped
    assert c.tick(6_000).wake_at_ms == 7_000 == c.reconcile_due_ms


def test_a_restarted_controller_reconciles_first_one_interval_after_its_start() -> None:
    c = core()  # agents have a whole interval to answer its report requests
    assert c.start(4_080).wake_at_ms == 5_080
    assert c.tick(5_090).wake_at_ms == 6_080  # its own phase from then on
