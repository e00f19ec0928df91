"""The wire format of the production shell: pydantic models of every message, and error replies.

Role: the controller's and the agent's HTTP bodies are these models. A model's fields are its core
record's, by name (a test checks that they cannot drift); the model adds only what HTTP needs:
strict validation constraints and the OpenAPI schema. It converts to and from the core's frozen
dataclasses through the one codec (`llmgw_twin.codec`), never by copying fields by hand
(`to_core` / `from_core`, round trips are tested), so the shells only move messages and every
decision stays in the cores.

Invariants:
- Validation is strict: no coercion ("8" is not 8), no unknown keys, names are letters, digits,
  `.`, `_`, `-`; a body that does not validate is a 422 whose `detail` names each bad field.
- Every size is bounded (`limits.MAX_*`): each list's length, each string's, the text of a
  profile's args, every integer (to SQLite's int64), a node's GPUs; so a message that
  validates has a bounded cost to hold, store and show. The bounds fit together: the largest
  heartbeat they allow fits `limits.CONTROL_BODY_LIMIT`, and an adapter's argv for the largest
  shard they allow is a valid report (both tested).
- `install_error_handlers` makes every error reply JSON with a `detail` message: a malformed or
  invalid body is 422, a refusal (`Refused`, e.g. the core's `ValueError` for an unknown
  profile) carries its own status, anything unexpected is 500; never an HTML page or no body.
  The routes declare these replies in their OpenAPI schema (`replies.py`), and a schema fuzz
  holds them to it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any, ClassVar, Generic, Literal, Self, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    field_validator,
    model_validator,
)

from llmgw_twin import codec
from llmgw_twin.control import protocol as p
from llmgw_twin.control.model import (
    ENGINES,
    MAX_ROLE_COUNT,
    Deployment,
    NodeInfo,
    Profile,
    Role,
    ShardReport,
    ShardSpec,
    ShardState,
    TraceEvent,
)
from llmgw_twin.control.topology import NodeTopology, TopologyRules
from llmgw_twin.service.common import errors
from llmgw_twin.service.common.limits import (
    MAX_ARGS,
    MAX_ARGS_CHARS,
    MAX_ARGV,
    MAX_ARGV_CHARS,
    MAX_ENGINES,
    MAX_GPUS_PER_NODE,
    MAX_INT,
    MAX_REPLICA_NODES,
    MAX_REPLICAS,
    MAX_SHARDS_PER_MESSAGE,
)

# the error replies, where they were first (`errors.py`)
Refused = errors.Refused
describe_errors = errors.describe_errors
error_reply = errors.error_reply
install_error_handlers = errors.install_error_handlers

NAME_PATTERN = r"^[A-Za-z0-9._-]+$"
Name = Annotated[
    str, Strict(), StringConstraints(pattern=NAME_PATTERN, min_length=1, max_length=128)
]
Engine = Annotated[Name, Field(json_schema_extra={"enum": list(ENGINES)})]
"""An engine's name; the schema lists the known ones, the validators say which is unknown."""
Text = Annotated[str, Strict(), StringConstraints(min_length=1, max_length=4096)]
Arg = Annotated[str, Strict(), StringConstraints(max_length=4096)]
Count = Annotated[int, Strict(), Field(ge=0, le=MAX_INT)]
Positive = Annotated[int, Strict(), Field(ge=1, le=MAX_INT)]
Signed = Annotated[int, Strict(), Field(ge=-MAX_INT, le=MAX_INT)]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
Gpu = Annotated[int, Strict(), Field(ge=0, lt=MAX_GPUS_PER_NODE)]
"""A GPU's index on its node."""
Gpus = Annotated[list[Gpu], Field(max_length=MAX_GPUS_PER_NODE)]
RankNodes = Annotated[list[Name], Field(max_length=MAX_REPLICA_NODES)]
RankPorts = Annotated[list[Port], Field(max_length=MAX_REPLICA_NODES)]
Args = Annotated[list[Arg], Field(max_length=MAX_ARGS)]
Argv = Annotated[
    list[Annotated[str, Strict(), StringConstraints(max_length=MAX_ARGV_CHARS)]],
    Field(max_length=MAX_ARGV),
]
URL_PATTERN = r"^https?://[\x21-\x2e\x30-\x7e]+(/[\x21-\x7e]*)?$"
"""http(s), a host (and port), a path, in printable ASCII, as a URL is sent."""


def _sendable(url: str) -> str:
    """A URL the HTTP client takes, with a host and a port a connection can be made to: one
    that is not (a bad or unclosed IPv6 address, a port out of 1-65535, no host, a control
    character) would otherwise be stored, then fail every send to it."""
    try:
        parts = urlsplit(url)
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as e:  # an unclosed or bad IPv6 address, say
        raise ValueError(f"not a URL the HTTP client can send to: {e}") from None
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ValueError("not a URL the HTTP client can send to: its port is not from 1 to 65535")
    if not parts.hostname:
        raise ValueError("not a URL the HTTP client can send to: it names no host")
    return url


