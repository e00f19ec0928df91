"""`llmgw-twin agent --config FILE`: run a node agent on uvicorn.

Role: read the config (exit 2 naming the file and the key on any mistake) and the node's
inventory under the configured root (exit 2 when it cannot say what the node is, e.g. no fabric),
then serve the agent's API until SIGINT or SIGTERM. uvicorn turns either signal into a graceful
shutdown, and the runtime's shutdown stops every shard it started, each as a process group. An
agent killed with SIGKILL (or crashed) stops nothing: the next one adopts what still runs. A
run-state file that cannot be locked (another agent of the node runs), read or written is exit 2.
"""

from __future__ import annotations

import argparse
import sys

from llmgw_twin.service.agent.app import AgentRuntime, create_agent_app
from llmgw_twin.service.agent.config import load_agent_config
from llmgw_twin.service.agent.runstate import RunStateError
from llmgw_twin.service.common import serving
from llmgw_twin.service.common.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serving.add_arguments(parser, "the agent's YAML")


def main(args: argparse.Namespace) -> int:
    serving.setup_logging(args.log_level)
    try:
        settings = load_agent_config(args.config)
        runtime = AgentRuntime(settings)
    except (ConfigError, RunStateError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return serving.EXIT_INVALID
    runtime.serve_from_ns = args.not_before  # waited for in `start`, everything else ready
    app = create_agent_app(runtime)
    return serving.serve(
        app,
        settings.host,
        settings.port,
        args.log_level,
        settings.tls,
        limits=settings.listen_limits,
    )
