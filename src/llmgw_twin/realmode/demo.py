"""`llmgw-twin demo`: a whole cluster on this machine in one command, to look at and to break.

It starts what `run --real` starts (`RealCluster`): a controller, a router, and four node agents
on two fabrics (ib-a: node01 node02; ib-b: node03 node04; four fake GPUs each, the sim engine),
then deploys one replica of `tiny`, a two-node profile, so that when a node of its fabric dies
the replica can only come back whole on the other fabric. Once it is ready it prints a line for
each thing to try (the status page's URL, `ctl status`, a request with curl, the `kill` that
takes a node down), then every event of the controller as it happens: a node lost, the replica
failed and its replacement ready on the other fabric.

Every port is chosen at run time (leased, `ports.py`: the agents' ranges and one for the
controller and the router; each node's engines bind a loopback address of its own), so two
demos on one machine do not collide. SIGINT (Ctrl-C), SIGTERM or SIGHUP ends every process it
started, and those its agents started (an agent killed with `kill -9` leaves its engines
running: they carry the demo's mark, `keeper.py`, and are swept), and removes its folder; a
SIGKILL of the demo leaves the same to its keeper. Exit status 0 after a stop signal, 1 when the
cluster could not be started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from llmgw_twin.control.model import TraceEvent
from llmgw_twin.realmode.cluster import RealCluster
from llmgw_twin.realmode.keeper import Keeper, sweep
from llmgw_twin.realmode.stop import Stopper, signals_to
from llmgw_twin.service.common.wire import TraceEventW
from llmgw_twin.twin.report.text import describe
from llmgw_twin.twin.scenario.loader import load_scenario_text
from llmgw_twin.twin.scenario.model import Scenario

MODEL = "tiny"
LOST_AFTER_S = 6
CLUSTER = f"""\
name: demo
description: llmgw-twin demo, one machine
duration: 24h
timings:
  heartbeat_interval: 1s
  node_lost_after: {LOST_AFTER_S}s
  reconcile_interval: 1s
cluster:
  fabrics:
    ib-a: [node01, node02]
    ib-b: [node03, node04]
  nodes:
    default: {{gpus: 4, gpu_memory: 80GiB, engines: [sim]}}
profiles:
  tiny-2n:
    engine: sim
    nodes: 2
    gpus_per_node: 4
    load_time: 2s
    model: /models/tiny
deployments:
  - {{model: {MODEL}, profile: tiny-2n, replicas: 1}}
