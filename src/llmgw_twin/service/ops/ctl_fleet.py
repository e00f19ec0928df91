"""`llmgw-twin ctl cordon|uncordon|drain|explain|deployment set|delete|gpu clear`: the fleet's
upkeep over the admin API (`service/controller/operator_api.py`).

Each is one bounded call, as every `ctl` command (`ctl.py`: `--controller`, the admin token from
`--token-file` or `$LLMGW_TWIN_TOKEN`, TLS flags; exit 0 answered, 1 refused, 2 unreachable),
except `drain --wait`, which then reads the drain's progress once a second until the node is
empty (exit 0) or the wait is over (exit 1), printing each change.

- `cordon NODE` / `uncordon NODE`: out of placement, or back in (which also ends a drain);
- `drain NODE [--wait D]`: cordon it and move each replica off it, make-before-break;
- `explain REPLICA`: where it is, or why it is pending and which fabrics could take it;
- `deployment set MODEL [--replicas N] [--profile P]`: scale it, or move it to a profile;
- `deployment delete MODEL`: retire every replica of it and forget it;
- `gpu clear NODE GPU`: the GPU was repaired or replaced (`clear-gpu`, its old name, still runs).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from llmgw_twin.service.ops.ctl import (
    _call,
    _changed,
    _common,
    _request,
    add_output,
    add_write_output,
    print_answer,
    refused,
)
from llmgw_twin.units import parse_duration

POLL_S = 1.0
"""How often `drain --wait` reads the drain's progress."""


class _OneCall:
    """A command that names one thing and makes one call about it."""

    arg = "node"
    method = "POST"
    path = ""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(cls.arg)
        add_write_output(parser)
        _common(parser)

    @classmethod
    def main(cls, args: argparse.Namespace) -> int:
        return _call(args, cls.method, cls.path.format(getattr(args, cls.arg)), cls.say)

    @staticmethod
    def say(answer: dict[str, Any]) -> str:
        raise NotImplementedError


class Cordon(_OneCall):
    """Take a node out of placement: what it runs keeps running."""

    path = "/v1/admin/nodes/{}/cordon"

    @staticmethod
    def say(answer: dict[str, Any]) -> str:
        return (
            f"node {answer['node']}: cordoned, out of placement (what it runs keeps running)"
            + _changed(answer)
        )


class Uncordon(_OneCall):
    """Put a cordoned node back into placement (a drain under way ends)."""

    method = "DELETE"
    path = "/v1/admin/nodes/{}/cordon"

    @staticmethod
    def say(answer: dict[str, Any]) -> str:
        return (
            f"node {answer['node']}: uncordoned, back in placement (a drain under way ends)"
            + _changed(answer)
        )


class DeleteDeployment(_OneCall):
    """Delete a deployment: every replica of it is retired, and nothing replaces them."""

    arg = "model"
    method = "DELETE"
    path = "/v1/admin/deployments/{}"

    @staticmethod
    def say(answer: dict[str, Any]) -> str:
        retired = answer.get("replicas_retired") or []
        return f"deployment {answer['model']} deleted: {len(retired)} replica(s) retired" + (
            f" ({', '.join(retired)})" if retired else ""
        )


