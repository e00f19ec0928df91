"""The wire format of the production shell: pydantic models of every message, and error replies.

Role: the controller's and the agent's HTTP bodies are these models; each converts exactly to and
from the core's frozen dataclasses (`to_core` / `from_core`, round trips are tested), so the
shells only move messages and every decision stays in the cores.

Invariants:
- Validation is strict: no coercion ("8" is not 8), no unknown keys, names are letters, digits,
  `.`, `_`, `-`; a body that does not validate is a 422 whose `detail` names each bad field.
- `install_error_handlers` makes every error reply JSON with a `detail` message: a malformed or
  invalid body is 422, a refusal (`Refused`, e.g. the core's `ValueError` for an unknown
  profile) carries its own status, anything unexpected is 500; never an HTML page or no body.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmgw_twin.core import protocol as p
from llmgw_twin.core.model import (
    ENGINES,
    Deployment,
    EngineName,
    FabricId,
    ModelName,
    NodeId,
    NodeInfo,
    Profile,
    ProfileName,
    ReplicaId,
    ShardReport,
    ShardSpec,
    ShardState,
    TraceEvent,
)

log = logging.getLogger(__name__)

NAME_PATTERN = r"^[A-Za-z0-9._-]+$"
Name = Annotated[
    str, Strict(), StringConstraints(pattern=NAME_PATTERN, min_length=1, max_length=128)
]
Text = Annotated[str, Strict(), StringConstraints(min_length=1, max_length=4096)]
Arg = Annotated[str, Strict(), StringConstraints(max_length=4096)]
Count = Annotated[int, Strict(), Field(ge=0)]
Positive = Annotated[int, Strict(), Field(ge=1)]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
Url = Annotated[
    str, Strict(), StringConstraints(pattern=r"^https?://[^\s/]+(/\S*)?$", max_length=512)
]


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (expected one of: {', '.join(ENGINES)})")


class NodeInfoW(Wire):
    node: Name
    fabric: Name
    gpus: Count
    gpu_memory_mib: Count
    engines: list[Name]

    @model_validator(mode="after")
    def _engines_known(self) -> NodeInfoW:
        for e in self.engines:
            _check_engine(e)
        return self

    def to_core(self) -> NodeInfo:
        engines = tuple(EngineName(e) for e in self.engines)
        return NodeInfo(
            NodeId(self.node), FabricId(self.fabric), self.gpus, self.gpu_memory_mib, engines
        )

    @staticmethod
    def from_core(n: NodeInfo) -> NodeInfoW:
        return NodeInfoW(
            node=n.node,
            fabric=n.fabric,
            gpus=n.gpus,
            gpu_memory_mib=n.gpu_memory_mib,
            engines=list(n.engines),
        )


class ShardSpecW(Wire):
    replica: Name
    model: Name
    profile: Name
    engine: Name
    model_path: Text
    rank: Count
    shard_count: Positive
    node: Name
    gpus: list[Count]
    leader: Name
    nodes: list[Name] = []
    rendezvous_port: Port
    rank_ports: list[Port] = []
    load_time_ms: Count = 0
    args: list[Arg] = []

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

    def to_core(self) -> ShardSpec:
        return ShardSpec(
            replica=ReplicaId(self.replica),
            model=ModelName(self.model),
            profile=ProfileName(self.profile),
            engine=EngineName(self.engine),
            model_path=self.model_path,
            rank=self.rank,
            shard_count=self.shard_count,
            node=NodeId(self.node),
            gpus=tuple(self.gpus),
            leader=NodeId(self.leader),
            nodes=tuple(NodeId(n) for n in self.nodes),
            rendezvous_port=self.rendezvous_port,
            rank_ports=tuple(self.rank_ports),
            load_time_ms=self.load_time_ms,
            args=tuple(self.args),
        )

    @staticmethod
    def from_core(s: ShardSpec) -> ShardSpecW:
        return ShardSpecW(
            replica=s.replica,
            model=s.model,
            profile=s.profile,
            engine=s.engine,
            model_path=s.model_path,
            rank=s.rank,
            shard_count=s.shard_count,
            node=s.node,
            gpus=list(s.gpus),
            leader=s.leader,
            nodes=list(s.nodes),
            rendezvous_port=s.rendezvous_port,
            rank_ports=list(s.rank_ports),
            load_time_ms=s.load_time_ms,
            args=list(s.args),
        )


class ShardReportW(Wire):
    spec: ShardSpecW
    state: ShardState
    endpoint: Url | None = None
    exit_code: Annotated[int, Strict()] | None = None
    argv: list[Arg] = []

    def to_core(self) -> ShardReport:
        return ShardReport(
            self.spec.to_core(), self.state, self.endpoint, self.exit_code, tuple(self.argv)
        )

    @staticmethod
    def from_core(r: ShardReport) -> ShardReportW:
        return ShardReportW(
            spec=ShardSpecW.from_core(r.spec),
            state=r.state,
            endpoint=r.endpoint,
            exit_code=r.exit_code,
            argv=list(r.argv),
        )


def _reports(shards: Sequence[ShardReportW]) -> tuple[ShardReport, ...]:
    return tuple(s.to_core() for s in shards)


class NodeRegisteredW(Wire):
    """A registration, with where the agent's API listens (kept by the controller's shell)."""

    info: NodeInfoW
    shards: list[ShardReportW] = []
    incarnation: Annotated[int, Strict()]
    agent_url: Url
    failed_gpus: list[Count] = []

    def to_core(self) -> p.NodeRegistered:
        return p.NodeRegistered(
            self.info.to_core(),
            _reports(self.shards),
            self.incarnation,
            tuple(sorted(set(self.failed_gpus))),
        )

    @staticmethod
    def from_core(m: p.NodeRegistered, agent_url: str) -> NodeRegisteredW:
        return NodeRegisteredW(
            info=NodeInfoW.from_core(m.info),
            shards=[ShardReportW.from_core(s) for s in m.shards],
            incarnation=m.incarnation,
            agent_url=agent_url,
            failed_gpus=list(m.failed_gpus),
        )


class HeartbeatW(Wire):
    node: Name
    shards: list[ShardReportW] = []
    failed_gpus: list[Count] = []

    def to_core(self) -> p.Heartbeat:
        failed = tuple(sorted(set(self.failed_gpus)))
        return p.Heartbeat(NodeId(self.node), _reports(self.shards), failed)

    @staticmethod
    def from_core(m: p.Heartbeat) -> HeartbeatW:
        return HeartbeatW(
            node=m.node,
            shards=[ShardReportW.from_core(s) for s in m.shards],
            failed_gpus=list(m.failed_gpus),
        )


class ReportReplyW(Wire):
    """The controller's answer to a heartbeat or registration. `report`: it asks, in-band, for a
    full registration now (it does not know this node: restarted, or its store was lost)."""

    report: bool = False


class AssignShardsW(Wire):
    node: Name
    shards: list[ShardSpecW]

    def to_core(self) -> p.AssignShards:
        return p.AssignShards(NodeId(self.node), tuple(s.to_core() for s in self.shards))

    @staticmethod
    def from_core(m: p.AssignShards) -> AssignShardsW:
        return AssignShardsW(node=m.node, shards=[ShardSpecW.from_core(s) for s in m.shards])


class RequestReportW(Wire):
    node: Name

    def to_core(self) -> p.RequestReport:
        return p.RequestReport(NodeId(self.node))

    @staticmethod
    def from_core(m: p.RequestReport) -> RequestReportW:
        return RequestReportW(node=m.node)


class ProfileW(Wire):
    """A profile's body; its name is the resource's (the URL path, or the config's key)."""

    engine: Name
    nodes: Positive = 1
    gpus_per_node: Positive
    model: Text
    load_time_ms: Count = 0
    args: list[Arg] = []

    @model_validator(mode="after")
    def _engine_known(self) -> ProfileW:
        _check_engine(self.engine)
        return self

    def to_core(self, name: str) -> Profile:
        return Profile(
            ProfileName(name),
            EngineName(self.engine),
            self.nodes,
            self.gpus_per_node,
            self.model,
            self.load_time_ms,
            tuple(self.args),
        )

    @staticmethod
    def from_core(pr: Profile) -> ProfileW:
        return ProfileW(
            engine=pr.engine,
            nodes=pr.nodes,
            gpus_per_node=pr.gpus_per_node,
            model=pr.model,
            load_time_ms=pr.load_time_ms,
            args=list(pr.args),
        )


class DeploymentW(Wire):
    """A deployment's body; its model is the resource's name."""

    profile: Name
    replicas: Count

    def to_core(self, model: str) -> Deployment:
        return Deployment(ModelName(model), ProfileName(self.profile), self.replicas)

    @staticmethod
    def from_core(d: Deployment) -> DeploymentW:
        return DeploymentW(profile=d.profile, replicas=d.replicas)


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


# --- error replies -----------------------------------------------------------------------------


def describe_errors(errors: Sequence[Any]) -> str:
    """One clause per failed field: `body.info.gpus: Input should be a valid integer`."""
    parts = []
    for err in errors:
        loc = tuple(err.get("loc", ()))
        if err.get("type") == "json_invalid" and len(loc) == 2:
            reason = (err.get("ctx") or {}).get("error", "invalid")
            parts.append(f"{loc[0]}: not valid JSON at character {loc[1]} ({reason})")
            continue
        where = ".".join(str(x) for x in loc) or "request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


class Refused(Exception):
    """A request the shell or the core turned down (an unknown profile, a node mismatch): the
    reply is `status` with this message."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def error_reply(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    """Every error a JSON `{"detail": message}`; bad input 422, never a 500."""

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message = "invalid request: " + describe_errors(exc.errors())
        content_type = request.headers.get("content-type", "")
        if request.method in ("POST", "PUT") and "json" not in content_type:
            message += " (send the body as JSON, with content-type: application/json)"
        return error_reply(422, message)

    async def http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return JSONResponse(
            {"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    async def refused(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Refused)
        return error_reply(exc.status, str(exc))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return error_reply(500, f"internal error: {type(exc).__name__}: {exc}")

    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Refused, refused)
    app.add_exception_handler(Exception, unexpected)
