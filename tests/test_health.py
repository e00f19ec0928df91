"""Node health from heartbeats: thresholds, recovery, and O(1) bookkeeping order."""

from __future__ import annotations

from llmgw_twin.control.health import HealthChange, HealthTracker
from llmgw_twin.control.model import NodeId, NodeState, Timings

T = Timings(heartbeat_interval_ms=10_000, node_suspect_after_ms=30_000, node_lost_after_ms=60_000)
A, B = NodeId("a"), NodeId("b")


def test_first_heartbeat_is_a_join_and_repeats_change_nothing() -> None:
    h = HealthTracker(T)
    assert h.seen(A, 0) == HealthChange(A, None, NodeState.ALIVE)
    assert h.seen(A, 10_000) is None
    assert h.state(A) is NodeState.ALIVE


def test_silence_goes_suspect_then_lost_exactly_at_the_thresholds() -> None:
    h = HealthTracker(T)
    h.seen(A, 5_000)
    assert h.expire(34_999) == []
    assert h.expire(35_000) == [HealthChange(A, NodeState.ALIVE, NodeState.SUSPECT)]
    assert h.expire(64_999) == []
    assert h.expire(65_000) == [HealthChange(A, NodeState.SUSPECT, NodeState.LOST)]
    assert h.state(A) is NodeState.LOST
    assert h.expire(1_000_000) == []


def test_a_long_gap_goes_straight_through_suspect_to_lost_in_one_pass() -> None:
    h = HealthTracker(T)
    h.seen(A, 0)
    assert h.expire(60_000) == [
        HealthChange(A, NodeState.ALIVE, NodeState.SUSPECT),
        HealthChange(A, NodeState.SUSPECT, NodeState.LOST),
    ]


def test_a_heartbeat_recovers_a_suspect_or_lost_node() -> None:
    h = HealthTracker(T)
    h.seen(A, 0)
    h.expire(30_000)
    assert h.seen(A, 31_000) == HealthChange(A, NodeState.SUSPECT, NodeState.ALIVE)
    h.expire(100_000)
    assert h.state(A) is NodeState.LOST
    assert h.seen(A, 100_001) == HealthChange(A, NodeState.LOST, NodeState.ALIVE)


def test_only_the_silent_node_expires_and_deadline_tracks_the_oldest() -> None:
    h = HealthTracker(T)
    h.seen(A, 0)
    h.seen(B, 1_000)
    h.seen(A, 20_000)  # A moves behind B
    assert h.next_deadline_ms() == 31_000
    assert h.expire(31_000) == [HealthChange(B, NodeState.ALIVE, NodeState.SUSPECT)]
    assert h.state(A) is NodeState.ALIVE
    assert h.next_deadline_ms() == 50_000  # A's suspect deadline comes before B's lost one
