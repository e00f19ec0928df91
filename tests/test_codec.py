"""The one codec: every record round-trips through JSON-shaped data and canonical text, and the
wire's models cannot drift from the core's records they carry."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw_twin import codec
from llmgw_twin.control import protocol as p
from llmgw_twin.control.durable import ReplicaRow
from llmgw_twin.control.model import (
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaId,
    Role,
    ShardReport,
    ShardSpec,
    ShardState,
    TraceEvent,
)
from llmgw_twin.control.topology import NodeTopology, TopologyRules
from llmgw_twin.service.common import wire

# The codec has no constraints of its own (those are the wire's): any text, any integer.
texts = st.text(max_size=12)
ints = st.integers(-(2**63), 2**63 - 1)
int_tuples = st.lists(ints, max_size=4).map(tuple)
text_tuples = st.lists(texts, max_size=4).map(tuple)

shard_specs = st.builds(
    ShardSpec,
    replica=texts.map(ReplicaId),
    model=texts.map(ModelName),
    profile=texts.map(ProfileName),
    engine=texts.map(EngineName),
    model_path=texts,
    rank=ints,
    shard_count=ints,
    node=texts.map(NodeId),
    gpus=int_tuples,
    leader=texts.map(NodeId),
    nodes=st.lists(texts.map(NodeId), max_size=4).map(tuple),
    rendezvous_port=ints,
    rank_ports=int_tuples,
    load_time_ms=ints,
    args=text_tuples,
)
shard_reports = st.builds(
    ShardReport,
    spec=shard_specs,
    state=st.sampled_from(list(ShardState)),
    endpoint=st.none() | texts,
    exit_code=st.none() | ints,
    argv=text_tuples,
)
profiles = st.builds(
    Profile,
    name=texts.map(ProfileName),
    engine=texts.map(EngineName),
    nodes=st.integers(1, 2**63 - 1),
    gpus_per_node=st.integers(1, 2**63 - 1),
    model=texts,
    load_time_ms=ints,
    args=text_tuples,
)
node_infos = st.builds(
    NodeInfo,
    node=texts.map(NodeId),
    fabric=texts.map(FabricId),
    gpus=ints,
    gpu_memory_mib=ints,
    engines=st.lists(texts.map(EngineName), max_size=4).map(tuple),
)
deployments = st.builds(
    Deployment, model=texts.map(ModelName), profile=texts.map(ProfileName), replicas=ints
)
replica_rows = st.builds(
    ReplicaRow,
    id=texts.map(ReplicaId),
    model=texts.map(ModelName),
    profile=texts.map(ProfileName),
    seq=ints,
    created_ms=ints,
    fabric=texts.map(FabricId),
    shard_count=ints,
    specs=st.lists(shard_specs, max_size=3).map(tuple),
)
records = st.one_of(shard_specs, shard_reports, profiles, node_infos, deployments, replica_rows)


@given(records)
def test_every_record_round_trips_through_data_and_canonical_text(record: object) -> None:
    cls = type(record)
    assert codec.decode(cls, codec.encode(record)) == record
    text = codec.dumps(record)
    assert codec.loads(cls, text) == record
    assert codec.loads(cls, text.encode()) == record
    assert codec.dumps(codec.loads(cls, text)) == text  # canonical: the same record, same bytes


def test_decoding_is_strict_and_names_the_field() -> None:
    data = codec.encode(NodeInfo(NodeId("n1"), FabricId("ib-a"), 8, 81920, ()))
    with pytest.raises(codec.CodecError, match="gpus: Expected `int`, got `str`"):
        codec.decode(NodeInfo, data | {"gpus": "8"})
    with pytest.raises(codec.CodecError, match="fabric: required field missing"):
        codec.decode(NodeInfo, {k: v for k, v in data.items() if k != "fabric"})
    with pytest.raises(codec.CodecError, match="record: invalid JSON"):
        codec.loads(NodeInfo, "{")


# --- the wire's models are the core's records, by field name ----------------------------------

# (model, its record, fields it carries beyond the record, the record's fields it does not carry)
WIRE_RECORDS: list[tuple[type[wire.Wire], type, set[str], set[str]]] = [
    (wire.NodeInfoW, NodeInfo, set(), set()),
    (wire.NodeTopologyW, NodeTopology, set(), set()),
    (wire.TopologyRulesW, TopologyRules, set(), set()),
    (wire.ShardSpecW, ShardSpec, set(), set()),
    (wire.ShardReportW, ShardReport, set(), set()),
    (wire.HeartbeatW, p.Heartbeat, set(), set()),
    (wire.AssignShardsW, p.AssignShards, set(), set()),
    (wire.RequestReportW, p.RequestReport, set(), set()),
    (wire.NodeRegisteredW, p.NodeRegistered, {"agent_url"}, set()),  # where the agent listens
    (wire.ProfileW, Profile, set(), {"name"}),  # the name is the URL path's (or config key's)
    (wire.DeploymentW, Deployment, set(), {"model"}),  # the model is the URL path's
    (wire.RoleW, Role, set(), set()),
    (wire.TraceEventW, TraceEvent, set(), set()),  # subjects: pairs in the core, a dict here
]
NO_RECORD = {wire.Wire, wire.Mirror, wire.ReportReplyW}  # the controller's reply is the shell's


@pytest.mark.parametrize(
    ("model", "record", "extras", "elsewhere"),
    WIRE_RECORDS,
    ids=[m.__name__ for m, *_ in WIRE_RECORDS],
)
def test_a_wire_model_has_its_records_fields(
    model: type[wire.Wire], record: type, extras: set[str], elsewhere: set[str]
) -> None:
    record_fields = {f.name for f in dataclasses.fields(record)}
    assert set(model.model_fields) == (record_fields - elsewhere) | extras
    assert not extras & record_fields and elsewhere <= record_fields
    if issubclass(model, wire.Mirror):
        assert model.core is record and not extras and not elsewhere


def test_every_wire_model_is_checked_against_its_record() -> None:
    models = {
        cls
        for _, cls in inspect.getmembers(wire, inspect.isclass)
        if issubclass(cls, wire.Wire)
        and cls.__module__ == wire.__name__
        and cls.__pydantic_generic_metadata__["origin"] is None  # not a `Mirror[Record]` base
    }
    checked = {m for m, *_ in WIRE_RECORDS}
    assert models - NO_RECORD - checked == set(), "add the new model to WIRE_RECORDS"


def test_the_wire_normalises_failed_gpus_and_carries_the_agent_url_beside_the_record() -> None:
    info = NodeInfo(NodeId("n1"), FabricId("ib-a"), 8, 81920, (EngineName("sim"),))
    reg = wire.NodeRegisteredW.from_core(p.NodeRegistered(info, (), 3), "http://a:1")
    assert reg.model_dump(mode="json") == {
        "info": codec.encode(info),
        "shards": [],
        "incarnation": 3,
        "agent_url": "http://a:1",
        "failed_gpus": [],
        "fabric_up": True,
        "heartbeat_interval_ms": 0,
        "version": 0,
    }
    again = reg.model_copy(update={"failed_gpus": [3, 1, 3]})
    assert again.to_core() == p.NodeRegistered(info, (), 3, (1, 3))
    beat = wire.HeartbeatW.model_validate({"node": "n1", "failed_gpus": [2, 0, 2]})
    assert beat.to_core() == p.Heartbeat(NodeId("n1"), (), (0, 2))
    assert wire.ProfileW.model_validate(
        {"engine": "sim", "gpus_per_node": 2, "model": "/m"}
    ).to_core("p") == Profile(ProfileName("p"), EngineName("sim"), 1, 2, "/m")
