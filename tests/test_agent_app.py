"""The node agent service: its API through `httpx.ASGITransport`, and real processes.

The agent runtime runs in this process against a fake controller (an `httpx.MockTransport` that
records every report); the sidecars and sim engines it starts are real processes on loopback.
Every wait has a deadline and fails when it passes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.services import eventually, free_range, gone, shard
from llmgw_twin.control.model import ShardSpec
from llmgw_twin.control.protocol import AssignShards
from llmgw_twin.service.agent.app import AgentRuntime, create_agent_app
from llmgw_twin.service.agent.config import AgentSettings, load_agent_config
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.agent.launcher import (
    EXIT_REFUSED,
    SIM_MODULE_ARGV,
    Refusal,
    resolve_argv,
)
from llmgw_twin.service.agent.processes import spawn, stop_group
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.common.wire import AssignShardsW

Posts = list[tuple[str, dict[str, Any]]]


def agent_config(tmp_path: Path, node: str, extra: str = "") -> AgentSettings:
    first, last = free_range(8)
    root = tmp_path / node
    write_sysfs_root(root, gpus=2, fabric_prefix=fabric_prefix_for("ib-a"), node=node)
    path = tmp_path / f"{node}.yaml"
    path.write_text(
        f"node: {node}\n"
        "controller: http://controller.test\n"
        "listen: {host: 127.0.0.1, port: 9}\n"
        f"root: {node}\n"
        f"ports: {{first: {first}, last: {last}}}\n"
        "heartbeat_interval: 200ms\n"
        "stop_grace: 3s\n"
        "worker_settle: 300ms\n"
        f"log_dir: logs-{node}\n" + extra
    )
    return load_agent_config(path)


@asynccontextmanager
async def agent(
    tmp_path: Path, node: str, posts: Posts, extra: str = "", forgetful: bool = False
) -> AsyncIterator[AgentRuntime]:
    """A started agent whose controller records every report; a `forgetful` one answers every
    heartbeat as a controller that does not know the node would."""

    async def controller(request: httpx.Request) -> httpx.Response:
        posts.append((request.url.path, json.loads(request.content)))
        asks = forgetful and request.url.path == "/v1/agents/heartbeat"
        return httpx.Response(200, json={"report": asks})

    runtime = AgentRuntime(
        agent_config(tmp_path, node, extra), controller_transport=httpx.MockTransport(controller)
    )
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


def assign(runtime: AgentRuntime, *specs: ShardSpec) -> None:
    body = AssignShardsW.from_core(AssignShards(runtime.info.node, specs))
    runtime.assign(body)


def reported(posts: Posts, node: str, replica: str, rank: int) -> dict[str, Any] | None:
    """The shard as the node's latest report shows it."""
    for _, body in reversed(posts):
        who = body.get("node") or body.get("info", {}).get("node")
        if who != node:
            continue
        for s in body["shards"]:
            if s["spec"]["replica"] == replica and s["spec"]["rank"] == rank:
                return dict(s)
        return None
    return None


def history(runtime: AgentRuntime, replica: str, rank: int) -> list[tuple[str, int]]:
    return [
        (h.what, h.t_ms) for h in runtime.shards.history if (h.replica, h.rank) == (replica, rank)
    ]


async def started_in_order(runtime: AgentRuntime, replica: str, rank: int) -> None:
    """Sidecar started, sidecar up, then (and only then) the engine; fails at the deadline."""

    async def engine_started() -> list[tuple[str, int]] | None:
        steps = history(runtime, replica, rank)
        return steps if "engine-started" in [w for w, _ in steps] else None

    steps = await eventually(engine_started, 20, f"the engine of {replica}/{rank} to start")
    whats = [w for w, _ in steps]
    assert whats[:3] == ["sidecar-started", "sidecar-up", "engine-started"], steps
    assert steps[1][1] <= steps[2][1]


def pgids(runtime: AgentRuntime) -> list[int]:
    return [p["pid"] for p in runtime.shards.processes()]


# --- the rules, on literals ------------------------------------------------------------------


