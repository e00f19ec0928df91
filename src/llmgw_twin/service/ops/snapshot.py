"""`llmgw-twin snapshot --controller URL -o fleet.yaml`: the live fleet as a scenario file.

One bounded call to the controller's admin API (`GET /v1/admin/state`, the admin token as `ctl`
takes it: `--token-file`, else `$LLMGW_TWIN_TOKEN`) and the file it makes (docs/live-twin.md):
the cluster (fabrics, each node's GPUs, memory and engines), the timings, the profiles and
deployments, and an `initial` section (docs/scenarios.md) with each node's failed GPUs, cordon,
drain and health, the quarantines, and every live replica with its id, profile, state and each
shard's node, rank and GPUs. The twin started from the file is in exactly that state.

Nothing secret goes into the file: no token, no credential, no agent URL, and a profile's engine
flag that carries a key, token, secret or password has its value written as `REDACTED`.

A controller that cannot be reached, or that refuses the credential, is one line on stderr and
exit 2; the file is written to a temporary name beside it and renamed, so a failure leaves no
half-written file (and any earlier file as it was).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml

from llmgw_twin.control.model import Timings
from llmgw_twin.service.common.tls import ClientTls
from llmgw_twin.service.ops.ctl import TIMEOUT_S, CtlError, _common, _headers, _to_leader
from llmgw_twin.units import fmt_duration, setting_keys

REDACTED = "REDACTED"
ROUTER_KEY_ENV = "LLMGW_TWIN_API_KEY"
SNAPSHOT_TOKENS = 32
"""The tokens a snapshot's traffic asks per request: the services count requests, not tokens."""
_SECRET_FLAG = re.compile(
    r"--?[A-Za-z0-9_-]*(key|token|secret|password|passwd)[A-Za-z0-9_-]*", re.I
)
DEFAULT_DURATION_MS = 600_000
_LIVE_STATES = {
    "ready": "ready",
    "degraded": "ready",
    "adopting": "starting",
    "placed": "starting",
    "starting": "starting",
    "pending": "pending",
}


class SnapshotError(Exception):
    """One line saying why no snapshot was written."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("-o", "--out", type=Path, required=True, help="the scenario file to write")
    parser.add_argument("--name", default="snapshot", help="the scenario's name (default snapshot)")
    parser.add_argument(
        "--duration", default="10m", help="how long the twin runs from the snapshot (default 10m)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the scenario's seed (default 0)")
    parser.add_argument(
        "--router",
        default="",
        help="routers whose recent request rates (five minutes) join the controller's own in "
        "the file's traffic, comma-separated URLs",
    )
    parser.add_argument(
        "--router-key-file",
        type=Path,
        help=f"a file holding an API key the routers take (else ${ROUTER_KEY_ENV}, if set)",
    )


def main(args: argparse.Namespace) -> int:
    try:
        from llmgw_twin.units import parse_duration

        duration_ms = parse_duration(str(args.duration))
        state = fetch_state(args)
        state["request_rates"] = rates_of(state, router_rates(args))
        text = scenario_text(state, args.name, duration_ms, args.seed, str(args.controller))
        write_atomically(args.out, text)
    except (SnapshotError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, AttributeError) as e:
        print(f"error: the controller's state is not as expected ({e!r})", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {_summary(state)}")
    return 0


def fetch_state(args: argparse.Namespace) -> dict[str, Any]:
    """The admin state of the leading controller, or `SnapshotError` in one line."""
    bases = [u.strip().rstrip("/") for u in str(args.controller).split(",") if u.strip()]
    if not bases:
        raise SnapshotError("--controller names no controller")
    try:
        verify = ClientTls(args.ca, args.cert, args.key or args.cert).context()
        headers = _headers(args)
        with httpx.Client(timeout=TIMEOUT_S, trust_env=False, verify=verify) as client:
            reply = _to_leader(client, bases, "GET", "/v1/admin/state", None, None, headers)
    except (CtlError, OSError) as e:
        raise SnapshotError(str(e)) from None
    except httpx.HTTPError as e:
        raise SnapshotError(f"cannot reach the controller at {args.controller}: {e}") from None
    if reply.status_code in (401, 403):
        raise SnapshotError(
            f"the controller at {args.controller} refused the credential ({reply.status_code}): "
            "snapshot needs an admin token, in $LLMGW_TWIN_TOKEN or --token-file"
        )
    try:
        answer = reply.json()
    except ValueError:
        answer = None
    if not reply.is_success or not isinstance(answer, dict):
        detail = answer.get("detail") if isinstance(answer, dict) else reply.text[:200]
        raise SnapshotError(
            f"the controller at {args.controller} answered {reply.status_code}: {detail}"
        )
    for key in ("nodes", "replicas", "deployments", "profiles", "timings"):
        if key not in answer:
            raise SnapshotError(
                f"the controller at {args.controller} sent no '{key}' in its state (a version "
                "before snapshots)"
            )
    return answer


def router_rates(args: argparse.Namespace) -> list[dict[str, float]]:
    """Each router's recent request rates by model (`GET /v1/router/state`)."""
    urls = [u.strip().rstrip("/") for u in str(getattr(args, "router", "") or "").split(",")]
    urls = [u for u in urls if u]
    if not urls:
        return []
    key = os.environ.get(ROUTER_KEY_ENV, "")
    if getattr(args, "router_key_file", None) is not None:
        try:
            key = args.router_key_file.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise SnapshotError(f"cannot read {args.router_key_file}: {e.strerror or e}") from None
    headers = {"authorization": f"Bearer {key}"} if key else {}
    out = []
    verify = ClientTls(args.ca, args.cert, args.key or args.cert).context()
    with httpx.Client(timeout=TIMEOUT_S, trust_env=False, verify=verify) as client:
        for url in urls:
            try:
                reply = client.get(f"{url}/v1/router/state", headers=headers)
            except httpx.HTTPError as e:
                raise SnapshotError(f"cannot reach the router at {url}: {e}") from None
            if reply.status_code in (401, 403):
                raise SnapshotError(
                    f"the router at {url} refused the key ({reply.status_code}): give one it "
                    f"takes in --router-key-file or ${ROUTER_KEY_ENV}"
                )
            try:
                rates = reply.json().get("request_rates") if reply.is_success else None
            except ValueError:
                rates = None
            if not isinstance(rates, dict):
                raise SnapshotError(
                    f"the router at {url} answered {reply.status_code} with no request rates"
                )
            out.append({str(m): float(r) for m, r in rates.items()})
    return out


