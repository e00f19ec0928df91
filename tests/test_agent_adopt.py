"""A restarted agent finds the shards its predecessor left: real agent processes, real shards.

Each test starts `llmgw-twin agent` processes against a fake controller (a FastAPI app on a
loopback port that records every registration and heartbeat), or against a real controller, and
kills an agent with SIGKILL (its own pid only): its sidecars and sim engines run on. The next
agent on the same config adopts the shards whose processes all still run (same engine pid,
reported in its registration, still serving), ends the ones partly gone, leaves alone a pid that
now names another process, and hands out ports really free where its shards bind them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from helpers.live import live_server
from helpers.services import free_ports, free_range, gone, shard, wait_sync
from llmgw_twin.control.model import NodeId, ShardSpec
from llmgw_twin.control.protocol import AssignShards
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.agent.processes import group_alive, start_ticks
from llmgw_twin.service.agent.runstate import (
    ProcRecord,
    RunState,
    RunStateFile,
    ShardRecord,
    boot_id,
)
from llmgw_twin.service.common.wire import AssignShardsW

NODE = "node01"
AGENT_YAML = """\
node: {node}
controller: {controller}
listen: {{host: 127.0.0.1, port: {port}}}
root: {node}
ports: {{first: {first}, last: {last}}}
heartbeat_interval: 200ms
stop_grace: 3s
worker_settle: 300ms
log_dir: logs
engine_host: {engine_host}
"""
Body = dict[str, Any]


class Posts:
    """What the fake controller was sent, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, Body]] = []

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/agents/{kind}")
        async def report(kind: str, request: Request) -> Body:
            body = await request.json()
            with self.lock:
                self.items.append((kind, body))
            return {"report": False}

        return app

    def registration(self, after: int | None = None) -> Body | None:
        """The latest registration of an incarnation other than `after`."""
        with self.lock:
            regs = [b for k, b in self.items if k == "register" and b["incarnation"] != after]
        return regs[-1] if regs else None

    def latest(self) -> Body | None:
        with self.lock:
            return self.items[-1][1] if self.items else None


