"""Schemathesis against the router service's live OpenAPI schema, as tests/test_api_schema.py
does for the controller and the agent: every operation, cases that fit the schema and cases that
do not (derandomized, `CASES` per operation and mode); no 5xx but the 503 of a model with no
replica, declared statuses, content types and bodies, invalid input refused, no error logged.

The router follows a scripted feed with one deployed model and no replica, so the inference
routes answer 400, 404 or 503 and nothing reaches an engine.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from helpers.router import router, static_feed
from helpers.router import settings as router_settings

CASES = 20
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


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


def fuzz(operation: Any, mode: GenerationMode) -> int:
    """Up to `CASES` cases of `operation` in `mode`; how many ran."""
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
        case.call_and_validate(checks=CHECKS)

    run()
    return len(ran)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_the_router_answers_as_its_schema_says(
    schema: Any, mode: GenerationMode, subtests: pytest.Subtests, caplog: pytest.LogCaptureFixture
) -> None:
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/router/state"}
    for op in operations:
        if mode is GenerationMode.NEGATIVE and not (list(op.iter_parameters()) or op.body):
            continue
        with subtests.test(msg=f"{op.method.upper()} {op.path}"):
            caplog.clear()
            with caplog.at_level(logging.ERROR):
                assert fuzz(op, mode) > 0
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert errors == [], "the router logged errors"
