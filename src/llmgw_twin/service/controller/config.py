"""The controller's YAML config file, read into checked, frozen settings.

Role: `load_controller_config(path)` turns a file into the `ControllerSettings` the runtime
takes; every mistake is a `ConfigError` naming the file and the key. The `timings`, `profiles`
and `deployments` have exactly a scenario's shape (the same `Timings` keys a loader reads).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from llmgw_twin.control.autoscale import AutoscalePolicy
from llmgw_twin.control.model import (
    MAX_ROLE_COUNT,
    ROLE_NAMES,
    Deployment,
    ModelName,
    Profile,
    ProfileName,
    Role,
    Timings,
)
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.service.common.config import (
    ConfigError,
    Duration,
    duration_setting,
    read_settings,
)
from llmgw_twin.service.common.config_access import (
    DEFAULT_LIMITS,
    AuthC,
    ClientTlsC,
    ControllerAuth,
    ControllerLimits,
    LimitsC,
    ListenC,
    auth_settings,
    client_tls,
    limits_settings,
    listen_limits,
    relative,
    server_tls,
)
from llmgw_twin.service.common.limits import MAX_ARGS, MAX_REPLICAS
from llmgw_twin.service.common.listener import DEFAULT_LISTEN_LIMITS, ListenLimits
from llmgw_twin.service.common.tls import ClientTls, ServerTls
from llmgw_twin.service.common.wire import (
    Name,
    Positive,
    ProfileW,
    Text,
    TopologyRulesW,
    Url,
    describe_errors,
)
from llmgw_twin.service.controller.engine_loads import ENGINE_SIGNALS
from llmgw_twin.store.postgres import is_postgres_url
from llmgw_twin.store.sqlite import EVENTS_KEPT
from llmgw_twin.units import SettingKey, parse_share, setting_keys, timings_refusal

__all__ = [
    "ConfigError",
    "ControllerAuth",
    "ControllerLimits",
    "ControllerSettings",
    "load_controller_config",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


TIMING_KEYS: tuple[SettingKey, ...] = setting_keys(Timings)


class ProfileC(_Strict):
    engine: Name
    nodes: Positive = 1
    gpus_per_node: Positive
    model: Text
    load_time: Duration = "0"
    start_timeout: Duration | None = None
    args: list[Annotated[str, Strict()]] = Field(default=[], max_length=MAX_ARGS)
    nvlink: Literal["any", "same_domain"] = "any"
    """Every shard in one NVLink domain (docs/topology.md)."""
    leaves: Literal["any", "fewest", "same"] = "any"
    """Every shard under one leaf switch, or as few as can be."""


class RoleC(_Strict):
    profile: Name
    count: Annotated[int, Strict(), Field(ge=1, le=MAX_ROLE_COUNT)] = 1


class DeploymentC(_Strict):
    model: Name
    profile: Name | None = None
    """Required unless `roles` names a profile per role."""
    replicas: Annotated[int, Strict(), Field(ge=0, le=MAX_REPLICAS)]
    """As the API bounds a deployment's (`PUT /v1/admin/deployments/{model}`); with `roles`, the
    role groups."""
    roles: dict[Literal["prefill", "decode"], RoleC] | None = None
    """A role group's roles, as a scenario file writes them (`docs/topology.md`)."""


class AutoscaleC(_Strict):
    """A deployment's autoscaling (docs/autoscale.md): the service follows the requests
    outstanding at its replicas, its own and the routers' (`autoscaling.py`), or the engines'
    queues or KV-cache use, read from their `/metrics` (`engine_loads.py`)."""

    min: Annotated[int, Strict(), Field(ge=0, le=MAX_REPLICAS)]
    """0 only with `scale_to_zero`."""
    max: Annotated[int, Strict(), Field(ge=1, le=MAX_REPLICAS)]
    scale_to_zero: Annotated[bool, Strict()] = False
    """No replica while no request comes; a request then waits for one (`router/holding.py`)."""
    signal: Literal["outstanding", "queue", "kv_cache"] = "outstanding"
    """TTFT is the twin's only: the service measures no time to first token."""
    target: Annotated[float, Field(gt=0, le=1_000_000)]
    up_window: Duration = "30s"
    down_window: Duration = "5m"
    interval: Duration = "10s"


