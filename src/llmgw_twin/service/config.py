"""The controller's and the agent's YAML config files, read into checked, frozen settings.

Role: `load_controller_config(path)` and `load_agent_config(path)` turn a file into the settings
the runtimes take; every mistake is a `ConfigError` naming the file and the key. Durations and
sizes are written as in scenario files (`10s`, `80GiB`, read by `twin.units`); the controller's
`timings`, `profiles` and `deployments` have exactly a scenario's shape.

Invariants:
- Unknown keys are errors, never ignored; no value is coerced from another type.
- Relative paths (the store, the sysfs root, the log directory) are relative to the config file.
- An agent config that names no engine binary is valid: the node can run the sim engine only
  (`AgentSettings.engine_names` is then `("sim",)`), and the agent says so with a warning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, assert_never

import yaml
from pydantic import BaseModel, ConfigDict, Strict, ValidationError

from llmgw_twin.core.model import ENGINES, Deployment, ModelName, Profile, ProfileName, Timings
from llmgw_twin.service.config_access import (
    DEFAULT_LIMITS,
    AuthC,
    ClientTlsC,
    ConfigError,
    ControllerAuth,
    ControllerLimits,
    Host,
    LimitsC,
    ListenC,
    auth_settings,
    client_tls,
    limits_settings,
    relative,
    server_tls,
)
from llmgw_twin.service.policy import DEFAULT_POLICY, PolicyC, PolicySettings, policy_settings
from llmgw_twin.service.tls import ClientTls, ServerTls
from llmgw_twin.service.wire import (
    Count,
    Name,
    Port,
    Positive,
    ProfileW,
    Text,
    Url,
    describe_errors,
)
from llmgw_twin.store import EVENTS_KEPT
from llmgw_twin.units import (
    SettingKey,
    in_file_terms,
    parse_duration,
    parse_share,
    parse_size_mib,
    setting_keys,
)

Duration = Annotated[str, Strict()]


__all__ = [
    "AgentSettings",
    "ConfigError",
    "ControllerAuth",
    "ControllerLimits",
    "ControllerSettings",
    "EngineBinary",
    "load_agent_config",
    "load_controller_config",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


TIMING_KEYS: tuple[SettingKey, ...] = setting_keys(Timings)
"""Every `Timings` field by its name without `_ms`: the same table a scenario's loader reads."""


class ProfileC(_Strict):
    engine: Name
    nodes: Positive = 1
    gpus_per_node: Positive
    model: Text
    load_time: Duration = "0"
    start_timeout: Duration | None = None
    args: list[Annotated[str, Strict()]] = []


class DeploymentC(_Strict):
    model: Name
    profile: Name
    replicas: Count


class ControllerFile(_Strict):
    listen: ListenC
    store: Text
    timings: dict[Annotated[str, Strict()], Any] = {}
    """Checked against `TIMING_KEYS` by `_timings`, so that the keys follow `Timings`."""
    profiles: dict[Name, ProfileC] = {}
    deployments: list[DeploymentC] = []
    auth: AuthC | None = None
    agents_tls: ClientTlsC | None = None
    limits: LimitsC = LimitsC()
    events_kept: Positive = EVENTS_KEPT


class EngineBinaryC(_Strict):
    binary: Text
    worker_binary: Text | None = None


class PortsC(_Strict):
    first: Port
    last: Port


class AgentFile(_Strict):
    node: Name
    controller: Url
    listen: ListenC
    advertise_url: Url | None = None
    root: Text = "/"
    fabric: Name | None = None
    use_nvml: Annotated[bool, Strict()] | None = None
    gpu_memory: Text = "80GiB"
    engines: dict[Name, Text | EngineBinaryC] | None = None
    ports: PortsC
    heartbeat_interval: Duration = "10s"
    engine_host: Host = "127.0.0.1"
    peer_addresses: dict[Name, Host] = {}
    peer_address_default: Host | None = "127.0.0.1"
    stop_grace: Duration = "5s"
    sidecar_timeout: Duration = "10s"
    worker_settle: Duration = "1s"
    ready_timeout: Duration = "30m"
    probe_interval: Duration = "5s"
    log_dir: Text | None = None
    run_state: Text | None = None
    policy: PolicyC = PolicyC()
    credential: Text | None = None
    controller_tls: ClientTlsC | None = None


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


@dataclass(frozen=True, slots=True)
class EngineBinary:
    binary: str
    worker_binary: str | None = None


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node: str
    controller_url: str
    host: str
    port: int
    advertise_url: str
    root: Path
    fabric: str | None
    use_nvml: bool
    gpu_memory_mib: int
    engines: tuple[tuple[str, EngineBinary], ...]
    """engine -> the binaries the agent may run for it, sorted by engine; may be empty."""
    port_first: int
    port_last: int
    heartbeat_interval_ms: int
    engine_host: str
    """The address this node's engines are reached at: the host of the endpoints it reports."""
    peer_addresses: tuple[tuple[str, str], ...]
    peer_address_default: str | None
    """Where a node not in `peer_addresses` is reached; None: at its own name."""
    stop_grace_ms: int
    sidecar_timeout_ms: int
    worker_settle_ms: int
    ready_timeout_ms: int
    probe_interval_ms: int
    log_dir: Path | None
    policy: PolicySettings = DEFAULT_POLICY
    credential: Path | None = None
    """The node's credential file (`llmgw-twin ctl onboard`); None: no credentials."""
    tls: ServerTls | None = None
    controller_tls: ClientTls | None = None
    run_state: Path | None = None
    """The run-state file (`runstate.py`); None: none, and nothing of an earlier run adopted."""

    @property
    def engine_names(self) -> tuple[str, ...]:
        """What the node registers as able to run: the sim engine, and each engine named."""
        return tuple(dict.fromkeys(("sim", *(e for e, _ in self.engines))))

    def binary_for(self, engine: str) -> EngineBinary | None:
        return dict(self.engines).get(engine)

    def address_of(self, node: str) -> str:
        """Where `node`'s engines are reached; this node itself, unless listed: `engine_host`."""
        peers = dict(self.peer_addresses)
        if node == self.node and node not in peers:
            return self.engine_host
        return peers.get(node) or self.peer_address_default or node


