"""Real mode on loopback: one `llmgw-twin controller` and two `llmgw-twin agent` processes.

Each agent reads its node from its own sysfs-shaped root. The operator deploys a 2-node sim
replica through the admin API; the test waits (with a deadline) until the controller reports it
ready, sends a chat completion through the controller's router, and at the end every process it
started, and every process those started, is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.services import free_ports, free_range, gone, wait_sync
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.agent.processes import group_alive

CONTROLLER_YAML = """\
listen: {{host: 127.0.0.1, port: {port}}}
store: controller.db
timings:
  heartbeat_interval: 300ms
  node_lost_after: 10s
  reconcile_interval: 100ms
profiles:
  tiny-2n:
    engine: sim
    nodes: 2
    gpus_per_node: 1
    load_time: 300ms
    model: /models/tiny
"""

AGENT_YAML = """\
node: {node}
controller: http://127.0.0.1:{controller_port}
listen: {{host: 127.0.0.1, port: {port}}}
root: {node}
ports: {{first: {first}, last: {last}}}
heartbeat_interval: 300ms
stop_grace: 3s
worker_settle: 300ms
log_dir: logs-{node}
"""


class Fleet:
    """The processes of one test, each in its own session, all ended by `close`."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.children: list[int] = []  # process groups the agents started

    def start(self, name: str, *args: str) -> None:
        log = (self.tmp_path / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "llmgw_twin.cli", *args],
            cwd=self.tmp_path,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")[-6000:]

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)}" for n in self.procs)

    def stop(self, name: str, within_s: float = 30) -> None:
        """SIGTERM, and a graceful shutdown within `within_s` (uvicorn, once shut down, ends
        the process by the signal it caught: -SIGTERM is its clean exit)."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not exit within {within_s}s of SIGTERM") from None
        assert code in (0, -signal.SIGTERM), f"{name} exited {code}:\n{self.log(name)}"
        assert "Application shutdown complete" in self.log(name), self.log(name)

    def close(self) -> None:
        for pgid in [p.pid for p in self.procs.values()] + self.children:
            if group_alive(pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.close()


def get(client: httpx.Client, url: str) -> dict[str, Any] | None:
    try:
        r = client.get(url)
    except httpx.HTTPError:
        return None
    return dict(r.json()) if r.status_code == 200 else None


def test_controller_and_two_agents_serve_a_two_node_replica(tmp_path: Path, fleet: Fleet) -> None:
    controller_port, port1, port2 = free_ports(3)
    base = f"http://127.0.0.1:{controller_port}"
    (tmp_path / "controller.yaml").write_text(CONTROLLER_YAML.format(port=controller_port))
    for node, port in (("node01", port1), ("node02", port2)):
        write_sysfs_root(
            tmp_path / node, gpus=2, fabric_prefix=fabric_prefix_for("ib-a"), node=node
        )
        first, last = free_range(8)
        (tmp_path / f"{node}.yaml").write_text(
            AGENT_YAML.format(
                node=node, controller_port=controller_port, port=port, first=first, last=last
            )
        )

    with httpx.Client(trust_env=False, timeout=10) as client:
        fleet.start("controller", "controller", "--config", "controller.yaml")
        wait_sync(lambda: get(client, base + "/health"), 30, "the controller's /health")
        fleet.start("node01", "agent", "--config", "node01.yaml")
        fleet.start("node02", "agent", "--config", "node02.yaml")

        def both_alive() -> list[dict[str, Any]] | None:
            state = get(client, base + "/v1/admin/state")
            nodes = state["nodes"] if state else []
            return nodes if [n["state"] for n in nodes] == ["alive", "alive"] else None

        nodes = wait_sync(both_alive, 30, "both agents registered and alive")
        assert {n["fabric"] for n in nodes} == {"ib-" + fabric_prefix_for("ib-a").replace(":", "-")}
        assert [n["gpu_count"] for n in nodes] == [2, 2]

        r = client.put(
            base + "/v1/admin/deployments/tiny", json={"profile": "tiny-2n", "replicas": 1}
        )
        assert r.status_code == 200, r.text

        def ready() -> dict[str, Any] | None:
            state = get(client, base + "/v1/admin/state")
            replicas = state["replicas"] if state else []
            return replicas[0] if replicas and replicas[0]["state"] == "ready" else None

        try:
            replica = wait_sync(ready, 60, "the replica ready")
        except AssertionError:
            logs = fleet.logs()
            raise AssertionError(f"replica never ready; logs:\n{logs}") from None
        assert sorted(replica["nodes"]) == ["node01", "node02"]
        assert [s["state"] for s in replica["shards"]] == ["serving", "running"]

        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}
        r = client.post(base + "/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        assert r.headers["x-llmgw-replica"] == replica["replica"]
        assert r.json()["choices"][0]["message"]["content"]
        with client.stream(
            "POST", base + "/v1/chat/completions", json=chat | {"stream": True}
        ) as s:
            assert s.status_code == 200
            lines = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) > 2

        events = client.get(base + "/v1/admin/events").json()["events"]
        kinds = [e["kind"] for e in events]
        for kind in ("node.joined", "replica.placed", "shard.started", "replica.ready"):
            assert kind in kinds, kinds
        started = [e for e in events if e["kind"] == "shard.started"]
        assert all("sim-engine" in e["subjects"]["argv"] for e in started)

        for node in ("node01", "node02"):
            agent_port = port1 if node == "node01" else port2
            state = get(client, f"http://127.0.0.1:{agent_port}/v1/state")
            assert state is not None
            fleet.children += [p["pid"] for p in state["processes"]]
    assert len(fleet.children) == 4  # each node: one sidecar, one engine

    fleet.stop("node01", 30)
    fleet.stop("node02", 30)
    fleet.stop("controller", 30)
    leftovers = [
        g for g in fleet.children + [p.pid for p in fleet.procs.values()] if group_alive(g)
    ]
    assert leftovers == [], f"process groups left behind: {leftovers}"
    assert gone(fleet.children)
    assert "Traceback" not in fleet.log("controller"), fleet.log("controller")