MAX_PROFILES = MAX_DEPLOYMENTS = 1_000
MAX_EVENTS_KEPT = 10_000_000
MAX_TIMING_COUNT = 1_000_000
"""A `timings` count (as scenario files bound theirs)."""


class ControllerFile(_Strict):
    listen: ListenC
    store: Text
    timings: dict[Annotated[str, Strict()], Any] = {}
    """Checked against `TIMING_KEYS` by `_timings`, so that the keys follow `Timings`."""
    profiles: dict[Name, ProfileC] = Field(default={}, max_length=MAX_PROFILES)
    deployments: list[DeploymentC] = Field(default=[], max_length=MAX_DEPLOYMENTS)
    autoscale: dict[Name, AutoscaleC] = Field(default={}, max_length=MAX_DEPLOYMENTS)
    """Per model: applied at every start, as the timings are (the deployments only to an
    empty store)."""
    auth: AuthC | None = None
    agents_tls: ClientTlsC | None = None
    limits: LimitsC = LimitsC()
    events_kept: Annotated[int, Strict(), Field(ge=1, le=MAX_EVENTS_KEPT)] = EVENTS_KEPT
    name: Name = "c1"
    """This controller's name in the store's lease (docs/high-availability.md): unique among the
    controllers that share one store."""
    advertise_url: Url | None = None
    """Where agents, routers and `ctl` reach this controller: what a standby names when it
    points at the leader. Default: the listen address (this host's name for a wildcard one)."""


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    host: str
    port: int
    store: str
    timings: Timings
    profiles: tuple[Profile, ...]
    deployments: tuple[Deployment, ...]
    auth: ControllerAuth | None = None
    """None: no credentials asked (allowed on loopback only, see docs/security.md)."""
    tls: ServerTls | None = None
    agents_tls: ClientTls | None = None
    limits: ControllerLimits = DEFAULT_LIMITS
    events_kept: int = EVENTS_KEPT
    """How many of the newest events the event log keeps, in the store and in memory."""
    name: str = "c1"
    """This controller's name in the store's lease."""
    advertise_url: str = ""
    """Where the others' clients reach this controller (`advertise_url` in the file)."""
    listen_limits: ListenLimits = DEFAULT_LISTEN_LIMITS
    """The listener's connection cap, timeouts and head bound (`listener.py`)."""
    autoscale: tuple[AutoscalePolicy, ...] = ()
    """The deployments whose count follows their load (`autoscale` in the file)."""


