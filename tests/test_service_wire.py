"""The wire format: every message converts exactly to and from the core's dataclasses (through
JSON too), and validation is strict, with messages that name the field. Also the controller's
config file."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from llmgw_twin.cli import main
from llmgw_twin.control.model import (
    ENGINES,
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaId,
    ShardReport,
    ShardSpec,
    ShardState,
    Timings,
    TraceEvent,
)
from llmgw_twin.control.protocol import AssignShards, Heartbeat, NodeRegistered, RequestReport
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.common.limits import MAX_GPUS_PER_NODE
from llmgw_twin.service.common.wire import (
    AssignShardsW,
    DeploymentW,
    HeartbeatW,
    NodeInfoW,
    NodeRegisteredW,
    ProfileW,
    RequestReportW,
    ShardReportW,
    ShardSpecW,
    TraceEventW,
    describe_errors,
)
from llmgw_twin.service.controller.config import load_controller_config

names = st.from_regex(r"[A-Za-z0-9._-]{1,12}", fullmatch=True)
engines = st.sampled_from(ENGINES).map(EngineName)
texts = st.text(min_size=1, max_size=20)
counts = st.integers(0, 10_000)


@st.composite
def specs(draw: st.DrawFn) -> ShardSpec:
    count = draw(st.integers(1, 4))
    nodes = tuple(NodeId(n) for n in draw(st.lists(names, min_size=count, max_size=count)))
    rank = draw(st.integers(0, count - 1))
    return ShardSpec(
        replica=ReplicaId(draw(names)),
        model=ModelName(draw(names)),
        profile=ProfileName(draw(names)),
        engine=draw(engines),
        model_path=draw(texts),
        rank=rank,
        shard_count=count,
        node=nodes[rank],
        gpus=tuple(draw(st.lists(st.integers(0, 15), unique=True, max_size=8))),
        leader=nodes[0],
        nodes=draw(st.sampled_from([nodes, ()])) if count == 1 else nodes,
        rendezvous_port=draw(st.integers(1, 65535)),
        load_time_ms=draw(counts),
        args=tuple(draw(st.lists(st.text(max_size=10), max_size=3))),
    )


@st.composite
def reports(draw: st.DrawFn) -> ShardReport:
    state = draw(st.sampled_from(list(ShardState)))
    endpoint = draw(st.sampled_from([None, "http://127.0.0.1:8000", "https://n1:9/x"]))
    exit_code = draw(st.none() | st.integers(-64, 2000))
    argv = tuple(draw(st.lists(st.text(max_size=10), max_size=4)))
    return ShardReport(draw(specs()), state, endpoint, exit_code, argv)


infos = st.builds(
    NodeInfo,
    names.map(NodeId),
    names.map(FabricId),
    st.integers(0, MAX_GPUS_PER_NODE),
    counts,
    st.lists(engines, unique=True).map(tuple),
)


@given(infos, st.lists(reports(), max_size=3), st.integers(-(2**62), 2**62))
def test_registrations_round_trip(info: NodeInfo, shards: list[ShardReport], inc: int) -> None:
    msg = NodeRegistered(info, tuple(shards), inc)
    wire = NodeRegisteredW.from_core(msg, "http://127.0.0.1:9100")
    assert wire.to_core() == msg
    again = NodeRegisteredW.model_validate_json(wire.model_dump_json())
    assert again.to_core() == msg and again.agent_url == "http://127.0.0.1:9100"
    assert NodeInfoW.from_core(info).to_core() == info


@given(names, st.lists(reports(), max_size=3))
def test_heartbeats_and_reports_round_trip(node: str, shards: list[ShardReport]) -> None:
    msg = Heartbeat(NodeId(node), tuple(shards))
    assert HeartbeatW.model_validate_json(
        HeartbeatW.from_core(msg).model_dump_json()
    ).to_core() == (msg)
    for r in shards:
        assert ShardReportW.from_core(r).to_core() == r


@given(names, st.lists(specs(), max_size=3))
def test_assignments_and_report_requests_round_trip(node: str, shards: list[ShardSpec]) -> None:
    msg = AssignShards(NodeId(node), tuple(shards))
    wire = AssignShardsW.from_core(msg)
    assert AssignShardsW.model_validate_json(wire.model_dump_json()).to_core() == msg
    ask = RequestReport(NodeId(node))
    assert (
        RequestReportW.model_validate_json(
            RequestReportW.from_core(ask).model_dump_json()
        ).to_core()
        == ask
    )
    for s in shards:
        assert ShardSpecW.from_core(s).to_core() == s


@given(
    names.map(ProfileName),
    engines,
    st.integers(1, 8),
    st.integers(1, 8),
    texts,
    counts,
    st.lists(st.text(max_size=8), max_size=3).map(tuple),
    names.map(ModelName),
    counts,
)
def test_profiles_and_deployments_round_trip(
    name: ProfileName,
    engine: EngineName,
    nodes: int,
    gpus: int,
    model_path: str,
    load_ms: int,
    args: tuple[str, ...],
    model: ModelName,
    replicas: int,
) -> None:
    profile = Profile(name, engine, nodes, gpus, model_path, load_ms, args)
    body = ProfileW.model_validate_json(ProfileW.from_core(profile).model_dump_json())
    assert body.to_core(name) == profile
    dep = Deployment(model, name, replicas)
    assert (
        DeploymentW.model_validate_json(DeploymentW.from_core(dep).model_dump_json()).to_core(model)
        == dep
    )


scalars = st.one_of(names, st.booleans(), st.integers(-5, 10**9))


@given(
    counts,
    names,
    st.dictionaries(
        names.filter(lambda k: k not in ("t_ms", "kind")),
        st.one_of(scalars, st.lists(names, max_size=3).map(tuple)),
    ),
)
def test_trace_events_round_trip(t_ms: int, kind: str, subjects: dict[str, object]) -> None:
    ev = TraceEvent.of(t_ms, kind, **subjects)
    wire = TraceEventW.model_validate_json(TraceEventW.from_core(ev).model_dump_json())
    back = wire.to_core()
    assert back == ev
    assert [type(v) for _, v in back.subjects] == [type(v) for _, v in ev.subjects]


def test_a_real_event_reads_back_as_the_core_wrote_it() -> None:
    ev = TraceEvent.of(
        1500, "replica.adopted", model="m", replica="m-r1", nodes=("n1", "n2"), ready=True
    )
    wire = TraceEventW.from_core(ev)
    assert wire.model_dump(mode="json") == {
        "t_ms": 1500,
        "kind": "replica.adopted",
        "subjects": {"model": "m", "nodes": ["n1", "n2"], "ready": True, "replica": "m-r1"},
    }
    assert wire.to_core() == ev


BASE_SPEC = ShardSpecW.from_core(
    ShardSpec(
        ReplicaId("m-r1"),
        ModelName("m"),
        ProfileName("p"),
        EngineName("sim"),
        "/m",
        0,
        2,
        NodeId("n1"),
        (0, 1),
        NodeId("n1"),
        (NodeId("n1"), NodeId("n2")),
    )
).model_dump()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"rank": "0"}, "rank: Input should be a valid integer"),
        ({"rank": 2}, "rank 2 is not below shard_count 2"),
        ({"engine": "trt"}, "unknown engine 'trt'"),
        ({"gpus": [0, 0]}, "gpus must not repeat"),
        ({"nodes": ["n2", "n1"]}, "nodes must list one node per rank, the leader first"),
        ({"rendezvous_port": 70000}, "rendezvous_port: Input should be less than or equal"),
        ({"replica": "a/b"}, "replica: String should match pattern"),
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
    ],
)
def test_invalid_specs_are_refused_naming_the_field(change: dict[str, object], says: str) -> None:
    with pytest.raises(ValidationError) as err:
        ShardSpecW.model_validate(BASE_SPEC | change)
    assert says in describe_errors(err.value.errors())


# --- the controller's config ---------------------------------------------------------------

CONFIG = """\
listen: {host: 127.0.0.1, port: 8080}
store: state/controller.db
timings: {heartbeat_interval: 2s, node_lost_after: 20s, reconcile_interval: 250ms}
profiles:
  tiny-2n: {engine: sim, nodes: 2, gpus_per_node: 1, model: /models/tiny, load_time: 1s}
  big: {engine: vllm, nodes: 1, gpus_per_node: 8, model: /models/big, args: [--dtype, bf16]}
