"""How the agent turns a shard spec into processes: the sidecar's argv, the engine's argv, and
which programs it may run.

Role: decisions of the agent's shell that need no process and no socket, kept apart so they
are tested on literals: the `LaunchContext` for a shard (every node on this machine is reached
at its configured address, each agent hands out ports from its own range), the engine's argv
from the engine adapter, and the rules for which argv may run: `checked_launch` applies them
all (the program, then the launch policy of `policy.py`) before any process of the shard starts.

The rule (`resolve_argv`): an argv runs only if its program is
- the sim engine's own program (`llmgw-twin`, the sim adapter's default) for the sim engine with
  no binary configured: it runs as `[sys.executable, "-m", "llmgw_twin.cli", ...]`, the very
  installation the agent runs from, so no console script needs to be on PATH; or
- a binary the agent's config names for that engine (`binary`, or `worker_binary` for engines
  whose workers run a second program).
Anything else is refused (`Refusal`, with the reason); no argv ever goes through a shell.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from llmgw_twin.control.model import ShardSpec
from llmgw_twin.engines.base import Launch, LaunchContext, Readiness, replica_nodes
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.engines.sim import PROGRAM as SIM_PROGRAM
from llmgw_twin.service.agent.config import AgentSettings
from llmgw_twin.service.agent.policy import PolicyError, check_launch

SIM_MODULE_ARGV = (sys.executable, "-m", "llmgw_twin.cli")
SIDECAR_ARGV = (sys.executable, "-m", "llmgw_twin.service.agent.sidecar")

# Exit codes the agent reports for a shard whose engine never ran. Outside 0..255 and above
# zero, so that no program's own exit status (nor a signal, reported negative) is mistaken
# for one of these.
EXIT_REFUSED = 1001
"""The engine's program is not one this agent may run (see `resolve_argv`), or its command line
breaks the agent's launch policy (`policy.check_launch`)."""
EXIT_SPAWN_FAILED = 1002
"""The program could not be started (missing, not executable)."""
EXIT_SIDECAR_FAILED = 1003
"""The shard's sidecar did not come up in time, or died before the engine was ready."""
EXIT_NO_PORT = 1004
"""The agent's port range has no free port left for the shard."""
EXIT_BAD_SPEC = 1005
"""The engine adapter cannot build a command line from the spec."""
EXIT_NOT_READY = 1006
"""The engine ran but was not ready within the agent's `ready_timeout`; the agent stopped it."""


class Refusal(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def launch_context(settings: AgentSettings, spec: ShardSpec, http_port: int) -> LaunchContext:
    binaries = settings.binary_for(spec.engine)
    try:
        nodes = replica_nodes(spec)
    except ValueError as e:
        raise Refusal(str(e), EXIT_BAD_SPEC) from None
    pace = settings.sim_pace_file
    return LaunchContext(
        leader_host=settings.address_of(spec.leader),
        http_port=http_port,
        binary=binaries.binary if binaries is not None else None,
        worker_binary=binaries.worker_binary if binaries is not None else None,
        bind_host=settings.engine_host,
        node_addresses=tuple((n, settings.address_of(n)) for n in dict.fromkeys(nodes)),
        pace_file=str(pace) if pace is not None else None,
        ready_file=ready_file(settings, spec),
    )


def ready_file(settings: AgentSettings, spec: ShardSpec) -> str | None:
    """Where the shard's rank may say it is ready, if it opens no port (`Readiness.FILE`)."""
    ready_dir = settings.ready_dir
    return None if ready_dir is None else str(ready_dir / f"{spec.replica}-{spec.rank}")


def engine_launch(settings: AgentSettings, spec: ShardSpec, http_port: int) -> Launch:
    ctx = launch_context(settings, spec, http_port)
    try:
        return adapter_for(spec.engine).launch(spec, ctx)
    except (KeyError, ValueError) as e:
        raise Refusal(f"cannot build the command line: {e}", EXIT_BAD_SPEC) from None


def resolve_argv(settings: AgentSettings, engine: str, argv: tuple[str, ...]) -> tuple[str, ...]:
    """The argv to execute for `argv` as the adapter built it, or `Refusal`."""
    if not argv:
        raise Refusal("the adapter built an empty command line", EXIT_BAD_SPEC)
    binaries = settings.binary_for(engine)
    if binaries is None:
        if engine == "sim" and argv[0] == SIM_PROGRAM.default_binary:
            return SIM_MODULE_ARGV + argv[1:]
        raise Refusal(
            f"engine {engine!r} is not onboarded on this node (its config names no binary "
            f"for it), so {argv[0]!r} is not run",
            EXIT_REFUSED,
        )
    allowed = [b for b in (binaries.binary, binaries.worker_binary) if b is not None]
    if argv[0] not in allowed:
        raise Refusal(
            f"{argv[0]!r} is not a binary this agent's config names for engine {engine!r} "
            f"(allowed: {allowed})",
            EXIT_REFUSED,
        )
    return argv


def checked_launch(
    settings: AgentSettings, spec: ShardSpec, http_port: int
) -> tuple[Launch, tuple[str, ...]]:
    """The engine's `Launch` and the argv to execute, or `Refusal`: every check the agent makes
    of a shard's command line, done before any process of the shard starts."""
    launch = engine_launch(settings, spec, http_port)
    argv = resolve_argv(settings, spec.engine, launch.argv)
    own = engine_launch(settings, replace(spec, args=()), http_port).argv if spec.args else None
    try:
        check_launch(settings.policy, spec, launch.argv, own or launch.argv)
    except PolicyError as e:
        raise Refusal(f"refused by the launch policy: {e}", EXIT_REFUSED) from None
    return launch, argv


@dataclass(frozen=True, slots=True)
class Probe:
    """How the shard's sidecar reads the engine's readiness."""

    args: tuple[str, ...]
    by_process: bool
    """The rank opens no port: it is judged by its process staying up (`worker_settle`)."""


def probe_for(settings: AgentSettings, launch: Launch) -> Probe:
    host = settings.engine_host
    if launch.readiness is Readiness.FILE and launch.ready_file:
        return Probe(("--probe-file", launch.ready_file), False)
    if launch.readiness is Readiness.HTTP_200 and launch.port and launch.health_path:
        return Probe(("--probe-http", f"http://{host}:{launch.port}{launch.health_path}"), False)
    if launch.readiness is Readiness.TCP_LISTEN and launch.port:
        return Probe(("--probe-tcp", f"{host}:{launch.port}"), False)
    return Probe((), True)


def sidecar_argv(spec: ShardSpec, port: int, probe: Probe) -> tuple[str, ...]:
    shard = f"{spec.replica}/{spec.rank}"
    return (
        *SIDECAR_ARGV,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--shard",
        shard,
        *probe.args,
    )
