"""A controller on a loopback port that asks for an admin token, and fake agents behind it.

The controller's commands to its agents go to an `httpx.MockTransport` that records each node's
latest assignment; a thread heartbeats every onboarded node with its assigned shards reported up
(the leader serving with an endpoint, the others running), so replicas become ready as they do
with real agents, and a test can make a node fall silent or a replica's shard exit.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from helpers.controller import registration
from helpers.live import live_controller
from llmgw_twin.control.autoscale import AutoscalePolicy
from llmgw_twin.control.model import NodeId, ShardReport, ShardSpec, ShardState, Timings
from llmgw_twin.control.protocol import Heartbeat
from llmgw_twin.service.common.auth import new_token, token_hash
from llmgw_twin.service.common.wire import HeartbeatW, ShardSpecW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerAuth, ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app

TIMINGS = Timings(
    heartbeat_interval_ms=200,
    node_suspect_after_ms=4_000,
    node_lost_after_ms=8_000,
    reconcile_interval_ms=50,
)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@dataclass
class Agents:
    """Fake agents: each node's latest assignment (from the controller's `POST /v1/assign`), and
    a thread heartbeating every node in `beating` with its shards reported up (the leader serving,
    the others running), or exited with a reason for a replica in `exits`."""

    base: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    nodes: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    """node -> (fabric, GPUs, its token)"""
    assigned: dict[str, list[ShardSpec]] = field(default_factory=dict)
    beating: set[str] = field(default_factory=set)
    failed_gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    exits: dict[str, str] = field(default_factory=dict)
    stopped: threading.Event = field(default_factory=threading.Event)

    def command(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/assign":
            body = json.loads(request.content)
            specs = [ShardSpecW.model_validate(s).to_core() for s in body["shards"]]
            with self.lock:
                self.assigned[body["node"]] = specs
        return httpx.Response(200, json={"ok": True})

    def register(self, client: httpx.Client, node: str) -> None:
        fabric, gpus, token = self.nodes[node]
        body = registration(node, fabric=fabric, gpus=gpus)
        r = client.post(self.base + "/v1/agents/register", json=body, headers=bearer(token))
        assert r.status_code == 200, r.text

    def _report(self, spec: ShardSpec, exits: dict[str, str]) -> ShardReport:
        if spec.replica in exits:
            return ShardReport(spec, ShardState.EXITED, None, 1, (), exits[spec.replica])
        if spec.rank == 0:
            return ShardReport(spec, ShardState.SERVING, f"http://engine-{spec.replica}:8000")
        return ShardReport(spec, ShardState.RUNNING)

    def beat(self, client: httpx.Client, node: str) -> None:
        with self.lock:
            specs = list(self.assigned.get(node, ()))
            failed, exits = self.failed_gpus.get(node, ()), dict(self.exits)
        reports = tuple(self._report(s, exits) for s in specs)
        body = HeartbeatW.from_core(Heartbeat(NodeId(node), reports, failed)).model_dump(
            mode="json"
        )
        token = self.nodes[node][2]
        r = client.post(self.base + "/v1/agents/heartbeat", json=body, headers=bearer(token))
        if r.status_code == 200 and r.json()["report"]:
            self.register(client, node)

    def run(self) -> None:
        with httpx.Client(trust_env=False, timeout=10) as client:
            while not self.stopped.wait(TIMINGS.heartbeat_interval_ms / 1000):
                with self.lock:
                    beating = sorted(self.beating)
                for node in beating:
                    with suppress(httpx.HTTPError):
                        self.beat(client, node)


@dataclass
class Fleet:
    url: str
    admin: str
    client: httpx.Client
    """the admin's client of the controller"""
    agents: Agents

    def put(self, path: str, body: dict[str, Any]) -> None:
        r = self.client.put(path, json=body)
        assert r.status_code == 200, r.text

    def add_node(self, node: str, fabric: str, gpus: int, failed: tuple[int, ...] = ()) -> None:
        r = self.client.post(
            f"/v1/admin/nodes/{node}/credential", json={"agent_url": f"http://agent-{node}"}
        )
        assert r.status_code == 200, r.text
        with self.agents.lock:
            self.agents.nodes[node] = (fabric, gpus, r.json()["token"])
            self.agents.failed_gpus[node] = failed
        self.agents.register(self.client, node)
        with self.agents.lock:
            self.agents.beating.add(node)

    def state(self) -> dict[str, Any]:
        r = self.client.get("/v1/admin/state")
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    def events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page_ = self.client.get("/v1/admin/events", params={"after": len(out)}).json()
            out += page_["events"]
            if not page_["events"]:
                return out

    def replicas(self, state: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.state()["replicas"] if state in (None, r["state"])]


@contextmanager
def running_fleet(
    tmp_path: Path,
    autoscale: tuple[AutoscalePolicy, ...] = (),
    engines: httpx.AsyncBaseTransport | None = None,
) -> Iterator[Fleet]:
    """A controller asking for an admin token, with fake agents; no node yet. `engines`
    answers the requests the controller forwards to replicas (`http://engine-{replica}:8000`)."""
    admin = new_token()
    auth = ControllerAuth((token_hash(admin),), (), tmp_path / "secret.key")
    settings = ControllerSettings(
        "127.0.0.1", 0, str(tmp_path / "c.db"), TIMINGS, (), (), auth=auth, autoscale=autoscale
    )
    agents = Agents()
    transport = httpx.MockTransport(agents.command)

    def build() -> Any:
        runtime = ControllerRuntime(settings, agent_transport=transport, engine_transport=engines)
        return create_controller_app(runtime)

    with (
        live_controller(build) as url,
        httpx.Client(base_url=url, trust_env=False, timeout=10, headers=bearer(admin)) as client,
    ):
        agents.base = url
        thread = threading.Thread(target=agents.run, name="fake-agents", daemon=True)
        thread.start()
        try:
            yield Fleet(url, admin, client, agents)
        finally:
            agents.stopped.set()
            thread.join(10)
