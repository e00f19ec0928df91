"""`llmgw-twin onboard NODE --out DIR ...`: everything one node needs, written in one go.

Role: write into DIR the node's agent config (`NODE.yaml`), optionally its credential
(`NODE.cred`, issued through the admin API by `ctl`'s own `issue_credential`), optionally a fake
sysfs root (`NODE-sysfs/`, `fakesysfs.write_sysfs_root`) for a machine without GPUs or
InfiniBand, and the systemd units `llmgw-twin-agent.service` and `llmgw-twin-controller.service`
(their texts: `onboard_files.py`). The engines the config names are the binaries this machine
has (found on PATH, or given); with none, it says plainly that the node runs only the sim engine.

Invariants:
- Nothing is half-written: every file is made in a staging directory inside DIR, the config is
  read back with `load_agent_config` (and the inventory under its root with the agent's own
  reader) there, and only then is each one renamed into place.
- An existing file is never replaced without `--force`; the check comes before the credential
  is issued, since issuing one rotates the node's credential at the controller.
- Bad input is exit 2 with one line saying what is wrong; the admin API's answers are `ctl`'s
  (1 refused, 2 unreachable).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import re
import shutil
import sys
import tempfile
from pathlib import Path

from llmgw_twin.control.model import ENGINES
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.service.agent.config import AgentSettings, load_agent_config
from llmgw_twin.service.agent.fakesysfs import fabric_prefix_for, write_sysfs_root
from llmgw_twin.service.agent.inventory import read_inventory, to_node_info
from llmgw_twin.service.common.config import ConfigError
from llmgw_twin.service.common.wire import NAME_PATTERN
from llmgw_twin.service.ops import ctl
from llmgw_twin.service.ops.onboard_files import (
    AgentPlan,
    Engine,
    agent_config,
    agent_unit,
    controller_unit,
    installed_cli,
)

EXIT_INVALID = 2
AGENT_UNIT = "llmgw-twin-agent.service"
CONTROLLER_UNIT = "llmgw-twin-controller.service"
DEFAULT_LISTEN = "127.0.0.1:8101"
DEFAULT_PORTS = "20000-20099"
SIM_ONLY = "it can run only the sim engine"
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_WILDCARD = ("0.0.0.0", "::", "")  # noqa: S104  (recognised, not bound)


class OnboardError(Exception):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node", help="the node's name, as the controller will know it")
    p.add_argument("--out", required=True, type=Path, help="the directory the files go into")
    p.add_argument("--force", action="store_true", help="replace files that exist there")
    p.add_argument(
        "--controller",
        help=f"the controller's base URL (default {ctl.DEFAULT_CONTROLLER}); with an admin "
        "token, the node's credential is issued there",
    )
    p.add_argument(
        "--token-file", type=Path, help=f"a file holding the admin token (else ${ctl.TOKEN_ENV})"
    )
    p.add_argument("--ca", type=Path, help="issuing: the CA of the controller's certificate")
    p.add_argument("--cert", type=Path, help="issuing: the operator's certificate (mutual TLS)")
    p.add_argument("--key", type=Path, help="issuing: the key of --cert")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help="the agent's")
    p.add_argument("--advertise-url", help="where the controller reaches the agent")
    p.add_argument("--allow-plaintext", action="store_true", help="plain HTTP off loopback")
    p.add_argument("--tls-cert", type=Path, help="the node's certificate (listener and client)")
    p.add_argument("--tls-key", type=Path, help="the key of --tls-cert")
    p.add_argument("--tls-ca", type=Path, help="the fleet's CA: controller and clients")
    p.add_argument("--engine-host", help="where this node's engines listen and are reached")
    p.add_argument("--peer", action="append", default=[], metavar="NODE=ADDR")
    p.add_argument("--ports", default=DEFAULT_PORTS, metavar="FIRST-LAST")
    p.add_argument("--fabric", help="the node's fabric, overriding the one its ports show")
    p.add_argument("--leaf", help="the node's leaf switch (docs/topology.md)")
    p.add_argument("--spine", help="its leaf's spine switch")
    p.add_argument("--nvlink-domain", help="its NVLink domain (default: what NVML tells)")
    p.add_argument("--fake-gpus", type=int, metavar="N", help="a fake sysfs root with N GPUs")
    p.add_argument("--gpu-memory", default="80GiB", help="per GPU, when the node cannot say")
    p.add_argument("--engine", action="append", default=[], metavar="ENGINE=PATH")
    p.add_argument("--worker", action="append", default=[], metavar="ENGINE=PATH")
    p.add_argument("--sim-only", action="store_true", help="advertise the sim engine only")
    p.add_argument("--model-dir", action="append", default=[], type=Path, metavar="DIR")
    p.add_argument("--log-dir", type=Path, help="one log file per process (default: journal)")
    p.add_argument("--install-dir", type=Path, help="where DIR will be on the node (units)")
    p.add_argument("--controller-config", type=Path, help="the controller unit's config")
    p.add_argument("--llmgw-twin", dest="cli", help="the installed llmgw-twin, for the units")
    p.add_argument("--user", default="llmgw", help="the units' user (default llmgw)")


def main(args: argparse.Namespace) -> int:
    try:
        return _onboard(args)
    except (OnboardError, OSError, ValueError) as e:  # bad input; a file not writable
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID


def _onboard(args: argparse.Namespace) -> int:
    node, out = args.node, Path(args.out).absolute()
    issue = _wants_credential(args)
    engines, notes = find_engines(args)
    names = [f"{node}.yaml", AGENT_UNIT, CONTROLLER_UNIT]
    names += [f"{node}.cred"] * issue + [f"{node}-sysfs"] * (args.fake_gpus is not None)
    if out.exists() and not out.is_dir():
        raise OnboardError(f"--out {out} is not a directory")
    if not _USER.fullmatch(args.user):
        raise OnboardError(f"--user {args.user!r}: not a user name")
    taken = [n for n in names if (out / n).exists() or (out / n).is_symlink()]
    if taken and not args.force:
        raise OnboardError(f"{out}: {', '.join(taken)} exist; --force replaces them")
    install = Path(args.install_dir or out).absolute()
    text = agent_config(plan_for(args, engines, notes, issue))
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".onboard-", dir=out))
    try:
        if args.fake_gpus is not None:
            write_sysfs_root(
                stage / f"{node}-sysfs",
                gpus=args.fake_gpus,
                fabric_prefix=fabric_prefix_for(args.fabric),
                node=node,
            )
        config = stage / f"{node}.yaml"
        _write(config, text)
        settings = _checked(config, out, fake=args.fake_gpus is not None)
        cli = (args.cli,) if args.cli else installed_cli()
        units = {
            AGENT_UNIT: agent_unit(node, cli, install / config.name, args.user, settings),
            CONTROLLER_UNIT: controller_unit(
                cli, Path(args.controller_config or install / "controller.yaml"), args.user
            ),
        }
        for name, body in units.items():
            _write(stage / name, body)
        if issue:
            status, cred = ctl.issue_credential(args, node, settings.advertise_url)
            if cred is None:
                return status
            cred.write(stage / f"{node}.cred")
            _give_to(stage / f"{node}.cred", args.user)
        for name in names:
            _replace(stage / name, out / name, stage)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    print(f"node {node}: {', '.join(names)} written to {out}")
    return 0


def _wants_credential(args: argparse.Namespace) -> bool:
    """Issue a credential only with both a controller named and an admin token to hand."""
    has_token = args.token_file is not None or bool(os.environ.get(ctl.TOKEN_ENV))
    if args.token_file is not None and args.controller is None:
        raise OnboardError("--token-file issues a credential: name the --controller too")
    if args.controller is not None and not has_token:
        print(
            f"note: no admin token (--token-file, ${ctl.TOKEN_ENV}): no credential issued, so "
            "the agent may listen on loopback only",
            file=sys.stderr,
        )
    return args.controller is not None and has_token


def find_engines(args: argparse.Namespace) -> tuple[list[Engine], list[str]]:
    """The engines this node has (given with --engine/--worker, else found on PATH), and notes
    for the operator: what is missing, and that a node without any runs the sim engine only."""
    given, workers = _pairs(args.engine, "--engine"), _pairs(args.worker, "--worker")
    if args.sim_only and (given or workers):
        raise OnboardError("--sim-only names no engine: drop --engine and --worker")
    for name in workers:
        if len(adapter_for(name).programs) < 2:
            raise OnboardError(f"--worker {name}=...: {name}'s workers run the leader's program")
    engines: list[Engine] = []
    notes: list[str] = []
    for name in ENGINES:
        programs = adapter_for(name).programs
        leader = given.get(name) or (
            None if args.sim_only or name == "sim" else shutil.which(programs[0].default_binary)
        )
        if leader is None:
            if name in workers:
                raise OnboardError(f"--worker {name}=...: no {name} leader found or given")
            continue
        worker = workers.get(name)
        if worker is None and len(programs) > 1 and not args.sim_only:
            default = programs[1].default_binary
            beside = Path(leader).parent / default
            worker = shutil.which(default) or (str(beside) if _runnable(beside) else None)
            if worker is None:
                notes.append(
                    f"{name}: no {default} beside {leader} or on PATH: this node cannot be a "
                    f"worker of a {name} replica that spans nodes (--worker {name}=PATH)"
                )
        engines.append(Engine(name, _program(leader, name), worker and _program(worker, name)))
    if not engines:
        wanted = ", ".join(adapter_for(e).programs[0].default_binary for e in ENGINES if e != "sim")
        why = f"no engine binary found on PATH ({wanted}) or given with --engine"
        notes.append(f"node {args.node}: {'--sim-only' if args.sim_only else why}: {SIM_ONLY}")
    elif not args.model_dir:
        notes.append("no --model-dir: the agent refuses every model but the sim engine's")
    return engines, notes


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        engine, sep, path = item.partition("=")
        if not sep or not path or engine not in ENGINES or engine in pairs:
            raise OnboardError(
                f"{flag} {item!r}: expected ENGINE=PATH once per engine, ENGINE one of "
                f"{', '.join(ENGINES)}"
            )
        pairs[engine] = path
    return pairs


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _program(path: str, engine: str) -> str:
    p = Path(path).absolute()
    if not _runnable(p):
        raise OnboardError(f"engine {engine}: {path} is not an executable file")
    return str(p)


def plan_for(
    args: argparse.Namespace, engines: list[Engine], notes: list[str], credential: bool
) -> AgentPlan:
    """The agent's config from the command line, every value checked that can be here."""
    host, port = _host_port(args.listen)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise OnboardError("--tls-cert and --tls-key go together")
    tls = (_abs(args.tls_cert), _abs(args.tls_key)) if args.tls_cert is not None else None
    if host in _WILDCARD and (args.advertise_url is None or args.engine_host is None):
        raise OnboardError(f"--listen {args.listen}: name --advertise-url and --engine-host")
    if args.fake_gpus is not None and args.fake_gpus < 0:
        raise OnboardError(f"--fake-gpus {args.fake_gpus}: a node has no fewer than 0 GPUs")
    if args.fake_gpus is not None and args.fabric is None:
        raise OnboardError("--fake-gpus needs --fabric: the fabric of the fake port")
    scheme = "https" if tls else "http"
    return AgentPlan(
        node=args.node,
        controller=(args.controller or ctl.DEFAULT_CONTROLLER).rstrip("/"),
        host=host,
        port=port,
        advertise_url=args.advertise_url or f"{scheme}://{_url_host(host)}:{port}",
        ports=_port_range(args.ports),
        engine_host=args.engine_host or host,
        credential=credential,
        tls=tls,
        tls_ca=_abs(args.tls_ca) if args.tls_ca is not None else None,
        allow_plaintext=args.allow_plaintext,
        fake_gpus=args.fake_gpus,
        fabric=args.fabric,
        topology=_topology(args),
        gpu_memory=args.gpu_memory,
        peers=tuple(_peers(args.peer, args.node, args.engine_host or host)),
        log_dir=_abs(args.log_dir) if args.log_dir is not None else None,
        engines=tuple(engines),
        sim_only=next((n for n in notes if n.endswith(SIM_ONLY)), None),
        model_dirs=tuple(_abs(d) for d in args.model_dir),
    )


