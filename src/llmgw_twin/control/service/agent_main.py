"""`llmgw-twin agent --config FILE`: run a node agent on uvicorn.

Role: read the config (exit 2 naming the file and the key on any mistake) and the node's
inventory under the configured root (exit 2 when it cannot say what the node is, e.g. no fabric),
then serve the agent's API until SIGINT or SIGTERM. uvicorn turns either signal into a graceful
shutdown, and the runtime's shutdown stops every shard it started, each as a process group.
"""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from llmgw_twin.control.service.agent_app import AgentRuntime, create_agent_app
from llmgw_twin.control.service.config import ConfigError, load_agent_config

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="the agent's YAML")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request
    try:
        settings = load_agent_config(args.config)
        runtime = AgentRuntime(settings)
    except (ConfigError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    server = uvicorn.Server(
        uvicorn.Config(
            create_agent_app(runtime),
            host=settings.host,
            port=settings.port,
            log_level=args.log_level,
            lifespan="on",
            access_log=False,
        )
    )
    server.run()
    return EXIT_OK if server.started else EXIT_FAILED
