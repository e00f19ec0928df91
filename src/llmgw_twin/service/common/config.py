"""What the services' YAML config files share: strict models, reading a file into settings,
durations as in scenario files, and the one error every mistake becomes.

Role: each process reads its own file (`controller.config`, `agent.config`, `router.config`);
every mistake is a `ConfigError` naming the file and the key. Durations and sizes are written as
in scenario files (`10s`, `80GiB`, read by `units`).

Invariants:
- Unknown keys are errors, never ignored; no value is coerced from another type.
- Relative paths (the store, the sysfs root, the log directory) are relative to the config file.
- The file itself is bounded before it is read into values (`MAX_FILE_BYTES`, `MAX_DEPTH`,
  `MAX_VALUES`, aliases counted as copies of what they name), so no file can make reading it
  recurse past Python's stack or expand past the memory; and every value is bounded where it is
  read, as the API bounds it (durations: `MAX_DURATION_MS`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Strict
from yaml import events

from llmgw_twin.service.common.config_access import ConfigError
from llmgw_twin.units import parse_duration

__all__ = ["ConfigError", "Duration", "duration_setting", "read_settings"]

Duration = Annotated[str, Strict()]

MAX_FILE_BYTES = 4 * 1024 * 1024
"""A config file's size: a fleet's peer addresses listed for 100,000 nodes fit."""
MAX_DEPTH = 32
"""Nesting of mappings and lists; the configs themselves need 5."""
MAX_VALUES = 1_000_000
"""Values in the document, each alias counted as a copy of what it names (alias bombs)."""
MAX_DURATION_MS = 30 * 24 * 3_600_000
"""Any duration setting: 30 days, as in scenario files."""


def read_settings(path: Path) -> Any:
    if path.is_dir():
        raise ConfigError(f"{path}: cannot read the config: it is a directory")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the config: {e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: the config is over {MAX_FILE_BYTES} bytes")
    try:
        _check_shape(path, text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return data


def duration_setting(path: Path, key: str, text: str, *, positive: bool = False) -> int:
    try:
        ms = parse_duration(text)
    except ValueError as e:
        raise ConfigError(f"{path}: {key}: {e}") from None
    if positive and ms <= 0:
        raise ConfigError(f"{path}: {key}: must be longer than 0")
    if ms > MAX_DURATION_MS:
        raise ConfigError(f"{path}: {key}: {text} is over the longest allowed, 30 days")
    return ms


def _check_shape(path: Path, text: str) -> None:
    """The document's nesting and size, from the parser's events (no recursion, nothing built):
    the first value past `MAX_DEPTH` or `MAX_VALUES` is named by its key path, and an alias
    counts as a copy of what it names."""
    stack: list[_Open] = []
    sizes: dict[str, int] = {}  # anchor -> the values it names
    total = 0

    def added(n: int, anchor: str | None, label: str) -> None:
        nonlocal total
        total += n
        if total > MAX_VALUES:
            where = _key_path(stack, label)
            raise ConfigError(f"{path}: {where}: over {MAX_VALUES} values (aliases counted)")
        if stack:
            stack[-1].size += n
        if anchor is not None:
            sizes[anchor] = n

    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if not isinstance(ev, events.NodeEvent | events.CollectionEndEvent):
            continue
        if isinstance(ev, events.CollectionEndEvent):
            done = stack.pop()
            added(done.size + 1, done.anchor, done.label)
            continue
        label = stack[-1].label_next(ev) if stack else ""
        if isinstance(ev, events.CollectionStartEvent):
            stack.append(_Open(label, ev.anchor, isinstance(ev, events.MappingStartEvent)))
            if len(stack) > MAX_DEPTH:
                where = _key_path(stack[:-1], label)
                raise ConfigError(f"{path}: {where}: nested deeper than {MAX_DEPTH} levels")
        elif isinstance(ev, events.AliasEvent):
            added(sizes.get(ev.anchor or "", 1), None, label)
        else:
            added(1, ev.anchor, label)


class _Open:
    """A mapping or a list being read: where it is, and how many values it holds so far."""

    def __init__(self, label: str, anchor: str | None, mapping: bool) -> None:
        self.label = label
        self.anchor = anchor
        self.mapping = mapping
        self.size = 0
        self._count = 0  # nodes seen directly inside
        self._key = "?"

    def label_next(self, ev: events.NodeEvent) -> str:
        """The label of the node `ev` starts: a mapping's key, a list's `[index]`."""
        n = self._count
        self._count += 1
        if not self.mapping:
            return f"[{n}]"
        if n % 2 == 0:  # a key
            self._key = str(ev.value) if isinstance(ev, events.ScalarEvent) else "?"
            return self._key
        return self._key


def _key_path(stack: list[_Open], label: str) -> str:
    labels = [o.label for o in stack[1:]] + [label]
    text = ""
    for part in labels:
        text += part if part.startswith("[") or not text else "." + part
    return text or "the top level"
