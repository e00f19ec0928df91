"""Late heartbeats done for real (`realmode/late.py`, `service/agent/late.py`): while a window
of `delay_heartbeats` is under way the node's agent posts each heartbeat it sends that much
later, in the order sent, and its reports of a change on time. The controller hears the node
late, so it turns suspect and recovers when the late ones land, never lost; an engine that dies
meanwhile is reported at once. The same file runs in the twin and on real processes, which must
make the same control decisions; `delay-heartbeats.yaml` and `lost-timeout-tradeoff.yaml` run in
the real suite (`tests/test_real_suite.py`).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from llmgw_twin.service.agent.late import LateHeartbeats, lateness_at
from test_real_faults import both, decisions, events
from test_real_mode import own_tmp

__all__ = ["own_tmp"]  # a fixture, used by name

LATE = """
name: real-late-heartbeats
duration: 2m30s
timings: {heartbeat_interval: 10s, node_lost_after: 60s}
cluster:
  fabrics: {ib-a: [node01, node02]}
profiles:
  one: {engine: sim, nodes: 1, gpus_per_node: 8, load_time: 10s, model: /models/one}
deployments: [{model: m, profile: one, replicas: 2}]
faults:
  - {id: late, at: 30s, delay_heartbeats: {nodes: [node02], by: 35s, for: 1m}}
  - {id: crash, at: 1m10s, kill_engine: {node: node02, replica_of: m}}
expect:
  - {event: node.suspect, node: node02, within: [late+25s, late+45s]}
  - {event: node.recovered, node: node02, within: [late+40s, late+55s]}
  - {event: node.lost, within: [start, end], never: true}
  - {event: node.suspect, node: node01, within: [start, end], never: true}
  - {event: replica.failed, node: node02, within: [crash, crash+100ms]}
  - {at: end, ready_replicas: {m: 2}}
"""


def test_late_heartbeats_make_a_node_suspect_not_lost_and_a_crash_is_told_at_once(
    own_tmp: Path,
) -> None:
    twin, real = both(LATE)
    assert decisions(real.trace, real.scenario.duration_ms) == twin
    (suspect,) = events(real, "node.suspect")
    (recovered,) = events(real, "node.recovered")
    assert suspect.get("node") == recovered.get("node") == "node02"
    assert suspect.t_ms < recovered.t_ms
    # the crash's report was not held back with the heartbeats: failed, then replaced
    (failed,) = events(real, "replica.failed")
    assert failed.get("node") == "node02"
    assert any(e.t_ms > failed.t_ms for e in events(real, "replica.ready"))


def test_the_lateness_in_force_is_the_last_line_made_by_then() -> None:
    text = "100 0\n200 3500\n\n300 0\n"
    assert [lateness_at(text, t) for t in (50, 100, 199, 200, 299, 300, 10**12)] == [
        0,
        0,
        0,
        3500,
        3500,
        0,
        0,
    ]
    with pytest.raises(ValueError):
        lateness_at("200 -1\n", 300)
    with pytest.raises(ValueError):
        lateness_at("200\n", 300)


def test_a_late_heartbeat_is_due_in_the_order_sent(tmp_path: Path) -> None:
    late = LateHeartbeats(tmp_path / "late")
    assert late.due(10.0, 3500) == 13.5
    # a shorter lateness later (windows overlapping, the longest ended) never overtakes
    assert late.due(11.0, 1000) == 13.5
    assert late.due(14.0, 1000) == 15.0


def test_no_file_or_a_malformed_one_means_on_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    late = LateHeartbeats(tmp_path / "late")
    assert late.now_ms() == 0  # no file
    (tmp_path / "late").write_text("1 2500\n")  # since boot's first nanosecond
    assert late.now_ms() == 2500
    (tmp_path / "late").write_text("1 two\n")
    with caplog.at_level(logging.WARNING, logger="llmgw_twin.agent"):
        assert late.now_ms() == 0
        assert late.now_ms() == 0
    assert sum("unreadable" in r.message for r in caplog.records) == 1  # once per text


def test_a_late_heartbeat_is_queued_behind_a_newer_report_never_in_its_place() -> None:
    from llmgw_twin.control.model import NodeId
    from llmgw_twin.control.protocol import Heartbeat
    from llmgw_twin.service.agent.reports import Reports
    from llmgw_twin.service.common.leaders import Controllers

    async def go() -> None:
        reports = Reports(
            Controllers(("http://c1:8080",)),
            lambda: None,
            lambda: None,
            lambda: None,
            lambda: None,
            "http://agent:9000",
        )
        older, newer, newest = (Heartbeat(NodeId("n1"), version=v) for v in (1, 2, 3))
        reports.enqueue(older)
        reports.enqueue(newer)  # not sent yet: the newer one says it all
        assert list(reports.queue) == [newer]
        reports.enqueue(older, late=True)  # held back on purpose: it lands after the newer
        assert list(reports.queue) == [newer, older]
        reports.enqueue(newest)  # a newer report still says it all
        assert list(reports.queue) == [newer, newest]

    asyncio.run(go())