class Node:
    """One node's config, its agent processes (one at a time) and every group they started;
    `close` ends what is left of them, and nothing else."""

    def __init__(self, tmp_path: Path, controller: str, engine_host: str = "127.0.0.1") -> None:
        self.tmp_path = tmp_path
        (self.port,) = free_ports(1)
        self.first, self.last = free_range(8)
        self.engine_host = engine_host
        write_sysfs_root(
            tmp_path / NODE, gpus=2, fabric_prefix=fabric_prefix_for("ib-a"), node=NODE
        )
        self.config = tmp_path / f"{NODE}.yaml"
        self.config.write_text(
            AGENT_YAML.format(
                node=NODE,
                controller=controller,
                port=self.port,
                first=self.first,
                last=self.last,
                engine_host=engine_host,
            )
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(trust_env=False, timeout=10)
        self.agents: list[subprocess.Popen[bytes]] = []
        self.groups: set[int] = set()

    def start(self) -> subprocess.Popen[bytes]:
        log = (self.tmp_path / f"agent-{len(self.agents)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw_twin.cli", "agent", "--config", str(self.config)],
            cwd=self.tmp_path,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.agents.append(proc)
        wait_sync(lambda: self._health(proc), 60, "the agent's /health")
        return proc

    def _health(self, proc: subprocess.Popen[bytes]) -> bool | None:
        if proc.poll() is not None:
            raise AssertionError(f"the agent exited with {proc.returncode}:\n{self.logs()}")
        with contextlib.suppress(httpx.HTTPError):
            return True if self.client.get(self.base + "/health").status_code == 200 else None
        return None

    def kill(self) -> None:
        """SIGKILL the running agent, its own pid only: its shards run on."""
        proc = self.agents[-1]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.tmp_path.glob("*.log"))

    def state(self) -> Body:
        r = self.client.get(self.base + "/v1/state")
        assert r.status_code == 200, r.text
        body: Body = r.json()
        self.groups |= {p["pid"] for p in body["processes"]}
        return body

    def assign(self, *specs: ShardSpec) -> None:
        body = AssignShardsW.from_core(AssignShards(NodeId(NODE), specs)).model_dump(mode="json")
        r = self.client.post(self.base + "/v1/assign", json=body)
        assert r.status_code == 200, r.text

    def shard(self, replica: str, phase: str = "serving") -> Body:
        """The shard in the agent's own view, once it reaches `phase`."""

        def reached() -> Body | None:
            for s in self.state()["shards"]:
                if s["replica"] == replica and s["phase"] == phase:
                    return dict(s)
                if s["replica"] == replica and s["phase"] == "exited":
                    raise AssertionError(f"{replica} exited: {s}\n{self.logs()}")
            return None

        return wait_sync(reached, 60, f"{replica} {phase}")

    def close(self) -> None:
        for proc in self.agents:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for pgid in self.groups:
            if group_alive(pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        self.client.close()


@pytest.fixture
def posts() -> Iterator[tuple[Posts, str]]:
    p = Posts()
    with live_server(p.app) as url:
        yield p, url


@pytest.fixture
def node(tmp_path: Path, posts: tuple[Posts, str]) -> Iterator[Node]:
    n = Node(tmp_path, posts[1])
    try:
        yield n
    finally:
        n.close()


def chat(endpoint: str) -> int:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(trust_env=False, timeout=10) as c:
        return c.post(endpoint + "/v1/chat/completions", json=body).status_code


def recorded_shards(node: Node) -> list[Body]:
    """The shards of the node's run-state file (by default beside its config)."""
    shards: list[Body] = json.loads((node.tmp_path / f"{NODE}.run.json").read_text())["shards"]
    return shards


def reported(reg: Body) -> dict[str, Body]:
    return {s["spec"]["replica"]: s for s in reg["shards"]}


def test_a_killed_agents_shard_is_adopted_reported_and_stopped_by_a_later_assignment(
    node: Node, posts: tuple[Posts, str]
) -> None:
    first = node.start()
    old = wait_sync(posts[0].registration, 30, "the first registration")["incarnation"]
    node.assign(shard("tiny-r1", 0, (NODE,), gpus=(0,)))
    before = node.shard("tiny-r1")
    assert chat(before["endpoint"]) == 200
    assert [s["engine"]["pid"] for s in recorded_shards(node)] == [before["engine_pid"]]

    node.kill()
    assert group_alive(before["engine_pid"]) and group_alive(before["sidecar_pid"])
    node.start()
    reg = wait_sync(lambda: posts[0].registration(after=old), 30, "the new agent's registration")
    assert first.pid != node.agents[-1].pid
    (report,) = reg["shards"]
    assert report["spec"]["replica"] == "tiny-r1" and report["state"] == "serving"
    assert report["endpoint"] == before["endpoint"]

    after = node.shard("tiny-r1")
    assert after["adopted"] is True
    assert (after["engine_pid"], after["sidecar_pid"]) == (
        before["engine_pid"],
        before["sidecar_pid"],
    )
    steps = [h["what"] for h in node.state()["history"]]
    assert "adopted" in steps and "engine-started" not in steps  # nothing started again
    assert chat(after["endpoint"]) == 200

    node.assign()  # the controller no longer wants it
    wait_sync(
        lambda: True if gone([before["engine_pid"], before["sidecar_pid"]]) else None,
        30,
        "the adopted shard's process groups gone",
    )
    latest = wait_sync(
        lambda: b if (b := posts[0].latest()) is not None and not b["shards"] else None,
        30,
        "a report without the shard",
    )
    assert latest["shards"] == []
    wait_sync(lambda: True if recorded_shards(node) == [] else None, 10, "an empty run state")


def test_a_shard_whose_engine_died_while_the_agent_was_down_is_ended_and_not_reported(
    node: Node, posts: tuple[Posts, str]
) -> None:
    node.start()
    old = wait_sync(posts[0].registration, 30, "the first registration")["incarnation"]
    node.assign(shard("a-r1", 0, (NODE,), gpus=(0,)), shard("b-r1", 0, (NODE,), gpus=(1,)))
    dead, kept = node.shard("a-r1"), node.shard("b-r1")

    node.kill()
    os.killpg(dead["engine_pid"], signal.SIGKILL)
    wait_sync(lambda: True if gone([dead["engine_pid"]]) else None, 10, "a-r1's engine gone")
    assert group_alive(dead["sidecar_pid"])
    node.start()
    reg = wait_sync(lambda: posts[0].registration(after=old), 30, "the new agent's registration")
    assert sorted(reported(reg)) == ["b-r1"]
    assert reported(reg)["b-r1"]["state"] == "serving"
    assert gone([dead["sidecar_pid"]])  # ended before the agent registered
    assert node.shard("b-r1")["engine_pid"] == kept["engine_pid"]
    assert chat(kept["endpoint"]) == 200
    assert "a-r1" not in {s["replica"] for s in node.state()["shards"]}


def test_a_recorded_pid_now_naming_another_process_is_left_alone(
    node: Node, posts: tuple[Posts, str]
) -> None:
    """The run state names pids of processes this test started, with other start times: as if
    the shard's processes had ended and their pids had gone to unrelated programs."""
    others = [
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
        )
        for _ in range(2)
    ]
    try:
        ticks = [start_ticks(p.pid) for p in others]
        assert None not in ticks
        spec = shard("old-r1", 0, (NODE,), gpus=(0,))
        procs = [
            ProcRecord(p.pid, (t or 0) + 1, ("python",)) for p, t in zip(others, ticks, strict=True)
        ]
        rec = ShardRecord(spec, procs[0], procs[1], node.first, node.first + 1, node.first + 1)
        file = RunStateFile(node.tmp_path / f"{NODE}.run.json")
        file.write(RunState(boot_id(), 1, 1, (rec,)))

        node.start()
        reg = wait_sync(posts[0].registration, 30, "the registration")
        assert reg["shards"] == []
        assert [p.poll() for p in others] == [None, None]  # neither was signalled
        assert "is another process's now, left alone" in node.logs()
        left = file.read()  # the entry is forgotten: nothing of it is this node's any more
        assert left is not None and left.shards == ()
    finally:
        for p in others:
            p.kill()
            p.wait(timeout=10)


