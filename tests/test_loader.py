"""The scenario loader: the canonical example loads to known values; every bad input is one
`ScenarioError` naming the exact line and column; nothing else ever escapes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    Timings,
)
from llmgw_twin.twin.scenario.loader import ScenarioError, load_scenario, load_scenario_text
from llmgw_twin.twin.scenario.model import (
    EventExpectation,
    FabricDown,
    FailGpu,
    Fault,
    KillEngine,
    KillNode,
    Partition,
    RestartController,
    RestartNode,
    Scenario,
    SetReplicas,
    StateExpectation,
)

DATA = Path(__file__).parent / "data"
CANONICAL = (DATA / "node-loss.yaml").read_text(encoding="utf-8")


def mutate(old: str, new: str, text: str = CANONICAL) -> str:
    assert text.count(old) == 1, f"{old!r} must occur once"
    return text.replace(old, new)


def error_of(text: str) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "s.yaml")
    return info.value


def load(text: str) -> Scenario:
    return load_scenario_text(textwrap.dedent(text), "s.yaml")


MINIMAL = """\
name: tiny
duration: 10m
cluster:
  fabrics:
    ib-a: [n1, n2]
    ib-b: [n3]
"""


# --- the canonical example ---------------------------------------------------------------------


def test_canonical_node_loss_loads_to_expected_values() -> None:
    s = load_scenario(DATA / "node-loss.yaml")
    assert s.path == str(DATA / "node-loss.yaml")
    assert s.name == "node-loss"
    assert s.description.startswith("node02 dies; its replica moves")
    assert s.seed == 1
    assert s.duration_ms == 360_000
    assert s.timings == Timings(
        heartbeat_interval_ms=10_000,
        node_suspect_after_ms=30_000,
        node_lost_after_ms=60_000,
        reconcile_interval_ms=1_000,
    )
    assert s.fabrics == (
        (FabricId("ib-a"), (NodeId("node01"), NodeId("node02"))),
        (FabricId("ib-b"), (NodeId("node03"), NodeId("node04"))),
    )
    sim = (EngineName("sim"),)
    assert s.nodes == (
        NodeInfo(NodeId("node01"), FabricId("ib-a"), 8, 81_920, sim),
        NodeInfo(NodeId("node02"), FabricId("ib-a"), 8, 81_920, sim),
        NodeInfo(NodeId("node03"), FabricId("ib-b"), 8, 81_920, sim),
        NodeInfo(NodeId("node04"), FabricId("ib-b"), 8, 81_920, sim),
    )
    assert s.profiles == (
        Profile(
            ProfileName("llama-70b-2n"), EngineName("sim"), 2, 4, "/models/llama-70b", 20_000, ()
        ),
    )
    assert s.deployments == (Deployment(ModelName("llama-70b"), ProfileName("llama-70b-2n"), 2),)
    assert s.faults == (Fault(120_000, KillNode(NodeId("node02")), "kill", 32),)
    assert s.expectations == (
        EventExpectation(
            kind="node.lost",
            filters=(("node", "node02"),),
            start_ms=170_000,
            end_ms=181_000,
            line=37,
            text="event node.lost node=node02 within [kill+50s, kill+61s]",
        ),
        EventExpectation(
            kind="replica.ready",
            filters=(("fabric", "ib-b"), ("model", "llama-70b")),
            start_ms=170_000,
            end_ms=202_000,
            line=40,
            text="event replica.ready model=llama-70b fabric=ib-b within [kill+50s, kill+82s]",
        ),
        EventExpectation(
            kind="replica.ready",
            filters=(("fabric", "ib-a"),),
            start_ms=120_000,
            end_ms=360_000,
            never=True,
            line=44,
            text="event replica.ready fabric=ib-a within [kill, end] never",
        ),
        StateExpectation(
            at_ms=360_000,
            ready_replicas=((ModelName("llama-70b"), 2),),
            idle_nodes=(NodeId("node01"),),
            line=48,
            text="at end: ready_replicas {llama-70b: 2}, idle_nodes [node01]",
        ),
    )
    assert s.invariants_off == ()
    assert load_scenario_text(CANONICAL, s.path) == s  # deterministic


# --- defaults and semantics --------------------------------------------------------------------


def test_minimal_file_takes_defaults() -> None:
    s = load(MINIMAL)
    assert s.seed == 0
    assert s.description == ""
    assert s.timings == Timings()
    assert [n.node for n in s.nodes] == ["n1", "n2", "n3"]
    assert [n.fabric for n in s.nodes] == ["ib-a", "ib-a", "ib-b"]
    assert all((n.gpus, n.gpu_memory_mib, n.engines) == (8, 81_920, ("sim",)) for n in s.nodes)
    assert (s.profiles, s.deployments, s.faults, s.expectations, s.invariants_off) == (
        (),
        (),
        (),
        (),
        (),
    )


def test_empty_sections_count_as_absent() -> None:
    s = load(MINIMAL + "timings:\nprofiles:\ndeployments:\nfaults:\nexpect:\ninvariants:\n")
    assert s.timings == Timings()
    assert s.faults == ()


def test_suspect_defaults_to_half_of_lost() -> None:
    s = load(MINIMAL + "timings: {node_lost_after: 45s, heartbeat_interval: 5s}\n")
    assert s.timings.node_lost_after_ms == 45_000
    assert s.timings.node_suspect_after_ms == 22_500
    assert s.timings.heartbeat_interval_ms == 5_000
    assert s.timings.reconcile_interval_ms == 1_000
    s = load(MINIMAL + "timings: {node_suspect_after: 50s}\n")
    assert (s.timings.node_suspect_after_ms, s.timings.node_lost_after_ms) == (50_000, 60_000)


def test_node_settings_override_default_key_by_key() -> None:
    s = load(
        MINIMAL
        + """\
  nodes:
    default: {gpus: 4, engines: [sim, vllm]}
    n2: {gpu_memory: 40GiB}
    n3: {gpus: 0, engines: []}
