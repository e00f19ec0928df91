"""A straggler's pace in the sim engine (`programs/sim_pace.py`) and how it gets there: the pace
file real mode writes (`realmode/pace.py`), the flags the agent hands its sim engines, a worker's
pace told to its leader, the load and the answers it slows, and a worker's ready file.

The real processes here are the sim engine's own (as in `test_sim_engine.py`); a whole run on real
processes is `test_real_pace.py`. Durations are only ever bounded below: a sleep never ends early.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.services import free_ports
from llmgw_twin.control.model import (
    EngineName,
    ModelName,
    NodeId,
    ProfileName,
    ReplicaId,
    ShardSpec,
)
from llmgw_twin.engines.base import LaunchContext, Readiness
from llmgw_twin.engines.perf.model import EnginePerf
from llmgw_twin.engines.sim import SimAdapter
from llmgw_twin.programs import sim_pace, sim_pacing
from llmgw_twin.programs.sim_api import SimModel, create_app
from llmgw_twin.programs.sim_batcher import Batcher
from llmgw_twin.programs.sim_pace import PaceFile, factor_at, format_changes, parse_changes
from llmgw_twin.programs.sim_pacing import Pacing
from llmgw_twin.programs.sim_rendezvous import LeaderRendezvous, join
from llmgw_twin.realmode.pace import node_paces, pace_path
from llmgw_twin.service.agent.launcher import launch_context, probe_for
from llmgw_twin.service.agent.sidecar import engine_state
from test_agent_app import agent_config
from test_sim_engine import MODEL, Replica, chat_body, client, new_replica, replicas

__all__ = ["replicas"]  # a fixture, used by name

THREE = Fraction(3)
ONE = Fraction(1)


# --- the pace file -----------------------------------------------------------------------------


def test_the_pace_file_lists_each_change_and_the_one_in_force_at_an_instant_counts() -> None:
    changes = ((1_000, Fraction(3)), (5_000, Fraction(5, 2)), (9_000, Fraction(1)))
    text = format_changes(changes)
    assert text == "1000 3\n5000 5/2\n9000 1\n"
    assert parse_changes(text) == changes
    at = [factor_at(changes, t) for t in (999, 1_000, 4_999, 5_000, 9_000)]
    assert at == [1, 3, 3, Fraction(5, 2), 1]
    for bad in ("1000 0.5\n", "1000\n", "x 3\n", "1000 101\n"):
        with pytest.raises(ValueError):
            parse_changes(bad)


def test_a_pace_file_is_read_again_only_when_it_was_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pace"
    pace = PaceFile(str(path))
    assert pace.now() == 1  # no file: pace 1
    reads: list[str] = []
    real_parse = sim_pace.parse_changes

    def parse(text: str) -> sim_pace.Changes:
        reads.append(text)
        return real_parse(text)

    monkeypatch.setattr(sim_pace, "parse_changes", parse)
    _replace(path, "100 3\n")
    assert [pace.now(), pace.now(), pace.at(99)] == [THREE, THREE, ONE]
    assert len(reads) == 1
    _replace(path, "100 3\n200 1\n")
    assert [pace.now(), pace.at(150)] == [ONE, THREE]
    assert len(reads) == 2
    _replace(path, "not a pace\n")
    assert pace.now() == 1  # malformed: pace 1, never an error


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_real_mode_keeps_a_nodes_pace_at_the_slowest_slowdown_under_way(tmp_path: Path) -> None:
    (tmp_path / "node02").mkdir()
    paces = node_paces(tmp_path, [])
    node = NodeId("node02")
    pace = PaceFile(str(pace_path(tmp_path / "node02")))
    seen: list[Fraction] = []
    for step, factor in (("begin", 3), ("begin", 2), ("end", 3), ("end", 2)):
        getattr(paces, step)(node, Fraction(factor))
        assert paces.now(node) == pace.now()  # as the file says
        seen.append(pace.now())
    assert seen == [THREE, THREE, Fraction(2), ONE]
    # a change a line, in order, each when it happened; none for a slowdown under a slower one
    factors = [f for _, f in pace.changes()]
    assert factors == [THREE, Fraction(2), ONE]
    assert [t for t, _ in pace.changes()] == sorted(t for t, _ in pace.changes())


# --- what the agent hands a sim engine ---------------------------------------------------------


def _spec(rank: int) -> ShardSpec:
    nodes = (NodeId("node01"), NodeId("node02"))
    return ShardSpec(
        replica=ReplicaId("m-r1"),
        model=ModelName("m"),
        profile=ProfileName("two"),
        engine=EngineName("sim"),
        model_path="/models/m",
        rank=rank,
        shard_count=2,
        node=nodes[rank],
        gpus=(0,),
        leader=nodes[0],
        nodes=nodes,
        rendezvous_port=29500,
        load_time_ms=1000,
    )


def test_the_sim_adapter_passes_the_pace_file_and_a_worker_its_ready_file() -> None:
    ctx = LaunchContext(leader_host="10.0.0.1", pace_file="/p/pace", ready_file="/r/m-r1-1")
    leader, worker = (SimAdapter().launch(_spec(rank), ctx) for rank in (0, 1))
    assert _after(leader.argv, "--pace-file") == ("--pace-file", "/p/pace")
    assert "--ready-file" not in leader.argv and leader.readiness is Readiness.HTTP_200
    assert _after(worker.argv, "--ready-file") == ("--ready-file", "/r/m-r1-1")
    assert (worker.readiness, worker.ready_file) == (Readiness.FILE, "/r/m-r1-1")
    # the twin's launches name neither: its trace's command lines are unchanged
    bare = SimAdapter().launch(_spec(1), LaunchContext(leader_host="node01"))
    assert "--pace-file" not in bare.argv and bare.readiness is Readiness.PROCESS


def _after(argv: tuple[str, ...], flag: str) -> tuple[str, str]:
    i = argv.index(flag)
    return argv[i], argv[i + 1]


def test_the_agent_gives_its_pace_file_and_a_ready_file_beside_its_run_state(
    tmp_path: Path,
) -> None:
    settings = agent_config(tmp_path, "node02", "sim_pace_file: node02/pace\n")
    ctx = launch_context(settings, _spec(1), 8000)
    assert ctx.pace_file == str(tmp_path / "node02" / "pace")  # relative to the config file
    assert settings.run_state is not None and settings.ready_dir is not None
    assert settings.ready_dir == settings.run_state.parent / "node02.ready"
    assert ctx.ready_file == str(settings.ready_dir / "m-r1-1")
    launch = SimAdapter().launch(_spec(1), ctx)
    assert probe_for(settings, launch).args == ("--probe-file", ctx.ready_file)


def test_the_sidecar_reads_a_rank_ready_once_its_file_is_there(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    args = argparse.Namespace(probe_http=None, probe_tcp=None, probe_file=str(ready))
    assert engine_state(args)["up"] is False
    ready.write_text("1\n")
    assert engine_state(args) | {"detail": ""} == {
        "probe": "file",
        "target": str(ready),
        "up": True,
        "detail": "",
    }


# --- the answers, at the replica's pace --------------------------------------------------------


def test_an_answer_accepted_at_pace_3_takes_three_times_its_tokens_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float, *a: Any) -> None:
        slept.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)  # as `sim_pacing` calls it
    pace = [THREE]
    app = create_app(SimModel(MODEL, "/models/m", token_latency_ms=10, pace=lambda: pace[0]))

    async def go() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as c:
            plain = await c.post("/v1/chat/completions", json=chat_body("hi", max_tokens=4))
            pace[0] = Fraction(1)
            again = await c.post("/v1/chat/completions", json=chat_body("hi", max_tokens=4))
            return [plain.json()["usage"]["completion_tokens"], again.status_code]

    tokens, status = asyncio.run(go())
    assert status == 200 and tokens == 4
    assert slept == [pytest.approx(0.03 * 4), pytest.approx(0.01 * 4)]


def test_a_batch_runs_the_iterations_after_a_submission_at_the_pace_then() -> None:
    perf = EnginePerf("t", Fraction(1000), Fraction(10), Fraction(100), 8, 10_000)

    async def first_token_us(factor: Fraction) -> int | None:
        batcher = Batcher(perf, clock_us=lambda: 0, pace=lambda: factor)
        ticket = batcher.submit(50, 3)
        when = batcher.engine.next_first_token_us()
        batcher.cancel(ticket)
        return when

    assert asyncio.run(first_token_us(Fraction(1))) == perf.iteration(50, 0)
    assert asyncio.run(first_token_us(THREE)) == perf.iteration(50, 0, THREE)


def test_a_replica_runs_at_its_slowest_nodes_pace(tmp_path: Path) -> None:
    assert Pacing(None, 0.01, lambda: THREE).latency() == pytest.approx(0.03)
    assert Pacing(None, 0.0, lambda: THREE).pace is None  # nothing to slow: never read
    rdv = LeaderRendezvous(2, MODEL)
    assert sim_pacing.replica_pace(None, LeaderRendezvous(1, MODEL)) is None
    own = tmp_path / "pace"
    replica = sim_pacing.replica_pace(PaceFile(str(own)), rdv)
    assert replica is not None and replica() == 1
    rdv.slowest = THREE
    assert replica() == 3
    _replace(own, "1 5\n")
    assert replica() == 5


def test_a_worker_tells_its_leader_its_pace_at_the_join_and_each_change_after() -> None:
    async def go() -> list[Fraction]:
        (port,) = free_ports(1)
        rdv = LeaderRendezvous(2, MODEL)
        await rdv.start("127.0.0.1", port)
        deadline = asyncio.get_running_loop().time() + 10
        link = await join(
            "127.0.0.1", port, rank=1, nnodes=2, model=MODEL, deadline_s=deadline, pace=THREE
        )
        seen = [rdv.slowest]
        link.send_pace(Fraction(3, 2))
        await _until(lambda: rdv.slowest != THREE)
        seen.append(rdv.slowest)
        link.close()
        await _until(lambda: not rdv.joined)
        seen.append(rdv.slowest)  # a worker gone leaves no pace behind
        await rdv.close(clean=False)
        return seen

    assert asyncio.run(go()) == [3, Fraction(3, 2), 1]


async def _until(condition: Any, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


# --- real processes ----------------------------------------------------------------------------


def test_a_slow_worker_loads_late_says_it_is_ready_then_and_slows_its_leaders_answers(
    replicas: list[Replica], tmp_path: Path
) -> None:
    """node02 runs at pace 5 from before its worker starts: the worker loads 5 times as long
    and writes its ready file only then, while the leader (pace 1) loads on time; the leader's
    answers take the worker's pace until it goes back to 1."""
    leader_pace, worker_pace, ready = tmp_path / "node01", tmp_path / "node02", tmp_path / "ready"
    _replace(worker_pace, f"{sim_pace.boottime_ns()} 5\n")
    replica = new_replica(replicas, 2, load_time_ms=200)
    leader = replica.start(0, "--pace-file", str(leader_pace), "--token-latency-ms", "40")
    worker = replica.start(1, "--pace-file", str(worker_pace), "--ready-file", str(ready))
    assert "at pace 5" in leader.wait_log("rank 1 joined")
    leader.wait_log("loaded in 200 ms")
    leader.wait_log("serving")
    worker.wait_log("loaded in 1000 ms")
    worker.wait_log("ready: loaded and joined")
    assert ready.read_text() == f"{worker.proc.pid}\n"

    with client() as c:
        started = time.monotonic()
        r = c.post(replica.base + "/v1/chat/completions", json=chat_body("hi", max_tokens=4))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert time.monotonic() - started >= 5 * 4 * 0.040  # at the worker's pace, 5

    _replace(worker_pace, f"{sim_pace.boottime_ns() - 10**9} 5\n{sim_pace.boottime_ns()} 1\n")
    worker.wait_log("the node's pace is now 1")
    leader.wait_log("rank 1 runs at pace 1")
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0
    assert not ready.exists()  # taken back as it exits