def read_settings(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the config: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return data


def duration_setting(path: Path, key: str, text: str, *, positive: bool = False) -> int:
    try:
        ms = parse_duration(text)
    except ValueError as e:
        raise ConfigError(f"{path}: {key}: {e}") from None
    if positive and ms <= 0:
        raise ConfigError(f"{path}: {key}: must be longer than 0")
    return ms


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
    lost = int(values.setdefault("node_lost_after_ms", defaults.node_lost_after_ms))
    values.setdefault("node_suspect_after_ms", max(1, lost // 2))
    try:
        return replace(defaults, **values)
    except ValueError as e:
        raise ConfigError(f"{path}: timings: {in_file_terms(str(e), TIMING_KEYS)}") from None


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
        if dc.profile not in f.profiles:
            raise ConfigError(
                f"{path}: deployments[{i}].profile: unknown profile {dc.profile!r} "
                f"(expected one of: {', '.join(f.profiles) or 'none defined'})"
            )
        if any(d.model == dc.model for d in deployments):
            raise ConfigError(f"{path}: deployments[{i}]: model {dc.model!r} is deployed twice")
        deployments.append(Deployment(ModelName(dc.model), ProfileName(dc.profile), dc.replicas))
    store = str(relative(path, f.store))
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
        agents_tls=client_tls(path, f.agents_tls),
        limits=limits_settings(path, f.limits),
        events_kept=f.events_kept,
    )


def load_agent_config(path: str | Path) -> AgentSettings:
    path = Path(path)
    try:
        f = AgentFile.model_validate(read_settings(path))
    except ValidationError as e:
        raise ConfigError(f"{path}: {describe_errors(e.errors())}") from None
    engines: list[tuple[str, EngineBinary]] = []
    for engine, value in sorted((f.engines or {}).items()):
        if engine not in ENGINES:
            raise ConfigError(
                f"{path}: engines: unknown engine {engine!r} (expected: {', '.join(ENGINES)})"
            )
        if isinstance(value, str):
            engines.append((engine, EngineBinary(value)))
        else:
            engines.append((engine, EngineBinary(value.binary, value.worker_binary)))
    if f.ports.first > f.ports.last:
        raise ConfigError(f"{path}: ports: first ({f.ports.first}) is above last ({f.ports.last})")
    try:
        gpu_memory_mib = parse_size_mib(f.gpu_memory)
    except ValueError as e:
        raise ConfigError(f"{path}: gpu_memory: {e}") from None
    root = relative(path, f.root)
    credential = relative(path, f.credential) if f.credential is not None else None
    tls = server_tls(path, f.listen, secured=credential is not None, what="it needs a credential")
    return AgentSettings(
        node=f.node,
        controller_url=f.controller.rstrip("/"),
        host=f.listen.host,
        port=f.listen.port,
        advertise_url=(
            f.advertise_url or f"{'https' if tls else 'http'}://{f.listen.host}:{f.listen.port}"
        ).rstrip("/"),
        root=root,
        fabric=f.fabric,
        use_nvml=f.use_nvml if f.use_nvml is not None else root.resolve() == Path("/"),
        gpu_memory_mib=gpu_memory_mib,
        engines=tuple(engines),
        port_first=f.ports.first,
        port_last=f.ports.last,
        heartbeat_interval_ms=duration_setting(
            path, "heartbeat_interval", f.heartbeat_interval, positive=True
        ),
        engine_host=f.engine_host,
        peer_addresses=tuple(sorted(f.peer_addresses.items())),
        peer_address_default=f.peer_address_default,
        stop_grace_ms=duration_setting(path, "stop_grace", f.stop_grace),
        sidecar_timeout_ms=duration_setting(
            path, "sidecar_timeout", f.sidecar_timeout, positive=True
        ),
        worker_settle_ms=duration_setting(path, "worker_settle", f.worker_settle),
        ready_timeout_ms=duration_setting(path, "ready_timeout", f.ready_timeout, positive=True),
        probe_interval_ms=duration_setting(path, "probe_interval", f.probe_interval, positive=True),
        log_dir=relative(path, f.log_dir) if f.log_dir is not None else None,
        policy=policy_settings(path, f.policy),
        credential=credential,
        tls=tls,
        controller_tls=client_tls(path, f.controller_tls),
        run_state=relative(path, f.run_state or f"{_state_dir()}/{f.node}.run.json"),
    )


def _state_dir() -> str:
    """Where the run state goes by default: the systemd unit's state directory (its first, as
    systemd sets `$STATE_DIRECTORY` from `StateDirectory=`), else beside the config file."""
    return os.environ.get("STATE_DIRECTORY", "").split(":")[0] or "."