"""
POLL_S = 0.25
"""How often the demo reads the controller's state and events."""
START_DEADLINE_S = 90.0
"""Every agent registered and the replica ready within this, or the demo gives up."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Stop it with Ctrl-C (or SIGTERM): every process it started is ended and its folder "
        "removed."
    )


def say(line: str = "") -> None:
    print(line, flush=True)


class Demo:
    def __init__(self, workdir: Path, keeper: Keeper) -> None:
        self.workdir = workdir
        self.scenario: Scenario = load_scenario_text(CLUSTER, "demo")
        self.cluster = RealCluster(self.scenario, workdir, env=keeper.env())
        self.t0 = time.monotonic()
        self.after = 0

    async def run(self) -> None:
        c = self.cluster
        await c.prepare_nodes({})
        config = c.write_controller_config()
        say(f"llmgw-twin demo: starting a controller, a router and 4 node agents in {c.workdir}")
        c.start_controller(config)
        assert c.controller is not None
        await asyncio.to_thread(c.wait_leading)
        c.start_router()
        assert c.router is not None
        await asyncio.to_thread(c.wait_healthy, c.router_url, c.router)
        async with httpx.AsyncClient(timeout=5.0, headers=c.admin_headers) as client:
            await c.onboard_all(client)
            for node in sorted(c.nodes):
                c.start_agent(node)
            await self._until(client, lambda s: len(s["nodes"]) == len(c.nodes), "registered")
            body = {"deployments": {MODEL: {"profile": "tiny-2n", "replicas": 1}}}
            r = await client.put(f"{c.controller_url}/v1/admin/deployments", json=body)
            r.raise_for_status()
            state = await self._until(client, _ready, f"a ready replica of {MODEL}")
            self._show(state)
            while True:  # until a stop signal cancels this task (`main` then ends it all)
                await self._events(client)
                await asyncio.sleep(POLL_S)

    async def _state(self, client: httpx.AsyncClient) -> dict[str, Any] | None:
        try:
            r = await client.get(f"{self.cluster.controller_url}/v1/admin/state")
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def _until(self, client: httpx.AsyncClient, holds: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            await self._events(client)
            state = await self._state(client)
            if state is not None and holds(state):
                return state
            await asyncio.sleep(POLL_S)
        raise RuntimeError(f"no {what} within {START_DEADLINE_S:.0f}s (logs in {self.workdir})")

    async def _events(self, client: httpx.AsyncClient) -> None:
        try:
            r = await client.get(
                f"{self.cluster.controller_url}/v1/admin/events", params={"after": self.after}
            )
            body = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return
        if body is None:
            return
        for ev in body["events"]:
            wire = TraceEventW.model_validate(ev).to_core()
            shown = TraceEvent(wire.t_ms, wire.kind, wire.subjects)
            at = time.monotonic() - self.t0
            say(f"  +{at:6.1f}s  {wire.kind:<22} {describe(shown)}")
        self.after = int(body["next"])

    def _show(self, state: dict[str, Any]) -> None:
        c = self.cluster
        replica = next(r for r in state["replicas"] if r["model"] == MODEL and r["routable"])
        nodes, fabric = sorted(replica["nodes"]), str(replica["fabric"])
        other = "ib-b" if fabric == "ib-a" else "ib-a"
        victim = nodes[0]
        proc = c.nodes[victim].proc
        assert proc is not None
        token_file = self.workdir / "admin.token"
        token = c.admin_headers["authorization"].removeprefix("Bearer ")
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        request = json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, separators=(",", ":")
        )
        ctl = f"{_program()} ctl status --nodes --controller {c.controller_url}"
        say()
        say(f"ready: replica {replica['replica']} of {MODEL} on {', '.join(nodes)} ({fabric})")
        say()
        say("try:")
        say(f"  watch the page:   {c.controller_url}/status#token={token}")
        say(f"  see the fleet:    {ctl} --token-file {token_file}")
        say(
            f"  send a request:   curl -s {c.router_url}/v1/chat/completions "
            f"-H 'content-type: application/json' -d {shlex.quote(request)}"
        )
        say(
            f"  kill a node:      kill -9 {proc.pid}    # {victim}'s agent: its heartbeats "
            f"stop, it is lost after {LOST_AFTER_S}s, and {MODEL} comes back on {other}"
        )
        say(f"  stop everything:  Ctrl-C (or kill -TERM {os.getpid()})")
        say()
        say("events:")


def _program() -> str:
    """How this command was called (`.venv/bin/llmgw-twin` outside the venv), for lines to copy."""
    called = sys.argv[0] if sys.argv else ""
    return shlex.quote(called) if Path(called).name == "llmgw-twin" else "llmgw-twin"


def _ready(state: dict[str, Any]) -> bool:
    return any(r["model"] == MODEL and r.get("routable") for r in state["replicas"])


def main(_args: argparse.Namespace) -> int:
    stopper = Stopper()
    failed: list[str] = []
    with signals_to(stopper.on_signal), tempfile.TemporaryDirectory(prefix="llmgw-demo-") as tmp:
        keeper = Keeper(Path(tmp))  # ends everything if the demo itself is SIGKILLed
        try:
            demo = Demo(Path(tmp), keeper)

            async def work() -> None:
                try:
                    await demo.run()
                except (RuntimeError, httpx.HTTPError, OSError) as e:
                    failed.append(str(e))

            async def stop() -> None:
                say("stopping every process the demo started")
                left = await demo.cluster.stop_all()
                sweep(keeper.mark)  # what a `kill -9`ed agent left: its engines, sidecars
                if left:
                    failed.append(f"process groups {left} did not stop")

            asyncio.run(stopper.guard(work, stop))
        finally:
            keeper.release()
    if failed:
        print(f"error: {'; '.join(failed)}", file=sys.stderr)
        return 1
    say("stopped; nothing is left running")
    return 0
