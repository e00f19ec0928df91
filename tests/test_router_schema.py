"""Schemathesis against the router service's live OpenAPI schema, as tests/test_api_schema.py
does for the controller and the agent: every operation, cases that fit the schema and cases that
do not (derandomized, `CASES` per operation and mode); no 5xx but the 503 of a model with no
replica, declared statuses, content types and bodies, invalid input refused, no error logged.

The router follows a scripted feed with one deployed model and no replica, so the inference
routes answer 400, 404 or 503 and nothing reaches an engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from schemathesis import GenerationMode

from helpers.router import router, static_feed
from helpers.router import settings as router_settings
from test_api_schema import MODES, fuzz_all


@pytest.fixture(scope="module")
def schema() -> Iterator[Any]:
    config = schemathesis.Config.from_dict(
        {
            "generation": {"with-security-parameters": False},  # it asks for no API key here
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
    with router(router_settings(), static_feed({}, models=("tiny",))) as url:
        yield schemathesis.openapi.from_url(url + "/openapi.json", config=config)


@pytest.mark.parametrize("mode", MODES, ids=str)
def test_the_router_answers_as_its_schema_says(
    schema: Any, mode: GenerationMode, subtests: pytest.Subtests, caplog: pytest.LogCaptureFixture
) -> None:
    paths = {r.ok().path for r in schema.get_all_operations()}
    assert paths >= {"/v1/chat/completions", "/v1/router/state"}
    fuzz_all(schema, mode, {}, subtests, caplog)