def rates_of(state: dict[str, Any], routers: list[dict[str, float]]) -> dict[str, float]:
    """Requests per second by deployed model: the controller's own and every router's."""
    deployed = {str(d["model"]) for d in state["deployments"]}
    total: dict[str, float] = {}
    for rates in [state.get("request_rates") or {}, *routers]:
        for model, rate in rates.items():
            if model in deployed and float(rate) > 0:
                total[model] = total.get(model, 0.0) + float(rate)
    return total


def rate_text(per_s: float) -> str:
    """A rate as the scenario file writes it (`R/s`, `R/min` or `R/h`, six decimals at most)."""
    for unit, scale in (("s", 1), ("min", 60), ("h", 3600)):
        value = per_s * scale
        if value >= 1 or unit == "h":
            text = f"{value:.6f}".rstrip("0").rstrip(".")
            return f"{text}/{unit}"
    raise AssertionError("unreachable")


def redact(args: list[str]) -> list[str]:
    """Engine flags with the value of any flag that names a key, token, secret or password
    replaced (`--api-key X`, `--api-key=X`)."""
    out: list[str] = []
    secret_next = False
    for arg in args:
        if secret_next and not arg.startswith("-"):
            out.append(REDACTED)
            secret_next = False
            continue
        secret_next = False
        flag, eq, _ = arg.partition("=")
        if _SECRET_FLAG.fullmatch(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                secret_next = True
        else:
            out.append(arg)
    return out


def _timings(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in setting_keys(Timings):
        if k.key not in values or values[k.key] == k.default:
            continue
        v = values[k.key]
        out[k.key] = (
            fmt_duration(int(v))
            if k.kind == "duration"
            else (repr(float(v)) if k.kind == "share" else int(v))
        )
    return out


def _profile(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "engine": body["engine"],
        "nodes": body.get("nodes", 1),
        "gpus_per_node": body["gpus_per_node"],
        "model": body["model"],
    }
    if body.get("load_time_ms"):
        out["load_time"] = fmt_duration(int(body["load_time_ms"]))
    if body.get("start_timeout_ms"):
        out["start_timeout"] = fmt_duration(int(body["start_timeout_ms"]))
    if body.get("args"):
        out["args"] = redact([str(a) for a in body["args"]])
    rules = body.get("topology") or {}
    for level in ("nvlink", "leaves"):
        if rules.get(level, "any") != "any":
            out[level] = rules[level]
    return out


def _topology(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The fleet's `cluster.topology` (docs/scenarios.md) from each node's registered place:
    leaves and the nodes under them, spines and their leaves, NVLink domains and their nodes."""
    leaves: dict[str, list[str]] = {}
    spines: dict[str, list[str]] = {}
    domains: dict[str, list[str]] = {}
    for n in nodes:
        where = n.get("topology") or {}
        if where.get("leaf"):
            leaves.setdefault(where["leaf"], []).append(n["node"])
            if where.get("spine") and where["leaf"] not in spines.get(where["spine"], []):
                spines.setdefault(where["spine"], []).append(where["leaf"])
        if where.get("nvlink_domain"):
            domains.setdefault(where["nvlink_domain"], []).append(n["node"])
    out: dict[str, Any] = {}
    for key, levels in (("leaves", leaves), ("spines", spines), ("nvlink_domains", domains)):
        if levels:
            out[key] = {k: sorted(v) for k, v in sorted(levels.items())}
    return out


def _initial_node(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if node.get("state") in ("suspect", "lost"):
        out["state"] = node["state"]
    if node.get("failed_gpus"):
        out["failed_gpus"] = sorted(int(g) for g in node["failed_gpus"])
    if node.get("draining"):
        out["draining"] = True
    elif node.get("cordoned"):
        out["cordoned"] = True
    return out


def _replica(r: dict[str, Any]) -> dict[str, Any]:
    state = _LIVE_STATES.get(str(r.get("state")), "starting")
    shards = sorted(r.get("shards") or [], key=lambda s: int(s["rank"]))
    out: dict[str, Any] = {
        "id": r["replica"],
        "model": r["model"],
        "profile": r["profile"],
        "state": state if shards or state == "pending" else "pending",
    }
    if r.get("group"):  # a role group's member (docs/topology.md)
        out["group"], out["role"] = r["group"], r["role"]
    if shards and state != "pending":
        out["fabric"] = r["fabric"]
        out["shards"] = [
            {"rank": int(s["rank"]), "node": s["node"], "gpus": [int(g) for g in s["gpus"]]}
            for s in shards
        ]
    return out


def scenario(state: dict[str, Any], name: str, duration_ms: int, seed: int) -> dict[str, Any]:
    """The scenario (as plain data, in the file's key order) of the admin `state`."""
    nodes = sorted(state["nodes"], key=lambda n: n["node"])
    fabrics: dict[str, list[str]] = {}
    settings: dict[str, Any] = {}
    for n in nodes:
        fabrics.setdefault(n["fabric"], []).append(n["node"])
        settings[n["node"]] = {
            "gpus": int(n["gpu_count"]),
            "gpu_memory": f"{int(n['gpu_memory_mib'])}MiB",
            "engines": list(n["engines"]),
        }
    initial_nodes = {n["node"]: got for n in nodes if (got := _initial_node(n))}
    quarantines = [
        {
            "node": q["node"],
            "profile": q["profile"],
            "for": fmt_duration(max(1, int(q["until_ms"]) - int(state["t_ms"]))),
            "reason": str(q.get("reason") or ""),
        }
        for q in sorted(state.get("quarantines", []), key=lambda q: (q["node"], q["profile"]))
        if int(q["until_ms"]) > int(state["t_ms"])
    ]
    replicas = sorted(state["replicas"], key=lambda r: r["replica"])
    initial: dict[str, Any] = {}
    if initial_nodes:
        initial["nodes"] = initial_nodes
    if quarantines:
        initial["quarantines"] = quarantines
    initial["replicas"] = [_replica(r) for r in replicas]
    out: dict[str, Any] = {
        "name": name,
        "description": "the live fleet as its controller saw it, written by llmgw-twin snapshot",
        "seed": seed,
        "duration": fmt_duration(duration_ms),
    }
    if timings := _timings(state["timings"]):
        out["timings"] = timings
    out["cluster"] = {"fabrics": {f: fabrics[f] for f in sorted(fabrics)}, "nodes": settings}
    if topology := _topology(nodes):
        out["cluster"]["topology"] = topology
    if state["profiles"]:
        out["profiles"] = {p: _profile(b) for p, b in sorted(state["profiles"].items())}
    out["deployments"] = [
        _deployment(d) for d in sorted(state["deployments"], key=lambda d: d["model"])
    ]
    rates = state.get("request_rates") or {}
    traffic = [
        {"model": m, "rate": rate_text(float(r)), "tokens": SNAPSHOT_TOKENS}
        for m, r in sorted(rates.items())
        if float(r) * 3600 >= 0.000001
    ]
    if traffic:
        out["traffic"] = traffic
    out["initial"] = initial
    return out


def scenario_text(
    state: dict[str, Any], name: str, duration_ms: int, seed: int, source: str
) -> str:
    data = scenario(state, name, duration_ms, seed)
    head = f"# llmgw-twin snapshot of {source} (docs/live-twin.md)\n"
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def write_atomically(path: Path, text: str) -> None:
    """`text` to `path` through a temporary file beside it, renamed over it when complete."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise SnapshotError(f"cannot write {path}: {e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise SnapshotError(f"cannot write {path}: {e}") from None


def _summary(state: dict[str, Any]) -> str:
    return (
        f"{len(state['nodes'])} node(s), {len(state['deployments'])} deployment(s), "
        f"{len(state['replicas'])} replica(s)"
    )


def _deployment(d: dict[str, Any]) -> dict[str, Any]:
    """A deployment as a scenario file writes it: a profile, or roles (`roles:` per name)."""
    out: dict[str, Any] = {"model": d["model"], "replicas": int(d["replicas"])}
    roles = d.get("roles") or []
    if not roles:
        return {"model": d["model"], "profile": d["profile"], "replicas": int(d["replicas"])}
    out["roles"] = {r["name"]: {"profile": r["profile"], "count": int(r["count"])} for r in roles}
    return out