deployments:
  - {model: tiny, profile: tiny-2n, replicas: 2}
"""


def test_the_controller_config_reads_as_a_scenario_would(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(CONFIG)
    s = load_controller_config(path)
    assert (s.host, s.port, s.store) == ("127.0.0.1", 8080, str(tmp_path / "state/controller.db"))
    assert s.timings == Timings(2_000, 10_000, 20_000, 250)
    assert s.profiles == (
        Profile(ProfileName("tiny-2n"), EngineName("sim"), 2, 1, "/models/tiny", 1_000),
        Profile(
            ProfileName("big"), EngineName("vllm"), 1, 8, "/models/big", 0, ("--dtype", "bf16")
        ),
    )
    assert s.deployments == (Deployment(ModelName("tiny"), ProfileName("tiny-2n"), 2),)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (("profile: tiny-2n, replicas: 2", "profile: nope, replicas: 2"), "unknown profile 'nope'"),
        (("load_time: 1s", "load_time: 1 sec"), "profiles.tiny-2n.load_time"),
        (("reconcile_interval: 250ms", "reconcile_interval: 0"), "timings.reconcile_interval"),
        (("node_lost_after: 20s", "node_lost_after: 20s, node_suspect_after: 30s"), "timings"),
        (("port: 8080", "port: 80800"), "listen.port"),
        (("engine: vllm", "engine: trt"), "unknown engine 'trt'"),
        (("replicas: 2", "replicas: -1"), "deployments.0.replicas"),
        (("store: state/controller.db", "stor: x"), "store: Field required"),
        (("listen:", "listen: [1]\nx:"), "listen"),
    ],
)
def test_controller_config_mistakes_name_the_file_and_key(
    tmp_path: Path, edit: tuple[str, str], says: str
) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(CONFIG.replace(*edit))
    with pytest.raises(ConfigError) as err:
        load_controller_config(path)
    assert str(path) in str(err.value) and says in str(err.value)


def test_a_config_that_is_not_yaml_or_not_there_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_controller_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("listen: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_controller_config(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_controller_config(tmp_path / "list.yaml")


def test_the_service_commands_exit_2_on_a_bad_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "agent.yaml").write_text("node: n1\n")
    assert main(["controller", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert main(["agent", "--config", str(tmp_path / "agent.yaml")]) == 2
    err = capsys.readouterr().err
    assert "missing.yaml: cannot read the config" in err
    assert "agent.yaml: controller: Field required" in err
