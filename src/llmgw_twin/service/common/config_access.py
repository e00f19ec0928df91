"""The parts of the services' configs that decide who gets in and how much: the listener and its
TLS, the controller's credentials (`auth`), the clients' TLS, and the controller's limits.

Role: read by `config.py` into the settings the runtimes take; every mistake is a `ConfigError`
naming the file and the key. A listener on an address other than loopback needs credentials
(the controller's `auth`, the agent's `credential`) and TLS, or an explicit
`allow_plaintext: true` (docs/security.md). Relative paths are relative to the config file.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from llmgw_twin.service.common import limits, listener
from llmgw_twin.service.common.auth import check_hash, is_loopback
from llmgw_twin.service.common.tls import ClientTls, ServerTls
from llmgw_twin.service.common.wire import Port, Text
from llmgw_twin.store.postgres import is_postgres_url
from llmgw_twin.units import parse_duration, parse_size_mib

Host = Annotated[str, Strict(), Field(min_length=1, max_length=255)]


class ConfigError(Exception):
    pass


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def relative(path: Path, value: str) -> Path:
    """`value` as a path, relative to the config file `path` unless it is absolute."""
    p = Path(value)
    return p if p.is_absolute() else path.parent / p


class ServerTlsC(StrictModel):
    cert: Text
    key: Text
    client_ca: Text | None = None


class ClientTlsC(StrictModel):
    ca: Text | None = None
    cert: Text | None = None
    key: Text | None = None


class ListenC(StrictModel):
    host: Host = "127.0.0.1"
    port: Port
    tls: ServerTlsC | None = None
    allow_plaintext: Annotated[bool, Strict()] = False
    """Serve plain HTTP on an address other than loopback (a network trusted end to end)."""
    max_connections: Annotated[
        int,
        Strict(),
        Field(ge=listener.MAX_CONNECTIONS_BOUNDS[0], le=listener.MAX_CONNECTIONS_BOUNDS[1]),
    ] = listener.MAX_CONNECTIONS
    head_timeout: Annotated[str, Strict()] = f"{listener.HEAD_TIMEOUT_MS // 1000}s"
    idle_timeout: Annotated[str, Strict()] = f"{listener.IDLE_TIMEOUT_MS // 1000}s"
    max_head_bytes: Annotated[
        int,
        Strict(),
        Field(ge=listener.MAX_HEAD_BYTES_BOUNDS[0], le=listener.MAX_HEAD_BYTES_BOUNDS[1]),
    ] = listener.MAX_HEAD_BYTES


class AuthC(StrictModel):
    admin_tokens: list[Annotated[str, Strict()]] = Field(default=[], max_length=64)
    api_keys: list[Annotated[str, Strict()]] = Field(default=[], max_length=4096)
    router_tokens: list[Annotated[str, Strict()]] = Field(default=[], max_length=64)
    reader_tokens: list[Annotated[str, Strict()]] = Field(default=[], max_length=64)
    secret_file: Text | None = None


class LimitsC(StrictModel):
    max_body: Text = f"{limits.CONTROL_BODY_LIMIT // limits.MiB}MiB"
    max_inference_body: Text = f"{limits.INFERENCE_BODY_LIMIT // limits.MiB}MiB"
    max_outstanding_per_replica: Annotated[int, Strict(), Field(ge=1, le=1_000_000)] = (
        limits.MAX_OUTSTANDING_PER_REPLICA
    )


@dataclass(frozen=True, slots=True)
class ControllerAuth:
    admin_hashes: tuple[str, ...]
    api_key_hashes: tuple[str, ...]
    """Empty: the router's routes are open to anyone who reaches them."""
    secret_file: Path
    """The key the agents' controller tokens derive from; created (mode 0600) if absent."""
    router_hashes: tuple[str, ...] = ()
    """Router processes that may follow the routing feed (`/v1/router/feed`)."""
    reader_hashes: tuple[str, ...] = ()
    """Readers: `GET /metrics` and the admin reads (state, events, explain, a drain's
    progress), nothing that changes the fleet (a dashboard's, a scraper's token)."""


@dataclass(frozen=True, slots=True)
class ControllerLimits:
    body_bytes: int = limits.CONTROL_BODY_LIMIT
    """The largest admin or agent request body; a larger one is answered 413."""
    inference_body_bytes: int = limits.INFERENCE_BODY_LIMIT
    """The largest request body on the router's inference routes."""
    outstanding_per_replica: int = limits.MAX_OUTSTANDING_PER_REPLICA
    """Requests in flight to one replica; beyond, another replica or 503 with Retry-After."""


DEFAULT_LIMITS = ControllerLimits()


def server_tls(path: Path, listen: ListenC, *, secured: bool, what: str) -> ServerTls | None:
    """The listener's TLS; an address other than loopback needs credentials and TLS (or an
    explicit `allow_plaintext`), so that nothing on the network can speak for a node."""
    tls = None
    if listen.tls is not None:
        t = listen.tls
        ca = relative(path, t.client_ca) if t.client_ca is not None else None
        tls = ServerTls(relative(path, t.cert), relative(path, t.key), ca)
        _check_tls(path, "listen.tls", tls.cert, tls.key, ca, ssl.PROTOCOL_TLS_SERVER)
    if not is_loopback(listen.host):
        if not secured:
            raise ConfigError(
                f"{path}: listen.host: {listen.host} is not a loopback address, so {what} "
                "(see docs/security.md)"
            )
        if tls is None and not listen.allow_plaintext:
            raise ConfigError(
                f"{path}: listen.tls: serving on {listen.host} needs TLS (cert and key), or "
                "listen.allow_plaintext: true on a network trusted end to end"
            )
    return tls