def _topology(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """Where the node sits, as the agent config's `topology:` names it: the levels given."""
    levels = (("leaf", args.leaf), ("spine", args.spine), ("nvlink_domain", args.nvlink_domain))
    out = []
    for key, value in levels:
        if value is None:
            continue
        if len(value) > 128 or re.fullmatch(NAME_PATTERN, value) is None:
            flag = "--" + key.replace("_", "-")
            raise OnboardError(f"{flag} {value!r}: letters, digits, '.', '_' and '-' only")
        out.append((key, value))
    if args.spine is not None and args.leaf is None:
        raise OnboardError("--spine needs --leaf: a spine is the spine of the node's leaf")
    return tuple(out)


def _peers(items: list[str], node: str, engine_host: str) -> list[tuple[str, str]]:
    """Every node's address as this node reaches it, itself at its engine host first: a leader
    binds its rendezvous where its workers dial it."""
    pairs = {node: engine_host}
    for item in items:
        name, sep, addr = item.partition("=")
        if not sep or not name or not addr or name in pairs:
            raise OnboardError(f"--peer {item!r}: expected NODE=ADDRESS, once per other node")
        pairs[name] = addr
    return list(pairs.items())


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise OnboardError(f"--listen {text!r}: expected HOST:PORT")
    return host, int(port)


def _port_range(text: str) -> tuple[int, int]:
    first, sep, last = text.partition("-")
    if not (sep and first.isdigit() and last.isdigit() and 0 < int(first) <= int(last) < 65536):
        raise OnboardError(f"--ports {text!r}: expected FIRST-LAST, FIRST no more than LAST")
    return int(first), int(last)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _abs(path: Path) -> str:
    return str(Path(path).absolute())


def _checked(config: Path, out: Path, *, fake: bool) -> AgentSettings:
    """The config as the agent reads it, and its node as the agent's inventory sees it: an
    error in a fake root is the onboarding's, one of this machine's own root only a warning."""
    try:
        settings = load_agent_config(config)
    except ConfigError as e:
        raise OnboardError(str(e).replace(str(config.parent), str(out))) from None
    inv = read_inventory(settings.root, fabric=settings.fabric, use_nvml=False)
    try:
        to_node_info(inv, settings.node, settings.gpu_memory_mib, settings.engine_names)
    except ValueError as e:
        if fake:
            raise OnboardError(str(e)) from None
        print(f"warning: on this machine the agent would not start: {e}", file=sys.stderr)
    return settings


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o644)


def _give_to(path: Path, user: str) -> None:
    """The credential belongs to the units' user when this runs as root (else chown it)."""
    if os.geteuid() != 0:
        return
    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _replace(new: Path, old: Path, stage: Path) -> None:
    """Put `new` where `old` is: a file by one rename, a directory by moving the old one into
    the staging directory first (it is removed with it)."""
    if old.is_dir() and not old.is_symlink():
        old.rename(stage / (".old-" + old.name))
    os.replace(new, old)
