"""The router service as a process of its own, beside a real controller and agent on loopback:
`llmgw-twin router --config FILE` follows the controller's feed, serves through the controller's
stop and restart without one failed request, and resyncs from the new controller afterwards;
its config refuses what would open it on the network.

Every process is started in its own session and its group is killed at teardown whatever
happened; the sim engines the agent starts are stopped by the agent (and killed by group if
the agent failed to). Waits are on conditions with deadlines; no assertion is about time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.services import free_ports, free_range, wait_sync
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.agent.processes import group_alive
from llmgw_twin.service.common.config_access import ConfigError
from llmgw_twin.service.router.config import load_router_config
from llmgw_twin.service.router.forwarding import REPLICA_HEADER
from test_services_e2e import Fleet, get

CONTROLLER_YAML = """\
listen: {{host: 127.0.0.1, port: {port}}}
store: controller.db
timings:
  heartbeat_interval: 300ms
  node_lost_after: 20s
  reconcile_interval: 100ms
profiles:
  tiny: {{engine: sim, nodes: 1, gpus_per_node: 1, load_time: 200ms, model: /models/tiny}}
deployments:
  - {{model: tiny, profile: tiny, replicas: 2}}
"""

AGENT_YAML = """\
node: node01
controller: http://127.0.0.1:{controller_port}
listen: {{host: 127.0.0.1, port: {port}}}
root: node01
ports: {{first: {first}, last: {last}}}
heartbeat_interval: 300ms
stop_grace: 3s
worker_settle: 200ms
log_dir: logs-node01
"""

ROUTER_YAML = """\
listen: {{host: 127.0.0.1, port: {port}}}
controller: http://127.0.0.1:{controller_port}
feed: {{wait: 2s, reconnect_max: 300ms}}
timeouts: {{connect: 1s, first_byte: 20s, between_chunks: 10s}}
ejection: {{failures: 3, base: 2s, max: 10s}}
"""

MAX_REQUESTS = 20_000
"""The most requests the background client sends: a bound, whatever happens."""
PACE_S = 0.005
"""Between one answer and the next request: the client must still be sending once the
controller is back (2,000 back-to-back requests were over before that)."""


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Fleet]:
    p = Fleet(tmp_path)
    try:
        yield p
    finally:
        p.close()


class Traffic:
    """A client sending chat completions to the router one after another, in a thread, until
    stopped (or `MAX_REQUESTS`); every answer's status and replica kept."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.answers: list[tuple[int, str | None, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the traffic thread did not stop"

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, trust_env=False, timeout=30) as client:
            for i in range(MAX_REQUESTS):
                if self._stop.wait(PACE_S):
                    return
                body = {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"ask {i}"}],
                    "max_tokens": 4,
                    "stream": i % 2 == 1,
                }
                try:
                    r = client.post("/v1/chat/completions", json=body)
                    self.answers.append((r.status_code, r.headers.get(REPLICA_HEADER), r.text))
                except httpx.HTTPError as e:
                    self.answers.append((0, None, repr(e)))

    def count(self) -> int:
        return len(self.answers)


