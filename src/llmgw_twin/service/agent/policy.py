"""The agent's launch policy: what an engine's command line may hold before anything of it runs.

Role: the agent is the last line of defence. The controller decides which shard runs where, but
the profile behind a shard (its model path, its extra flags) is only data to the agent: before a
shard's sidecar or engine starts, `check_launch` holds the adapter's argv to the policy of the
agent's own config (`policy:` in the agent's YAML, `PolicyC`), and a launch that breaks a rule
starts nothing and is reported with the rule it broke.

The rules, in the order they are checked:
1. Every argument is free of control characters (newline, CR, NUL, anything below U+0020, DEL),
   and the model's name and path do not begin with `-` (they would read as flags).
2. The model path is absolute and resolves (`os.path.realpath`: `..` and symlinks followed)
   under one of `policy.model_dirs`, for every engine but the sim engine, which never opens it.
3. Every flag (`--name`, or `--name` of `--name=value`) is in the flag list of the program that
   runs for that rank, at the adapter's pinned version (`engines/flags/`, read here: the
   adapters are pure). A flag a list marks `removed` is not known.
4. A held-back flag (`policy_rules`: code, network listeners, downloads, opaque configs, and
   the flags the agent sets itself, `--host`, `--port`, the rendezvous) may come from the
   profile only when `policy.allow_flags` lists it. The adapter's own flags pass.
5. A path flag's value (the next word, or after `=`) is absolute and resolves under
   `policy.model_dirs` or `policy.path_dirs`, as its table entry says. A flag listed in
   `allow_flags` skips rules 4 and 5.

Defaults: every list empty. So with no `policy:` section the node runs the sim engine (whose
flags are checked all the same) and refuses every other engine's model, and any path flag;
`model_dirs: [/]` is how a config says "models anywhere", explicitly. Relative directories are
relative to the config file. The check is made once, at launch: directories listed must be
writable by the operator only, or a symlink made there later could still lead elsewhere.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Strict, StringConstraints, field_validator

from llmgw_twin.control.model import ShardSpec
from llmgw_twin.engines.base import EngineAdapter, Program
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.service.agent.policy_rules import OPAQUE, RULES, PathFlag, ProgramRules, governed
from llmgw_twin.service.common.wire import Text

FLAGS_PACKAGE = "llmgw_twin.engines"
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SHOWN_CHARS = 160
"""Values longer than this are cut in messages: a reason travels to the controller."""

FlagName = Annotated[
    str, Strict(), StringConstraints(pattern=r"^--?[A-Za-z0-9][\w.-]*$", max_length=128)
]


class PolicyC(BaseModel):
    """The agent config's `policy:` section."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model_dirs: list[Text] = []
    """Where the models (weights, tokenizers, adapters) the node may load lie."""
    path_dirs: list[Text] = []
    """Where the files other path flags name (logs, templates, certificates) may lie."""
    allow_flags: list[FlagName] = []
    """Held-back flags this node lets a profile pass; a path flag here is not path-checked."""

    @field_validator("model_dirs", "path_dirs")
    @classmethod
    def _plain_dirs(cls, dirs: list[str]) -> list[str]:
        for d in dirs:
            if CONTROL.search(d):
                raise ValueError(f"{d!r} holds a control character")
        return dirs

    @field_validator("allow_flags")
    @classmethod
    def _governed(cls, flags: list[str]) -> list[str]:
        for f in flags:
            if not governed(f):
                raise ValueError(
                    f"{f} is neither held back nor path-checked by any engine's launch policy, "
                    "so listing it changes nothing"
                )
        return flags


@dataclass(frozen=True, slots=True)
class PolicySettings:
    model_dirs: tuple[str, ...] = ()
    path_dirs: tuple[str, ...] = ()
    allow_flags: frozenset[str] = frozenset()


DEFAULT_POLICY = PolicySettings()
"""No `policy:` section: no model or path directory, no flag allowed (the sim engine only)."""


def policy_settings(config_path: Path, c: PolicyC) -> PolicySettings:
    """The section as settings; relative directories are relative to the config file."""

    def absolute(dirs: list[str]) -> tuple[str, ...]:
        return tuple(d if os.path.isabs(d) else str(config_path.parent / d) for d in dirs)

    return PolicySettings(absolute(c.model_dirs), absolute(c.path_dirs), frozenset(c.allow_flags))


class PolicyError(Exception):
    """A launch the policy refuses; the message says which rule and which argument."""


# --- the flag lists --------------------------------------------------------------------------


def program_for(adapter: EngineAdapter, rank: int) -> Program:
    """The program a rank runs: the leader's is first; workers run the second, if there is one."""
    return adapter.programs[0] if rank == 0 or len(adapter.programs) == 1 else adapter.programs[1]


