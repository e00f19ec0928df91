"""Every error of an inference route reaches the official `openai` client as OpenAI's error
object (`{"error": {"message", "type", "param", "code"}}`): the client's exception carries the
message, the type and the code, so a user sees what went wrong and what to do, and a missing key
is told apart from a wrong one. Real servers on loopback (the router and the controller, each
on uvicorn), the real client."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import FastAPI
from starlette.exceptions import HTTPException

from helpers.live import live_controller, live_server
from helpers.router import router, settings, static_feed
from helpers.services import FAST, wait_sync
from llmgw_twin.service.common.auth import new_token, token_hash
from llmgw_twin.service.common.config_access import ControllerAuth
from llmgw_twin.service.common.replies import OPENAI_PATHS
from llmgw_twin.service.common.wire import install_error_handlers
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app

MODEL = "tiny"
KEY = new_token()
ADMIN = new_token()


def client(url: str, key: str) -> openai.OpenAI:
    # no retries: each status is seen once, as sent
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=10)


def chat(c: openai.OpenAI, model: str = MODEL, content: str = "hi") -> None:
    c.chat.completions.create(model=model, messages=[{"role": "user", "content": content}])


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def router_with_keys(**kw: object) -> Iterator[str]:
    """A router that asks for `KEY`, whose one replica of `MODEL` refuses connections, and
    which also knows a deployed model with no replica at all (`empty`)."""
    feed = static_feed(
        {f"{MODEL}-r1": f"http://127.0.0.1:{closed_port()}"}, models=(MODEL, "empty")
    )
    with router(settings(api_key_hashes=(token_hash(KEY),), **kw), feed) as url:
        yield url


def missing_key(url: str, path: str = "/v1/chat/completions") -> dict[str, object]:
    """A request with no key at all (the official client refuses to send one, so a plain HTTP
    client does, as curl would): the error object of its 401."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{url}{path}", json=body) if path != "/v1/models" else httpx.get(url + path)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
    raw = r.json()
    assert set(raw["error"]) >= {"message", "type", "param", "code"}, raw
    return dict(raw["error"])


def error_of(e: openai.APIStatusError) -> dict[str, object]:
    """The error object as the client parsed it (its `body`), checked against the raw reply."""
    raw = e.response.json()
    assert set(raw["error"]) >= {"message", "type", "param", "code"}, raw
    assert e.body == raw["error"]
    assert e.code == raw["error"]["code"] and e.type == raw["error"]["type"]
    assert raw["error"]["message"] in str(e), "the client's message is the server's"
    return dict(raw["error"])


def test_router_missing_key_and_wrong_key_are_told_apart() -> None:
    with router_with_keys() as url:
        err = missing_key(url)
        assert err["code"] == "missing_api_key" and err["type"] == "authentication_error"
        assert "no API key" in str(err["message"]) and "Authorization: Bearer" in str(
            err["message"]
        )
        with pytest.raises(openai.AuthenticationError) as wrong:
            chat(client(url, new_token()))
        err = error_of(wrong.value)
        assert err["code"] == "invalid_api_key"
        assert "matches none" in str(err["message"]) and "auth.api_keys" in str(err["message"])
        # the model list, which clients call first, answers in the same shape
        assert missing_key(url, "/v1/models")["code"] == "missing_api_key"
        with pytest.raises(openai.AuthenticationError) as listing:
            client(url, new_token()).models.list()
        assert error_of(listing.value)["code"] == "invalid_api_key"


