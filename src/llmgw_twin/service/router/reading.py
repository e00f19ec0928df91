"""What the forwarding reads of an OpenAI request: the model it names and whether it streams.

Role: `forwarding.Forwarder` forwards a request's body unchanged; `parse_request` reads only the
two fields routing needs, or answers the 400 that refuses the body.

Invariants:
- Every body is read as `json.loads` reads it: the same model and flag, or the same 400. A
  body of valid UTF-8 that msgspec decodes as an object takes the short way (the fields routing
  does not read are skipped, not built); any other body (another encoding, `NaN`, nesting past
  the recursion limit, not JSON) is left to `json.loads`, its errors and its leniencies.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from fastapi.responses import Response

from llmgw_twin.control.model import ModelName
from llmgw_twin.service.common.replies import openai_error


class _Named(msgspec.Struct):
    """What routing reads of a request: its other fields are skipped, not built."""

    model: Any = None
    stream: Any = None


_named = msgspec.json.Decoder(_Named).decode


def parse_request(raw: bytes) -> tuple[ModelName, bool] | Response:
    """The model a request names and whether it streams, or the 400 that refuses it: as
    `json.loads` reads the body. A body of valid UTF-8 that `msgspec` decodes as an object is
    read the same by both (the same values, the last of a repeated key); any other is left to
    `json.loads`, its errors and its leniencies (other encodings, `NaN`) included."""
    try:
        if not raw.isascii():
            raw.decode("utf-8")  # msgspec does not check the strings it skips
        named = _named(raw)
    except (ValueError, msgspec.MsgspecError, RecursionError):  # (UnicodeDecodeError: a ValueError)
        return _parse_slowly(raw)
    return _judged(named.model, named.stream)


def _parse_slowly(raw: bytes) -> tuple[ModelName, bool] | Response:
    try:
        body = json.loads(raw)
    except ValueError:
        return _invalid("invalid request: the body is not JSON", "invalid_json")
    except RecursionError:
        return _invalid("invalid request: the body's JSON is nested too deep", "invalid_json")
    if not isinstance(body, dict):
        return _judged(None, None)
    return _judged(body.get("model"), body.get("stream"))


def _judged(model: object, stream: object) -> tuple[ModelName, bool] | Response:
    if not isinstance(model, str) or not model:
        return _invalid(
            "invalid request: body.model: the name of a deployed model is required",
            "model_required",
        )
    return ModelName(model), stream is True


def _invalid(message: str, code: str) -> Response:
    return openai_error(400, message, "invalid_request_error", code)
