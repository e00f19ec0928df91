"""Importing a fleet's topology into a scenario's `cluster` section: from `ibnetdiscover` output,
or from the node labels Topograph writes (docs/topology.md).

`llmgw-twin topology import FORMAT FILE [--fabric NAME]` prints the `cluster:` section (the
fabric with its nodes, and `topology:` with leaves, spines and NVLink domains) as YAML, ready to
paste into a scenario; the loader checks it as any file's.

- **ibnetdiscover**: blocks of `Switch N "S-<guid>" # "<description>" ...` and
  `Ca N "H-<guid>" # "<description>"`, each followed by its connected ports
  (`[p] "S-<guid>"[q] ...`). A node is named by the first word of its adapters' description
  (`node01 HCA-1` -> `node01`); SHARP aggregation nodes are not nodes. A leaf is a switch an
  adapter is linked to; a node with several adapters (rails) is under the leaf of its first
  adapter, by description. The spine of a leaf is the switch above it (one linked to it that is
  no leaf); a leaf linked to several spines (a fat tree) is under the first of them by name.
  A switch is named by its description (`MF0;L0_R05:MQM8700/U1` -> `L0_R05`), else by its GUID.
  One subnet is one fabric, named by `--fabric`.
- **topograph**: `kubectl get nodes -o json` (or YAML), or a mapping of node names to their
  labels. Leaf, spine and NVLink domain come from `network.topology.nvidia.com/leaf`, `/spine`
  and `/accelerator`, or from Topograph 1.x's `fabric.topograph.run/tier-0`, `tier-1` and
  `accelerator.topograph.run/domain`, or `nvidia.com/gpu.clique` for the domain. Every node goes
  in the one fabric `--fabric` names.

Invariant: the output names only names the scenario format accepts (letters, digits, `.`, `_`,
`-`); a leaf's nodes and a spine's leaves are one fabric's, as the loader requires.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

NAME_OK = re.compile(r"[^A-Za-z0-9._-]+")
LABELS_LEAF = ("network.topology.nvidia.com/leaf", "fabric.topograph.run/tier-0")
LABELS_SPINE = ("network.topology.nvidia.com/spine", "fabric.topograph.run/tier-1")
LABELS_DOMAIN = (
    "network.topology.nvidia.com/accelerator",
    "accelerator.topograph.run/domain",
    "nvidia.com/gpu.clique",
)


class TopologyImportError(ValueError):
    """The file is not of the format named; the message says why."""


@dataclass(slots=True)
class Imported:
    """A fabric's nodes and their topology, in name order."""

    nodes: list[str] = field(default_factory=list)
    leaves: dict[str, list[str]] = field(default_factory=dict)
    spines: dict[str, list[str]] = field(default_factory=dict)
    domains: dict[str, list[str]] = field(default_factory=dict)

    def cluster(self, fabric: str) -> dict[str, Any]:
        topology: dict[str, Any] = {}
        for key, groups in (
            ("leaves", self.leaves),
            ("spines", self.spines),
            ("nvlink_domains", self.domains),
        ):
            if groups:
                topology[key] = {k: sorted(v) for k, v in sorted(groups.items())}
        out: dict[str, Any] = {"fabrics": {fabric: sorted(self.nodes)}}
        if topology:
            out["topology"] = topology
        return {"cluster": out}


def clean(name: str) -> str:
    """A name the scenario format accepts: other characters become `_`, at most 128."""
    return NAME_OK.sub("_", name.strip()).strip("_")[:128] or "unnamed"


# --- ibnetdiscover ---------------------------------------------------------------------------

_HEAD = re.compile(r'^(Switch|Ca)\s+\d+\s+"([SH]-[0-9a-fA-F]+)"\s*(?:#\s*"([^"]*)")?')
_PORT = re.compile(r'^\[\d+\](?:\([0-9a-fA-F]+\))?\s+"([SH]-[0-9a-fA-F]+)"')


@dataclass(slots=True)
class _Device:
    kind: str
    guid: str
    description: str
    links: list[str] = field(default_factory=list)


def _devices(text: str) -> dict[str, _Device]:
    devices: dict[str, _Device] = {}
    current: _Device | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if (head := _HEAD.match(line)) is not None:
            current = _Device(head.group(1), head.group(2), head.group(3) or "")
            devices[current.guid] = current
        elif current is not None and (port := _PORT.match(line)) is not None:
            current.links.append(port.group(1))
        elif not line:
            current = None
    if not devices:
        raise TopologyImportError("no Switch or Ca block found: is this ibnetdiscover's output?")
    return devices


def _switch_name(dev: _Device) -> str:
    desc = dev.description
    if ";" in desc:  # Mellanox: "MF0;<name>:<model>/U1"
        desc = desc.split(";", 1)[1].split(":", 1)[0]
    return clean(desc) if desc.strip() else clean(dev.guid)


