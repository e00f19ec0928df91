"""A node agent's YAML config file, read into checked, frozen settings.

Role: `load_agent_config(path)` turns a file into the `AgentSettings` the agent takes; every
mistake is a `ConfigError` naming the file and the key.

Invariants:
- An agent config that names no engine binary is valid: the node can run the sim engine only
  (`AgentSettings.engine_names` is then `("sim",)`), and the agent says so with a warning.
- What the agent may launch is its `policy` (`policy.py`), checked here when the file is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from llmgw_twin.control.model import ENGINES
from llmgw_twin.control.topology import DomainId, LeafId, NodeTopology, SpineId
from llmgw_twin.service.agent.policy import DEFAULT_POLICY, PolicyC, PolicySettings, policy_settings
from llmgw_twin.service.common.config import (
    ConfigError,
    Duration,
    duration_setting,
    read_settings,
)
from llmgw_twin.service.common.config_access import (
    ClientTlsC,
    Host,
    ListenC,
    client_tls,
    listen_limits,
    relative,
    server_tls,
)
from llmgw_twin.service.common.listener import DEFAULT_LISTEN_LIMITS, ListenLimits
from llmgw_twin.service.common.tls import ClientTls, ServerTls
from llmgw_twin.service.common.wire import Name, Port, Text, Url, describe_errors
from llmgw_twin.units import fmt_ms, parse_size_mib

__all__ = ["AgentSettings", "ConfigError", "EngineBinary", "load_agent_config"]


MAX_CONTROLLERS = 16
"""Controllers sharing one store: a leader and its standbys."""
MAX_PEERS = 100_000
"""Nodes listed under `peer_addresses`: a fleet's."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineBinaryC(_Strict):
    binary: Text
    worker_binary: Text | None = None


class PortsC(_Strict):
    first: Port
    last: Port


class TopologyC(_Strict):
    """Where the node sits below its fabric and beside it (docs/topology.md)."""

    leaf: Name | None = None
    spine: Name | None = None
    nvlink_domain: Name | None = None


class AgentFile(_Strict):
    node: Name
    controller: Url
    controllers: list[Url] = Field(default=[], max_length=MAX_CONTROLLERS)
    """Every controller's address, when several share a store (the agent follows the leader);
    `controller` is tried first."""
    listen: ListenC
    advertise_url: Url | None = None
    root: Text = "/"
    fabric: Name | None = None
    topology: TopologyC | None = None
    use_nvml: Annotated[bool, Strict()] | None = None
    gpu_memory: Text = "80GiB"
    engines: dict[Name, Text | EngineBinaryC] | None = None
    ports: PortsC
    heartbeat_interval: Duration = "10s"
    engine_host: Host = "127.0.0.1"
    peer_addresses: dict[Name, Host] = Field(default={}, max_length=MAX_PEERS)
    peer_address_default: Host | None = "127.0.0.1"
    stop_grace: Duration = "5s"
    sidecar_timeout: Duration = "10s"
    report_timeout: Duration = "5s"
    worker_settle: Duration = "1s"
    ready_timeout: Duration = "30m"
    probe_interval: Duration = "5s"
    log_dir: Text | None = None
    run_state: Text | None = None
    sim_pace_file: Text | None = None
    """The node's pace file, handed to its sim engines (`--pace-file`; real mode's stragglers)."""
    late_heartbeats_file: Text | None = None
    """Real mode's late heartbeats (`agent/late.py`): the heartbeats are held back as it says."""
    policy: PolicyC = PolicyC()
    credential: Text | None = None
    controller_tls: ClientTlsC | None = None


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
    report_timeout_ms: int
    """A report to a controller not answered by then is tried at the next controller."""
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

    controller_urls: tuple[str, ...] = ()
    """Every controller's address, `controller_url` first (docs/high-availability.md)."""
    listen_limits: ListenLimits = DEFAULT_LISTEN_LIMITS
    """The listener's connection cap, timeouts and head bound (`listener.py`)."""
    topology: NodeTopology | None = None
    """The node's leaf, spine and NVLink domain, as the config names them (None: not known)."""
    sim_pace_file: Path | None = None
    """The node's pace file for its sim engines (`--pace-file`, `programs/sim_pace.py`): how
    many times slower they run, which real mode's `slow_node` and `nvlink_degraded` write;
    None: they run at pace 1."""
    late_heartbeats_file: Path | None = None
    """How late the agent's heartbeats are to be, which real mode's `delay_heartbeats` writes
    (`agent/late.py`); None: nothing is read, every heartbeat goes on time."""

    @property
    def ready_dir(self) -> Path | None:
        """Where the node's sim workers write their ready files (`--ready-file`): beside the
        run-state file; None without one (they are then judged by their process)."""
        if self.run_state is None:
            return None
        return self.run_state.parent / f"{self.node}.ready"

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