Url = Annotated[
    str,
    Strict(),
    StringConstraints(pattern=URL_PATTERN, max_length=512),
    AfterValidator(_sendable),
]

R = TypeVar("R")


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def _to(self, record: type[R], *, exclude: Collection[str] = (), **fields: Any) -> R:
        """This body as a `record`, through the codec, less the fields it `exclude`s (beyond the
        record) and with `fields` it does not carry (a name from the URL path)."""
        return codec.decode(record, self.model_dump(mode="json", exclude=set(exclude)) | fields)

    @classmethod
    def _of(cls, record: object, *, drop: Collection[str] = (), **fields: Any) -> Self:
        """The body of a core record, through the codec, less the fields it `drop`s (carried
        elsewhere) and with `fields` beyond the record; validated as any body is."""
        data = {k: v for k, v in codec.encode(record).items() if k not in drop}
        return cls.model_validate(data | fields)


class Mirror(Wire, Generic[R]):
    """A body with exactly its core record's fields (`class NodeInfoW(Mirror[NodeInfo])`): it
    converts both ways with nothing added."""

    core: ClassVar[type[Any]]
    """The record, read from the parametrised base `Mirror[Record]`."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        meta = cls.__pydantic_generic_metadata__
        if meta["origin"] is Mirror:
            cls.core = meta["args"][0]

    def to_core(self) -> R:
        out: R = self._to(self.core)
        return out

    @classmethod
    def from_core(cls, record: R) -> Self:
        return cls._of(record)


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (expected one of: {', '.join(ENGINES)})")


def _check_chars(words: list[str], limit: int, what: str) -> list[str]:
    total = sum(len(w) for w in words)
    if total > limit:
        raise ValueError(f"{what} are {total} characters together, over the {limit} allowed")
    return words


class NodeTopologyW(Mirror[NodeTopology]):
    """Where a node sits below its fabric and beside it (`control/topology.py`)."""

    leaf: Name | None = None
    spine: Name | None = None
    nvlink_domain: Name | None = None


class TopologyRulesW(Mirror[TopologyRules]):
    """A profile's placement rules per topology level."""

    nvlink: Literal["any", "same_domain"] = "any"
    leaves: Literal["any", "fewest", "same"] = "any"


class NodeInfoW(Mirror[NodeInfo]):
    node: Name
    fabric: Name
    gpus: Annotated[int, Strict(), Field(ge=0, le=MAX_GPUS_PER_NODE)]
    gpu_memory_mib: Count
    engines: Annotated[list[Engine], Field(max_length=MAX_ENGINES)]
    topology: NodeTopologyW | None = None

    @model_validator(mode="after")
    def _engines_known(self) -> NodeInfoW:
        for e in self.engines:
            _check_engine(e)
        return self


class ShardSpecW(Mirror[ShardSpec]):
    replica: Name
    model: Name
    profile: Name
    engine: Engine
    model_path: Text
    rank: Count
    shard_count: Annotated[int, Strict(), Field(ge=1, le=MAX_REPLICA_NODES)]
    node: Name
    gpus: Gpus
    leader: Name
    nodes: RankNodes = []
    rendezvous_port: Port
    rank_ports: RankPorts = []
    load_time_ms: Count = 0
    args: Args = []
    role: Literal["", "prefill", "decode"] = ""

    @field_validator("args")
    @classmethod
    def _args_size(cls, args: list[str]) -> list[str]:
        return _check_chars(args, MAX_ARGS_CHARS, "args")

    @model_validator(mode="after")
    def _consistent(self) -> ShardSpecW:
        _check_engine(self.engine)
        if self.rank >= self.shard_count:
            raise ValueError(f"rank {self.rank} is not below shard_count {self.shard_count}")
        if self.nodes and (len(self.nodes) != self.shard_count or self.nodes[0] != self.leader):
            raise ValueError("nodes must list one node per rank, the leader first")
        if self.rank_ports and (
            len(self.rank_ports) != self.shard_count or self.rank_ports[0] != self.rendezvous_port
        ):
            raise ValueError("rank_ports must list one port per rank, the rendezvous port first")
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError("gpus must not repeat")
        return self


class ShardReportW(Mirror[ShardReport]):
    spec: ShardSpecW
    state: ShardState
    endpoint: Url | None = None
    exit_code: Signed | None = None
    argv: Argv = []
    reason: Text | None = None

    @field_validator("argv")
    @classmethod
    def _argv_size(cls, argv: list[str]) -> list[str]:
        return _check_chars(argv, MAX_ARGV_CHARS, "argv")


