"""Schemathesis against the live OpenAPI schema of the controller and of an agent.

Each service runs on uvicorn on a loopback port of its own (`helpers.live`), built from settings
made here, and its schema is read from its `/openapi.json`. Every operation is fuzzed with cases
that fit the schema and (where it has inputs) cases that do not; every answer must be no 5xx, a
status code the operation declares, its declared content type, a body its declared schema
allows, and a rejection of what the schema does not allow; nothing may be logged as an error.

Bounded for CI: `CASES` cases per operation and mode, generated deterministically (the same
cases on every run, no example database). The inference routes are in: the controller has a
deployed model and no replica, so they answer 404, 422 or 503 (a deployed model with no ready
replica is a 503 by design, the one 5xx allowed). The agent's node has a name the fuzzer does
not generate, so no assignment starts a process.

Each operation is a subtest, read from the live schema: an endpoint added later is fuzzed with
no list to keep. (Schemathesis's `from_fixture` loader is not used: it renames pytest's nodes
through an attribute pytest 9.2 no longer has.)

Credentials: both services here ask none (`auth` not configured), so schemathesis neither sends
nor leaves out a bearer token; `headers` is what every request carries, the place for tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from helpers.live import live_controller, live_server
from helpers.services import FAST, free_range
from llmgw_twin.control.model import Deployment, EngineName, ModelName, Profile, ProfileName
from llmgw_twin.service.agent.app import AgentRuntime, create_agent_app
from llmgw_twin.service.agent.config import load_agent_config
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import ControllerSettings
from llmgw_twin.service.controller.routes import create_controller_app

CASES = 20
"""Cases per operation and generation mode."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
AGENT_NODE = "fuzz-node-7f3a9c"


def _config() -> schemathesis.Config:
    return schemathesis.Config.from_dict(
        {
            "generation": {"with-security-parameters": False},
            "operations": [
                {
                    "include-path-regex": "^/v1/(chat/)?completions$",
                    "checks": {
                        "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", 503]}
                    },
                }
            ],
        }
    )


@pytest.fixture(scope="module")
def headers() -> dict[str, str]:
    """What every request carries: the credentials, for services that ask them."""
    return {}


@pytest.fixture(scope="module")
def controller_settings(tmp_path_factory: pytest.TempPathFactory) -> ControllerSettings:
    """A controller with a deployed model and no node, asking no credentials."""
    tmp = tmp_path_factory.mktemp("controller")
    return ControllerSettings(
        host="127.0.0.1",
        port=0,  # not read: `live_server` binds the port
        store=str(tmp / "controller.db"),
        timings=FAST,
        profiles=(Profile(ProfileName("tiny"), EngineName("sim"), 1, 1, "/models/tiny"),),
        deployments=(Deployment(ModelName("tiny"), ProfileName("tiny"), 1),),
        auth=None,
    )


@pytest.fixture(scope="module")
def controller_schema(controller_settings: ControllerSettings) -> Iterator[Any]:
    def build() -> FastAPI:
        # commands to the agents the fuzzer registers go nowhere
        agents = httpx.MockTransport(lambda _: httpx.Response(200, json={"ok": True}))
        return create_controller_app(ControllerRuntime(controller_settings, agent_transport=agents))

    with live_controller(build) as url:
        yield schemathesis.openapi.from_url(url + "/openapi.json", config=_config())


@pytest.fixture(scope="module")
def agent_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp: Path = tmp_path_factory.mktemp("agent")
    write_sysfs_root(tmp / "root", gpus=2, fabric_prefix=fabric_prefix_for("ib-a"), node=AGENT_NODE)
    first, last = free_range(4)
    (tmp / "agent.yaml").write_text(
        f"node: {AGENT_NODE}\ncontroller: http://controller.test\n"
        "listen: {host: 127.0.0.1, port: 9}\nroot: root\n"
        f"ports: {{first: {first}, last: {last}}}\nheartbeat_interval: 10s\nlog_dir: logs\n"
    )
    agent_settings = load_agent_config(tmp / "agent.yaml")

    def build() -> FastAPI:
        controller = httpx.MockTransport(lambda _: httpx.Response(200, json={"report": False}))
        return create_agent_app(AgentRuntime(agent_settings, controller_transport=controller))

    with live_server(build) as url:
        yield schemathesis.openapi.from_url(url + "/openapi.json", config=_config())


def fuzz(operation: Any, mode: GenerationMode, headers: dict[str, str]) -> int:
    """Up to `CASES` cases of `operation` in `mode` against its server; how many ran."""
    ran = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=CASES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        ran.append(case)
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()
    return len(ran)


def fuzz_all(
    schema: Any,
    mode: GenerationMode,
    headers: dict[str, str],
    subtests: pytest.Subtests,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every operation of the live schema, each a subtest; in negative mode only those with
    inputs (the others have nothing to get wrong)."""
    operations = [r.ok() for r in schema.get_all_operations()]
    assert operations, "the schema lists no operation"
    for op in operations:
        if mode is GenerationMode.NEGATIVE and not (list(op.iter_parameters()) or op.body):
            continue
        with subtests.test(msg=f"{op.method.upper()} {op.path}"):
            caplog.clear()
            with caplog.at_level(logging.ERROR):
                assert fuzz(op, mode, headers) > 0
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert errors == [], "the service logged errors"


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_the_controller_answers_as_its_schema_says(
    controller_schema: Any,
    headers: dict[str, str],
    mode: GenerationMode,
    subtests: pytest.Subtests,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fuzz_all(controller_schema, mode, headers, subtests, caplog)


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_the_agent_answers_as_its_schema_says(
    agent_schema: Any,
    headers: dict[str, str],
    mode: GenerationMode,
    subtests: pytest.Subtests,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fuzz_all(agent_schema, mode, headers, subtests, caplog)