def _timings(path: Path, raw: dict[str, Any]) -> Timings:
    """As a scenario's `timings`: the same keys (every `Timings` field without `_ms`), omitted
    keys take the defaults; suspicion, unless set, comes halfway to the loss deadline."""
    by_key = {k.key: k for k in TIMING_KEYS}
    values: dict[str, Any] = {}  # field -> value, each of its key's kind
    for name, value in raw.items():
        key = by_key.get(name)
        if key is None:
            raise ConfigError(
                f"{path}: timings: unknown key {name!r} (expected one of: {', '.join(by_key)})"
            )
        if value is not None:
            values[key.attr] = _setting(path, f"timings.{name}", key, value)
    defaults = Timings()
    written = [by_key[name].key for name in raw if raw[name] is not None]
    lost = int(values.setdefault("node_lost_after_ms", defaults.node_lost_after_ms))
    values.setdefault("node_suspect_after_ms", max(1, lost // 2))
    try:
        return replace(defaults, **values)
    except ValueError as e:
        # one value against another (a heartbeat not shorter than the suspicion, ...): the
        # first key named that the file wrote, and every value named
        text, at = timings_refusal(str(e), TIMING_KEYS, values, written)
        where = f"timings.{at}" if at is not None else "timings"
        raise ConfigError(f"{path}: {where}: {text}") from None


def _setting(path: Path, where: str, key: SettingKey, value: object) -> int | float:
    """One `timings` value, of the kind its key says; YAML may have read it as a number."""
    plain_number = isinstance(value, int | float) and not isinstance(value, bool)
    match key.kind:
        case "duration":
            if isinstance(value, str) or (isinstance(value, int) and plain_number):
                return duration_setting(path, where, str(value), positive=key.minimum > 0)
            raise ConfigError(f"{path}: {where}: expected a duration such as 10s, got {value!r}")
        case "count":
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{path}: {where}: expected a whole number, got {value!r}")
            if value < key.minimum:
                raise ConfigError(f"{path}: {where}: must be at least {key.minimum}, got {value}")
            if value > MAX_TIMING_COUNT:
                raise ConfigError(
                    f"{path}: {where}: must be at most {MAX_TIMING_COUNT}, got {value}"
                )
            return value
        case "share":
            if not (isinstance(value, str) or plain_number):
                raise ConfigError(f"{path}: {where}: expected a share such as 0.5 or 50%")
            try:
                return parse_share(str(value))
            except ValueError as e:
                raise ConfigError(f"{path}: {where}: {e}") from None
        case _:
            assert_never(key.kind)


def _store_file(path: Path, value: str) -> str:
    """The SQLite store's file: one that may be opened (or made), named here when it cannot
    (SQLite itself would say only "unable to open database file")."""
    store = relative(path, value)
    if store.is_dir():
        raise ConfigError(f"{path}: store: {store} is a directory, not a database file")
    return str(store)


def load_controller_config(path: str | Path) -> ControllerSettings:
    path = Path(path)
    try:
        f = ControllerFile.model_validate(read_settings(path))
    except ValidationError as e:
        raise ConfigError(f"{path}: {describe_errors(e.errors())}") from None
    profiles = []
    for name, pc in f.profiles.items():
        load_ms = duration_setting(path, f"profiles.{name}.load_time", pc.load_time)
        try:
            body = ProfileW(
                engine=pc.engine,
                nodes=pc.nodes,
                gpus_per_node=pc.gpus_per_node,
                model=pc.model,
                load_time_ms=load_ms,
                args=pc.args,
                topology=TopologyRulesW(nvlink=pc.nvlink, leaves=pc.leaves),
            )
        except ValidationError as e:
            raise ConfigError(f"{path}: profiles.{name}: {describe_errors(e.errors())}") from None
        profile = body.to_core(name)
        if pc.start_timeout is not None:
            timeout_ms = duration_setting(
                path, f"profiles.{name}.start_timeout", pc.start_timeout, positive=True
            )
            profile = replace(profile, start_timeout_ms=timeout_ms)
        profiles.append(profile)
    deployments: list[Deployment] = []
    for i, dc in enumerate(f.deployments):
        if any(d.model == dc.model for d in deployments):
            raise ConfigError(f"{path}: deployments[{i}]: model {dc.model!r} is deployed twice")
        deployments.append(_deployment(path, i, dc, f.profiles))
    autoscale = tuple(_autoscale(path, model, ac) for model, ac in sorted(f.autoscale.items()))
    for dep in deployments:
        if dep.roles and dep.model in f.autoscale:  # its load is per decode, its count per group
            raise ConfigError(
                f"{path}: autoscale.{dep.model}: a deployment of roles is not autoscaled yet"
            )
    for policy in autoscale:
        _engine_exports(path, policy, f)
    store = f.store if is_postgres_url(f.store) else _store_file(path, f.store)
    auth = auth_settings(path, f.auth, store)
    tls = server_tls(path, f.listen, secured=auth is not None, what="it needs an auth section")
    return ControllerSettings(
        host=f.listen.host,
        port=f.listen.port,
        store=store,
        timings=_timings(path, f.timings),
        profiles=tuple(profiles),
        deployments=tuple(deployments),
        auth=auth,
        tls=tls,
        agents_tls=client_tls(path, f.agents_tls, "agents_tls"),
        limits=limits_settings(path, f.limits),
        events_kept=f.events_kept,
        name=f.name,
        listen_limits=listen_limits(path, f.listen),
        autoscale=autoscale,
        advertise_url=(f.advertise_url or default_url(f.listen.host, f.listen.port, tls)).rstrip(
            "/"
        ),
    )


def _autoscale(path: Path, model: str, ac: AutoscaleC) -> AutoscalePolicy:
    where = f"autoscale.{model}"
    try:
        return AutoscalePolicy(
            model=ModelName(model),
            minimum=ac.min,
            maximum=ac.max,
            signal=ac.signal,
            target=Fraction(str(ac.target)),
            up_window_ms=duration_setting(path, f"{where}.up_window", ac.up_window, positive=True),
            down_window_ms=duration_setting(
                path, f"{where}.down_window", ac.down_window, positive=True
            ),
            interval_ms=duration_setting(path, f"{where}.interval", ac.interval, positive=True),
            scale_to_zero=ac.scale_to_zero,
        )
    except ValueError as e:
        raise ConfigError(f"{path}: {where}: {e}") from None


def _engine_exports(path: Path, policy: AutoscalePolicy, f: ControllerFile) -> None:
    """A policy on an engine signal the model's engine does not export (llama.cpp's KV-cache
    use) is refused, where the file deploys the model; a deployment made through the API is
    skipped by the scraper instead (`engine_loads.py`)."""
    if policy.signal not in ENGINE_SIGNALS:
        return
    for dc in f.deployments:
        pc = f.profiles.get(dc.profile) if dc.profile is not None else None
        if dc.model != policy.model or pc is None:
            continue
        try:
            metrics = adapter_for(pc.engine).load_metrics
        except KeyError:
            continue  # an unknown engine: the profile itself is refused
        if not getattr(metrics, policy.signal):
            raise ConfigError(
                f"{path}: autoscale.{policy.model}.signal: engine {pc.engine} (profile "
                f"{dc.profile}) exports no {policy.signal} metric; follow another signal"
            )


def default_url(host: str, port: int, tls: ServerTls | None) -> str:
    """The listen address as a client would write it: this host's name for a wildcard."""
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - naming it, not binding it
        host = socket.getfqdn()
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls is not None else 'http'}://{host}:{port}"


def _deployment(path: Path, i: int, dc: DeploymentC, profiles: Mapping[str, object]) -> Deployment:
    """A deployment of the file, plain or of roles, its profiles checked."""
    where = f"{path}: deployments[{i}]"
    if (dc.profile is None) == (dc.roles is None):
        raise ConfigError(f"{where}: name either a profile or roles (a profile per role)")
    named = [("profile", dc.profile)] if dc.profile is not None else []
    roles: list[Role] = []
    given: dict[str, RoleC] = {str(k): v for k, v in (dc.roles or {}).items()}
    for name in ROLE_NAMES if dc.roles is not None else ():
        rc = given.get(name)
        if rc is None:
            raise ConfigError(f"{where}.roles: missing role {name!r} (a group needs both)")
        named.append((f"roles.{name}.profile", rc.profile))
        roles.append(Role(name, ProfileName(rc.profile), rc.count))
    for key, profile in named:
        if profile not in profiles:
            raise ConfigError(
                f"{where}.{key}: unknown profile {profile!r} "
                f"(expected one of: {', '.join(profiles) or 'none defined'})"
            )
    first = roles[0].profile if roles else ProfileName(str(dc.profile))
    return Deployment(ModelName(dc.model), first, dc.replicas, tuple(roles))
