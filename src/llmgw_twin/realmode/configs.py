"""The config files of a real-mode run's services, from the scenario: the controller's and each
node agent's, as `llmgw-twin controller --config` and `llmgw-twin agent --config` read them.

Pure: each builder returns the file's content as a mapping; `cluster.RealCluster` writes it,
having chosen the ports, proxies and paths it names (`AgentWiring`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_twin.control.model import EngineName, NodeInfo, Timings
from llmgw_twin.realmode.late import delays, late_path
from llmgw_twin.realmode.pace import pace_path, slows
from llmgw_twin.twin.scenario.model import Scenario
from llmgw_twin.units import fmt_duration, setting_keys


def duration(ms: int) -> str:
    """A duration as the config files write it ("0" for none)."""
    return fmt_duration(ms) if ms else "0"


def controller_config(
    sc: Scenario, port: int, workdir: Path, admin_hash: str, router_hash: str
) -> dict[str, Any]:
    """The controller's: every timing and profile of the scenario, in the config's own spelling,
    its store in `workdir`, the run's admin and router tokens. No deployments: the run applies
    them once every agent has registered."""
    t = sc.timings
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "store": str(workdir / "controller.db"),
        "timings": {
            k.key: duration(getattr(t, k.attr)) if k.kind == "duration" else getattr(t, k.attr)
            for k in setting_keys(Timings)
        },
        "profiles": {
            p.name: {
                "engine": p.engine,
                "nodes": p.nodes,
                "gpus_per_node": p.gpus_per_node,
                "model": p.model,
                "load_time": duration(p.load_time_ms),
                "args": list(p.args),
            }
            | ({"start_timeout": duration(p.start_timeout_ms)} if p.start_timeout_ms else {})
            | (
                {"nvlink": p.topology.nvlink, "leaves": p.topology.leaves}
                if p.topology.constrained
                else {}
            )
            for p in sc.profiles
        },
        "auth": {
            "admin_tokens": [admin_hash],
            "router_tokens": [router_hash],
            # one key for every controller of the run: a successor derives the same
            # controller tokens (a PostgreSQL store has no file to put it beside)
            "secret_file": str(workdir / "controller.key"),
        },
    }


@dataclass(frozen=True, slots=True)
class AgentWiring:
    """Where one agent is reached and reaches: the proxies to its controllers and to itself,
    its own port and its shards' range, its engines' address and its fabric peers'."""

    controller: str
    controllers: list[str]
    port: int
    advertise: str
    ports: tuple[int, int]
    address: str
    peers: dict[str, str]


def agent_config(
    sc: Scenario,
    info: NodeInfo,
    wiring: AgentWiring,
    root: Path,
    workdir: Path,
    credential: Path,
    engines: Mapping[EngineName, dict[str, str]],
    models: list[str],
) -> dict[str, object]:
    """One node agent's: its fake sysfs `root`, its engines and launch policy (`models`), its
    intervals on the scaled clock, and the fault files the scenario needs (pace, lateness)."""
    t = sc.timings
    config: dict[str, object] = {
        "node": info.node,
        "controller": wiring.controller,
        "controllers": wiring.controllers,
        "listen": {"host": "127.0.0.1", "port": wiring.port},
        "advertise_url": wiring.advertise,
        "root": str(root),
        "fabric": info.fabric,
        "use_nvml": False,
        "gpu_memory": f"{info.gpu_memory_mib}MiB",
        "engines": engines,
        "ports": {"first": wiring.ports[0], "last": wiring.ports[1]},
        "heartbeat_interval": duration(t.heartbeat_interval_ms),
        "probe_interval": duration(t.probe_interval_ms),
        "engine_host": wiring.address,
        "peer_addresses": wiring.peers,
        "stop_grace": "2s",
        # a stalled controller holds a report until this: half a heartbeat, as the default
        # is, on the scaled clock
        "report_timeout": duration(max(500, t.heartbeat_interval_ms // 2)),
        "worker_settle": "200ms",
        "log_dir": str(workdir / "logs" / info.node),
        "policy": {"model_dirs": models},
        "credential": str(credential),
    }
    if slows(sc):
        config["sim_pace_file"] = str(pace_path(root))
    if delays(sc):
        config["late_heartbeats_file"] = str(late_path(root))
    if info.topology is not None:  # a fake root tells none: the config names it
        place = {
            "leaf": info.topology.leaf,
            "spine": info.topology.spine,
            "nvlink_domain": info.topology.nvlink_domain,
        }
        config["topology"] = {k: v for k, v in place.items() if v is not None}
    return config
