"""The text of the files `llmgw-twin onboard` writes: the agent's config and the systemd units.

Role: text only (no file is touched here). `agent_config(plan)` is the agent's YAML, commented
where a value says something an operator should know; the units run the installed
`llmgw-twin` as an unprivileged user, restart on failure, and keep the hardening that leaves
GPUs and InfiniBand reachable (docs/node-onboarding.md says why each choice was made).

Invariants:
- Every string in the config reads back as itself (`_y`: plain when YAML would not read it as
  something else, else a double-quoted scalar).
- The agent unit's `KillMode=process`: a stop sends SIGTERM to the agent alone, which stops
  every shard it started, each as a process group, within `stop_grace`; nothing else of the unit
  is ever signalled, so after a crash of the agent (SIGKILL included) its shards run on and the
  agent `Restart=` starts adopts them (docs/services.md, "Agent restarts"): a stop ends the
  shards, a crash does not.
- No device is hidden from the agent: no `PrivateDevices`, `DevicePolicy`, `DeviceAllow`, nor
  `ProtectClock` (which implies a device allow-list), so `/dev/nvidia*` and `/dev/infiniband/*`
  stay reachable; no `MemoryDenyWriteExecute` (CUDA and Triton compile code at run time).
- Every word of `ExecStart` is quoted and escaped as systemd reads it (`%` and `$` doubled).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmgw_twin.service.agent.config import AgentSettings
from llmgw_twin.service.agent.processes import KILL_WAIT_S
from llmgw_twin.service.common.auth import is_loopback


@dataclass(frozen=True, slots=True)
class Engine:
    name: str
    binary: str
    worker_binary: str | None = None


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """What the agent's config says, every value checked and every path absolute."""

    node: str
    controller: str
    host: str
    port: int
    advertise_url: str
    ports: tuple[int, int]
    engine_host: str
    credential: bool = False
    tls: tuple[str, str] | None = None
    """The node's certificate and key: its listener's, and its client's to an https controller."""
    tls_ca: str | None = None
    allow_plaintext: bool = False
    fake_gpus: int | None = None
    fabric: str | None = None
    topology: tuple[tuple[str, str], ...] = ()
    """(level, name) of the levels named: leaf, spine, nvlink_domain."""
    gpu_memory: str = "80GiB"
    peers: tuple[tuple[str, str], ...] = ()
    log_dir: str | None = None
    engines: tuple[Engine, ...] = ()
    sim_only: str | None = None
    """Why the node runs only the sim engine, when it does."""
    model_dirs: tuple[str, ...] = ()


def agent_config(plan: AgentPlan) -> str:
    node = plan.node
    lines = [
        f"# {node}: the node agent's config, written by `llmgw-twin onboard`",
        '# (docs/node-onboarding.md); every key: docs/services.md, "The agent".',
        f"node: {_y(node)}",
        f"controller: {_y(plan.controller)}",
        "listen:",
        f"  host: {_y(plan.host)}",
        f"  port: {plan.port}",
    ]
    if plan.tls is not None:
        ca = f", client_ca: {_y(plan.tls_ca)}" if plan.tls_ca else ""
        lines.append(f"  tls: {{cert: {_y(plan.tls[0])}, key: {_y(plan.tls[1])}{ca}}}")
    if plan.allow_plaintext:
        lines.append("  allow_plaintext: true")
    if plan.credential:
        lines.append(f"advertise_url: {_y(plan.advertise_url)}   # the credential is bound to it")
        lines.append(f"credential: {_y(node + '.cred')}")
    else:
        lines.append(f"advertise_url: {_y(plan.advertise_url)}")
        lines.append("# no credential, so loopback only: `onboard --controller URL` with an")
        lines.append("# admin token issues one (docs/node-onboarding.md)")
    if plan.controller.startswith("https:") and (plan.tls or plan.tls_ca):
        parts = [f"ca: {_y(plan.tls_ca)}"] if plan.tls_ca else []
        if plan.tls is not None:
            parts += [f"cert: {_y(plan.tls[0])}", f"key: {_y(plan.tls[1])}"]
        lines.append(f"controller_tls: {{{', '.join(parts)}}}")
    if plan.fake_gpus is not None:
        lines.append(
            f"root: {_y(node + '-sysfs')}   # a fake sysfs: {plan.fake_gpus} GPUs and an "
            "InfiniBand port, none of them real"
        )
    if plan.fabric is not None:
        lines.append(f"fabric: {_y(plan.fabric)}")
    if plan.topology:
        named = ", ".join(f"{k}: {_y(v)}" for k, v in plan.topology)
        lines.append(f"topology: {{{named}}}   # docs/topology.md")
    lines.append(f"gpu_memory: {_y(plan.gpu_memory)}")
    lines.append(f"engine_host: {_y(plan.engine_host)}")
    if plan.peers:
        peers = ", ".join(f"{_y(k)}: {_y(v)}" for k, v in plan.peers)
        lines.append(f"peer_addresses: {{{peers}}}")
    if is_loopback(plan.engine_host):
        lines.append("peer_address_default: 127.0.0.1")
    else:
        lines.append("peer_address_default: null   # nodes not in peer_addresses: by their name")
    lines.append(f"ports: {{first: {plan.ports[0]}, last: {plan.ports[1]}}}")
    if plan.log_dir is not None:
        lines.append(f"log_dir: {_y(plan.log_dir)}")
    if plan.sim_only is not None:
        lines += [f"# {part}" for part in textwrap.wrap(plan.sim_only, 96)]
        lines.append("engines: {}")
    else:
        lines.append("engines:   # the binaries this node has")
        for e in plan.engines:
            worker = f", worker_binary: {_y(e.worker_binary)}" if e.worker_binary else ""
            lines.append(f"  {e.name}: {{binary: {_y(e.binary)}{worker}}}")
    if plan.model_dirs:
        lines.append(f"policy: {{model_dirs: [{', '.join(_y(d) for d in plan.model_dirs)}]}}")
    return "\n".join(lines) + "\n"