def test_after_a_restart_new_shards_get_ports_really_free_where_they_bind(
    tmp_path: Path, posts: tuple[Posts, str]
) -> None:
    """The engine address is not 127.0.0.1: a port must be free there (engines) and on 127.0.0.1
    (sidecars), and an adopted engine's port counts as taken before it listens."""
    node = Node(tmp_path, posts[1], engine_host="127.0.0.2")
    try:
        (rendezvous,) = free_ports(1)
        node.start()
        old = wait_sync(posts[0].registration, 30, "the first registration")["incarnation"]
        # the leader of a 2-node replica whose worker never comes: started, not yet listening
        lead = shard("big-r1", 0, (NODE, "node02"), gpus=(1,), rendezvous_port=rendezvous)
        node.assign(lead)
        waiting = node.shard("big-r1", "engine")
        assert f"127.0.0.2:{rendezvous}" in waiting["argv"]  # its rendezvous: its engine address

        node.kill()
        node.start()
        reg = wait_sync(lambda: posts[0].registration(after=old), 30, "the new registration")
        assert reported(reg)["big-r1"]["state"] == "starting"
        adopted = node.shard("big-r1", "engine")
        assert adopted["adopted"] is True and adopted["engine_pid"] == waiting["engine_pid"]
        taken = {waiting["sidecar_port"], waiting["engine_port"]}
        with socket.socket() as probe:  # nothing listens on the adopted engine's port yet
            probe.bind(("127.0.0.2", waiting["engine_port"]))

        with socket.socket() as orphan:  # a sidecar's port held on 127.0.0.1 by a stranger
            free = [p for p in range(node.first, node.last + 1) if p not in taken]
            orphan.bind(("127.0.0.1", free[0]))
            orphan.listen()
            node.assign(lead, shard("tiny-r1", 0, (NODE,), gpus=(0,)))
            new = node.shard("tiny-r1")
        assert {new["sidecar_port"], new["engine_port"]}.isdisjoint(taken | {free[0]})
        assert new["endpoint"].startswith("http://127.0.0.2:")
        assert chat(new["endpoint"]) == 200
        assert node.shard("big-r1", "engine")["engine_pid"] == waiting["engine_pid"]
    finally:
        node.close()