def from_ibnetdiscover(text: str) -> Imported:
    devices = _devices(text)
    switches = {g: d for g, d in devices.items() if d.kind == "Switch"}
    names = _unique({g: _switch_name(d) for g, d in switches.items()})
    adapters = sorted(
        (
            d
            for d in devices.values()
            if d.kind == "Ca" and "aggregation node" not in d.description.lower()
        ),
        key=lambda d: (d.description, d.guid),
    )
    out = Imported()
    leaf_of: dict[str, str] = {}
    for ca in adapters:
        node = clean(ca.description.split()[0]) if ca.description.strip() else clean(ca.guid)
        out.nodes.append(node)
        up = [g for g in ca.links if g in switches]
        if node not in leaf_of and up:
            leaf_of[node] = up[0]
    leaf_guids = sorted(set(leaf_of.values()), key=lambda g: names[g])
    for node, guid in sorted(leaf_of.items()):
        out.leaves.setdefault(names[guid], []).append(node)
    leaf_set = set(leaf_guids)
    for guid in leaf_guids:
        linked = {g for g in switches[guid].links if g in switches}
        linked |= {g for g, d in switches.items() if guid in d.links}
        spines = sorted(names[g] for g in linked if g not in leaf_set)
        if spines:
            out.spines.setdefault(spines[0], []).append(names[guid])
    out.nodes = sorted(dict.fromkeys(out.nodes))
    return out


def _unique(names: Mapping[str, str]) -> dict[str, str]:
    """Switch names, a GUID's tail added where two switches share a description."""
    seen: dict[str, int] = {}
    for n in names.values():
        seen[n] = seen.get(n, 0) + 1
    return {g: (n if seen[n] == 1 else clean(f"{n}-{g[-6:]}")) for g, n in names.items()}


# --- Topograph node labels -------------------------------------------------------------------


def _label_sets(data: Any) -> Iterable[tuple[str, Mapping[str, Any]]]:
    if isinstance(data, dict) and isinstance(data.get("items"), list):  # kubectl get nodes
        for item in data["items"]:
            meta = item.get("metadata", {}) if isinstance(item, dict) else {}
            if isinstance(meta, dict) and isinstance(meta.get("name"), str):
                labels = meta.get("labels") or {}
                yield meta["name"], labels if isinstance(labels, dict) else {}
        return
    if isinstance(data, dict) and data.get("kind") == "Node":
        meta = data.get("metadata", {})
        yield str(meta.get("name")), meta.get("labels") or {}
        return
    if isinstance(data, dict):
        for name, labels in data.items():
            if isinstance(labels, dict):
                yield str(name), labels
        return
    raise TopologyImportError("expected kubectl's node list or a mapping of node names to labels")


def _first(labels: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = labels.get(key)
        if isinstance(value, str) and value.strip():
            return clean(value)
    return None


def from_topograph(text: str) -> Imported:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise TopologyImportError(f"not JSON or YAML: {err}") from None
    out = Imported()
    spine_of: dict[str, str] = {}
    for name, labels in _label_sets(data):
        node = clean(name)
        out.nodes.append(node)
        leaf = _first(labels, LABELS_LEAF)
        spine = _first(labels, LABELS_SPINE)
        domain = _first(labels, LABELS_DOMAIN)
        if leaf is not None:
            out.leaves.setdefault(leaf, []).append(node)
            if spine is not None:
                spine_of.setdefault(leaf, spine)
        if domain is not None:
            out.domains.setdefault(domain, []).append(node)
    if not out.nodes:
        raise TopologyImportError("no node found")
    for leaf, spine in sorted(spine_of.items()):
        out.spines.setdefault(spine, []).append(leaf)
    out.nodes = sorted(dict.fromkeys(out.nodes))
    return out


FORMATS = {"ibnetdiscover": from_ibnetdiscover, "topograph": from_topograph}


def render(imported: Imported, fabric: str) -> str:
    return yaml.safe_dump(
        imported.cluster(clean(fabric)), sort_keys=False, default_flow_style=None, width=100
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=sorted(FORMATS), help="what FILE holds")
    parser.add_argument("file", type=Path, help="the file to read ('-': standard input)")
    parser.add_argument("--fabric", default="ib-a", help="the fabric's name (default ib-a)")


def main(args: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text()
    except OSError as err:
        print(f"llmgw-twin topology import: {err}", file=sys.stderr)
        return 2
    try:
        imported = FORMATS[args.format](text)
    except TopologyImportError as err:
        print(f"llmgw-twin topology import: {args.file}: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(render(imported, args.fabric))
    return 0
