"""`llmgw-twin controller --config FILE`: run the controller service on uvicorn.

Role: read the config (exit 2 with the file and the key on any mistake), wait for
`--not-before`, listen on the port (exit 1 when it is taken), build the runtime and its app, and
serve until SIGINT or SIGTERM; uvicorn turns either into a graceful shutdown, which
stops the reconcile loop, lets in-flight commands finish (bounded) and closes the store.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys

from llmgw_twin.service.common import serving
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.controller.app import ControllerRuntime
from llmgw_twin.service.controller.config import load_controller_config
from llmgw_twin.service.controller.gcpauses import GcPauses
from llmgw_twin.service.controller.routes import create_controller_app
from llmgw_twin.store.sqlite import StoreError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serving.add_arguments(parser, "the controller's YAML")


def main(args: argparse.Namespace) -> int:
    serving.setup_logging(args.log_level)
    try:
        settings = load_controller_config(args.config)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return serving.EXIT_INVALID
    serving.wait_not_before(args)
    # listening before the store opens: an agent that answers the restarted controller's report
    # request during its start-up waits to be accepted, instead of being refused and heard only
    # at its next heartbeat, after the first reconcile judged its silence
    try:
        sock = serving.listen(settings.host, settings.port)
    except OSError as e:
        print(f"error: cannot listen on {settings.host}:{settings.port}: {e}", file=sys.stderr)
        return serving.EXIT_FAILED
    try:
        runtime = ControllerRuntime(settings)
    except (StoreError, OSError, sqlite3.Error, ValueError) as e:  # the store, its secret key
        sock.close()
        print(f"error: {e}", file=sys.stderr)
        return serving.EXIT_INVALID
    # this process holds the fleet: keep full collections short, and time them
    runtime.gc_pauses = GcPauses(pauses=runtime.histograms.gc_pause)
    app = create_controller_app(runtime)
    return serving.serve(
        app,
        settings.host,
        settings.port,
        args.log_level,
        settings.tls,
        sock,
        limits=settings.listen_limits,
    )