class SetDeployment:
    """Change a deployment's replica count or profile (what is not given stays as it is); a
    model not yet deployed needs both."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("model")
        parser.add_argument("--replicas", type=int, help="the replica count it should have")
        parser.add_argument("--profile", help="the profile its replicas should run")
        add_write_output(parser)
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        if args.replicas is None and args.profile is None:
            print("error: give --replicas N, --profile NAME, or both", file=sys.stderr)
            return 2
        if args.replicas is not None and args.replicas < 0:
            print("error: --replicas is 0 or more", file=sys.stderr)
            return 2
        status, state = _request(args, "GET", "/v1/admin/state")
        if status != 0:
            return status
        now = {d["model"]: d for d in state.get("deployments", [])}.get(args.model)
        if now is None and (args.replicas is None or args.profile is None):
            print(
                f"error: no deployment '{args.model}': a new one needs --replicas and --profile",
                file=sys.stderr,
            )
            return 1
        was = now or {}
        roles = was.get("roles") or []
        if roles and args.profile is not None:
            print(
                f"error: '{args.model}' is deployed in roles (docs/topology.md), whose profiles "
                "cannot change in place: --replicas scales its groups",
                file=sys.stderr,
            )
            return 2
        body = {
            "profile": args.profile if args.profile is not None else was["profile"],
            "replicas": args.replicas if args.replicas is not None else was["replicas"],
        } | ({"roles": roles} if roles else {})
        status, answer = _request(args, "PUT", f"/v1/admin/deployments/{args.model}", body=body)
        if status == 0:
            line = f"deployment {args.model}: {body['replicas']} replica(s) of {body['profile']}"
            if roles:
                each = ", ".join(f"{r['count']} {r['name']} of {r['profile']}" for r in roles)
                line = f"deployment {args.model}: {body['replicas']} role group(s) of {each}"
            if answer.get("warnings"):
                line += "; " + "; ".join(str(w) for w in answer["warnings"])
            print_answer(args, answer, line if args.output not in ("json", "yaml") else "")
        return status


def _progress(answer: dict[str, Any]) -> str:
    left = answer.get("replicas", [])
    if answer.get("drained") or not left:
        return f"node {answer.get('node')}: drained, nothing left on it (still cordoned)"
    parts = []
    for r in left:
        copy = r.get("copy")
        if copy is None:
            parts.append(f"{r['replica']} ({r['state']}, no copy yet)")
        else:
            why = f": {r['copy_reason']}" if r.get("copy_reason") else ""
            parts.append(f"{r['replica']} ({r['state']}) -> {copy} ({r['copy_state']}{why})")
    return f"node {answer.get('node')}: {len(left)} replica(s) left: " + "; ".join(parts)


def _show(args: argparse.Namespace, answer: dict[str, Any], line: str) -> None:
    """A drain's progress: `line` for people, the answer itself with -o json|yaml."""
    print_answer(args, answer, line)
    sys.stdout.flush()


class Drain:
    """Empty a node for maintenance: it is cordoned, and each replica on it gets a copy
    elsewhere; the original stops once its copy is ready."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("node")
        parser.add_argument(
            "--wait",
            metavar="D",
            help="wait up to D (e.g. 10m) for the node to be empty, printing the progress",
        )
        add_write_output(parser)
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        try:
            wait_ms = parse_duration(args.wait) if args.wait is not None else None
        except ValueError as e:
            print(f"error: --wait: {e}", flush=True)
            return 2
        status, answer = _request(args, "POST", f"/v1/admin/nodes/{args.node}/drain")
        if status != 0:
            return status
        line = _progress(answer)
        _show(args, answer, line)
        if wait_ms is None:
            return 0
        deadline = time.monotonic() + wait_ms / 1000
        while not (answer.get("drained") or not answer.get("replicas")):
            if time.monotonic() >= deadline:
                # on stderr beside -o json|yaml, whose stdout is the answers only
                quiet = args.output in ("json", "yaml")
                print(timed_out(args.node, args.wait), file=sys.stderr if quiet else sys.stdout)
                return 1
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            status, answer = _request(args, "GET", f"/v1/admin/nodes/{args.node}/drain")
            if status != 0:
                return status
            if (now := _progress(answer)) != line:
                line = now
                _show(args, answer, line)
        return 0


def timed_out(node: str, wait: str) -> str:
    """What a `drain --wait` that ran out says: the drain is not stopped by it."""
    return (
        f"node {node}: not drained after {wait}; the drain goes on in the controller "
        f"(`llmgw-twin ctl drain {node} --wait D` waits again; `llmgw-twin ctl uncordon {node}` "
        "cancels it and puts the node back into placement)"
    )


class Explain:
    """Why a replica is where it is, why it is pending and where it could go, or why it
    failed or was reaped; given a model, the same for each of its replicas."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("replica", metavar="REPLICA|MODEL", help="a replica id or a model")
        add_output(parser)
        _common(parser)

    @staticmethod
    def main(args: argparse.Namespace) -> int:
        name = args.replica
        path = f"/v1/admin/replicas/{name}/explain"
        status, answer = _request(args, "GET", path, quiet=True)
        render = render_explain
        if status == 1 and answer.get("_status") == 404:
            model = f"/v1/admin/models/{name}/explain"
            status, by_model = _request(args, "GET", model, quiet=True)
            if status == 0:
                answer, render = by_model, render_model
            elif by_model.get("_status") == 404:
                print(f"error: no replica and no model {name} in the controller", file=sys.stderr)
                print(
                    "hint: ctl explain takes a replica id (such as tiny-r3) or a model name; "
                    "`llmgw-twin ctl status` lists the models, `-o json` every replica id",
                    file=sys.stderr,
                )
                return 1
        if status == 1:
            code = int(answer.pop("_status", 0))
            refused(args, code, answer)
        if status != 0:
            return status
        print_answer(args, answer, render(answer) if args.output == "table" else "")
        return 0


