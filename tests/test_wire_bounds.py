"""The wire models' bounds (`limits.MAX_*`): a message past one is a 422 naming the field; and the
bounds fit together, so nothing a valid agent sends is refused for its size."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from helpers.controller import PROFILE, controller, registration
from llmgw_twin.control.model import (
    ENGINES,
    EngineName,
    ModelName,
    NodeId,
    ProfileName,
    ReplicaId,
    ShardReport,
    ShardSpec,
    ShardState,
)
from llmgw_twin.control.protocol import Heartbeat
from llmgw_twin.engines.base import LaunchContext
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.service.common.limits import (
    CONTROL_BODY_LIMIT,
    MAX_ARGS,
    MAX_ARGS_CHARS,
    MAX_ARGV,
    MAX_ARGV_CHARS,
    MAX_GPUS_PER_NODE,
    MAX_INT,
    MAX_REPLICA_NODES,
    MAX_REPLICAS,
    MAX_SHARDS_PER_MESSAGE,
)
from llmgw_twin.service.common.wire import HeartbeatW, ShardReportW


def largest_spec(engine: str, rank: int) -> ShardSpec:
    """A shard with every field at its bound: 64 nodes of 128-character names, a 4 KiB model
    path, 64 GPUs, the most args of the most text."""
    nodes = tuple(NodeId(f"{i:03d}" + "n" * 125) for i in range(MAX_REPLICA_NODES))
    return ShardSpec(
        replica=ReplicaId("r" * 128),
        model=ModelName("m" * 128),
        profile=ProfileName("p" * 128),
        engine=EngineName(engine),
        model_path="/" + "x" * 4095,
        rank=rank,
        shard_count=MAX_REPLICA_NODES,
        node=nodes[rank],
        gpus=tuple(range(MAX_GPUS_PER_NODE)),
        leader=nodes[0],
        nodes=nodes,
        rendezvous_port=29500,
        rank_ports=tuple(29500 + i for i in range(MAX_REPLICA_NODES)),
        load_time_ms=MAX_INT,
        args=("a" * (MAX_ARGS_CHARS // MAX_ARGS),) * MAX_ARGS,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_the_argv_an_adapter_makes_for_the_largest_shard_is_a_valid_report(engine: str) -> None:
    ctx = LaunchContext(
        leader_host="h" * 253, binary="/" + "b" * 4095, worker_binary="/" + "w" * 4095
    )
    for rank in (0, 1):
        spec = largest_spec(engine, rank)
        argv = adapter_for(engine).launch(spec, ctx).argv
        assert len(argv) <= MAX_ARGV and sum(map(len, argv)) <= MAX_ARGV_CHARS
        report = ShardReport(spec, ShardState.SERVING, "http://" + "e" * 500, -MAX_INT, argv)
        assert ShardReportW.from_core(report).to_core() == report


def test_the_largest_heartbeat_the_bounds_allow_fits_the_body_limit_and_is_taken(
    tmp_path: Path,
) -> None:
    """Every shard of a node at every bound, its argv the longest: a heartbeat is never
    refused for its size (a node whose heartbeats were refused would be declared lost)."""
    longest_argv = ("v" * (MAX_ARGV_CHARS // MAX_ARGV),) * MAX_ARGV
    report = ShardReport(
        largest_spec("vllm", 0),
        ShardState.EXITED,
        "http://" + "e" * 505,
        -MAX_INT,
        longest_argv,
        reason="r" * 4096,
    )
    beat = Heartbeat(
        NodeId("n" * 128), (report,) * MAX_SHARDS_PER_MESSAGE, tuple(range(MAX_GPUS_PER_NODE))
    )
    raw = HeartbeatW.from_core(beat).model_dump_json().encode()
    assert 0.7 * CONTROL_BODY_LIMIT < len(raw) <= CONTROL_BODY_LIMIT

    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            headers = {"content-type": "application/json"}
            r = await client.post("/v1/agents/heartbeat", content=raw, headers=headers)
            assert r.status_code == 200 and r.json() == {"report": True}, r.text[:300]

    asyncio.run(go())


BAD_PROFILES: list[tuple[dict[str, Any], str]] = [
    (PROFILE | {"args": ["--x"] * (MAX_ARGS + 1)}, "body.args: List should have at most 256"),
    (PROFILE | {"args": ["x" * 4097]}, "body.args.0: String should have at most 4096"),
    (PROFILE | {"args": ["x" * 4096] * 5}, f"20480 characters together, over the {MAX_ARGS_CHARS}"),
    (PROFILE | {"gpus_per_node": MAX_GPUS_PER_NODE + 1}, "body.gpus_per_node"),
    (PROFILE | {"nodes": MAX_REPLICA_NODES + 1}, "body.nodes"),
    (PROFILE | {"load_time_ms": MAX_INT + 1}, "body.load_time_ms"),
]


def test_profiles_past_a_bound_are_422_naming_it_and_not_stored(tmp_path: Path) -> None:
    async def go() -> None:
        async with controller(tmp_path) as (runtime, client):
            for body, why in BAD_PROFILES:
                r = await client.put("/v1/admin/profiles/p", json=body)
                assert r.status_code == 422 and why in r.json()["detail"], r.text
            r = await client.put(
                "/v1/admin/deployments/m", json={"profile": "p", "replicas": MAX_REPLICAS + 1}
            )
            assert r.status_code == 422 and "body.replicas" in r.json()["detail"]
            assert not runtime.store.load().profiles
            r = await client.put("/v1/admin/profiles/p", json=BAD_PROFILES[2][0] | {"args": []})
            assert r.status_code == 200, r.text

    asyncio.run(go())


def test_agent_messages_past_a_bound_are_422_naming_it(tmp_path: Path) -> None:
    """A node of more GPUs than any has (its state view would list each), integers SQLite
    cannot store, URLs the HTTP client cannot send to, more shards than a node holds."""
    spec = largest_spec("sim", 0)
    one = ShardReport(spec, ShardState.RUNNING, None, None, ())
    beat = HeartbeatW.from_core(Heartbeat(NodeId("n1"), (one,))).model_dump(mode="json")
    bad = [
        ("/v1/agents/register", registration(gpus=MAX_GPUS_PER_NODE + 1), "body.info.gpus"),
        ("/v1/agents/register", registration() | {"incarnation": 2**63}, "body.incarnation"),
        ("/v1/agents/register", registration() | {"agent_url": "http://a\x17b"}, "agent_url"),
        ("/v1/agents/register", registration() | {"agent_url": "http://a:x"}, "Invalid port"),
        ("/v1/agents/heartbeat", beat | {"failed_gpus": [MAX_GPUS_PER_NODE]}, "failed_gpus.0"),
        (
            "/v1/agents/heartbeat",
            beat | {"shards": beat["shards"] * (MAX_SHARDS_PER_MESSAGE + 1)},
            "body.shards: List should have at most 64",
        ),
    ]

    async def go() -> None:
        async with controller(tmp_path) as (runtime, client):
            for path, body, why in bad:
                r = await client.post(path, json=body)
                assert r.status_code == 422 and why in r.json()["detail"], r.text
            assert runtime.core.nodes() == []

    asyncio.run(go())
