"""Group commit: a registration storm becomes a few transactions, committed off the event loop,
and no request is answered before what it decided is on disk."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx

from helpers.services import FAST, node_info
from llmgw_twin.control.protocol import NodeRegistered
from llmgw_twin.service.common.wire import NodeRegisteredW
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app


def test_a_registration_storm_is_few_transactions_each_reply_after_its_commit(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"

    async def go() -> None:
        settings = ControllerSettings("127.0.0.1", 0, str(db), FAST, (), ())
        runtime = ControllerRuntime(
            settings, agent_transport=httpx.MockTransport(lambda _: httpx.Response(200))
        )
        await runtime.start()
        before = runtime.committer.transactions
        transport = httpx.ASGITransport(app=create_controller_app(runtime))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:

                async def register(i: int) -> None:
                    msg = NodeRegistered(node_info(f"n{i:03d}"), (), incarnation=1)
                    body = NodeRegisteredW.from_core(msg, f"http://agent-{i}").model_dump(
                        mode="json"
                    )
                    r = await client.post("/v1/agents/register", json=body)
                    assert r.status_code == 200, r.text
                    with sqlite3.connect(db) as conn:  # durable when answered
                        rows = conn.execute(
                            "SELECT node FROM nodes WHERE node = ?", (f"n{i:03d}",)
                        ).fetchall()
                    assert rows == [(f"n{i:03d}",)]

                await asyncio.gather(*(register(i) for i in range(200)))
            transactions = runtime.committer.transactions - before
            assert 1 <= transactions <= 100, transactions  # grouped: not a commit per registration
        finally:
            await runtime.stop()

    asyncio.run(go())
