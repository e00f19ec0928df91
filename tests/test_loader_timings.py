"""Every `Timings` field is a `timings` key, in scenario files and in the controller's config, by
its name without `_ms`; bad values are the loader's normal error (exit 2, file:line:column), never
a traceback, and so are the values `Timings` itself refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from llmgw_twin.cli import main
from llmgw_twin.control.model import Timings
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.controller.config import TIMING_KEYS as CONFIG_KEYS
from llmgw_twin.service.controller.config import load_controller_config
from llmgw_twin.twin.scenario.loader import TIMING_KEYS, ScenarioError, load_scenario_text
from llmgw_twin.twin.scenario.timescale import scale_scenario
from llmgw_twin.units import SettingKey, fmt_duration, parse_share, setting_keys

HEAD = """\
name: t
duration: 10m
timings:
"""
TAIL = """\
cluster:
  fabrics:
    ib-a: [n1, n2]
profiles:
  p: {engine: sim, gpus_per_node: 1, model: /m, load_time: 10s}
"""


def scenario(*timing_lines: str, tail: str = TAIL) -> str:
    return HEAD + "".join(f"  {line}\n" for line in timing_lines) + tail


def a_value(key: SettingKey) -> tuple[str, int | float]:
    """A valid non-default value for `key`, as written and as read."""
    if key.key == "node_suspect_after":  # twice the default would be the loss deadline
        return "45s", 45_000
    match key.kind:
        case "duration":
            ms = 2 * int(key.default)
            return fmt_duration(ms), ms
        case "count":
            return str(int(key.default) + 1), int(key.default) + 1
        case "share":
            return "25%", 0.25
    raise AssertionError(key.kind)


# --- the key table -------------------------------------------------------------------------------


def test_the_key_table_is_every_timings_field() -> None:
    assert [k.attr for k in TIMING_KEYS] == [f.name for f in dataclasses.fields(Timings)]
    assert CONFIG_KEYS == TIMING_KEYS  # both loaders read one table
    kinds = {k.key: k.kind for k in TIMING_KEYS}
    assert kinds["heartbeat_interval"] == kinds["probe_interval"] == "duration"
    assert kinds["quarantine_after"] == kinds["mass_loss_min_nodes"] == "count"
    assert kinds["mass_loss_share"] == kinds["mass_loss_quorum"] == "share"
    minimum = {k.key: k.minimum for k in TIMING_KEYS}
    assert minimum["probe_interval"] == minimum["quarantine_after"] == 1
    assert minimum["start_grace"] == minimum["unresponsive_grace"] == 0
    assert minimum["mass_loss_min_nodes"] == 0


def test_a_field_added_to_the_dataclass_is_a_key() -> None:
    @dataclasses.dataclass(frozen=True)
    class Settings:
        drain_timeout_ms: int = 5
        retries: int = 2
        spare: float = 0.1

    assert [(k.key, k.kind) for k in setting_keys(Settings)] == [
        ("drain_timeout", "duration"),
        ("retries", "count"),
        ("spare", "share"),
    ]


@pytest.mark.parametrize(
    ("text", "share"), [("0.5", 0.5), ("50%", 0.5), ("12.5%", 0.125), ("1", 1.0), (".25", 0.25)]
)
def test_shares_read_as_a_fraction_or_a_percentage(text: str, share: float) -> None:
    assert parse_share(text) == share


@pytest.mark.parametrize("text", ["", "-0.5", "half", "50 %", "0.5.1", "%"])
def test_bad_shares_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="share"):
        parse_share(text)


# --- scenario files ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", TIMING_KEYS, ids=lambda k: k.key)
def test_the_loader_accepts_every_timing_key(key: SettingKey) -> None:
    written, value = a_value(key)
    s = load_scenario_text(scenario(f"{key.key}: {written}"), "s.yaml")
    changes: dict[str, Any] = {key.attr: value}
    want = dataclasses.replace(Timings(), **changes)
    if key.key == "node_lost_after":  # suspicion follows the loss deadline unless set
        want = dataclasses.replace(want, node_suspect_after_ms=int(value) // 2)
    assert s.timings == want


def test_all_the_new_keys_at_once() -> None:
    s = load_scenario_text(
        scenario(
            "mass_loss_share: 0.6",
            "mass_loss_quorum: 40%",
            "mass_loss_min_nodes: 0",
            "restart_backoff: 5s",
            "restart_backoff_max: 2m",
            "failure_window: 30m",
            "quarantine_after: 5",
            "quarantine_for: 1h",
            "start_grace: 0",
            "probe_interval: 2s",
            "unresponsive_grace: 0",
        ),
        "s.yaml",
    )
    t = s.timings
    assert (t.mass_loss_share, t.mass_loss_quorum, t.mass_loss_min_nodes) == (0.6, 0.4, 0)
    assert (t.restart_backoff_ms, t.restart_backoff_max_ms, t.failure_window_ms) == (
        5_000,
        120_000,
        1_800_000,
    )
    assert (t.quarantine_after, t.quarantine_for_ms) == (5, 3_600_000)
    assert (t.start_grace_ms, t.probe_interval_ms, t.unresponsive_grace_ms) == (0, 2_000, 0)


def test_a_profile_may_set_its_start_timeout() -> None:
    tail = TAIL.replace("load_time: 10s}", "load_time: 10s, start_timeout: 2m}")
    s = load_scenario_text(scenario("probe_interval: 1s", tail=tail), "s.yaml")
    assert s.profiles[0].start_timeout_ms == 120_000
    assert s.timings.start_deadline_ms(s.profiles[0]) == 120_000
    assert load_scenario_text(scenario("probe_interval: 1s"), "s.yaml").profiles[0] == (
        dataclasses.replace(s.profiles[0], start_timeout_ms=0)
    )


BAD = {
    # timing line -> (column, message); the line is always 4
    "probe_interval: 0": (19, "timings.probe_interval must be longer than 0"),
    "restart_backoff: 10": (20, "timings.restart_backoff: number without a unit"),
    "failure_window: 1.5m": (19, "timings.failure_window: unexpected '.'"),
    "quarantine_after: 0": (21, "timings.quarantine_after must be at least 1, got 0"),
    "quarantine_after: 2.5": (21, "timings.quarantine_after must be a whole number"),
    "quarantine_after: 3s": (21, "timings.quarantine_after must be a whole number"),
    "mass_loss_min_nodes: -1": (24, "timings.mass_loss_min_nodes must be at least 0, got -1"),
    "mass_loss_share: half": (20, "timings.mass_loss_share: cannot read share 'half'"),
    "mass_loss_share: -0.5": (20, "timings.mass_loss_share: share '-0.5' is negative"),
    "mass_loss_share: 0": (20, "timings: mass_loss_share must be a share above 0 and at most 1"),
    "mass_loss_quorum: 150%": (
        21,
        "timings: mass_loss_quorum must be a share above 0 and at most 1",
    ),
    "heartbeat_interval: 60s": (
        23,
        "timings: heartbeat_interval (1m00.000s) must be shorter than node_suspect_after "
        "(30.000s: not set, half of node_lost_after): a healthy node would turn suspect between "
        "two heartbeats",
    ),
    "heartbeat_interval: 30s": (
        23,
        "timings: heartbeat_interval (30.000s) must be shorter than node_suspect_after (30.000s",
    ),
    "node_lost_after: 5s": (
        20,
        "timings: heartbeat_interval (10.000s) must be shorter than node_suspect_after (2.500s: "
        "not set, half of node_lost_after)",
    ),
    "node_suspect_after: 1m": (
        23,
        "timings: node_suspect_after (1m00.000s) must be shorter than node_lost_after (1m00.000s)",
    ),
    "node_suspect_after: 10s": (
        23,
        "timings: heartbeat_interval (10.000s) must be shorter than node_suspect_after (10.000s)",
    ),
    "restart_backoff: 10m": (
        20,
        "timings: restart_backoff (10m00.000s) must not exceed restart_backoff_max (5m00.000s)",
    ),
    "probe_every: 5s": (3, "unknown key 'probe_every' in timings (expected one of: "),
}


@pytest.mark.parametrize("line", BAD, ids=list(BAD))
def test_bad_timings_exit_2_naming_file_line_and_column(
    line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    column, message = BAD[line]
    path = tmp_path / "s.yaml"
    path.write_text(scenario(line))
    assert main(["run", "-q", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}:4:{column}: {message}" in err, err
    assert "Traceback" not in err
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(scenario(line), "s.yaml")
    assert (info.value.line, info.value.column) == (4, column)


def test_a_value_timings_refuses_points_at_the_first_key_written() -> None:
    # both keys written: the message names heartbeat_interval first
    text = scenario("node_lost_after: 20s", "heartbeat_interval: 30s")
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "s.yaml")
    assert (info.value.line, info.value.column) == (5, 23)


def test_a_zero_start_timeout_is_refused() -> None:
    tail = TAIL.replace("load_time: 10s}", "load_time: 10s, start_timeout: 0}")
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(scenario("probe_interval: 1s", tail=tail), "s.yaml")
    assert info.value.message == "profiles.p.start_timeout must be longer than 0"
    assert (info.value.line, info.value.column) == (9, 80)


def test_scaling_a_scenario_scales_every_duration_setting_and_no_count_or_share() -> None:
    tail = TAIL.replace("load_time: 10s}", "load_time: 10s, start_timeout: 2m}")
    s = load_scenario_text(
        scenario("probe_interval: 2s", "start_grace: 0", "quarantine_after: 5", tail=tail),
        "s.yaml",
    )
    fast = scale_scenario(s, 0.1)
    t = fast.timings
    assert (t.probe_interval_ms, t.start_grace_ms, t.failure_window_ms) == (200, 0, 60_000)
    assert (t.quarantine_after, t.mass_loss_share) == (5, 0.5)
    assert fast.profiles[0].start_timeout_ms == 12_000
    assert (
        scale_scenario(load_scenario_text(scenario("start_grace: 0"), "s.yaml"), 0.1)
        .profiles[0]
        .start_timeout_ms
        == 0
    )


# --- the controller's config file -----------------------------------------------------------------

CONFIG = """\
listen: {host: 127.0.0.1, port: 8080}
store: state/controller.db
timings:
  heartbeat_interval: 2s
  node_lost_after: 20s
  mass_loss_share: 60%
  mass_loss_quorum: 0.4
  mass_loss_min_nodes: 0
  restart_backoff: 5s
  quarantine_after: 5
  quarantine_for: 1h
  start_grace: 0
  probe_interval: 2s
  unresponsive_grace: 30s
