"""Timings are checked together wherever they are read: a heartbeat not shorter than the
suspect time, a suspicion not shorter than the loss, a back-off above its cap are refused by
the scenario loader (file, line, column, key), the controller's config and the agent's config
(exit 2 naming file and key); an agent whose heartbeat does not fit its controller's timings is
told of at registration (`node.heartbeat_too_slow`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from conftest import T, node
from llmgw_twin.cli import main
from llmgw_twin.control.agent import AgentCore
from llmgw_twin.control.controller import Controller
from llmgw_twin.control.model import Timings
from llmgw_twin.control.protocol import NodeRegistered
from llmgw_twin.service.agent.config import load_agent_config
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.common.wire import NodeRegisteredW
from llmgw_twin.service.controller.config import load_controller_config
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario_text

SCENARIO = """\
name: t
duration: 10m
timings:
{timings}cluster:
  fabrics:
    ib-a: [n1, n2]
profiles:
  p: {{engine: sim, gpus_per_node: 1, model: /m, load_time: 10s}}
"""


def load(*lines: str) -> Timings:
    text = SCENARIO.format(timings="".join(f"  {line}\n" for line in lines))
    return load_scenario_text(text, "s.yaml").timings


def refusal(*lines: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load(*lines)
    return info.value


# --- the orderings ------------------------------------------------------------------------------


def test_the_defaults_hold_every_ordering() -> None:
    assert Timings().misordered() == []
    assert T.misordered() == []


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"heartbeat_interval_ms": 30_000}, "heartbeat_interval must be shorter than node_suspect"),
        ({"heartbeat_interval_ms": 45_000}, "heartbeat_interval must be shorter than node_suspect"),
        ({"node_suspect_after_ms": 60_000}, "node_suspect_after must be shorter than node_lost"),
        ({"restart_backoff_ms": 600_000}, "restart_backoff must not exceed restart_backoff_max"),
    ],
)
def test_each_ordering_is_refused(changes: dict[str, int], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        replace(Timings(), **changes)


def test_just_inside_each_ordering_is_accepted() -> None:
    t = Timings(heartbeat_interval_ms=29_999, node_suspect_after_ms=30_000)
    assert t.misordered() == []
    assert Timings(node_suspect_after_ms=59_999).misordered() == []
    assert Timings(restart_backoff_ms=300_000).misordered() == []


# --- the scenario loader ------------------------------------------------------------------------


def test_the_loader_refuses_a_heartbeat_at_the_suspect_time_at_its_value() -> None:
    err = refusal("heartbeat_interval: 20s", "node_suspect_after: 20s")
    assert (err.line, err.column) == (4, 23)
    assert err.message == (
        "timings: heartbeat_interval (20.000s) must be shorter than node_suspect_after "
        "(20.000s): a healthy node would turn suspect between two heartbeats"
    )


def test_a_suspicion_left_to_the_loss_deadline_is_said_and_the_loss_pointed_at() -> None:
    err = refusal("reconcile_interval: 1s", "node_lost_after: 20s")  # suspect 10s = heartbeat
    assert (err.line, err.column) == (5, 20)
    assert "node_suspect_after (10.000s: not set, half of node_lost_after)" in err.message


def test_a_suspicion_at_the_loss_deadline_is_refused() -> None:
    err = refusal("node_suspect_after: 60s")
    assert (err.line, err.column) == (4, 23)
    assert "node_suspect_after (1m00.000s) must be shorter than node_lost_after (1m00.000s)" in (
        err.message
    )


def test_a_back_off_above_its_cap_is_refused() -> None:
    err = refusal("restart_backoff_max: 30s", "restart_backoff: 1m")
    assert (err.line, err.column) == (5, 20)
    assert "restart_backoff (1m00.000s) must not exceed restart_backoff_max (30.000s)" in (
        err.message
    )


def test_run_exits_2_naming_file_line_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(timings="  heartbeat_interval: 30s\n"))
    assert main(["run", "-q", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}:4:23: timings: heartbeat_interval (30.000s) must be shorter" in err
    assert "Traceback" not in err


# --- the controller's config ---------------------------------------------------------------------


def controller_config(tmp_path: Path, timings: str) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(f"listen: {{host: 127.0.0.1, port: 9}}\nstore: s.db\ntimings: {timings}\n")
    return path


def test_the_controller_config_names_file_and_key(tmp_path: Path) -> None:
    path = controller_config(tmp_path, "{heartbeat_interval: 15s, node_suspect_after: 15s}")
    with pytest.raises(ConfigError) as info:
        load_controller_config(path)
    assert str(info.value).startswith(
        f"{path}: timings.heartbeat_interval: heartbeat_interval (15.000s) must be shorter than "
        "node_suspect_after (15.000s)"
    )
    path = controller_config(tmp_path, "{node_lost_after: 12s}")  # suspect 6s < heartbeat 10s
    with pytest.raises(ConfigError, match=r"timings\.node_lost_after: heartbeat_interval"):
        load_controller_config(path)


def test_the_controller_exits_2_on_misordered_timings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = controller_config(tmp_path, "{node_suspect_after: 1m, node_lost_after: 1m}")
    assert main(["controller", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}: timings.node_suspect_after: node_suspect_after (1m00.000s)" in err
    assert not (tmp_path / "s.db").exists()  # refused before anything was opened


# --- the agent's config --------------------------------------------------------------------------


def agent_config(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "node: n1\ncontroller: http://controller.test\nlisten: {host: 127.0.0.1, port: 9}\n"
        f"root: n1\nports: {{first: 20000, last: 20003}}\n{extra}"
    )
    return path


def test_the_agent_refuses_a_worker_settle_not_shorter_than_its_ready_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = agent_config(tmp_path, "worker_settle: 30s\nready_timeout: 30s\n")
    with pytest.raises(ConfigError) as info:
        load_agent_config(path)
    assert str(info.value).startswith(
        f"{path}: worker_settle: worker_settle (30.000s) must be shorter than ready_timeout "
        "(30.000s)"
    )
    assert main(["agent", "--config", str(path)]) == 2
    assert f"error: {path}: worker_settle: " in capsys.readouterr().err


def test_the_agent_reads_its_heartbeat_and_tells_it_when_registering(tmp_path: Path) -> None:
    s = load_agent_config(agent_config(tmp_path, "heartbeat_interval: 40s\n"))
    assert s.heartbeat_interval_ms == 40_000
    core = AgentCore(node("n1", "ib-a"), heartbeat_interval_ms=s.heartbeat_interval_ms)
    reg = core.registration()
    assert reg.heartbeat_interval_ms == 40_000
    wire = NodeRegisteredW.from_core(reg, "http://n1:9")
    assert wire.to_core() == reg
    assert NodeRegisteredW.model_validate(wire.model_dump()).heartbeat_interval_ms == 40_000


# --- the controller, when an agent registers ------------------------------------------------------


def test_a_node_registering_with_a_heartbeat_at_the_suspect_time_is_said() -> None:
    ctl = Controller(T)  # suspect after 30s
    step = ctl.handle(NodeRegistered(node("n1", "ib-a"), heartbeat_interval_ms=30_000), 0)
    (ev,) = [e for e in step.events if e.kind == "node.heartbeat_too_slow"]
    assert ev.get("node") == "n1" and ev.get("heartbeat_interval_ms") == 30_000
    assert "node_suspect_after of 30000 ms" in str(ev.get("reason"))
    # said at each such registration; a fitting or unsaid interval says nothing
    again = ctl.handle(NodeRegistered(node("n1", "ib-a"), heartbeat_interval_ms=45_000), 1_000)
    assert [e.kind for e in again.events].count("node.heartbeat_too_slow") == 1
    for interval in (29_999, 10_000, 0):
        fits = ctl.handle(NodeRegistered(node("n2", "ib-a"), heartbeat_interval_ms=interval), 0)
        assert "node.heartbeat_too_slow" not in [e.kind for e in fits.events]
