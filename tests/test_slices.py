"""Large operations in slices (`control/slices.py`): no reconcile creates, retires or places more
than `SLICE` replicas, the core asks for the next reconcile at once while work is left, every
pending replica is tried within a round, and the end is what one go would have reached."""

from __future__ import annotations

import pytest

from conftest import T, model, node, profile
from llmgw_twin.control import slices
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import Deployment, ReplicaState, ShardReport, ShardState
from llmgw_twin.control.protocol import (
    ApplyDeployment,
    ApplyProfile,
    Heartbeat,
    NodeRegistered,
    Step,
)
from llmgw_twin.control.slices import SLICE

M = model("big-fleet")
SMALL = model("small")
ONE = profile("one", nodes=1, gpus=8)
"""A replica of a whole node: placed ones are easy to count against the fleet."""


def fleet(nodes: int, gpus: int = 8) -> Controller:
    ctl = Controller(T)
    for i in range(nodes):
        ctl.handle(NodeRegistered(node(f"n{i:04d}", f"ib-{i // 50:02d}", gpus=gpus)), 0)
    return ctl


def settle(ctl: Controller, now: int) -> list[Step]:
    """The reconcile at `now` and every one the core asks for at the same instant."""
    steps = [ctl.tick(now)]
    while steps[-1].wake_at_ms == now:
        assert len(steps) < 100, "the core keeps asking for a reconcile at once"
        steps.append(ctl.tick(now))
    return steps


def count(step: Step, kind: str) -> int:
    return sum(1 for e in step.events if e.kind == kind)


def bring_up(ctl: Controller, now: int) -> None:
    for n in ctl.nodes():
        shards = tuple(
            ShardReport(s, ShardState.SERVING, f"http://{n}:8000", None, ("e", "0"))
            for s in ctl.assigned(n)
        )
        ctl.handle(Heartbeat(n, shards), now)


def test_a_large_deployment_is_placed_a_slice_a_reconcile() -> None:
    want = 3 * SLICE + 7
    ctl = fleet(want + 10)
    ctl.handle(ApplyProfile(ONE), 0)
    ctl.handle(ApplyDeployment(Deployment(M, ONE.name, want)), 0)
    steps = settle(ctl, 1_000)
    assert len(steps) == 4
    assert [count(s, "replica.placed") for s in steps] == [SLICE, SLICE, SLICE, 7]
    assert [s.wake_at_ms == 1_000 for s in steps] == [True, True, True, False]
    live = ctl.live_replicas(M)
    assert len(live) == want and all(r.placed for r in live)
    assert len({r.nodes for r in live}) == want  # one node each: nothing booked twice


def _scaled_down(monkeypatch: pytest.MonkeyPatch, cut: bool) -> tuple[list[str], list[Step]]:
    if not cut:
        monkeypatch.setattr(slices, "SLICE", 10**9)
    ctl = fleet(2 * SLICE + 40)
    ctl.handle(ApplyProfile(ONE), 0)
    ctl.handle(ApplyDeployment(Deployment(M, ONE.name, 2 * SLICE + 30)), 0)
    settle(ctl, 1_000)
    bring_up(ctl, 1_500)
    settle(ctl, 2_000)
    assert len(ctl.ready_replicas(M)) == 2 * SLICE + 30
    ctl.handle(ApplyDeployment(Deployment(M, ONE.name, 3)), 2_500)
    steps = settle(ctl, 3_000)
    reaped = [str(e.get("replica")) for s in steps for e in s.events if e.kind == "replica.reaped"]
    return reaped, steps


def test_a_large_scale_down_retires_a_slice_a_reconcile_what_one_go_retires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_slices, steps = _scaled_down(monkeypatch, cut=True)
    assert [count(s, "replica.reaped") for s in steps] == [SLICE, SLICE, 27]
    in_one_go, steps = _scaled_down(monkeypatch, cut=False)
    assert len(steps) == 1
    assert in_slices == in_one_go  # the same replicas, in the same order


def test_a_round_reaches_the_replicas_behind_ones_that_never_fit() -> None:
    """The largest go first in the placement order: a slice's worth of replicas too large for
    any node must not keep the small ones behind them from being tried."""
    ctl = fleet(20, gpus=4)  # no node has the 8 GPUs that ONE needs
    small = profile("small", nodes=1, gpus=1)
    ctl.handle(ApplyProfile(ONE), 0)
    ctl.handle(ApplyProfile(small), 0)
    ctl.handle(ApplyDeployment(Deployment(M, ONE.name, SLICE + 10)), 0)
    ctl.handle(ApplyDeployment(Deployment(SMALL, small.name, 5)), 0)
    steps = settle(ctl, 1_000)
    assert len(steps) <= 3
    assert len(ctl.live_replicas(SMALL)) == 5
    assert all(r.placed for r in ctl.live_replicas(SMALL))
    assert not any(r.placed for r in ctl.live_replicas(M))
    # the round is over: nothing is tried again until something changes
    later = settle(ctl, 2_000)
    assert len(later) == 1 and count(later[0], "replica.placed") == 0
    assert all(r.state is ReplicaState.PENDING for r in ctl.live_replicas(M))