def test_router_unknown_model_no_replica_and_failed_replica() -> None:
    with router_with_keys() as url:
        c = client(url, KEY)
        with httpx.Client(base_url=url) as raw:  # wait for the feed, bounded by the helper

            def known() -> bool | None:
                r = raw.get("/v1/models", headers={"authorization": f"Bearer {KEY}"})
                return True if r.status_code == 200 and r.json()["data"] else None

            wait_sync(known, 30, "the router to read its feed")
        with pytest.raises(openai.NotFoundError) as unknown:
            chat(c, model="nope")
        err = error_of(unknown.value)
        assert err["type"] == "invalid_request_error" and "not deployed" in str(err["message"])
        assert "tiny" in str(err["message"]), "the message names what is deployed"
        with pytest.raises(openai.InternalServerError) as none:
            chat(c, model="empty")
        assert none.value.status_code == 503
        assert error_of(none.value)["type"] == "server_error"
        with pytest.raises(openai.InternalServerError) as failed:
            chat(c)
        assert failed.value.status_code == 502
        err = error_of(failed.value)
        assert err["type"] == "server_error" and f"{MODEL}-r1" in str(err["message"])


def test_router_body_over_the_limit_is_an_openai_error() -> None:
    with router_with_keys(inference_body_bytes=1_000) as url:
        with pytest.raises(openai.APIStatusError) as big:
            chat(client(url, KEY), content="x" * 5_000)
        assert big.value.status_code == 413
        err = error_of(big.value)
        assert err["code"] == "request_too_large" and "at most 1000 bytes" in str(err["message"])


@contextmanager
def controller(tmp_path: Path) -> Iterator[str]:
    auth = ControllerAuth((token_hash(ADMIN),), (token_hash(KEY),), tmp_path / "secret.key")
    s = ControllerSettings("127.0.0.1", 0, str(tmp_path / "c.db"), FAST, (), (), auth=auth)

    def build() -> FastAPI:
        runtime = ControllerRuntime(
            s, agent_transport=httpx.MockTransport(lambda _r: httpx.Response(200, json={}))
        )
        return create_controller_app(runtime)

    with live_controller(build) as url:
        yield url


def test_controller_inference_routes_answer_in_openai_shape(tmp_path: Path) -> None:
    with controller(tmp_path) as url:
        assert missing_key(url)["code"] == "missing_api_key"
        with pytest.raises(openai.AuthenticationError) as wrong:
            client(url, new_token()).completions.create(model=MODEL, prompt="hi")
        assert error_of(wrong.value)["code"] == "invalid_api_key"
        # an admin token is a credential, but not an API key: 403, saying what to send
        with pytest.raises(openai.PermissionDeniedError) as admin:
            chat(client(url, ADMIN))
        err = error_of(admin.value)
        assert err["type"] == "permission_error" and "send an API key" in str(err["message"])
        with pytest.raises(openai.NotFoundError) as unknown:
            chat(client(url, KEY), model="nope")
        assert "not deployed" in str(error_of(unknown.value)["message"])
        # the admin API keeps its own shape: `detail` only
        r = httpx.get(f"{url}/v1/admin/state")
        assert r.status_code == 401 and set(r.json()) == {"detail"}


def test_rate_limits_and_unexpected_errors_on_an_inference_path_are_openai_errors() -> None:
    """Whatever raises on an inference route (a limit that answers 429, a bug) is shaped by the
    services' common error handlers: the same object, with OpenAI's type for the status."""

    def build() -> FastAPI:
        app = FastAPI()
        install_error_handlers(app)

        @app.post("/v1/chat/completions")
        async def limited() -> None:
            raise HTTPException(429, "over 5 requests a second: try again in 1s")

        @app.post("/v1/completions")
        async def broken() -> None:
            raise RuntimeError("boom")

        return app

    with live_server(build) as url:
        c = client(url, KEY)
        with pytest.raises(openai.RateLimitError) as limited:
            chat(c)
        err = error_of(limited.value)
        assert (err["type"], err["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert "try again" in str(err["message"])
        with pytest.raises(openai.InternalServerError) as broken:
            c.completions.create(model=MODEL, prompt="hi")
        err = error_of(broken.value)
        assert err["type"] == "server_error" and "RuntimeError: boom" in str(err["message"])
    assert "/v1/chat/completions" in OPENAI_PATHS
    assert json.dumps(err)  # plain JSON all through
