"""The services' HTTP surface says what the servers do: URLs checked where they are taken (an
onboarding's `agent_url`), integer bounds published as the integers the server checks, a 405's
`Allow` naming every method of the path, and `/metrics` refusing in text as it answers in text
(docs/security.md, docs/metrics.md). On the controller's and the router's apps, over ASGI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers.controller import controller
from llmgw_twin.service.common.auth import new_token, token_hash
from llmgw_twin.service.common.limits import MAX_INT
from llmgw_twin.service.router.app import RouterRuntime, create_router_app
from llmgw_twin.service.router.config import RouterSettings


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://[", "Invalid IPv6 URL"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://a:99999", "port is not from 1 to 65535"),
        ("http://a:0", "port is not from 1 to 65535"),
        ("http://:8100", "names no host"),
    ],
)
def test_an_agent_url_that_cannot_be_called_is_refused_at_onboarding(
    tmp_path: Path, url: str, says: str
) -> None:
    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            r = await client.post("/v1/admin/nodes/n1/credential", json={"agent_url": url})
            assert r.status_code == 422, r.text
            detail = r.json()["detail"]
            assert "body.agent_url" in detail and says in detail, detail
            ok = await client.post(
                "/v1/admin/nodes/n1/credential", json={"agent_url": "http://[::1]:8100"}
            )
            # a URL that can be called passes; this controller, asking no credentials, then
            # says it issues none
            assert ok.status_code == 409 and "asks no credentials" in ok.text, ok.text

    asyncio.run(go())


def _integer_bounds(node: Any) -> list[Any]:
    found = []
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, dict):
            if n.get("type") == "integer":
                found += [n[k] for k in ("minimum", "maximum", "exclusiveMaximum") if k in n]
            todo.extend(n.values())
        elif isinstance(n, list):
            todo.extend(n)
    return found


def test_integer_bounds_are_published_as_the_integers_the_server_checks(tmp_path: Path) -> None:
    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            schema = json.loads((await client.get("/openapi.json")).text)
            bounds = _integer_bounds(schema)
            assert bounds and all(type(b) is int for b in bounds), sorted(map(repr, bounds))
            assert MAX_INT in bounds and -MAX_INT in bounds  # int64, exactly
            replicas = schema["components"]["schemas"]["DeploymentW"]["properties"]["replicas"]
            assert replicas["maximum"] == 10_000 and type(replicas["maximum"]) is int

    asyncio.run(go())


def test_a_405_allows_every_method_of_the_path(tmp_path: Path) -> None:
    async def go() -> None:
        async with controller(tmp_path) as (_, client):
            r = await client.patch("/v1/admin/nodes/n1/credential")
            assert r.status_code == 405 and r.headers["allow"] == "DELETE, POST", r.headers
            r = await client.put("/v1/admin/state")
            assert r.status_code == 405 and r.headers["allow"].split(", ")[0] == "GET"

    asyncio.run(go())


def test_metrics_refuse_in_text_as_they_answer_in_text() -> None:
    key = new_token()
    settings = RouterSettings(
        "127.0.0.1", 0, "http://127.0.0.1:9", api_key_hashes=(token_hash(key),)
    )
    app = create_router_app(RouterRuntime(settings))

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://r") as client:
            for headers in ({}, {"authorization": f"Bearer {new_token()}"}):
                r = await client.get("/metrics", headers=headers)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
                assert r.headers["content-type"].startswith("text/plain"), r.headers
                assert "credentials" in r.text or "API key" in r.text, r.text
            ok = await client.get("/metrics", headers={"authorization": f"Bearer {key}"})
            assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")
            schema = (await client.get("/openapi.json")).json()
            refusal = schema["paths"]["/metrics"]["get"]["responses"]["401"]["content"]
            assert list(refusal) == ["text/plain"], refusal

    asyncio.run(go())
