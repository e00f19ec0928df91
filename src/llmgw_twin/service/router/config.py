"""The router service's YAML config, read into checked, frozen settings.

Role: `load_router_config(path)` turns a file into the `RouterSettings` that
`app.RouterRuntime` takes (docs/router.md lists the keys); every mistake is a
`ConfigError` naming the file and the key. The listener, its TLS and the controller's TLS have
the controller's and the agent's shape (`config_access.py`).

Invariants:
- Unknown keys are errors, never ignored; no value is coerced from another type; durations and
  sizes are written as in every other config (`2s`, `16MiB`).
- A listener on an address other than loopback needs API keys (`auth.api_keys`) and TLS, or an
  explicit `listen.allow_plaintext: true`, as the controller's does (docs/security.md).
- Relative paths (the token file, TLS files) are relative to the config file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field, Strict, ValidationError

from llmgw_twin.control.routing import Ejection, RouterTimeouts
from llmgw_twin.service.common import limits
from llmgw_twin.service.common.auth import check_hash
from llmgw_twin.service.common.config import duration_setting, read_settings
from llmgw_twin.service.common.config_access import (
    ClientTlsC,
    ConfigError,
    ListenC,
    StrictModel,
    client_tls,
    listen_limits,
    relative,
    server_tls,
)
from llmgw_twin.service.common.listener import DEFAULT_LISTEN_LIMITS, ListenLimits
from llmgw_twin.service.common.tls import ClientTls, ServerTls
from llmgw_twin.service.common.wire import Text, Url, describe_errors
from llmgw_twin.service.router.follower import LOAD_PUSH_S
from llmgw_twin.service.router.forwarding import MAX_ANSWER_BYTES
from llmgw_twin.service.router.holding import HOLD_MS
from llmgw_twin.units import parse_size_mib

Duration = Annotated[str, Strict()]


class RouterAuthC(StrictModel):
    api_keys: list[Annotated[str, Strict()]] = Field(default=[], max_length=4096)


class RouterLimitsC(StrictModel):
    max_inference_body: Text = f"{limits.INFERENCE_BODY_LIMIT // limits.MiB}MiB"
    max_answer: Text = f"{MAX_ANSWER_BYTES // limits.MiB}MiB"
    max_outstanding_per_replica: Annotated[int, Strict(), Field(ge=1, le=1_000_000)] = (
        limits.MAX_OUTSTANDING_PER_REPLICA
    )


class TimeoutsC(StrictModel):
    connect: Duration = "2s"
    first_byte: Duration = "120s"
    between_chunks: Duration = "60s"
    hold_at_zero: Duration = f"{HOLD_MS // 1000}s"
    """How long a request waits for a model scaled to zero (`holding.py`)."""


class EjectionC(StrictModel):
    failures: Annotated[int, Strict(), Field(ge=1, le=1000)] = 3
    base: Duration = "5s"
    max: Duration = "60s"


class FeedC(StrictModel):
    wait: Duration = "20s"
    reconnect_max: Duration = "5s"
    load_push: Duration = f"{LOAD_PUSH_S:g}s"
    """How often the router pushes its load to the controller's autoscaler."""


class RouterFile(StrictModel):
    listen: ListenC
    controller: Url
    controllers: list[Url] = Field(default_factory=list, max_length=16)
    """Every controller's address, when several share a store (the router follows the leader)."""
    controller_token_file: Text | None = None
    controller_tls: ClientTlsC | None = None
    auth: RouterAuthC = RouterAuthC()
    limits: RouterLimitsC = RouterLimitsC()
    timeouts: TimeoutsC = TimeoutsC()
    ejection: EjectionC = EjectionC()
    feed: FeedC = FeedC()


DEFAULT_TIMEOUTS = RouterTimeouts()
MAX_HOLD_MS = 3_600_000
DEFAULT_EJECTION = Ejection()