_PLAIN = re.compile(r"[A-Za-z0-9_./@+~-][A-Za-z0-9_./:@+~-]*")


def _y(value: str) -> str:
    """A YAML scalar that reads back as the string `value`: plain when it can be."""
    try:
        plain = _PLAIN.fullmatch(value) is not None and yaml.safe_load(value) == value
    except yaml.YAMLError:
        plain = False
    return value if plain else json.dumps(value)


STATE_DIR = "llmgw-twin"
"""`StateDirectory=`: /var/lib/llmgw-twin, made and owned by the units' user; their working
directory (the controller's store, the engines' caches)."""

_COMMON = """\
Restart=on-failure
RestartSec=5s
StateDirectory={state}
WorkingDirectory=/var/lib/{state}
UMask=0027
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=full
ProtectHome=read-only
ProtectControlGroups=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes
SystemCallArchitectures=native
"""

AGENT = """\
[Unit]
Description=llmgw-twin node agent ({node})
Wants=network-online.target
After=network-online.target

[Service]
Type=exec
User={user}
ExecStart={exec_start}
{common}\
# A stop is SIGTERM to the agent alone, which stops every shard's process group (stop_grace,
# then SIGKILL). Nothing else is killed: after a crash, the agent Restart= starts adopts the
# shards that still run (docs/services.md, "Agent restarts"). `systemctl kill` ends them all.
KillMode=process
TimeoutStopSec={stop_s}s
# Devices stay reachable (GPUs, InfiniBand): no PrivateDevices, DevicePolicy or ProtectClock.
# RDMA pins memory; engines open many files and threads.
LimitMEMLOCK=infinity
LimitNOFILE=1048576
TasksMax=infinity

[Install]
WantedBy=multi-user.target
"""

CONTROLLER = """\
[Unit]
Description=llmgw-twin controller
Wants=network-online.target
After=network-online.target

[Service]
Type=exec
User={user}
ExecStart={exec_start}
{common}\
# The controller starts no process: a stop is SIGTERM to it, a graceful shutdown.
KillMode=control-group
TimeoutStopSec=30s
PrivateDevices=yes
ProtectClock=yes
ProtectKernelTunables=yes
LimitNOFILE=1048576

[Install]
WantedBy=multi-user.target
"""


def installed_cli() -> tuple[str, ...]:
    """The command that runs this installation: its `llmgw-twin` console script (beside this
    interpreter, as in a virtual environment, or on PATH), else `python -m llmgw_twin.cli`."""
    beside = Path(sys.executable).parent / "llmgw-twin"
    if beside.is_file() and os.access(beside, os.X_OK):
        return (str(beside.absolute()),)
    found = shutil.which("llmgw-twin")
    if found is not None:
        return (str(Path(found).absolute()),)
    return (sys.executable, "-m", "llmgw_twin.cli")


def agent_unit(
    node: str, cli: tuple[str, ...], config: Path, user: str, settings: AgentSettings
) -> str:
    stop_s = -(-settings.stop_grace_ms // 1000) + round(KILL_WAIT_S) + 20
    return AGENT.format(
        node=node,
        user=user,
        exec_start=command_line((*cli, "agent", "--config", str(config))),
        common=_COMMON.format(state=STATE_DIR),
        stop_s=stop_s,
    )


def controller_unit(cli: tuple[str, ...], config: Path, user: str) -> str:
    return CONTROLLER.format(
        user=user,
        exec_start=command_line((*cli, "controller", "--config", str(config))),
        common=_COMMON.format(state=STATE_DIR),
    )


def command_line(words: tuple[str, ...]) -> str:
    return " ".join(_word(w) for w in words)


_SAFE = re.compile(r"[A-Za-z0-9_./:@+=,-]+")


def _word(text: str) -> str:
    """One word of a systemd command line: specifiers and variables escaped, quoted if needed."""
    text = text.replace("%", "%%").replace("$", "$$")
    if _SAFE.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