def flag_list_name(adapter: EngineAdapter, program: Program) -> str:
    """`<engine>-<version>.txt`, or `<engine>-<program>-<version>.txt` for an engine of two."""
    if len(adapter.programs) == 1:
        return f"{adapter.name}-{adapter.pinned_version}.txt"
    return f"{adapter.name}-{program.default_binary}-{adapter.pinned_version}.txt"


@cache
def known_flags(name: str) -> frozenset[str] | None:
    """The flags of one list in `engines/flags/` (less those marked `removed`); None if absent."""
    try:
        text = resources.files(FLAGS_PACKAGE).joinpath("flags", name).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return None
    flags = set()
    for line in text.splitlines():
        words = line.split()
        if words and not line.startswith("#") and "removed" not in words[1:]:
            flags.add(words[0])
    return frozenset(flags)


# --- the check -------------------------------------------------------------------------------


def check_launch(
    policy: PolicySettings, spec: ShardSpec, argv: tuple[str, ...], own: tuple[str, ...]
) -> None:
    """Raise `PolicyError` unless `argv` (as the adapter built it for `spec`) keeps every rule.
    `own`: the adapter's argv for the spec without the profile's flags; what `argv` has beyond
    it is the profile's (all of it, should `argv` not begin with `own`)."""
    adapter = adapter_for(spec.engine)
    program = program_for(adapter, spec.rank)
    rules = RULES.get(program.default_binary)
    known = known_flags(flag_list_name(adapter, program))
    where = f"{program.default_binary} {adapter.pinned_version}"
    if rules is None or known is None:
        raise PolicyError(f"no flag list for {where} ({flag_list_name(adapter, program)})")
    for word in (*argv, spec.model, spec.model_path):
        if CONTROL.search(word):
            raise PolicyError(f"argument {_shown(word)!r} holds a control character")
    for what, value in (("model name", spec.model), ("model path", spec.model_path)):
        if value.startswith("-"):
            raise PolicyError(f"the {what} {_shown(value)} begins with '-'")
    start = 1 + len(program.command)
    if tuple(argv[1:start]) != program.command:
        raise PolicyError(f"{' '.join(argv[:start])} does not run {where}")
    if rules.checks_model_path:
        _check_path(policy, "model_dirs", spec.model_path, "the model path")
    profile_from = len(own) if argv[: len(own)] == own else start
    i = start
    while i < len(argv):
        word = argv[i]
        at, i = i, i + 1
        if not _is_flag(word):
            continue
        flag, eq, value = word.partition("=")
        if flag not in known:
            raise PolicyError(f"flag {flag} is not one {where} knows")
        if flag in policy.allow_flags:
            continue
        why = _held_back(rules, flag)
        if why is not None and at >= profile_from:
            raise PolicyError(
                f"flag {flag} is refused: it {why}; the agent's policy.allow_flags does not list it"
            )
        path = rules.paths.get(flag)
        if path is None:
            continue
        if not eq:
            if i >= len(argv):
                raise PolicyError(f"flag {flag} has no value")
            value, i = argv[i], i + 1
        shown = word if eq else f"{flag} {value}"
        _check_value(policy, path, value, f"flag {_shown(shown)}")


def _held_back(rules: ProgramRules, flag: str) -> str | None:
    if flag in rules.held:
        return rules.held[flag]
    if flag not in rules.paths and any(flag.endswith(s) for s in rules.held_suffixes):
        return OPAQUE
    return None


def _check_value(policy: PolicySettings, path: PathFlag, value: str, what: str) -> None:
    if value in path.keywords:
        return
    parts = value.split(",") if path.form != "one" else [value]
    for part in parts:
        target = part.rsplit(":", 1)[0] if path.form == "scaled" and ":" in part else part
        _check_path(policy, path.dirs, target, what)


def _check_path(policy: PolicySettings, key: str, value: str, what: str) -> None:
    dirs: tuple[str, ...] = policy.model_dirs if key == "model_dirs" else policy.path_dirs
    if not value or not os.path.isabs(value):
        raise PolicyError(f"{what}: {_shown(value)!r} is not an absolute path")
    real = os.path.realpath(value)
    for d in dirs:
        top = os.path.realpath(d)
        if os.path.commonpath([real, top]) == top:
            return
    if not dirs:
        raise PolicyError(f"{what}: {_shown(value)} is refused: the agent's policy.{key} is empty")
    resolved = f" (it resolves to {_shown(real)})" if real != value else ""
    raise PolicyError(
        f"{what}: {_shown(value)}{resolved} is not under the agent's policy.{key} "
        f"({', '.join(dirs)})"
    )


def _is_flag(word: str) -> bool:
    if not word.startswith("-") or word == "-":
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False  # a negative number is a value


def _shown(value: str) -> str:
    return value if len(value) <= SHOWN_CHARS else value[:SHOWN_CHARS] + "..."
