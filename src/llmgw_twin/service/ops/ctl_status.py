"""`llmgw-twin ctl status`: the fleet at a glance, from the controller's `GET /v1/admin/state`.

One bounded call, as every `ctl` command (`ctl.py`: `--controller`, the admin token from
`--token-file` or `$LLMGW_TWIN_TOKEN`, TLS flags; exit 0 answered, 1 refused, 2 unreachable).
It prints, as aligned tables:

- a header line: node, fabric, replica and deployment counts, the mass-loss hold, quarantines;
- one line per fabric: nodes, how many are alive, suspect and lost, GPUs used/total, failed GPUs
  (a 10,000-node fleet is a few lines); `--nodes` adds one line per node: its health, GPUs
  used/total, its fabric link (`unknown (last up)` for a suspect or lost node: the last value
  heard, not a current one), its failed GPUs, and flags (cordoned, draining) when it has any;
- one line per model: the deployment's profile and wanted count, its live, ready and routable
  replicas, and how many are in each state;
- one line per pending replica, with the reason it is not placed when the state gives one.

`-o json` (or `-o yaml`) prints the state as the controller answered it, instead.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from typing import Any

from llmgw_twin.control.model import NodeState, ReplicaState
from llmgw_twin.service.ops.ctl import _common, _request, add_output, print_answer

HEALTHS = tuple(s.value for s in NodeState)
"""alive, suspect, lost: the per-fabric columns."""
STATES = tuple(s.value for s in ReplicaState)
"""Replica states in lifecycle order: the order of the STATES cell."""


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """`headers` and `rows` in columns two spaces apart, each as wide as its widest cell."""
    cells = [list(headers), *([str(c) for c in row] for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    ]


def _used(node: dict[str, Any]) -> int:
    return sum(1 for g in node.get("gpus", ()) if g.get("replica") is not None)


def _total(node: dict[str, Any]) -> int:
    return int(node.get("gpu_count", len(node.get("gpus", ()))))


def header(state: dict[str, Any]) -> str:
    nodes, fabrics = state.get("nodes", []), state.get("fabrics", [])
    replicas, deployments = state.get("replicas", []), state.get("deployments", [])
    parts = [
        f"{len(nodes)} nodes in {len(fabrics)} fabrics",
        f"{len(replicas)} live replicas of {len(deployments)} deployments",
        f"mass-loss hold: {'ON' if state.get('mass_loss_hold') else 'off'}",
    ]
    if quarantines := state.get("quarantines"):
        parts.append(f"{len(quarantines)} quarantines")
    if lead := state.get("leadership"):
        parts.append(f"leader {lead.get('name')} in epoch {lead.get('epoch')}")
        standbys = [s.get("name") for s in lead.get("standbys") or []]
        parts.append(f"standbys: {', '.join(map(str, standbys)) or 'none'}")
    return "; ".join(parts)


def fabric_rows(state: dict[str, Any]) -> list[list[object]]:
    """FABRIC NODES ALIVE SUSPECT LOST GPUS (used/total) FAILED (GPUs)."""
    by_fabric: dict[str, list[dict[str, Any]]] = {f["fabric"]: [] for f in state.get("fabrics", [])}
    for node in state.get("nodes", []):
        by_fabric.setdefault(node["fabric"], []).append(node)
    rows: list[list[object]] = []
    for fabric in sorted(by_fabric):
        nodes = by_fabric[fabric]
        health = Counter(n.get("state") for n in nodes)
        used, total = sum(map(_used, nodes)), sum(map(_total, nodes))
        failed = sum(len(n.get("failed_gpus", ())) for n in nodes)
        rows.append([fabric, len(nodes), *(health[h] for h in HEALTHS), f"{used}/{total}", failed])
    return rows


def link(node: dict[str, Any]) -> str:
    """The node's fabric link: up or down, or, for a node not heard from (suspect, lost), the
    last value heard marked as such: `unknown (last up)`, never a bare `up`."""
    heard = "up" if node.get("fabric_link_up") is not False else "down"
    return f"unknown (last {heard})" if node.get("stale") else heard


def node_rows(state: dict[str, Any]) -> list[list[object]]:
    """NODE FABRIC HEALTH LINK GPUS (used/total) FAILED (the failed GPUs' indexes) FLAGS."""
    rows: list[list[object]] = []
    for node in sorted(state.get("nodes", []), key=lambda n: str(n["node"])):
        failed = ",".join(str(g) for g in node.get("failed_gpus", ())) or "-"
        flags = [f for f in ("cordoned", "draining") if node.get(f)]
        rows.append(
            [
                node["node"],
                node["fabric"],
                node.get("state") or "-",
                link(node),
                f"{_used(node)}/{_total(node)}",
                failed,
                ",".join(flags) or "-",
            ]
        )
    return rows


def model_rows(state: dict[str, Any]) -> list[list[object]]:
    """MODEL PROFILE WANTED LIVE READY ROUTABLE STATES (`state=count ...`, lifecycle order)."""
    deployments = {d["model"]: d for d in state.get("deployments", [])}
    replicas: dict[str, list[dict[str, Any]]] = {m: [] for m in deployments}
    for rep in state.get("replicas", []):
        replicas.setdefault(rep["model"], []).append(rep)
    rows: list[list[object]] = []
    for model in sorted(replicas):
        reps, dep = replicas[model], deployments.get(model)
        counts = Counter(r["state"] for r in reps)
        order = [s for s in STATES if counts[s]] + sorted(set(counts) - set(STATES))
        rows.append(
            [
                model,
                dep["profile"] if dep is not None else "-",
                dep["replicas"] if dep is not None else "-",
                len(reps),
                counts[ReplicaState.READY.value],
                sum(1 for r in reps if r.get("routable")),
                " ".join(f"{s}={counts[s]}" for s in order) or "-",
            ]
        )
    return rows


def pending_rows(state: dict[str, Any]) -> list[list[object]]:
    """PENDING (the replica) MODEL PROFILE REASON (when the state gives one)."""
    pending = [r for r in state.get("replicas", []) if r["state"] == ReplicaState.PENDING.value]
    pending.sort(key=lambda r: (str(r["model"]), str(r["replica"])))
    return [[r["replica"], r["model"], r["profile"], r.get("reason") or "-"] for r in pending]


def render(state: dict[str, Any], *, every_node: bool) -> str:
    lines = [header(state), ""]
    lines += table(
        ["FABRIC", "NODES", *(h.upper() for h in HEALTHS), "GPUS", "FAILED"], fabric_rows(state)
    )
    if every_node:
        lines.append("")
        lines += table(
            ["NODE", "FABRIC", "HEALTH", "LINK", "GPUS", "FAILED", "FLAGS"], node_rows(state)
        )
    lines.append("")
    models = model_rows(state)
    if models:
        lines += table(
            ["MODEL", "PROFILE", "WANTED", "LIVE", "READY", "ROUTABLE", "STATES"], models
        )
    else:
        lines.append("no deployments and no replicas")
    lines.append("")
    pending = pending_rows(state)
    if pending:
        lines += table(["PENDING", "MODEL", "PROFILE", "REASON"], pending)
    else:
        lines.append("no replica is pending")
    return "\n".join(lines)


class Status:
    """Show the fleet: fabrics (or, with --nodes, every node), replicas per model, and the
    pending replicas with why they wait."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--nodes", action="store_true", help="one line per node as well")
        add_output(parser)
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        status, answer = _request(args, "GET", "/v1/admin/state")
        if status != 0:
            return status
        table = render(answer, every_node=args.nodes) if args.output == "table" else ""
        print_answer(args, answer, table)
        return 0
