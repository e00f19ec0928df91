"""A scenario's cluster as real processes on this machine: one controller, one agent per node.

Each node gets its own sysfs-shaped root (its GPUs, its InfiniBand port in its fabric's subnet),
its own loopback address (127.A.B.N, with A.B drawn from the run's pid: its engines bind there,
so no two nodes' engines contend for a port, in one run or in two at once), its own port range
(leased for the run: no other run on the machine uses it, `ports.py`), and a pair of cuttable
proxies that carry all of its traffic with the controller, one per direction: a partition cuts
them (each node's wiring and power: `nodes.py`). The engines' peer traffic within a fabric goes
through proxies of its own (`fabric.py`), which a `fabric_down` cuts. Every process is started
in a new session (its own process group), never through a shell, and `stop_all` ends every group
this cluster started (and still runs this project's code, stopped ones too: SIGKILL ends a
stopped process), then checks that none is left.

The cluster runs with credentials, as production does: the controller's config lists the hash
of an admin token the cluster made, and each node is onboarded through the admin API
(`onboard_all`, before its agent starts), its agent reading the credential file written for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml

from llmgw_twin.control.model import NodeId
from llmgw_twin.realmode.configs import controller_config
from llmgw_twin.realmode.controllers import RealControllers, controller_names, store_faults
from llmgw_twin.realmode.fabric import RealFabrics
from llmgw_twin.realmode.nodes import STOP_GRACE_S, NodeProcs, node_address, wire_node
from llmgw_twin.realmode.pgstore import RealPostgres
from llmgw_twin.realmode.ports import lease_ports
from llmgw_twin.realmode.procs import alive_after as _alive_after
from llmgw_twin.realmode.procs import killpg as _killpg
from llmgw_twin.realmode.procs import ours as _ours
from llmgw_twin.service.agent.fakesysfs import fail_gpu
from llmgw_twin.service.common.auth import CredentialFile, new_token, token_hash
from llmgw_twin.twin.scenario.model import Scenario

__all__ = ["STARTUP_DEADLINE_S", "STOP_GRACE_S", "NodeProcs", "RealCluster", "node_address"]

STARTUP_DEADLINE_S = 30.0


class RealCluster:
    def __init__(
        self,
        scenario: Scenario,
        workdir: Path,
        controller_port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.ports = lease_ports(len(scenario.all_nodes) + 1)
        """The agents' port ranges (sidecars, engines; each agent's own port the last of its
        range), and one more for the run's controllers and router: none in the ephemeral
        range, where any outgoing connection could take a port between its choice and its
        bind, and no other run's (`realmode/ports.py`)."""
        first, last = self.ports.range_of(len(scenario.all_nodes))
        self._service_ports = iter(range(first, last + 1))
        if controller_port is None:
            controller_port = self.service_port()
        self.scenario = scenario
        self.env = dict(env) if env is not None else None
        """What every process of the cluster starts with (the run's mark: `keeper.py`)."""
        self.workdir = workdir
        self.controller_port = controller_port
        self._c1_url = f"http://127.0.0.1:{controller_port}"
        self.multi: RealControllers | None = None
        """The controllers c1..cK of a scenario with several (`controllers.py`)."""
        if scenario.controllers > 1:
            ports = [controller_port] + [
                self.service_port() for _ in range(scenario.controllers - 1)
            ]
            self.multi = RealControllers(self, controller_names(scenario.controllers), ports)
        self.pg = (
            RealPostgres(self.multi.names, self.env)
            if self.multi and store_faults(scenario)
            else None
        )
        """The store as a PostgreSQL server behind proxies, for a scenario that takes it away."""
        self.controller: subprocess.Popen[bytes] | None = None
        self.standbys: list[subprocess.Popen[bytes]] = []
        """The next controller processes, each started ahead of its `restart_controller` and
        waiting to serve (`controller --not-before`), in the order of their restarts: the first
        becomes `controller` when the current one is killed."""
        self.router: subprocess.Popen[bytes] | None = None
        """A router process of its own, started for a scenario with traffic."""
        self._router_token = new_token()
        self.nodes: dict[NodeId, NodeProcs] = {}
        self.started_groups: set[int] = set()
        self._logs: list[TextIO] = []
        self._admin_token = new_token()
        self.admin_headers = {"authorization": f"Bearer {self._admin_token}"}
        """What the harness sends with every admin call to the controller."""
        self.client_headers: dict[str, str] = {}
        """What the run's clients send to the router (the cluster asks clients for no key)."""
        self.router_url = self._c1_url
        """Where clients send requests."""
        self._controller_tokens: dict[NodeId, str] = {}
        self.fabrics: RealFabrics | None = None
        """The engines' peer links and InfiniBand ports per fabric (after `prepare_nodes`)."""
        self.hung: set[int] = set()
        """Engine process groups stopped (SIGSTOP) by `hang_engine`: killed at the end."""
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    def service_port(self) -> int:
        """A port of the run's own for a controller or the router (at most 100 of them)."""
        return next(self._service_ports)

    @property
    def controller_url(self) -> str:
        """Where the harness reaches the controller: the one that leads, of several."""
        return self.multi.leading_url if self.multi is not None else self._c1_url

    @controller_url.setter
    def controller_url(self, url: str) -> None:
        self._c1_url = url

    # --- configuration -----------------------------------------------------------------------

    def write_controller_config(self) -> Path:
        config = controller_config(
            self.scenario,
            self.controller_port,
            self.workdir,
            token_hash(self._admin_token),
            token_hash(self._router_token),
        )
        path = self.workdir / "controller.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=True))
        if self.multi is not None:
            self.multi.write_configs(path, self.pg)
        return path

    async def prepare_nodes(self, engine_binaries: dict[str, dict[str, str]]) -> None:
        """Roots, proxies and agent configs for every node of the scenario (one `add_node`
        brings too: its agent starts at the fault's instant)."""
        if self.pg is not None:
            await self.pg.start()
        slot = os.getpid() % 50_000
        every = self.scenario.all_nodes
        addresses = {n.node: node_address(slot, i) for i, n in enumerate(every)}
        roots = {n.node: self.workdir / "nodes" / n.node for n in every}
        self.fabrics = RealFabrics(self.scenario, roots, addresses, slot)
        await self.fabrics.start()
        # the agents' launch policy: the models the scenario's profiles name, and nothing else
        models = sorted({p.model for p in self.scenario.profiles if p.engine != "sim"})
        for i, info in enumerate(every):
            self.nodes[info.node] = await wire_node(
                self, i, info, roots[info.node], addresses[info.node], engine_binaries, models
            )

    def _others(self) -> list[str]:
        """The controllers after c1, by address."""
        return self.multi.urls[1:] if self.multi is not None else []

    def _credential_path(self, node: NodeId) -> Path:
        return self.workdir / f"agent-{node}.cred"

    async def onboard_all(self, client: httpx.AsyncClient) -> None:
        """Issue each node's credential, bound to the proxy its controller reaches it through,
        and write the file its agent reads; the controller must be up."""
        for node, n in sorted(self.nodes.items()):
            r = await client.post(
                f"{self.controller_url}/v1/admin/nodes/{node}/credential",
                json={"agent_url": f"http://127.0.0.1:{n.to_agent.port}"},
                headers=self.admin_headers,
            )
            r.raise_for_status()
            body = r.json()
            CredentialFile(node, body["token"], body["controller_token"]).write(
                self._credential_path(node)
            )
            self._controller_tokens[node] = body["controller_token"]

    # --- processes ---------------------------------------------------------------------------

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = (self.workdir / "logs" / log_name).open("a")
        self._logs.append(log)
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter, a fixed argv, no shell
            [sys.executable, "-m", "llmgw_twin.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self.env,
        )
        self.started_groups.add(proc.pid)
        return proc

    def start_controller(
        self, config: Path, not_before_ns: int | None = None, *, standby: bool = False
    ) -> None:
        """A controller process; with `not_before_ns` it loads now and serves from that instant
        of the host's monotonic clock (`controller --not-before`): it opens the store and binds
        its port only then. `standby`: it is a next one, started while the current one still
        serves (`promote_standby` makes it current once that one is killed)."""
        args = ["controller", "--config", str(config)]
        if not_before_ns is not None:
            args += ["--not-before", str(not_before_ns)]
        proc = self._spawn(args, "controller.log")
        if standby:
            self.standbys.append(proc)
        else:
            self.controller = proc

    def promote_standby(self) -> bool:
        """The first standby controller becomes the current one (False: there is none, or it
        died)."""
        if not self.standbys:
            return False
        proc = self.standbys.pop(0)
        if proc.poll() is not None:
            return False
        self.controller = proc
        return True

    def start_router(self) -> None:
        """A router beside the controller, following its feed; clients go to it from now on."""
        port = self.service_port()
        token = self.workdir / "router.token"
        token.write_text(self._router_token)
        token.chmod(0o600)
        config = self.workdir / "router.yaml"
        router = {
            "listen": {"host": "127.0.0.1", "port": port},
            "controller": self._c1_url,
            "controllers": self._others(),
            "controller_token_file": str(token),
        }
        config.write_text(yaml.safe_dump(router, sort_keys=True))
        self.router = self._spawn(["router", "--config", str(config)], "router.log")
        self.router_url = f"http://127.0.0.1:{port}"

    def start_agent(self, node: NodeId, not_before_ns: int | None = None) -> None:
        """The node's agent process; with `not_before_ns`, as `start_controller`."""
        n = self.nodes[node]
        n.thaw_dead()
        args = ["agent", "--config", str(n.config)]
        if not_before_ns is not None:
            args += ["--not-before", str(not_before_ns)]
        n.proc = self._spawn(args, f"agent-{node}.log")
        n.groups.add(n.proc.pid)

    def wait_healthy(self, url: str, proc: subprocess.Popen[bytes], path: str = "/health") -> None:
        """Poll `url``path` until it answers 200 (bounded), failing fast if the process died."""
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        headers = self.admin_headers if path != "/health" else None
        with httpx.Client(timeout=1.0, headers=headers) as client:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} at start")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{url}{path}").status_code == 200:
                        return
                time.sleep(0.05)  # a process starting up: nothing to await but its port
        raise RuntimeError(f"{url}{path} did not answer within {STARTUP_DEADLINE_S}s")

    def wait_leading(self) -> None:
        """The controller serves the admin API: it holds the lease and restored its store (its
        health answers 200 as soon as the process listens, a standby's too)."""
        assert self.controller is not None
        self.wait_healthy(self.controller_url, self.controller, "/v1/admin/state")

    def agent_state(self, node: NodeId) -> dict[str, Any] | None:
        """The agent's own view, asked directly (not through the proxies a partition cuts)."""
        try:
            token = self._controller_tokens.get(node, "")
            r = httpx.get(
                f"http://127.0.0.1:{self.nodes[node].agent_port}/v1/state",
                headers={"authorization": f"Bearer {token}"},
                timeout=2,
            )
            return r.json() if r.status_code == 200 else None
        except httpx.HTTPError:
            return None

    def remember_groups(self, node: NodeId) -> set[int]:
        """Every process group the node's agent reports running, added to what we must end."""
        state = self.agent_state(node)
        groups: set[int] = set()
        for proc in (state or {}).get("processes", []):
            pgid = proc.get("pgid", proc.get("pid"))
            if isinstance(pgid, int):
                groups.add(pgid)
        self.nodes[node].groups |= groups
        self.started_groups |= groups
        return groups

    def kill_node(self, node: NodeId) -> None:
        """Power off: every process of the node stops, its sockets open (`NodeProcs.power_off`)."""
        self.nodes[node].power_off(self.started_groups)

    def crash_node(self, node: NodeId) -> None:
        """Crash: every process of the node dies at once (`NodeProcs.crash`)."""
        self.nodes[node].crash(self.started_groups)

    def fail_gpu(self, node: NodeId, gpu: int) -> None:
        """The GPU falls off the bus: the node's root shows it so from now on, across reboots."""
        fail_gpu(self.workdir / "nodes" / node, gpu)

    def hang(self, pgid: int) -> None:
        """An engine hangs: alive, its sockets open, answering nothing (SIGSTOP to its group)."""
        self.hung.add(pgid)
        self.started_groups.add(pgid)
        _killpg(pgid, signal.SIGSTOP)

    def kill_controller(self) -> None:
        if self.controller is not None:
            _killpg(self.controller.pid, signal.SIGKILL)
            self.controller.wait(timeout=STOP_GRACE_S)
            self.controller = None

    async def stop_all(self) -> list[int]:
        """End everything this cluster started; returns the groups still alive after (none)."""
        for node in sorted(self.nodes):
            self.remember_groups(node)
            self.nodes[node].thaw_dead()
        for pgid in sorted(self.hung):  # a stopped engine would sit out its agent's stop grace
            if _ours(pgid):
                _killpg(pgid, signal.SIGKILL)
        procs = [n.proc for n in self.nodes.values() if n.proc is not None]
        for proc in procs:  # agents first: they stop their shards on SIGTERM
            _killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_GRACE_S)
        several = self.multi.stop() if self.multi is not None else []
        for service in (self.router, self.controller, *self.standbys, *several):
            if service is None:
                continue
            _killpg(service.pid, signal.SIGTERM)
            try:
                service.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _killpg(service.pid, signal.SIGKILL)
                service.wait(timeout=STOP_GRACE_S)
        for pgid in sorted(self.started_groups):
            if _ours(pgid):  # a group id long gone may belong to someone else by now
                _killpg(pgid, signal.SIGKILL)
        for n in self.nodes.values():
            for proxy in (n.to_controller, n.to_agent, *n.to_others):
                await proxy.close()
        if self.fabrics is not None:
            await self.fabrics.close()
        if self.pg is not None:
            await self.pg.close()
        for log in self._logs:
            log.close()
        left = _alive_after(sorted(self.started_groups))
        self.ports.close()  # only now may another run use these ports
        return left