def render_model(a: dict[str, Any]) -> str:
    """A model's explanation: its deployment, each live replica, its recent ends."""
    dep = a.get("deployment")
    wanted = f"deployed as {dep['replicas']} x profile {dep['profile']}" if dep else "not deployed"
    reps = a.get("replicas", [])
    lines = [f"model {a['model']}: {wanted}; {len(reps)} live replica(s)"]
    for r in reps:
        lines += ["", render_explain(r)]
    ends = a.get("recent_ends", [])
    if ends:
        lines += ["", "recent failures and reaps (newest first):"]
        for e in ends:
            where = f" on {e['node']}" if e.get("node") else ""
            verb = "failed" if e["event"] == "replica.failed" else "reaped"
            lines.append(f"  {e['replica']} {verb}{where}: {e.get('reason') or '-'}")
    return "\n".join(lines)


def render_explain(a: dict[str, Any]) -> str:
    if a.get("forgotten"):
        return (
            f"replica {a['replica']} of {a.get('model', '?')}: {a['state']} (forgotten but for "
            f"the event log)\n  why: {a.get('why')}"
        )
    need = a.get("needs", {})
    lines = [
        f"replica {a['replica']} of {a['model']} (profile {a['profile']}): {a['state']}",
        f"  needs: {need.get('nodes')} node(s) x {need.get('gpus_per_node')} GPU(s), engine "
        f"{need.get('engine')}, all in one fabric"
        + (f", nvlink {need['nvlink']}, leaves {need['leaves']}" if "nvlink" in need else ""),
        f"  why: {a.get('why')}",
    ]
    if a.get("group"):
        g = a["group"]
        partners = ", ".join(f"{r} {m['role']} {m['state']}" for r, m in g["members"].items())
        lines.append(f"  {g['role']} of role group {g['group']}: {partners}")
    if a.get("moving_to"):
        lines.append(f"  moving to: {a['moving_to']} (a drain's or a rollout's copy)")
    if a.get("copy_of"):
        lines.append(f"  copy of: {a['copy_of']}")
    for s in a.get("shards", []):
        lines.append(f"  rank {s['rank']}: {s['node']} GPUs {s['gpus']} {s['state'] or '-'}")
    for h in a.get("stability", []):
        lines.append(f"  {h['node']}: {h['verdict']} ({h['history']})")
    if a.get("blast_radius"):
        lines.append(f"  blast radius: {a['blast_radius']['summary']}")
    if a.get("never_fits"):
        lines.append(f"  never fits the fleet as registered: {a['never_fits']}")
    for f in a.get("fabrics", []):
        verdict = "fits now" if f["fits"] else f"{f['candidates']} of {f['needs']} node(s) needed"
        nodes = ", ".join(f["candidate_nodes"])
        blocked = ", ".join(f"{n} {why}" for why, n in f["blocked"].items())
        lines.append(
            f"  {f['fabric']}: {verdict}"
            + (f" ({nodes})" if nodes else "")
            + (f"; other nodes: {blocked}" if blocked else "")
        )
        for node, history in f.get("unstable", {}).items():
            lines.append(f"    {node} taken last on a tie: {history}")
    return "\n".join(lines)