def test_the_router_serves_through_a_controller_restart_and_resyncs_after(
    tmp_path: Path, procs: Fleet
) -> None:
    controller_port, agent_port, router_port = free_ports(3)
    controller = f"http://127.0.0.1:{controller_port}"
    base = f"http://127.0.0.1:{router_port}"
    (tmp_path / "controller.yaml").write_text(CONTROLLER_YAML.format(port=controller_port))
    write_sysfs_root(
        tmp_path / "node01", gpus=2, fabric_prefix=fabric_prefix_for("ib-a"), node="node01"
    )
    first, last = free_range(8)
    (tmp_path / "node01.yaml").write_text(
        AGENT_YAML.format(controller_port=controller_port, port=agent_port, first=first, last=last)
    )
    (tmp_path / "router.yaml").write_text(
        ROUTER_YAML.format(port=router_port, controller_port=controller_port)
    )

    with httpx.Client(trust_env=False, timeout=10) as client:
        procs.start("controller", "controller", "--config", "controller.yaml")
        wait_sync(lambda: get(client, controller + "/health"), 30, "the controller's /health")
        procs.start("node01", "agent", "--config", "node01.yaml")
        procs.start("router", "router", "--config", "router.yaml")

        def routable(count: int) -> dict[str, Any] | None:
            models = get(client, base + "/v1/models")
            data = models["data"] if models else []
            return models if [m["ready_replicas"] for m in data] == [count] else None

        try:
            wait_sync(lambda: routable(2), 60, "two routable replicas at the router")
        except AssertionError:
            raise AssertionError(f"never routable; logs:\n{procs.logs()}") from None
        state = get(client, base + "/v1/router/state")
        assert state is not None and state["feed"]["connected"]
        old_epoch = state["feed"]["epoch"]
        agent = get(client, f"http://127.0.0.1:{agent_port}/v1/state")
        assert agent is not None
        procs.children += [p["pid"] for p in agent["processes"]]

        def feed() -> dict[str, Any] | None:
            s = get(client, base + "/v1/router/state")
            return s["feed"] if s else None

        with Traffic(base) as traffic:
            wait_sync(lambda: traffic.count() >= 5 or None, 30, "requests before the stop")
            procs.stop("controller")

            def lost() -> bool | None:
                f = feed()
                return True if f is not None and not f["connected"] else None

            wait_sync(lost, 30, "the router to notice the controller gone")
            served = traffic.count()
            wait_sync(lambda: traffic.count() >= served + 10 or None, 30, "requests while down")
            procs.start("controller", "controller", "--config", "controller.yaml")

            def resynced() -> dict[str, Any] | None:
                f = feed()
                return f if f and f["connected"] and f["epoch"] != old_epoch else None

            try:
                after = wait_sync(resynced, 60, "the router following the new controller")
            except AssertionError:
                raise AssertionError(f"no resync; logs:\n{procs.logs()}") from None
            served = traffic.count()
            wait_sync(lambda: traffic.count() >= served + 10 or None, 30, "requests after it")

        failed = [a for a in traffic.answers if a[0] != 200]
        assert failed == [], f"{len(failed)} of {traffic.count()} failed: {failed[:3]}"
        assert {replica for _, replica, _ in traffic.answers} <= {"tiny-r1", "tiny-r2"}
        page = get(client, controller + "/v1/router/feed")
        assert page is not None and after["epoch"] == page["epoch"] and after["resyncs"] >= 2

        # it follows the new controller: a replica retired there leaves the router's table
        r = client.put(
            controller + "/v1/admin/deployments/tiny", json={"profile": "tiny", "replicas": 1}
        )
        assert r.status_code == 200, r.text
        wait_sync(lambda: routable(1), 60, "one routable replica at the router")
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        r = client.post(base + "/v1/chat/completions", json=ask)
        assert r.status_code == 200, r.text

    procs.stop("router")
    procs.stop("node01")
    procs.stop("controller")
    leftovers = [g for g in procs.children if group_alive(g)]
    assert leftovers == [], f"engine process groups left behind: {leftovers}"
    for name in ("router", "controller"):
        assert "Traceback" not in procs.log(name), procs.log(name)


def test_a_router_on_the_network_needs_api_keys_and_tls(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    for text, problem in [
        ("listen: {host: 10.0.0.5, port: 8090}", r"listen\.host: 10\.0\.0\.5 .*auth\.api_keys"),
        (
            "listen: {host: 10.0.0.5, port: 8090}\nauth: {api_keys: ['sha256:" + "0" * 64 + "']}",
            r"listen\.tls",
        ),
        ("listen: {port: 8090}\nauth: {api_keys: [lgw_plain]}", r"auth\.api_keys\[0\]"),
        ("listen: {port: 8090}\nejection: {base: 10s, max: 1s}", r"ejection\.max"),
        ("listen: {port: 8090}\ntimeouts: {first_byte: 0s}", r"timeouts\.first_byte"),
        ("listen: {port: 8090}\nlimits: {max_answer: 2TiB}", r"limits\.max_answer"),
        ("listen: {port: 8090}\nretries: 3", "retries"),
    ]:
        path.write_text(f"{text}\ncontroller: http://127.0.0.1:8080\n")
        with pytest.raises(ConfigError, match=problem):
            load_router_config(path)
    path.write_text(
        "listen: {host: 10.0.0.5, port: 8090, allow_plaintext: true}\n"
        "controller: https://10.0.0.1:8080\ncontroller_token_file: router.token\n"
        "auth: {api_keys: ['sha256:" + "0" * 64 + "']}\n"
        "limits: {max_outstanding_per_replica: 8}\n"
        "timeouts: {connect: 500ms}\nejection: {failures: 5, base: 1s, max: 8s}\n"
    )
    s = load_router_config(path)
    assert s.controller_token_file == tmp_path / "router.token"
    assert (s.outstanding_per_replica, s.timeouts.connect_ms, s.timeouts.first_byte_ms) == (
        8,
        500,
        120_000,
    )
    assert (s.ejection.failures, s.ejection.base_ms, s.ejection.max_ms) == (5, 1_000, 8_000)