profiles:
  tiny: {engine: sim, gpus_per_node: 1, model: /models/tiny, load_time: 1s, start_timeout: 90s}
"""


def test_the_controller_config_reads_the_same_timing_keys(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(CONFIG)
    s = load_controller_config(path)
    t = s.timings
    assert (t.heartbeat_interval_ms, t.node_lost_after_ms, t.node_suspect_after_ms) == (
        2_000,
        20_000,
        10_000,
    )
    assert (t.mass_loss_share, t.mass_loss_quorum, t.mass_loss_min_nodes) == (0.6, 0.4, 0)
    assert (t.restart_backoff_ms, t.quarantine_after, t.quarantine_for_ms) == (5_000, 5, 3_600_000)
    assert (t.start_grace_ms, t.probe_interval_ms, t.unresponsive_grace_ms) == (0, 2_000, 30_000)
    assert s.profiles[0].start_timeout_ms == 90_000


@pytest.mark.parametrize("key", TIMING_KEYS, ids=lambda k: k.key)
def test_the_controller_config_accepts_every_timing_key(key: SettingKey, tmp_path: Path) -> None:
    written, value = a_value(key)
    path = tmp_path / "controller.yaml"
    path.write_text(f"listen: {{port: 8080}}\nstore: s.db\ntimings: {{{key.key}: {written}}}\n")
    assert getattr(load_controller_config(path).timings, key.attr) == value


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (("probe_interval: 2s", "probe_interval: 0"), "timings.probe_interval: must be longer"),
        (("probe_interval: 2s", "probe_interval: 2"), "timings.probe_interval: number without"),
        (("quarantine_after: 5", "quarantine_after: 0"), "timings.quarantine_after: must be at"),
        (("quarantine_after: 5", "quarantine_after: '5'"), "timings.quarantine_after: expected a"),
        (("mass_loss_share: 60%", "mass_loss_share: lots"), "timings.mass_loss_share: cannot"),
        (("mass_loss_share: 60%", "mass_loss_share: 2"), "timings.mass_loss_share: mass_loss_"),
        (("mass_loss_share: 60%", "mass_loss_share: true"), "timings.mass_loss_share: expected"),
        (
            ("heartbeat_interval: 2s", "heartbeat_interval: 10s"),
            "timings.heartbeat_interval: heartbeat_interval (10.000s) must be shorter than "
            "node_suspect_after (10.000s: not set, half of node_lost_after)",
        ),
        (
            ("heartbeat_interval: 2s\n  node_lost_after: 20s", "node_lost_after: 15s"),
            "timings.node_lost_after: heartbeat_interval (10.000s) must be shorter than "
            "node_suspect_after (7.500s: not set, half of node_lost_after)",
        ),
        (
            ("node_lost_after: 20s", "node_lost_after: 20s\n  node_suspect_after: 20s"),
            "timings.node_suspect_after: node_suspect_after (20.000s) must be shorter than "
            "node_lost_after (20.000s)",
        ),
        (("probe_interval: 2s", "probe_every: 2s"), "timings: unknown key 'probe_every'"),
        (("start_timeout: 90s", "start_timeout: soon"), "profiles.tiny.start_timeout"),
    ],
)
def test_bad_controller_timings_are_config_errors(
    edit: tuple[str, str], says: str, tmp_path: Path
) -> None:
    path = tmp_path / "controller.yaml"
    assert CONFIG.count(edit[0]) == 1
    path.write_text(CONFIG.replace(*edit))
    with pytest.raises(ConfigError) as err:
        load_controller_config(path)
    assert str(err.value).startswith(f"{path}: ") and says in str(err.value), str(err.value)