"""
    )
    n1, n2, n3 = s.nodes
    assert (n1.gpus, n1.gpu_memory_mib, n1.engines) == (4, 81_920, ("sim", "vllm"))
    assert (n2.gpus, n2.gpu_memory_mib, n2.engines) == (4, 40_960, ("sim", "vllm"))
    assert (n3.gpus, n3.gpu_memory_mib, n3.engines) == (0, 81_920, ())


FAULTS = (
    MINIMAL
    + """\
profiles:
  p: {engine: vllm, gpus_per_node: 2, model: m, args: [--tp, "2"]}
deployments:
  - {model: m1, profile: p, replicas: 1}
faults:
  - {at: second-30s, id: third, fabric_down: {fabric: ib-b, for: 1m}}
  - {at: 5m, id: second, partition: {nodes: [n1, n2], for: 90s}}
  - {at: 0, fail_gpu: {node: n3, gpu: 7}}
  - {at: end-1m, id: the-end, set_replicas: {model: m1, replicas: 3}}
  - {at: start, kill_engine: {node: n1, replica_of: m1}}
  - {at: third+30s, restart_controller: {down_for: 0s}}
  - {at: the-end, kill_node: n2}
  - {at: the-end-0s, restart_node: n2}
"""
)


def test_every_fault_kind_and_time_form() -> None:
    s = load(FAULTS)
    assert s.profiles[0].args == ("--tp", "2")
    assert [(f.at_ms, f.line, f.id) for f in s.faults] == [
        (0, 14, None),
        (0, 16, None),
        (270_000, 12, "third"),
        (300_000, 13, "second"),  # ties keep file order
        (300_000, 17, None),
        (540_000, 15, "the-end"),
        (540_000, 18, None),
        (540_000, 19, None),
    ]
    assert [f.action for f in s.faults] == [
        FailGpu(NodeId("n3"), 7),
        KillEngine(NodeId("n1"), ModelName("m1")),
        FabricDown(FabricId("ib-b"), 60_000),
        Partition((NodeId("n1"), NodeId("n2")), 90_000),
        RestartController(0),
        SetReplicas(ModelName("m1"), 3),
        KillNode(NodeId("n2")),
        RestartNode(NodeId("n2")),
    ]


def test_expectation_forms() -> None:
    s = load(
        FAULTS
        + """\
