"""`llmgw-twin controller --config FILE`: run the controller service on uvicorn.

Role: read the config (exit 2 with the file and the key on any mistake), build the runtime and
its app, and serve until SIGINT or SIGTERM; uvicorn turns either into a graceful shutdown, which
stops the reconcile loop, lets in-flight commands finish (bounded) and closes the store.
"""

from __future__ import annotations

import argparse
import logging
import sqlite3
import sys

import uvicorn

from llmgw_twin.control.service.config import ConfigError, load_controller_config
from llmgw_twin.control.service.controller_app import ControllerRuntime, create_controller_app
from llmgw_twin.control.store import StoreError

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE", help="the controller's YAML")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request
    try:
        settings = load_controller_config(args.config)
        runtime = ControllerRuntime(settings)
    except (ConfigError, StoreError, OSError, sqlite3.Error) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    app = create_controller_app(runtime)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=args.log_level,
            lifespan="on",
            access_log=False,
        )
    )
    server.run()
    return EXIT_OK if server.started else EXIT_FAILED
