"""The controller's command delivery: bounded in flight, one pending command of a kind per node,
retried with back-off, given up on after its attempts; through an httpx mock transport that
holds each send until the test lets it go."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from helpers.services import eventually
from llmgw_twin.control.model import NodeId
from llmgw_twin.control.protocol import AssignShards, RequestReport
from llmgw_twin.service.controller import delivery
from llmgw_twin.service.controller.delivery import Delivery


class Agents:
    """A mock of every agent: records what arrives, can hold sends and fail the first ones."""

    def __init__(self, fail_first: int = 0) -> None:
        self.arrived: list[tuple[str, str, Any]] = []
        self.open = asyncio.Event()
        self.open.set()
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_first = fail_first

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.open.wait()
            if self.fail_first > 0:
                self.fail_first -= 1
                return httpx.Response(503, json={"detail": "busy"})
            body = json.loads(request.content)
            self.arrived.append((request.url.host, request.url.path, body))
            return httpx.Response(200, json={"ok": True})
        finally:
            self.in_flight -= 1


def urls(n: int) -> dict[NodeId, str]:
    return {NodeId(f"n{i}"): f"http://agent-n{i}" for i in range(n)}


def test_at_most_max_in_flight_sends_whatever_the_fleet() -> None:
    async def go() -> None:
        agents = Agents()
        agents.open.clear()
        d = Delivery(urls(200), None, transport=httpx.MockTransport(agents), max_in_flight=8)
        d.open()
        for i in range(200):
            d.send(AssignShards(NodeId(f"n{i}"), ()))

        async def eight() -> bool | None:
            return agents.in_flight == 8 or None

        await eventually(eight, 5, "eight sends in flight")
        assert d.in_flight == 200
        agents.open.set()

        async def all_sent() -> bool | None:
            return len(agents.arrived) == 200 or None

        await eventually(all_sent, 10, "every node's assignment delivered")
        assert agents.most_in_flight == 8
        assert sorted(h for h, _, _ in agents.arrived) == sorted(f"agent-n{i}" for i in range(200))
        assert (d.sent, d.failed, d.in_flight) == (200, 0, 0)
        await d.close()

    asyncio.run(go())


def test_a_newer_command_replaces_a_pending_one_of_its_kind_order_kept() -> None:
    async def go() -> None:
        agents = Agents()
        agents.open.clear()
        d = Delivery(urls(1), None, transport=httpx.MockTransport(agents), max_in_flight=4)
        d.open()
        n0 = NodeId("n0")
        d.send(AssignShards(n0, ()))  # taken by a worker at once, held in the transport

        async def held() -> bool | None:
            return agents.in_flight == 1 or None

        await eventually(held, 5, "the first send in flight")
        d.send(RequestReport(n0))
        d.send(AssignShards(n0, ()))
        d.send(RequestReport(n0))  # replaces the first report request: moves after the assign
        assert agents.most_in_flight == 1  # one send at a time per node
        agents.open.set()

        async def done() -> bool | None:
            return len(agents.arrived) == 3 or None

        await eventually(done, 5, "the node's commands")
        assert [p for _, p, _ in agents.arrived] == [
            "/v1/assign",
            "/v1/assign",
            "/v1/report-request",
        ]
        await d.close()
        assert len(agents.arrived) == 3

    asyncio.run(go())


def test_a_failed_send_is_retried_with_back_off_then_given_up_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(delivery, "RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(delivery, "RETRY_ATTEMPTS", 3)

    async def go() -> None:
        agents = Agents(fail_first=2)
        d = Delivery(urls(2), None, transport=httpx.MockTransport(agents))
        d.open()
        d.send(AssignShards(NodeId("n0"), ()))

        async def delivered() -> bool | None:
            return len(agents.arrived) == 1 or None

        await eventually(delivered, 5, "the assignment delivered on its third attempt")
        assert (d.sent, d.failed, d.dropped) == (1, 2, 0)
        agents.fail_first = 10
        d.send(AssignShards(NodeId("n1"), ()))

        async def given_up() -> bool | None:
            return d.dropped == 1 or None

        await eventually(given_up, 5, "the send given up on")
        assert d.failed == 5 and d.in_flight == 0 and len(agents.arrived) == 1
        await d.close()

    asyncio.run(go())


def test_a_failed_send_is_never_retried_after_a_newer_one_of_its_kind_went(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An assignment to a node that is down fails and waits for its retry; the node comes back
    and a newer assignment is delivered before the retry's time: the retry is dropped, so the
    node's last assignment is the newer one (it once overwrote it, stopping its shards)."""
    monkeypatch.setattr(delivery, "RETRY_FIRST_S", 0.05)

    async def go() -> None:
        agents = Agents(fail_first=1)
        d = Delivery(urls(1), None, transport=httpx.MockTransport(agents))
        d.open()
        n0 = NodeId("n0")
        old, new = AssignShards(n0, ()), AssignShards(n0, ())
        d.send(old)

        async def failed_once() -> bool | None:
            return (d.failed == 1 and bool(d._retries)) or None

        await eventually(failed_once, 5, "the first send failed, its retry waiting")
        d.send(new)

        async def delivered() -> bool | None:
            return len(agents.arrived) == 1 or None

        await eventually(delivered, 5, "the newer assignment delivered")
        await asyncio.gather(*list(d._retries))  # the old one's retry comes due
        assert d.in_flight == 0 and d.sent == 1 and len(agents.arrived) == 1
        await d.close()

    asyncio.run(go())


def test_nothing_goes_to_a_node_without_an_address() -> None:
    async def go() -> None:
        agents = Agents()
        d = Delivery(urls(1), None, transport=httpx.MockTransport(agents))
        d.open()
        d.send(AssignShards(NodeId("elsewhere"), ()))
        assert d.in_flight == 0
        await d.close()
        assert agents.arrived == []

    asyncio.run(go())


def test_a_report_request_counts_as_tried_once_it_left_not_once_answered() -> None:
    # a powered-off agent: its kernel takes the request, nothing ever answers it. The restarted
    # controller's wait for that agent must run from when the request left (an interval), not
    # until the send's read bound gives up
    async def go() -> None:
        received = asyncio.Event()
        held: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            received.set()
            await asyncio.Event().wait()  # never answers; cancelled with the server

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        node = NodeId("n0")
        d = Delivery({node: f"http://127.0.0.1:{port}"}, None)
        tried: list[NodeId] = []
        d.on_report_tried = tried.append
        d.open()
        try:
            d.send(RequestReport(node))
            async with asyncio.timeout(10):
                await received.wait()

            async def said() -> bool | None:
                return True if tried else None

            await eventually(said, 5, "the report request said tried")
            assert tried == [node] and d.in_flight == 1  # tried, its answer still awaited
        finally:
            for w in held:
                w.close()
            server.close()
            await d.close()

    asyncio.run(go())
