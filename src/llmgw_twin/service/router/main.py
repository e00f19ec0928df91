"""`llmgw-twin router --config FILE`: run the router service on uvicorn.

Role: read the config (exit 2 with the file and the key on any mistake), build the runtime and
its app, and serve until SIGINT or SIGTERM; uvicorn turns either into a graceful shutdown, which
lets streams in flight finish (bounded) and stops following the controller's feed.
"""

from __future__ import annotations

import argparse
import sys

from llmgw_twin.service.common import serving
from llmgw_twin.service.common.config_access import ConfigError
from llmgw_twin.service.router.app import RouterRuntime, create_router_app
from llmgw_twin.service.router.config import load_router_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serving.add_arguments(parser, "the router's YAML")


def main(args: argparse.Namespace) -> int:
    serving.setup_logging(args.log_level)
    try:
        settings = load_router_config(args.config)
        runtime = RouterRuntime(settings)
    except (ConfigError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return serving.EXIT_INVALID
    app = create_router_app(runtime)
    return serving.serve(
        app,
        settings.host,
        settings.port,
        args.log_level,
        settings.tls,
        limits=settings.listen_limits,
        lane=app.fast,
    )