@dataclass(frozen=True, slots=True)
class RouterSettings:
    host: str
    port: int
    controller_url: str
    controller_token_file: Path | None = None
    """A file holding the router's token for the controller's feed; None: the controller asks
    none (loopback only)."""
    controller_tls: ClientTls | None = None
    tls: ServerTls | None = None
    api_key_hashes: tuple[str, ...] = ()
    """Empty: the inference routes are open to anyone who reaches the router."""
    inference_body_bytes: int = limits.INFERENCE_BODY_LIMIT
    answer_bytes: int = MAX_ANSWER_BYTES
    outstanding_per_replica: int = limits.MAX_OUTSTANDING_PER_REPLICA
    timeouts: RouterTimeouts = DEFAULT_TIMEOUTS
    ejection: Ejection = DEFAULT_EJECTION
    feed_wait_ms: int = 20_000
    """How long one read of the feed may wait for news (the controller caps it at 30 s)."""
    reconnect_max_ms: int = 5_000
    """The longest pause between two attempts to reach the controller."""
    other_controllers: tuple[str, ...] = ()
    """The other controllers' addresses (docs/high-availability.md)."""
    listen_limits: ListenLimits = DEFAULT_LISTEN_LIMITS
    """The listener's connection cap, timeouts and head bound (`listener.py`)."""
    hold_at_zero_ms: int = HOLD_MS
    """How long a request waits for a model scaled to zero before a 503."""
    load_push_ms: int = int(LOAD_PUSH_S * 1000)
    """How often the load is pushed to the controller (and at once when a request is held)."""


def _ms(path: Path, key: str, text: str) -> int:
    """A duration longer than 0, as the controller's config reads one."""
    return duration_setting(path, key, text, positive=True)


def _bytes(path: Path, key: str, text: str) -> int:
    try:
        mib = parse_size_mib(text)
    except ValueError as e:
        raise ConfigError(f"{path}: {key}: {e}") from None
    if not 1 <= mib <= 1024:
        raise ConfigError(f"{path}: {key}: must be from 1MiB to 1GiB")
    return mib * limits.MiB


def load_router_config(path: str | Path) -> RouterSettings:
    path = Path(path)
    try:
        f = RouterFile.model_validate(read_settings(path))
    except ValidationError as e:
        raise ConfigError(f"{path}: {describe_errors(e.errors())}") from None
    for i, value in enumerate(f.auth.api_keys):
        try:
            check_hash(value)
        except ValueError as e:
            raise ConfigError(f"{path}: auth.api_keys[{i}]: {e}") from None
    tls = server_tls(path, f.listen, secured=bool(f.auth.api_keys), what="it needs auth.api_keys")
    t, ej = f.timeouts, f.ejection
    base_ms, max_ms = _ms(path, "ejection.base", ej.base), _ms(path, "ejection.max", ej.max)
    if max_ms < base_ms:
        raise ConfigError(f"{path}: ejection.max: must be at least ejection.base")
    token = f.controller_token_file
    hold_ms = _ms(path, "timeouts.hold_at_zero", t.hold_at_zero)
    if hold_ms > MAX_HOLD_MS:
        raise ConfigError(f"{path}: timeouts.hold_at_zero: must be at most 1h")
    return RouterSettings(
        host=f.listen.host,
        port=f.listen.port,
        listen_limits=listen_limits(path, f.listen),
        controller_url=f.controller.rstrip("/"),
        other_controllers=tuple(
            u.rstrip("/") for u in f.controllers if u.rstrip("/") != f.controller.rstrip("/")
        ),
        controller_token_file=relative(path, token) if token is not None else None,
        controller_tls=client_tls(path, f.controller_tls),
        tls=tls,
        api_key_hashes=tuple(f.auth.api_keys),
        inference_body_bytes=_bytes(path, "limits.max_inference_body", f.limits.max_inference_body),
        answer_bytes=_bytes(path, "limits.max_answer", f.limits.max_answer),
        outstanding_per_replica=f.limits.max_outstanding_per_replica,
        timeouts=RouterTimeouts(
            connect_ms=_ms(path, "timeouts.connect", t.connect),
            first_byte_ms=_ms(path, "timeouts.first_byte", t.first_byte),
            between_chunks_ms=_ms(path, "timeouts.between_chunks", t.between_chunks),
        ),
        ejection=Ejection(failures=ej.failures, base_ms=base_ms, max_ms=max_ms),
        feed_wait_ms=_ms(path, "feed.wait", f.feed.wait),
        reconnect_max_ms=_ms(path, "feed.reconnect_max", f.feed.reconnect_max),
        hold_at_zero_ms=hold_ms,
        load_push_ms=_ms(path, "feed.load_push", f.feed.load_push),
    )