def _check_orderings(path: Path, f: AgentFile) -> None:
    """The agent's waits that must come in order: a worker is judged ready once it stayed up for
    `worker_settle`, so that must be shorter than `ready_timeout`, or every worker is stopped
    as never ready. (How its heartbeat fits the controller's `node_suspect_after` the agent
    cannot know: the controller says so when the agent registers, `node.heartbeat_too_slow`.)"""
    settle = duration_setting(path, "worker_settle", f.worker_settle)
    ready = duration_setting(path, "ready_timeout", f.ready_timeout, positive=True)
    if settle >= ready:
        raise ConfigError(
            f"{path}: worker_settle: worker_settle ({fmt_ms(settle)}) must be shorter than "
            f"ready_timeout ({fmt_ms(ready)}): every worker would be stopped as never ready"
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
            binary = EngineBinary(_program(path, f"engines.{engine}", value))
        else:
            worker = value.worker_binary
            binary = EngineBinary(
                _program(path, f"engines.{engine}.binary", value.binary),
                _program(path, f"engines.{engine}.worker_binary", worker) if worker else None,
            )
        engines.append((engine, binary))
    if f.ports.first > f.ports.last:
        raise ConfigError(f"{path}: ports: first ({f.ports.first}) is above last ({f.ports.last})")
    try:
        gpu_memory_mib = parse_size_mib(f.gpu_memory)
    except ValueError as e:
        raise ConfigError(f"{path}: gpu_memory: {e}") from None
    _check_orderings(path, f)
    root = relative(path, f.root)
    credential = relative(path, f.credential) if f.credential is not None else None
    tls = server_tls(path, f.listen, secured=credential is not None, what="it needs a credential")
    return AgentSettings(
        node=f.node,
        controller_url=f.controller.rstrip("/"),
        controller_urls=tuple(dict.fromkeys(u.rstrip("/") for u in (f.controller, *f.controllers))),
        host=f.listen.host,
        port=f.listen.port,
        listen_limits=listen_limits(path, f.listen),
        advertise_url=(
            f.advertise_url or f"{'https' if tls else 'http'}://{f.listen.host}:{f.listen.port}"
        ).rstrip("/"),
        root=root,
        fabric=f.fabric,
        topology=_topology(f.topology),
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
        report_timeout_ms=duration_setting(path, "report_timeout", f.report_timeout, positive=True),
        ready_timeout_ms=duration_setting(path, "ready_timeout", f.ready_timeout, positive=True),
        probe_interval_ms=duration_setting(path, "probe_interval", f.probe_interval, positive=True),
        log_dir=relative(path, f.log_dir) if f.log_dir is not None else None,
        policy=policy_settings(path, f.policy),
        credential=credential,
        tls=tls,
        controller_tls=client_tls(path, f.controller_tls),
        run_state=relative(path, f.run_state or f"{_state_dir()}/{f.node}.run.json"),
        sim_pace_file=relative(path, f.sim_pace_file) if f.sim_pace_file is not None else None,
        late_heartbeats_file=(
            relative(path, f.late_heartbeats_file) if f.late_heartbeats_file is not None else None
        ),
    )


def _topology(t: TopologyC | None) -> NodeTopology | None:
    if t is None or (t.leaf is None and t.spine is None and t.nvlink_domain is None):
        return None
    return NodeTopology(
        LeafId(t.leaf) if t.leaf is not None else None,
        SpineId(t.spine) if t.spine is not None else None,
        DomainId(t.nvlink_domain) if t.nvlink_domain is not None else None,
    )


def _program(path: Path, key: str, value: str) -> str:
    """An engine binary: an absolute path to a program, never a command line; one that exists
    must be an executable file (one not there yet is warned about when the agent starts)."""
    if not os.path.isabs(value) or any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(
            f"{path}: {key}: {value!r} is not an absolute path to a program (an engine binary "
            "is the program's path, such as /opt/vllm/bin/vllm, not a command line)"
        )
    if os.path.exists(value) and not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise ConfigError(f"{path}: {key}: {value} is not an executable file")
    return value


def _state_dir() -> str:
    """Where the run state goes by default: the systemd unit's state directory (its first, as
    systemd sets `$STATE_DIRECTORY` from `StateDirectory=`), else beside the config file."""
    return os.environ.get("STATE_DIRECTORY", "").split(":")[0] or "."