class NodeRegisteredW(Wire):
    """A registration, with where the agent's API listens (kept by the controller's shell)."""

    info: NodeInfoW
    shards: Annotated[list[ShardReportW], Field(max_length=MAX_SHARDS_PER_MESSAGE)] = []
    incarnation: Signed
    agent_url: Url
    failed_gpus: Gpus = []
    fabric_up: Annotated[bool, Strict()] = True
    heartbeat_interval_ms: Count = 0
    """How often the agent heartbeats; 0: not said (an agent from before it was)."""
    version: Count = 0
    """The report's version within the incarnation; 0: not said (an agent from before it was)."""

    def to_core(self) -> p.NodeRegistered:
        failed = sorted(set(self.failed_gpus))
        return self._to(p.NodeRegistered, exclude={"agent_url"}, failed_gpus=failed)

    @classmethod
    def from_core(cls, m: p.NodeRegistered, agent_url: str) -> Self:
        return cls._of(m, agent_url=agent_url)


class HeartbeatW(Mirror[p.Heartbeat]):
    node: Name
    shards: Annotated[list[ShardReportW], Field(max_length=MAX_SHARDS_PER_MESSAGE)] = []
    failed_gpus: Gpus = []
    fabric_up: Annotated[bool, Strict()] = True
    incarnation: Signed = 0
    version: Count = 0
    """The report's version within the incarnation; 0: not said (an older agent)."""

    def to_core(self) -> p.Heartbeat:
        return self._to(p.Heartbeat, failed_gpus=sorted(set(self.failed_gpus)))


class ReportReplyW(Wire):
    """The controller's answer to a heartbeat or registration. `report`: it asks, in-band, for a
    full registration now (it does not know this node: restarted, or its store was lost)."""

    report: bool = False


class AssignShardsW(Mirror[p.AssignShards]):
    node: Name
    shards: Annotated[list[ShardSpecW], Field(max_length=MAX_SHARDS_PER_MESSAGE)]
    epoch: Count = 0
    """The sending leader's epoch (docs/high-availability.md); 0 from a controller before them."""


class RequestReportW(Mirror[p.RequestReport]):
    node: Name
    epoch: Count = 0


class ProfileW(Wire):
    """A profile's body; its name is the resource's (the URL path, or the config's key)."""

    engine: Engine
    nodes: Annotated[int, Strict(), Field(ge=1, le=MAX_REPLICA_NODES)] = 1
    gpus_per_node: Annotated[int, Strict(), Field(ge=1, le=MAX_GPUS_PER_NODE)]
    model: Text
    load_time_ms: Count = 0
    start_timeout_ms: Count = 0
    args: Args = []
    topology: TopologyRulesW = TopologyRulesW()

    @field_validator("args")
    @classmethod
    def _args_size(cls, args: list[str]) -> list[str]:
        return _check_chars(args, MAX_ARGS_CHARS, "args")

    @model_validator(mode="after")
    def _engine_known(self) -> ProfileW:
        _check_engine(self.engine)
        return self

    def to_core(self, name: str) -> Profile:
        return self._to(Profile, name=name)

    @classmethod
    def from_core(cls, pr: Profile) -> Self:
        return cls._of(pr, drop={"name"})


class RoleW(Mirror[Role]):
    """One role of a role group (`control/groups.py`)."""

    name: Literal["prefill", "decode"]
    profile: Name
    count: Annotated[int, Strict(), Field(ge=1, le=MAX_ROLE_COUNT)] = 1


class DeploymentW(Wire):
    """A deployment's body; its model is the resource's name. With `roles` (in any order),
    `replicas` counts role groups, and `profile` must be the prefill role's."""

    profile: Name
    replicas: Annotated[int, Strict(), Field(ge=0, le=MAX_REPLICAS)]
    roles: Annotated[list[RoleW], Field(max_length=2)] = []

    @model_validator(mode="after")
    def _roles(self) -> DeploymentW:
        if not self.roles:
            return self
        if sorted(r.name for r in self.roles) != ["decode", "prefill"]:
            raise ValueError("a role group needs the roles prefill and decode, each once")
        if next(r.profile for r in self.roles if r.name == "prefill") != self.profile:
            raise ValueError("profile must be the prefill role's profile")
        members = self.replicas * sum(r.count for r in self.roles)
        if members > MAX_REPLICAS:
            raise ValueError(
                f"{self.replicas} groups of {members // max(self.replicas, 1)} replicas are "
                f"{members} replicas, more than the {MAX_REPLICAS} allowed"
            )
        return self

    def to_core(self, model: str) -> Deployment:
        return self._to(Deployment, model=model)

    @classmethod
    def from_core(cls, d: Deployment) -> Self:
        return cls._of(d, drop={"model"})


Scalar = Annotated[str, Strict()] | Annotated[bool, Strict()] | Annotated[int, Strict()]


class TraceEventW(Wire):
    t_ms: Annotated[int, Strict()]
    kind: Name
    subjects: dict[str, Scalar | list[Scalar]] = {}

    def to_core(self) -> TraceEvent:
        pairs = tuple(
            sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in self.subjects.items())
        )
        return TraceEvent(self.t_ms, self.kind, pairs)

    @staticmethod
    def from_core(ev: TraceEvent) -> TraceEventW:
        subjects: dict[str, Any] = {
            k: list(v) if isinstance(v, tuple) else v for k, v in ev.subjects
        }
        return TraceEventW(t_ms=ev.t_ms, kind=ev.kind, subjects=subjects)
