"""The actions `what-if` rehearses, from its command line to scenario faults.

Role: each `--drain NODE`, `--fabric-down FABRIC=10m`, `--scale MODEL=N`... option is one
`Action`, kept in the order given. `check` refuses an action that names a node, fabric, model,
profile or GPU the fleet does not have, in one line, before anything runs; `faults` writes the
actions as the scenario file's `faults` entries (docs/scenarios.md), all at the same instant.

Invariants:
- An action is checked against the fleet it will run on, never against another.
- The faults are plain scenario data: the file `what-if -o` writes runs again with `run`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.units import fmt_duration, parse_duration


class ActionError(ValueError):
    """An action that cannot be rehearsed on this fleet: one line, why."""


@dataclass(frozen=True, slots=True)
class Action:
    kind: str
    """The option's name without dashes: drain, cordon, lose-node, node-down, lose-fabric,
    fabric-down, scale, set-profile, fail-gpu."""
    target: str
    """The node, fabric or model it names."""
    value: str = ""
    """A duration (node-down, fabric-down), a count (scale), a profile, or a GPU index."""

    def __str__(self) -> str:
        sep = {"fail-gpu": ":", "node-down": " for ", "fabric-down": " for "}.get(self.kind, "=")
        return f"{self.kind} {self.target}" + (f"{sep}{self.value}" if self.value else "")


ACTIONS: dict[str, tuple[str, str]] = {
    "drain": ("NODE", "drain a node: its replicas move, make-before-break, and it stays cordoned"),
    "cordon": ("NODE", "cordon a node: nothing new is placed on it"),
    "lose-node": ("NODE", "a node powers off and stays down"),
    "node-down": ("NODE=DURATION", "a node powers off and boots again, empty, after DURATION"),
    "lose-fabric": ("FABRIC", "a fabric's links fail for the rest of the run"),
    "fabric-down": ("FABRIC=DURATION", "a fabric's links fail for DURATION"),
    "scale": ("MODEL=N", "a deployment's replica count becomes N"),
    "set-profile": ("MODEL=PROFILE", "a deployment moves to another profile of the fleet"),
    "fail-gpu": ("NODE:GPU", "one GPU of a node fails"),
}
_SPLIT = {"node-down": "=", "fabric-down": "=", "scale": "=", "set-profile": "=", "fail-gpu": ":"}


class _Append(argparse.Action):
    """Appends `Action(kind, target, value)` to `namespace.actions`, in command-line order."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        kind = str(option_string).lstrip("-")
        text = str(values)
        sep = _SPLIT.get(kind)
        if sep is None:
            target, value = text, ""
        else:
            target, found, value = text.partition(sep)
            if not found or not target or not value:
                parser.error(f"{option_string} takes {ACTIONS[kind][0]}, not {text!r}")
        actions = list(getattr(namespace, "actions", None) or [])
        actions.append(Action(kind, target, value))
        namespace.actions = actions


def add_action_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "actions (one or more, in the order given, all at --at)",
    )
    for kind, (metavar, help_text) in ACTIONS.items():
        group.add_argument(f"--{kind}", metavar=metavar, action=_Append, help=help_text)
    parser.set_defaults(actions=[])


def check(actions: list[Action], scenario: Scenario) -> None:
    """`ActionError` for the first action that names what the fleet does not have."""
    nodes = {str(n.node): n for n in scenario.nodes}
    fabrics = {str(f) for f, _ in scenario.fabrics}
    models = {str(d.model) for d in scenario.deployments}
    profiles = {str(p.name) for p in scenario.profiles}

    def one_of(what: str, name: str, known: set[str] | dict[str, Any]) -> None:
        if name not in known:
            listed = ", ".join(sorted(known)) or "none"
            raise ActionError(f"{what} '{name}': the fleet has no such {what} (it has: {listed})")

    for a in actions:
        if a.kind in ("drain", "cordon", "lose-node", "node-down", "fail-gpu"):
            one_of("node", a.target, nodes)
        elif a.kind in ("lose-fabric", "fabric-down"):
            one_of("fabric", a.target, fabrics)
        else:
            one_of("model", a.target, models)
        if a.kind in ("node-down", "fabric-down"):
            try:
                if parse_duration(a.value) <= 0:
                    raise ValueError("it must be more than 0")
            except ValueError as e:
                raise ActionError(f"--{a.kind} {a.target}={a.value}: {e}") from None
        elif a.kind == "scale" and (not a.value.isdigit() or int(a.value) > 100_000):
            raise ActionError(f"--scale {a.target}={a.value}: N is a count of replicas, 0 or more")
        elif a.kind == "set-profile":
            one_of("profile", a.value, profiles)
        elif a.kind == "fail-gpu":
            gpus = nodes[a.target].gpus
            if not a.value.isdigit() or int(a.value) >= gpus:
                raise ActionError(
                    f"--fail-gpu {a.target}:{a.value}: the node has GPUs 0 to {gpus - 1}"
                )


def faults(actions: list[Action], at_ms: int, end_ms: int) -> list[dict[str, Any]]:
    """The actions as scenario `faults` entries, all at `at_ms`, in the order given."""
    at = fmt_duration(at_ms)
    out: list[dict[str, Any]] = []
    for i, a in enumerate(actions, 1):
        fid = f"whatif{i}"
        match a.kind:
            case "drain" | "cordon":
                out.append({"id": fid, "at": at, a.kind: a.target})
            case "lose-node":
                out.append({"id": fid, "at": at, "kill_node": a.target})
            case "node-down":
                out.append({"id": fid, "at": at, "kill_node": a.target})
                back = at_ms + parse_duration(a.value)
                if back < end_ms:
                    out.append({"at": f"{fid}+{a.value}", "restart_node": a.target})
            case "lose-fabric" | "fabric-down":
                lasts = end_ms - at_ms if a.kind == "lose-fabric" else parse_duration(a.value)
                down = {"fabric": a.target, "for": fmt_duration(max(1, lasts))}
                out.append({"id": fid, "at": at, "fabric_down": down})
            case "scale":
                scale = {"model": a.target, "replicas": int(a.value)}
                out.append({"id": fid, "at": at, "set_replicas": scale})
            case "set-profile":
                change = {"model": a.target, "profile": a.value}
                out.append({"id": fid, "at": at, "set_profile": change})
            case "fail-gpu":
                gpu = {"node": a.target, "gpu": int(a.value)}
                out.append({"id": fid, "at": at, "fail_gpu": gpu})
            case _:
                raise ActionError(f"unknown action --{a.kind}")
    return out
