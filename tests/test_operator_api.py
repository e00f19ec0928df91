"""The operator's word on failed GPUs and quarantines: the admin API (through ASGI) and the
`llmgw-twin ctl` commands (against a real controller process on loopback). A failed GPU stays
failed across a controller restart until an operator clears it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from helpers.services import FAST, eventually, free_ports, node_info, wait_sync
from llmgw_twin.cli import main
from llmgw_twin.control.durable import PutFailedGpu
from llmgw_twin.control.model import NodeId
from llmgw_twin.control.protocol import Heartbeat, NodeRegistered, RequestReport, Step
from llmgw_twin.service.common.wire import HeartbeatW, NodeRegisteredW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app


def _registration(name: str) -> dict[str, object]:
    msg = NodeRegistered(node_info(name, "ib-a"), (), incarnation=1)
    return NodeRegisteredW.from_core(msg, f"http://agent-{name}").model_dump(mode="json")


def _beat(name: str, failed: tuple[int, ...]) -> dict[str, object]:
    return HeartbeatW.from_core(Heartbeat(NodeId(name), (), failed)).model_dump(mode="json")


async def _with_controller(db: Path, body: object) -> None:
    settings = ControllerSettings("127.0.0.1", 0, str(db), FAST, (), ())
    runtime = ControllerRuntime(
        settings, agent_transport=httpx.MockTransport(lambda r: httpx.Response(200, json={}))
    )
    await runtime.start()
    transport = httpx.ASGITransport(app=create_controller_app(runtime))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            await body(client)  # type: ignore[operator]
    finally:
        await runtime.stop()


def _failed(state: dict[str, object], node: str) -> list[int]:
    nodes = state["nodes"]
    assert isinstance(nodes, list)
    (entry,) = [n for n in nodes if n["node"] == node]
    return list(entry["failed_gpus"])


def test_a_failed_gpu_survives_a_restart_until_the_operator_clears_it(tmp_path: Path) -> None:
    db = tmp_path / "c.db"

    async def report(client: httpx.AsyncClient) -> None:
        assert (await client.post("/v1/agents/register", json=_registration("n1"))).is_success
        assert (await client.post("/v1/agents/heartbeat", json=_beat("n1", (3,)))).is_success
        assert _failed((await client.get("/v1/admin/state")).json(), "n1") == [3]

    async def after_restart(client: httpx.AsyncClient) -> None:
        # the node comes back reporting the GPU healthy: the store still holds it failed
        assert (await client.post("/v1/agents/register", json=_registration("n1"))).is_success
        assert (await client.post("/v1/agents/heartbeat", json=_beat("n1", ()))).is_success
        assert _failed((await client.get("/v1/admin/state")).json(), "n1") == [3]
        r = await client.delete("/v1/admin/nodes/n1/failed-gpus/3")
        assert r.status_code == 200 and r.json() == {"node": "n1", "gpu": 3, "cleared": True}
        assert _failed((await client.get("/v1/admin/state")).json(), "n1") == []
        again = await client.delete("/v1/admin/nodes/n1/failed-gpus/3")
        assert again.status_code == 404
        assert again.json() == {"detail": "GPU 3 of node n1 is not marked failed"}
        none = await client.delete("/v1/admin/nodes/n1/quarantine", params={"profile": "p"})
        assert none.status_code == 404
        assert none.json() == {"detail": "node n1 is not quarantined for profile p"}
        bad = await client.delete("/v1/admin/nodes/n1/failed-gpus/-1")
        assert bad.status_code == 422

    asyncio.run(_with_controller(db, report))
    asyncio.run(_with_controller(db, after_restart))


CONTROLLER_YAML = """\
listen: {{host: 127.0.0.1, port: {port}}}
store: controller.db
timings:
  heartbeat_interval: 1s
  node_lost_after: 30s
  reconcile_interval: 100ms