def test_a_second_agent_of_the_node_refuses_to_start(node: Node) -> None:
    node.start()
    second = subprocess.run(
        [sys.executable, "-m", "llmgw_twin.cli", "agent", "--config", str(node.config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert second.returncode == 2, second.stderr
    assert "another agent of this node runs" in second.stderr


CONTROLLER_YAML = """\
listen: {{host: 127.0.0.1, port: {port}}}
store: controller.db
timings:
  heartbeat_interval: 200ms
  node_lost_after: 30s
  reconcile_interval: 100ms
profiles:
  tiny: {{engine: sim, nodes: 1, gpus_per_node: 1, load_time: 200ms, model: /models/tiny}}
"""


def test_the_controller_keeps_the_replica_ready_across_an_agent_restart(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"
    (tmp_path / "controller.yaml").write_text(CONTROLLER_YAML.format(port=port))
    log = (tmp_path / "controller.log").open("wb")
    controller = subprocess.Popen(
        [sys.executable, "-m", "llmgw_twin.cli", "controller", "--config", "controller.yaml"],
        cwd=tmp_path,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    node = Node(tmp_path, base)
    c = node.client

    def state() -> Body | None:
        with contextlib.suppress(httpx.HTTPError):
            r = c.get(base + "/v1/admin/state")
            return dict(r.json()) if r.status_code == 200 else None
        return None

    def ready() -> Body | None:
        replicas = (state() or {}).get("replicas", [])
        return replicas[0] if len(replicas) == 1 and replicas[0]["state"] == "ready" else None

    def events(kind: str) -> list[Body]:
        every = c.get(base + "/v1/admin/events").json()["events"]
        return [e for e in every if e["kind"] == kind]

    try:
        wait_sync(state, 60, "the controller's state")
        node.start()
        r = c.put(base + "/v1/admin/deployments/tiny", json={"profile": "tiny", "replicas": 1})
        assert r.status_code == 200, r.text
        replica = wait_sync(ready, 60, "the replica ready")
        before = node.shard(replica["replica"])

        node.kill()
        node.start()
        joined = wait_sync(
            lambda: e[1] if len(e := events("node.joined")) == 2 else None, 30, "re-registered"
        )
        after = node.shard(replica["replica"])
        assert after["adopted"] and after["engine_pid"] == before["engine_pid"]

        def later() -> bool | None:  # the controller's clock, past 5 heartbeats of the new agent
            t_ms: int = c.get(base + "/health").json()["t_ms"]
            return True if t_ms >= joined["t_ms"] + 1000 else None

        wait_sync(later, 30, "five heartbeat intervals after the re-registration")
        again = wait_sync(ready, 10, "the replica still ready")
        assert (again["replica"], again["endpoint"]) == (replica["replica"], replica["endpoint"])
        assert events("replica.failed") == [] and len(events("replica.placed")) == 1
        chat_body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}
        r = c.post(base + "/v1/chat/completions", json=chat_body)
        assert r.status_code == 200 and r.headers["x-llmgw-replica"] == replica["replica"]

        node.agents[-1].send_signal(signal.SIGTERM)  # a stop: the agent ends its shards
        assert node.agents[-1].wait(timeout=30) in (0, -signal.SIGTERM)
        assert gone([before["engine_pid"], before["sidecar_pid"]])
    finally:
        node.close()
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
            controller.wait(timeout=10)