def test_only_the_sim_engine_and_configured_binaries_may_run(tmp_path: Path) -> None:
    bare = agent_config(tmp_path, "n1")
    argv = resolve_argv(bare, "sim", ("llmgw-twin", "sim-engine", "--model", "m"))
    assert argv == (*SIM_MODULE_ARGV, "sim-engine", "--model", "m")
    assert argv[0] == sys.executable
    with pytest.raises(Refusal, match="not onboarded") as refused:
        resolve_argv(bare, "vllm", ("vllm", "serve", "m"))
    assert refused.value.exit_code == EXIT_REFUSED
    onboarded = agent_config(
        tmp_path,
        "n2",
        "engines:\n  vllm: /opt/vllm/bin/vllm\n"
        "  llamacpp: {binary: /opt/llama/llama-server, worker_binary: /opt/llama/rpc-server}\n",
    )
    assert onboarded.engine_names == ("sim", "llamacpp", "vllm")
    assert resolve_argv(onboarded, "vllm", ("/opt/vllm/bin/vllm", "serve"))[0].endswith("vllm")
    assert resolve_argv(onboarded, "llamacpp", ("/opt/llama/rpc-server", "-p", "1"))
    with pytest.raises(Refusal, match="not a binary this agent's config names"):
        resolve_argv(onboarded, "vllm", ("/usr/bin/python3", "-c", "print()"))