def listen_limits(path: Path, listen: ListenC) -> listener.ListenLimits:
    """The listener's connection cap, timeouts and head bound (`listener.py`), each within
    its bounds."""
    timeouts = {}
    for key, (low, high) in (
        ("head_timeout", listener.HEAD_TIMEOUT_BOUNDS_MS),
        ("idle_timeout", listener.IDLE_TIMEOUT_BOUNDS_MS),
    ):
        try:
            ms = parse_duration(getattr(listen, key))
        except ValueError as e:
            raise ConfigError(f"{path}: listen.{key}: {e}") from None
        if not low <= ms <= high:
            raise ConfigError(f"{path}: listen.{key}: must be from {low}ms to {high // 1000}s")
        timeouts[key] = ms
    return listener.ListenLimits(
        listen.max_connections,
        timeouts["head_timeout"],
        timeouts["idle_timeout"],
        listen.max_head_bytes,
    )


def client_tls(path: Path, c: ClientTlsC | None, where: str = "controller_tls") -> ClientTls | None:
    """A client's TLS (`where`: its key in the file), its files read once here, so that a
    missing or bad one is a config error naming it, not a failure at the first call."""
    if c is None:
        return None
    if (c.cert is None) != (c.key is None):
        raise ConfigError(f"{path}: {where}: a client certificate needs both cert and key")

    def rel(v: str | None) -> Path | None:
        return relative(path, v) if v is not None else None

    tls = ClientTls(rel(c.ca), rel(c.cert), rel(c.key))
    _check_tls(path, where, tls.cert, tls.key, tls.ca, ssl.PROTOCOL_TLS_CLIENT)
    return tls


def _check_tls(
    path: Path, where: str, cert: Path | None, key: Path | None, ca: Path | None, side: int
) -> None:
    """The certificate, its key and the CA load as TLS will load them when serving or calling."""
    for name, file in (
        ("cert", cert),
        ("key", key),
        ("ca" if side == ssl.PROTOCOL_TLS_CLIENT else "client_ca", ca),
    ):
        if file is not None and not file.is_file():
            raise ConfigError(f"{path}: {where}.{name}: {file}: no such file")
    ctx = ssl.SSLContext(side)
    if cert is not None:
        try:
            ctx.load_cert_chain(str(cert), str(key) if key is not None else None)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"{path}: {where}.cert: {cert} (key {key}): {e}") from None
    if ca is not None:
        try:
            ctx.load_verify_locations(cafile=str(ca))
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"{path}: {where}: {ca}: not a CA certificate: {e}") from None


def auth_settings(path: Path, a: AuthC | None, store: str) -> ControllerAuth | None:
    if a is None:
        return None
    hashes: dict[str, tuple[str, ...]] = {}
    keys = (
        ("admin_tokens", a.admin_tokens),
        ("api_keys", a.api_keys),
        ("router_tokens", a.router_tokens),
        ("reader_tokens", a.reader_tokens),
    )
    for key, values in keys:
        for i, value in enumerate(values):
            try:
                check_hash(value)
            except ValueError as e:
                raise ConfigError(f"{path}: auth.{key}[{i}]: {e}") from None
        hashes[key] = tuple(values)
    if not hashes["admin_tokens"]:
        raise ConfigError(f"{path}: auth.admin_tokens: at least one admin token hash is needed")
    if not a.secret_file and is_postgres_url(store):
        raise ConfigError(
            f"{path}: auth.secret_file: needed with a PostgreSQL store (there is no store file "
            "to keep the key beside): name one file, and give every controller of the store the "
            "same key, or agents refuse a successor's controller tokens"
        )
    secret = relative(path, a.secret_file) if a.secret_file else Path(store + ".key")
    problem = _secret_problem(secret)
    if problem is not None:
        key = (
            "auth.secret_file" if a.secret_file else "auth.secret_file (not set: beside the store)"
        )
        raise ConfigError(f"{path}: {key}: {secret}: {problem}")
    return ControllerAuth(
        hashes["admin_tokens"],
        hashes["api_keys"],
        secret,
        hashes["router_tokens"],
        hashes["reader_tokens"],
    )


def _secret_problem(secret: Path) -> str | None:
    """What keeps `secret` from being the controller's secret key (`auth.load_secret` reads it,
    or makes it where none is), or None."""
    if secret.is_dir():
        return "is a directory, not a key file"
    if secret.exists():
        try:
            text = secret.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as e:
            return f"cannot be read: {e}"
        if not re.fullmatch(r"[0-9a-f]{64,}", text):
            return "not a secret key (64 or more hex digits)"
        return None
    folder = secret.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        return f"absent, and cannot be made: {folder} is not a folder this process may write"
    return None


def limits_settings(path: Path, c: LimitsC) -> ControllerLimits:
    sizes = {}
    for key in ("max_body", "max_inference_body"):
        try:
            mib = parse_size_mib(getattr(c, key))
        except ValueError as e:
            raise ConfigError(f"{path}: limits.{key}: {e}") from None
        if not 1 <= mib <= 1024:
            raise ConfigError(f"{path}: limits.{key}: must be from 1MiB to 1GiB")
        sizes[key] = mib * limits.MiB
    return ControllerLimits(
        sizes["max_body"], sizes["max_inference_body"], c.max_outstanding_per_replica
    )
