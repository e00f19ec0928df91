"""`llmgw-twin ctl clear-gpu` and `ctl clear-quarantine`: an operator's word to the controller.

Each command is one bounded HTTP call to the controller's admin API (`--controller`, default
`http://127.0.0.1:8080`): it prints the controller's answer and exits 0 when the controller
accepted, 1 when it refused (the GPU is not failed, the node not quarantined), 2 when the
controller could not be reached.
"""

from __future__ import annotations

import argparse
import json
import sys

import httpx

DEFAULT_CONTROLLER = "http://127.0.0.1:8080"
TIMEOUT_S = 10.0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--controller",
        default=DEFAULT_CONTROLLER,
        help=f"the controller's base URL (default {DEFAULT_CONTROLLER})",
    )


def _call(method: str, url: str, params: dict[str, str] | None = None) -> int:
    try:
        with httpx.Client(timeout=TIMEOUT_S, trust_env=False) as client:
            reply = client.request(method, url, params=params)
    except httpx.HTTPError as e:
        print(f"error: cannot reach the controller at {url}: {e}", file=sys.stderr)
        return 2
    try:
        body = reply.json()
    except ValueError:
        body = {"detail": reply.text}
    if reply.is_success:
        print(json.dumps(body, sort_keys=True))
        return 0
    print(f"refused ({reply.status_code}): {body.get('detail', body)}", file=sys.stderr)
    return 1


class ClearGpu:
    """Clear a GPU the controller holds failed (after it was repaired or replaced)."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node")
        parser.add_argument("gpu", type=int)
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        base = str(args.controller).rstrip("/")
        return _call("DELETE", f"{base}/v1/admin/nodes/{args.node}/failed-gpus/{args.gpu}")


class ClearQuarantine:
    """Lift a node's quarantine, for one profile (`--profile`) or for all of them."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node")
        parser.add_argument("--profile", help="only this profile's quarantine")
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        base = str(args.controller).rstrip("/")
        params = {"profile": args.profile} if args.profile else None
        return _call("DELETE", f"{base}/v1/admin/nodes/{args.node}/quarantine", params)