def test_a_config_without_engines_is_accepted_with_a_plain_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = agent_config(tmp_path, "n1")
    assert settings.engines == () and settings.engine_names == ("sim",)
    with caplog.at_level(logging.WARNING):
        runtime = AgentRuntime(settings)
    assert "can run the sim engine and nothing else" in caplog.text
    assert runtime.info.gpus == 2 and runtime.info.engines == ("sim",)
    assert runtime.info.fabric.startswith("ib-fec0-")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("engines: {tensorrt: /bin/x}\n", "unknown engine 'tensorrt'"),
        ("stop_grace: 5 seconds\n", "stop_grace"),
        ("gpu_memory: 80GB\n", "gpu_memory"),
        ("colour: blue\n", "colour: Extra inputs are not permitted"),
    ],
)
def test_agent_config_mistakes_name_the_key(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        agent_config(tmp_path, "n1", extra)


def test_stop_group_ends_children_and_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    child = "import time; time.sleep(60)"
    parent = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "p.log"
    proc = spawn([sys.executable, "-c", parent], None, log)

    async def started() -> bool | None:
        return True if "ready" in log.read_text() else None

    async def go() -> int | None:
        await eventually(started, 10, "the process and its child to start")
        return await stop_group(proc, grace_s=0.3)

    assert asyncio.run(go()) == -signal.SIGKILL
    assert gone([proc.pid])


# --- the API through ASGITransport ------------------------------------------------------------


def test_agent_api_answers_and_refuses_bad_input_with_422(tmp_path: Path) -> None:
    async def go() -> None:
        posts: Posts = []
        async with agent(tmp_path, "n1", posts) as runtime:
            transport = httpx.ASGITransport(app=create_agent_app(runtime))
            async with httpx.AsyncClient(transport=transport, base_url="http://agent") as c:
                assert (await c.get("/health")).json()["node"] == "n1"
                r = await c.post("/v1/assign", json={"node": "n1", "shards": []})
                assert r.status_code == 200 and r.json() == {"ok": True, "shards": 0}
                r = await c.post("/v1/assign", json={"node": "n2", "shards": []})
                assert r.status_code == 409 and "this agent is node n1" in r.json()["detail"]
                too_many = shard("r", 0, ("n1",), gpus=(5,))
                body = AssignShardsW.from_core(AssignShards(runtime.info.node, (too_many,)))
                r = await c.post("/v1/assign", json=body.model_dump(mode="json"))
                assert r.status_code == 422 and "has 2" in r.json()["detail"]
                for path, bad in [
                    ("/v1/assign", b"{"),
                    ("/v1/assign", {"node": "n1"}),
                    ("/v1/assign", {"node": "n1", "shards": [{"rank": -1}]}),
                    ("/v1/report-request", {"node": 3}),
                    ("/v1/report-request", b""),
                ]:
                    if isinstance(bad, bytes):
                        hdrs = {"content-type": "application/json"}
                        r = await c.post(path, content=bad, headers=hdrs)
                    else:
                        r = await c.post(path, json=bad)
                    assert r.status_code == 422, (path, bad, r.text)
                    assert r.json()["detail"].startswith("invalid request: ")
                r = await c.post("/v1/report-request", json={"node": "n1"})
                assert r.status_code == 200
                # a leader of epoch 3 spoke: a deposed leader's commands (epoch 2) are refused
                r = await c.post("/v1/assign", json={"node": "n1", "shards": [], "epoch": 3})
                assert r.status_code == 200
                for path, payload in [
                    ("/v1/assign", {"node": "n1", "shards": [], "epoch": 2}),
                    ("/v1/report-request", {"node": "n1", "epoch": 2}),
                ]:
                    r = await c.post(path, json=payload)
                    assert r.status_code == 409, (path, r.text)
                    assert "epoch 2 is older than epoch 3" in r.json()["detail"]
                state = (await c.get("/v1/state")).json()
                assert state["info"]["node"] == "n1" and state["shards"] == []

            async def registered_twice() -> bool | None:
                regs = [p for p in posts if p[0] == "/v1/agents/register"]
                return True if len(regs) >= 2 else None

            await eventually(registered_twice, 5, "the registration at start and on request")
            reg = next(b for p, b in posts if p == "/v1/agents/register")
            assert reg["agent_url"] == "http://127.0.0.1:9" and reg["info"]["gpus"] == 2

    asyncio.run(go())


def test_an_agent_asked_in_band_registers_again(tmp_path: Path) -> None:
    async def go() -> None:
        posts: Posts = []
        async with agent(tmp_path, "n1", posts, forgetful=True):

            async def re_registered() -> bool | None:
                paths = [p for p, _ in posts]
                if "/v1/agents/heartbeat" not in paths:
                    return None
                after = paths[paths.index("/v1/agents/heartbeat") :]
                return True if "/v1/agents/register" in after else None

            await eventually(re_registered, 5, "a registration answering the heartbeat's reply")

    asyncio.run(go())


# --- real processes --------------------------------------------------------------------------


def test_one_node_replica_sidecar_first_then_serving_then_stopped(tmp_path: Path) -> None:
    async def go() -> None:
        posts: Posts = []
        async with agent(tmp_path, "n1", posts) as runtime:
            spec = shard("solo-r1", 0, ("n1",), gpus=(0, 1))
            assign(runtime, spec)
            await started_in_order(runtime, "solo-r1", 0)

            async def serving() -> dict[str, Any] | None:
                s = reported(posts, "n1", "solo-r1", 0)
                return s if s is not None and s["state"] == "serving" else None

            report = await eventually(serving, 30, "the leader to serve")
            assert report["argv"][0] == sys.executable and "sim-engine" in report["argv"]
            async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
                r = await client.post(report["endpoint"] + "/v1/chat/completions", json=chat)
                assert r.status_code == 200, r.text
            started = pgids(runtime)
            assert len(started) == 2  # the sidecar and the engine, each its own group

            assign(runtime)  # the controller no longer wants it

            async def stopped() -> bool | None:
                whats = [w for w, _ in history(runtime, "solo-r1", 0)]
                return True if whats[-1] == "stopped" and gone(started) else None

            await eventually(stopped, 10, "the shard stopped and its process groups gone")

    asyncio.run(go())


def test_two_node_replica_serves_and_an_engine_exit_is_reported_with_its_code(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        posts: Posts = []
        nodes = ("n1", "n2")
        rendezvous = free_range(1)[0]
        async with agent(tmp_path, "n1", posts) as a1, agent(tmp_path, "n2", posts) as a2:
            specs = [shard("duo-r1", k, nodes, rendezvous_port=rendezvous) for k in (0, 1)]
            assign(a2, specs[1])  # the worker first: it waits for its leader's rendezvous
            assign(a1, specs[0])
            await started_in_order(a1, "duo-r1", 0)
            await started_in_order(a2, "duo-r1", 1)

            async def up() -> bool | None:
                leader = reported(posts, "n1", "duo-r1", 0)
                worker = reported(posts, "n2", "duo-r1", 1)
                if (
                    leader
                    and worker
                    and (leader["state"], worker["state"])
                    == (
                        "serving",
                        "running",
                    )
                ):
                    return True
                return None

            await eventually(up, 30, "the leader serving and the worker running")
            worker_pid = a2.shards.describe(specs[1].key)["engine_pid"]
            os.kill(worker_pid, signal.SIGKILL)

            async def exits() -> tuple[Any, Any] | None:
                leader = reported(posts, "n1", "duo-r1", 0)
                worker = reported(posts, "n2", "duo-r1", 1)
                if leader and worker and leader["state"] == worker["state"] == "exited":
                    return leader["exit_code"], worker["exit_code"]
                return None

            codes = await eventually(exits, 20, "both exits reported")
            assert codes == (1, -signal.SIGKILL)  # the leader lost its worker: exit 1

    asyncio.run(go())


def test_shutdown_stops_every_shard_and_leaves_no_process(tmp_path: Path) -> None:
    async def go() -> list[int]:
        posts: Posts = []
        async with agent(tmp_path, "n1", posts) as runtime:
            a = shard("a-r1", 0, ("n1",), gpus=(0,))
            b = shard("b-r1", 0, ("n1",), gpus=(1,), rendezvous_port=29501)
            assign(runtime, a, b)
            await started_in_order(runtime, "a-r1", 0)
            await started_in_order(runtime, "b-r1", 0)
            running = pgids(runtime)
            assert len(running) == 4
        return running  # the runtime has stopped

    assert gone(asyncio.run(go()))


def test_an_engine_the_node_was_not_onboarded_with_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> dict[str, Any]:
        posts: Posts = []
        async with agent(tmp_path, "n1", posts) as runtime:
            assign(runtime, shard("v-r1", 0, ("n1",), engine="vllm"))

            async def exited() -> dict[str, Any] | None:
                s = reported(posts, "n1", "v-r1", 0)
                return s if s is not None and s["state"] == "exited" else None

            report = await eventually(exited, 10, "the refusal reported")
            assert "engine-started" not in [w for w, _ in history(runtime, "v-r1", 0)]
            return report

    with caplog.at_level(logging.ERROR, logger="llmgw_twin.agent"):
        report = asyncio.run(go())
    assert report["exit_code"] == EXIT_REFUSED
    assert "engine 'vllm' is not onboarded on this node" in caplog.text


def test_an_agent_follows_the_controller_that_leads(tmp_path: Path) -> None:
    """Given every controller's address, an agent reports to the one that answers: the first
    is down (a standby does not answer, a dead leader is gone), so the second gets the report
    and stays the one tried first, until it fails in turn and the first answers again."""
    down = {"c1"}
    seen: list[tuple[str, str]] = []

    async def controllers(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in down:
            raise httpx.ConnectError("connection refused", request=request)
        seen.append((host, request.url.path))
        return httpx.Response(200, json={"report": False})

    listed = agent_config(tmp_path, "n1", "controllers: [http://c1:8080/, http://c2:8080]\n")
    assert listed.controller_urls == (
        "http://controller.test",
        "http://c1:8080",
        "http://c2:8080",
    )  # the `controller` first, each once, without a trailing slash
    urls = ("http://c1:8080", "http://c2:8080")
    config = replace(listed, controller_url=urls[0], controller_urls=urls)

    async def go() -> None:
        runtime = AgentRuntime(config, controller_transport=httpx.MockTransport(controllers))
        await runtime.start()
        try:

            async def registered() -> bool | None:
                return True if ("c2", "/v1/agents/register") in seen else None

            await eventually(registered, 10, "the registration at the second controller")
            assert runtime.controllers.current == "http://c2:8080"
            down.clear()
            down.add("c2")  # a failover the other way: the report goes to c1 now
            runtime._enqueue(runtime.core.heartbeat())

            async def moved() -> bool | None:
                return True if any(h == "c1" for h, _ in seen) else None

            await eventually(moved, 10, "a report at the first controller again")
            assert runtime.controllers.current == "http://c1:8080"
        finally:
            await runtime.stop()

    asyncio.run(go())