expect:
  - {event: replica.placed, rank: 0, reason: x, fault: third, within: [0s, 1m], count: 2}
  - {event: fault.injected, within: [third, third]}
  - at: the-end+30s
    node_state: {n2: lost, n1: alive}
    replicas_in: {ib-b: 1}
    idle_nodes: []
invariants:
  off: {no_orphans: engines outlive the run here, single_fabric: testing}
"""
    )
    count, window, state = s.expectations
    assert isinstance(count, EventExpectation)
    assert count.filters == (("fault", "third"), ("rank", 0), ("reason", "x"))
    assert (count.start_ms, count.end_ms, count.count, count.never) == (0, 60_000, 2, False)
    assert count.text == "event replica.placed rank=0 reason=x fault=third within [0s, 1m] count=2"
    assert isinstance(window, EventExpectation)
    assert (window.start_ms, window.end_ms) == (270_000, 270_000)
    assert isinstance(state, StateExpectation)
    assert state.at_ms == 570_000
    assert state.node_state == ((NodeId("n2"), "lost"), (NodeId("n1"), "alive"))
    assert state.replicas_in == ((FabricId("ib-b"), 1),)
    assert state.idle_nodes == ()
    assert state.ready_replicas is None
    assert state.line == 23
    assert state.text == (
        "at the-end+30s: node_state {n2: lost, n1: alive}, replicas_in {ib-b: 1}, idle_nodes []"
    )
    assert s.invariants_off == (
        ("no_orphans", "engines outlive the run here"),
        ("single_fabric", "testing"),
    )


def test_names_are_read_as_written() -> None:
    s = load(MINIMAL.replace("[n1, n2]", "[01, on, 1.5]"))
    assert [n.node for n in s.nodes][:3] == ["01", "on", "1.5"]


# --- errors: each names the exact line and column ----------------------------------------------

CASES = {
    "bad YAML": (
        ("  reconcile_interval: 1s", "  reconcile_interval: 1s: 2s"),
        (9, 25, "invalid YAML: mapping values are not allowed here"),
    ),
    "unknown top-level key": (
        ("seed: 1", "sede: 1"),
        (3, 1, "unknown key 'sede' in the scenario (expected one of: name, description, seed,"),
    ),
    "unknown key in a deployment": (
        ("    replicas: 2", "    replica: 2"),
        (
            29,
            5,
            "unknown key 'replica' in deployments[0] "
            "(expected one of: model, profile, replicas, autoscale, roles)",
        ),
    ),
    "unknown node in a fault": (
        ("kill_node: node02", "kill_node: node09"),
        (34, 16, "faults[0].kill_node: unknown node 'node09' (known: node01, node02, node03,"),
    ),
    "bad duration": (
        ("load_time: 20s", "load_time: 20sec"),
        (23, 16, "profiles.llama-70b-2n.load_time: unknown unit 'sec' in duration '20sec'"),
    ),
    "unknown fault id in a time": (
        ("within: [kill+50s, kill+61s]", "within: [kil+50s, kill+61s]"),
        (39, 14, "expect[0].within[0]: unknown fault id 'kil' in time 'kil+50s'"),
    ),
    "cycle": (
        (
            "    at: 2m\n",
            "    at: undo-10s\n    kill_node: node02\n  - id: undo\n    at: kill+1m\n",
        ),
        (33, 9, "faults[0].at: fault times refer to each other in a loop (kill -> undo -> kill)"),
    ),
    "self reference": (
        ("    at: 2m\n", "    at: kill+1s\n"),
        (33, 9, "faults[0].at: fault times refer to each other in a loop (kill -> kill)"),
    ),
    "fault after the run": (
        ("    at: 2m\n", "    at: 7m\n"),
        (33, 9, "faults[0].at: '7m' is 7m00.000s, outside the run [0.000s, 6m00.000s]"),
    ),
    "window after the run": (
        ("within: [kill, end]", "within: [end+1s, end+2s]"),
        (46, 14, "expect[2].within[0]: 'end+1s' is 6m01.000s, outside the run"),
    ),
    "window before the start": (
        ("within: [kill, end]", "within: [start-1ms, end]"),
        (46, 14, "expect[2].within[0]: 'start-1ms' is -0.001s, outside the run"),
    ),
    "duplicate node": (
        ("ib-b: [node03, node04]", "ib-b: [node03, node01]"),
        (14, 20, "node 'node01' is listed twice (first under fabric 'ib-a' at line 13)"),
    ),
    "duplicate node in one fabric": (
        ("ib-a: [node01, node02]", "ib-a: [node01, node01]"),
        (13, 20, "node 'node01' is listed twice (first under fabric 'ib-a' at line 13)"),
    ),
    "duplicate key": (
        ("  reconcile_interval: 1s\n", "  reconcile_interval: 1s\n  node_lost_after: 30s\n"),
        (10, 3, "duplicate key 'node_lost_after' in timings (first at line 8)"),
    ),
    "duplicate top-level key": (
        ("seed: 1", "seed: 1\nname: again"),
        (4, 1, "duplicate key 'name' in the scenario (first at line 1)"),
    ),
    "missing required key": (
        ("duration: 6m\n", ""),
        (1, 1, "missing required key 'duration' in the scenario"),
    ),
    "seed is a bool": (
        ("seed: 1", "seed: true"),
        (3, 7, "seed must be a whole number, got the boolean 'true'"),
    ),
    "bad scenario name": (
        ("name: node-loss", "name: node loss"),
        (1, 7, "name: 'node loss' is not a valid scenario name"),
    ),
    "zero duration": (("duration: 6m", "duration: 0s"), (4, 11, "duration must be longer than 0")),
    "suspect after lost": (
        ("  reconcile_interval: 1s\n", "  reconcile_interval: 1s\n  node_suspect_after: 61s\n"),
        (10, 23, "node_suspect_after (1m01.000s) must be shorter than node_lost_after (1m00.000s)"),
    ),
    "zero timing": (
        ("heartbeat_interval: 10s", "heartbeat_interval: 0ms"),
        (7, 23, "timings.heartbeat_interval must be longer than 0"),
    ),
    "settings for an unknown node": (
        ("    default: {gpus", "    node09: {gpus: 1}\n    default: {gpus"),
        (16, 5, "cluster.nodes: unknown node 'node09' (expected 'default' or a node listed"),
    ),
    "bad size": (
        ("gpu_memory: 80GiB", "gpu_memory: 80GB"),
        (16, 36, "unknown unit 'GB' in size '80GB'"),
    ),
    "unknown engine": (
        ("engines: [sim]", "engines: [sim, trt]"),
        (16, 58, "cluster.nodes.default.engines[1]: unknown engine 'trt' (expected one of: sim,"),
    ),
    "unknown profile": (
        ("    profile: llama-70b-2n", "    profile: llama-70b"),
        (28, 14, "deployments[0].profile: unknown profile 'llama-70b' (expected one of:"),
    ),
    "missing gpus_per_node": (
        ("    gpus_per_node: 4\n", ""),
        (20, 5, "missing required key 'gpus_per_node' in profiles.llama-70b-2n"),
    ),
    "two actions": (
        ("    kill_node: node02", "    kill_node: node02\n    restart_node: node02"),
        (35, 5, "faults[0] has two actions, 'kill_node' and 'restart_node'"),
    ),
    "no action": (("    kill_node: node02\n", ""), (32, 5, "faults[0] has no action")),
    "reserved fault id": (("id: kill", "id: end"), (32, 9, "'end' cannot be a fault id")),
    "fault id that reads as a duration": (
        ("id: kill", "id: 2m"),
        (32, 9, "'2m' cannot be a fault id"),
    ),
    "gpu out of range": (
        ("kill_node: node02", "fail_gpu: {node: node02, gpu: 8}"),
        (34, 35, "faults[0].fail_gpu.gpu: node02 has GPUs 0..7, not GPU 8"),
    ),
    "undeployed model": (
        ("kill_node: node02", "set_replicas: {model: llama-8b, replicas: 1}"),
        (34, 27, "faults[0].set_replicas.model: 'llama-8b' is not a deployed model"),
    ),
    "unknown fabric": (
        ("kill_node: node02", "fabric_down: {fabric: ib-c, for: 1m}"),
        (34, 27, "faults[0].fabric_down.fabric: unknown fabric 'ib-c' (known: ib-a, ib-b)"),
    ),
    "unknown event kind": (
        ("event: node.lost", "event: node.gone"),
        (37, 12, "expect[0].event: unknown event kind 'node.gone'"),
    ),
    "list-valued filter": (
        ("    node: node02\n", "    nodes: [node02]\n"),
        (38, 5, "expect[0]: 'nodes' cannot be a filter, its value is a list"),
    ),
    "filter on an undeployed model": (
        ("    model: llama-70b\n", "    model: llama-7b\n"),
        (41, 12, "expect[1].model: 'llama-7b' is not a deployed model"),
    ),
    "window reversed": (
        ("within: [kill, end]", "within: [end, kill]"),
        (46, 13, "expect[2].within: the window ends before it starts"),
    ),
    "window of one": (
        ("within: [kill, end]", "within: [kill]"),
        (46, 13, "expect[2].within must be two times [FROM, TO], got 1 item(s)"),
    ),
    "never and count": (
        ("    never: true\n", "    never: true\n    count: 0\n"),
        (48, 5, "expect[2]: 'never' and 'count' cannot be used together"),
    ),
    "never is a string": (
        ("never: true", 'never: "true"'),
        (47, 12, "expect[2].never must be true or false, got the string 'true'"),
    ),
    "event and at": (
        ("  - event: node.lost\n", "  - event: node.lost\n    at: end\n"),
        (38, 5, "expect[0] has more than one of 'event', 'at' and 'requests'"),
    ),
    "neither event nor at": (
        ("  - event: node.lost\n    node: node02\n", "  - node: node02\n"),
        (37, 5, "expect[0] needs 'event: KIND' (events in a window), 'at: TIME'"),
    ),
    "state asserts nothing": (
        ("    ready_replicas: {llama-70b: 2}\n    idle_nodes: [node01]", ""),
        (48, 5, "expect[3] asserts nothing (expected any of: ready_replicas, idle_nodes,"),
    ),
    "bad node state": (
        ("idle_nodes: [node01]", "node_state: {node01: dead}"),
        (50, 26, "expect[3].node_state.node01: unknown node state 'dead' (expected one of:"),
    ),
    "unknown invariant": (
        (
            "    idle_nodes: [node01]",
            "    idle_nodes: [node01]\ninvariants:\n  off: {no_orphan: x}",
        ),
        (52, 9, "invariants.off: unknown invariant 'no_orphan' (expected one of: single_fabric,"),
    ),
    "invariant off without a reason": (
        (
            "    idle_nodes: [node01]",
            "    idle_nodes: [node01]\ninvariants:\n  off: {no_orphans: ''}",
        ),
        (52, 21, "invariants.off.no_orphans needs a reason"),
    ),
    "top level is a list": (
        ("name: node-loss", "- name: node-loss"),
        (2, 1, "invalid YAML: expected <block end>, but found '?'"),
    ),
    "merge key": (
        ("seed: 1", "<<: {seed: 1}"),
        (3, 1, "merge keys (<<) are not supported in the scenario"),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_names_line_and_column(case: str) -> None:
    (old, new), (line, column, message) = CASES[case]
    err = error_of(mutate(old, new))
    assert (err.line, err.column) == (line, column), err
    assert message in err.message, err
    assert str(err) == f"s.yaml:{line}:{column}: {err.message}"


def test_error_message_for_unknown_key_is_exact() -> None:
    err = error_of(mutate("    replicas: 2", "    replica: 2"))
    assert err.message == (
        "unknown key 'replica' in deployments[0] "
        "(expected one of: model, profile, replicas, autoscale, roles)"
    )
    assert str(err) == (
        "s.yaml:29:5: unknown key 'replica' in deployments[0] "
        "(expected one of: model, profile, replicas, autoscale, roles)"
    )


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        ("", 1, 1, "the file is empty"),
        ("# just a comment\n", 1, 1, "the file is empty"),
        ("- a\n- b\n", 1, 1, "the scenario must be a mapping, got a list"),
        (
            "name: a\n---\nname: b\n",
            2,
            1,
            "invalid YAML: expected a single document in the stream, but found another",
        ),
        ("name: [a\n", 2, 1, "invalid YAML: expected ',' or ']'"),
        ("name: a\nduration: 1m\ncluster: {fabrics: {}}\n", 3, 20, "at least one fabric"),
        ("name: a\nduration: 1m\ncluster: {fabrics: {f: []}}\n", 3, 24, "at least one node"),
        ("a: *nope\n", 1, 4, "found undefined alias 'nope'"),
        ("name: a\x07\n", 1, 8, "invalid YAML: special characters are not allowed"),
    ],
)
def test_whole_file_errors(text: str, line: int, column: int, message: str) -> None:
    err = error_of(text)
    assert (err.line, err.column) == (line, column), err
    assert message in err.message, err


TIMED = MINIMAL + "faults:\n  - {id: a-b, at: 1m, kill_node: n1}\n  - {at: %s, restart_node: n1}\n"


@pytest.mark.parametrize(
    ("at", "at_ms"),
    [
        ("0", 0),
        ("0s", 0),
        ("start", 0),
        ("'2m'", 120_000),
        ("end", 600_000),
        ("end-10s", 590_000),
        ("a-b", 60_000),
        ("a-b+1m30s", 150_000),
        ("a-b-1m", 0),
        ("start+1h0m0s", None),
    ],
)
def test_time_expressions(at: str, at_ms: int | None) -> None:
    if at_ms is None:
        err = error_of(TIMED % at)
        assert (err.line, err.column) == (9, 10)
        assert "outside the run" in err.message
        return
    s = load(TIMED % at)
    assert [f.at_ms for f in s.faults if isinstance(f.action, RestartNode)] == [at_ms]


@pytest.mark.parametrize(
    ("at", "message"),
    [
        ("5", "cannot read time '5': number without a unit in duration '5'"),
        ("5min", "unknown unit 'min' in duration '5min' (expected h, m, s or ms); nor is it"),
        ("a-c", "unknown fault id 'a-c' in time 'a-c' (expected start, end or a fault id;"),
        ("a-b+5x", "bad offset in time 'a-b+5x': unknown unit 'x'"),
        ("a-b + 5s", "cannot read time 'a-b + 5s' (expected start, end or a fault id,"),
        ("1:30", "cannot read time '1:30'"),
        ("[0]", "faults[1].at must be a string, got a list"),
        ("~", "faults[1].at needs a value, got null"),
    ],
)
def test_bad_time_expressions(at: str, message: str) -> None:
    err = error_of(TIMED % at)
    assert (err.line, err.column) == (9, 10), err
    assert message in err.message, err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0x10", "seed must be a plain decimal whole number, got the integer '0x10'"),
        ("010", "seed must be a plain decimal whole number"),
        ("1.5", "seed must be a whole number, got the number '1.5'"),
        ("'1'", "seed must be a whole number, got the string '1'"),
        ("[1]", "seed must be a whole number, got a list"),
    ],
)
def test_seed_must_be_a_plain_integer(value: str, message: str) -> None:
    err = error_of(MINIMAL + f"seed: {value}\n")
    assert (err.line, err.column) == (7, 7), err
    assert message in err.message, err


def test_seed_accepts_underscores_and_sign() -> None:
    assert load(MINIMAL + "seed: 1_000\n").seed == 1000
    assert load(MINIMAL + "seed: -3\n").seed == -3


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ScenarioError) as info:
        load_scenario(missing)
    assert (info.value.path, info.value.line, info.value.column) == (str(missing), 1, 1)
    assert info.value.message == "cannot read file: No such file or directory"
    with pytest.raises(ScenarioError, match="cannot read file"):
        load_scenario(tmp_path)


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: x\ndescription: caf\xe9\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert (info.value.line, info.value.column) == (2, 17)
    assert "not UTF-8" in info.value.message


def test_recursive_alias_is_refused_not_walked() -> None:
    err = error_of(MINIMAL + "faults: &loop [*loop]\n")
    assert (err.line, err.column) == (7, 9)  # an alias reports its anchor
    assert "recursive aliases are refused" in err.message


def test_scenario_error_pickles_and_compares() -> None:
    import pickle

    err = ScenarioError("f.yaml", 3, 4, "boom")
    again = pickle.loads(pickle.dumps(err))  # noqa: S301 -- our own object
    assert (again.path, again.line, again.column, again.message) == ("f.yaml", 3, 4, "boom")
    assert str(again) == "f.yaml:3:4: boom"


# --- fuzz: only ScenarioError, ever ------------------------------------------------------------

_SNIPPETS = [
    ":",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a ",
    "*a",
    "!!int ",
    "!!str ",
    "<<: ",
    "~",
    "null",
    "yes",
    "'",
    '"',
    "#",
    "\t",
    "\n",
    "  ",
    "-1",
    "0",
    "1e9",
    "kill",
    "kill+",
    "end-",
    "start",
    "99999999999h",
    "node01",
    "ib-a",
    "GiB",
    "ms",
    "at: ",
    "id: ",
    "within: [",
    "\x00",
    "\ufeff",
    "é",
]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    lines = CANONICAL.splitlines(keepends=True)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        i = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "insert", "cut", "replace"]))
        line = lines[i]
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "swap":
            j = draw(st.integers(min_value=0, max_value=len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            pos = draw(st.integers(min_value=0, max_value=len(line)))
            piece = draw(st.sampled_from(_SNIPPETS) | st.text(max_size=4))
            if op == "insert":
                lines[i] = line[:pos] + piece + line[pos:]
            elif op == "cut":
                lines[i] = line[:pos] + line[pos + len(piece) :]
            else:
                lines[i] = line[:pos] + piece + line[pos + len(piece) :]
        if not lines:
            lines = [""]
    return "".join(lines)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_only_scenario_errors(text: str) -> None:
    try:
        s = load_scenario_text(text, "fuzz.yaml")
    except ScenarioError as err:
        assert err.line >= 1
        assert err.column >= 1
        assert err.message
        return
    assert isinstance(s, Scenario)
    assert [f.at_ms for f in s.faults] == sorted(f.at_ms for f in s.faults)
    assert all(0 <= f.at_ms <= s.duration_ms for f in s.faults)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(_SNIPPETS) | st.text(max_size=6), max_size=30))
def test_fuzz_random_yamlish_text(pieces: list[str]) -> None:
    try:
        load_scenario_text("".join(pieces), "fuzz.yaml")
    except ScenarioError as err:
        assert err.line >= 1
        assert err.column >= 1


def test_the_example_in_the_docs_loads() -> None:
    doc = (Path(__file__).parent.parent / "docs" / "scenarios.md").read_text(encoding="utf-8")
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    s = load_scenario_text(example, "docs/scenarios.md")
    assert s.name == "node-loss"
    assert [f.at_ms for f in s.faults] == [120_000]
    assert len(s.expectations) == 3


def test_a_window_closing_after_the_run_closes_at_its_end() -> None:
    text = CANONICAL.replace("within: [kill, end]", "within: [kill, end+1m]")
    exp = load_scenario_text(text).expectations[2]
    assert isinstance(exp, EventExpectation)
    assert (exp.start_ms, exp.end_ms) == (120_000, 360_000)
