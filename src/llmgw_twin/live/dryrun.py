"""`--dry-run` for the `ctl` commands that change the fleet: `drain`, `cordon`, `deployment set`
and `deployment delete` print what `what-if` predicts the change does to the live fleet, and
change nothing.

Role: each command here is the `ctl` command of `service/ops/ctl_fleet.py` with `--dry-run`,
`--seeds` and `--watch` added; the command table (`commands.py`) points at these, so the ops
layer keeps no knowledge of the twin. Without `--dry-run` the command is exactly the ops one.
A dry run snapshots the live controller (`--controller`, the same credential) and runs
`what-if` with the one action at `+30s`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from llmgw_twin.live import whatif
from llmgw_twin.live.whatif_actions import Action
from llmgw_twin.service.ops import ctl_fleet


def _dry_run_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rehearse first (llmgw-twin what-if; docs/live-twin.md)")
    group.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: print what the twin predicts the change does to this fleet",
    )
    group.add_argument("--seeds", type=int, default=3, help="seeds of the dry run (default 3)")
    group.add_argument(
        "--watch", default="30m", help="how long the dry run follows the change (default 30m)"
    )


def _rehearse(args: argparse.Namespace, actions: list[Action]) -> int:
    plan = argparse.Namespace(
        snapshot=None,
        controller=args.controller,
        token_file=args.token_file,
        ca=args.ca,
        cert=args.cert,
        key=args.key,
        actions=actions,
        at="30s",
        watch=args.watch,
        seeds=args.seeds,
        rate=[],
        out=None,
        html=None,
        json=getattr(args, "output", "text") == "json",
    )
    return whatif.main(plan)


class _DryRun:
    """The ops command `command` (its `add_arguments` and `main`) with `--dry-run`, which
    rehearses the `actions` its arguments name instead of calling the controller."""

    def __init__(self, command: Any, actions: Callable[[argparse.Namespace], list[Action]]) -> None:
        self.command = command
        self.actions = actions

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.command.add_arguments(parser)
        _dry_run_arguments(parser)

    def main(self, args: argparse.Namespace) -> int:
        if args.dry_run:
            return _rehearse(args, self.actions(args))
        result: int = self.command.main(args)
        return result


def _set_actions(args: argparse.Namespace) -> list[Action]:
    actions = []
    if args.profile is not None:
        actions.append(Action("set-profile", args.model, args.profile))
    if args.replicas is not None:
        actions.append(Action("scale", args.model, str(args.replicas)))
    return actions


Drain = _DryRun(ctl_fleet.Drain, lambda args: [Action("drain", args.node)])
Cordon = _DryRun(ctl_fleet.Cordon, lambda args: [Action("cordon", args.node)])
SetDeployment = _DryRun(ctl_fleet.SetDeployment, _set_actions)
DeleteDeployment = _DryRun(
    ctl_fleet.DeleteDeployment, lambda args: [Action("scale", args.model, "0")]
)
