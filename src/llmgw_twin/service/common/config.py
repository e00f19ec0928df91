"""What the services' YAML config files share: strict models, reading a file into settings,
durations as in scenario files, and the one error every mistake becomes.

Role: each process reads its own file (`controller.config`, `agent.config`, `router.config`);
every mistake is a `ConfigError` naming the file and the key. Durations and sizes are written as
in scenario files (`10s`, `80GiB`, read by `units`).

Invariants:
- Unknown keys are errors, never ignored; no value is coerced from another type.
- Relative paths (the store, the sysfs root, the log directory) are relative to the config file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Strict

from llmgw_twin.service.common.config_access import ConfigError
from llmgw_twin.units import parse_duration

__all__ = ["ConfigError", "Duration", "duration_setting", "read_settings"]

Duration = Annotated[str, Strict()]


def read_settings(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the config: {e}") from None
    try:
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
    return ms