"""


@pytest.fixture
def controller_url(tmp_path: Path) -> object:
    (port,) = free_ports(1)
    (tmp_path / "controller.yaml").write_text(CONTROLLER_YAML.format(port=port))
    log = (tmp_path / "controller.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw_twin.cli", "controller", "--config", "controller.yaml"],
        cwd=tmp_path,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool | None:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(base + "/health", timeout=1.0).is_success or None
            assert proc.poll() is None, (tmp_path / "controller.log").read_text()
            return None

        wait_sync(up, 30, "the controller to answer /health")
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_ctl_clears_a_failed_gpu_and_says_when_there_is_nothing_to_clear(
    controller_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with httpx.Client(base_url=controller_url, timeout=5.0) as client:
        assert client.post("/v1/agents/register", json=_registration("node01")).is_success
        assert client.post("/v1/agents/heartbeat", json=_beat("node01", (2,))).is_success
    assert main(["ctl", "clear-gpu", "node01", "2", "--controller", controller_url]) == 0
    out = capsys.readouterr().out  # prose, as every ctl write prints
    assert out == "node node01: GPU 2 cleared, placement may use it again\n"
    assert main(["ctl", "clear-gpu", "node01", "2", "--controller", controller_url]) == 1
    assert "refused (404): GPU 2 of node node01 is not marked failed" in capsys.readouterr().err
    code = main(["ctl", "clear-quarantine", "node01", "--controller", controller_url])
    assert code == 1
    assert "node node01 is not quarantined" in capsys.readouterr().err


def test_ctl_without_a_controller_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    assert main(["ctl", "clear-gpu", "node01", "2", "--controller", url]) == 2
    assert "cannot reach the controller" in capsys.readouterr().err


def test_a_failed_commit_stops_the_controller_before_anything_is_sent(tmp_path: Path) -> None:
    sent: list[str] = []
    fatal: list[str] = []

    def agent(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(200, json={})

    def die(message: str) -> None:
        fatal.append(message)
        raise RuntimeError(message)  # the real one ends the process here

    def broken(writes: object, events: object = (), epoch: int | None = None) -> None:
        raise OSError("disk full")

    async def go() -> None:
        settings = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), FAST, (), ())
        runtime = ControllerRuntime(settings, agent_transport=httpx.MockTransport(agent), fatal=die)
        await runtime.start()
        transport = httpx.ASGITransport(app=create_controller_app(runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            assert (await client.post("/v1/agents/register", json=_registration("n1"))).is_success
        # a step with a write and a command: the commit fails, so the command never leaves
        step = Step(
            commands=(RequestReport(NodeId("n1")),), writes=(PutFailedGpu(NodeId("n1"), 1),)
        )
        original = runtime.store.commit
        runtime.store.commit = broken  # type: ignore[method-assign]
        done = runtime._apply(step)
        assert done is not None  # it has a write: carried out only once durable
        with pytest.raises(RuntimeError, match="disk full"):
            await done
        runtime.store.commit = original  # type: ignore[method-assign]
        assert runtime.delivery.in_flight == 0  # no send was even started
        assert "/v1/report-request" not in sent
        runtime._apply(step)  # the same step with a working store does send it

        async def arrived() -> bool | None:
            return "/v1/report-request" in sent or None

        await eventually(arrived, 5, "the report request")
        await runtime.stop()

    asyncio.run(go())
    # the real fatal ends the process at the first; here a reconcile that committed while the
    # store was broken (a slow machine stretches that moment) is a second, for the same cause
    assert fatal and all("disk full" in m for m in fatal)


def test_a_controller_told_not_before_opens_its_store_and_serves_only_from_then(
    tmp_path: Path,
) -> None:
    """`controller --not-before NS`: the program loads, waits for that instant of the host's
    monotonic clock, then listens, opens its store and serves (a restart without start-up
    downtime). Its port refuses connections while it waits, as a controller that is down does;
    from the moment its store opens, a connection is accepted and answered once it serves,
    never refused (an agent answering the restart's report request is heard at once)."""
    (port,) = free_ports(1)
    (tmp_path / "controller.yaml").write_text(CONTROLLER_YAML.format(port=port))
    not_before = time.monotonic_ns() + 3_000_000_000
    argv = ["controller", "--config", "controller.yaml", "--not-before", str(not_before)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw_twin.cli", *argv],
        cwd=tmp_path,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        store = tmp_path / "controller.db"

        def opened() -> int | None:
            assert proc.poll() is None
            return time.monotonic_ns() if store.exists() else None

        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert time.monotonic_ns() < not_before, "checked too late to tell anything"
        # the store appears only once the instant has come: a lower bound, not a timing
        assert wait_sync(opened, 60, "the store to be opened") >= not_before
        # one request, no retry: the port listened before the store was opened
        reply = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30.0)
        assert reply.status_code == 200
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_the_controller_logs_its_listen_address_at_start(
    controller_url: str, tmp_path: Path
) -> None:
    """The log says where the controller is reached, once, before it serves."""
    lines = (tmp_path / "controller.log").read_text().splitlines()
    said = [line for line in lines if "listening on" in line]
    assert len(said) == 1, lines
    assert said[0].endswith(f"llmgw_twin.serving: listening on {controller_url}")
