"""`llmgw-twin ctl engine-check`: every flag the project can emit, held against the engine's help.

    llmgw-twin ctl engine-check --engine NAME [--binary PATH] [--worker-binary PATH]
                                [--help-file FILE] [--worker-help-file FILE] [--json]

Engines rename and drop flags between versions, and a launch with a flag the engine no longer
knows fails minutes into a model load. This command builds the widest launch the project would
ever produce for the engine (a 4-node replica, every optional flag on: `adapter.widest()`), takes
each program's flags, and looks for each in that program's own `--help` (run as a subprocess,
never through a shell, with a timeout; or read from a saved file). No GPU is needed.

Invariants:
- a flag matches on a word boundary only: `--port` is not satisfied by `--port-range`;
- a help text that looks cut (shorter than the program's complete help ever is, missing one of
  the sections every complete help has, or ending mid-line) never yields a "missing" verdict:
  the flags it lacks are reported as unconfirmed, with a warning;
- exit status: 0 every flag present; 1 a flag missing (this wins: that launch would fail);
  2 a program's help could not be had, or looked cut and lacked flags.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmgw_twin.engines.base import EngineAdapter, Program, program_flags
from llmgw_twin.engines.registry import adapter_for, engine_names

EXIT_OK, EXIT_MISSING, EXIT_NO_HELP = 0, 1, 2
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class FlagResult:
    flag: str
    used_by: tuple[str, ...]
    """Roles whose argv carries the flag: leader, worker."""
    found: bool | None
    """None: not in a help text that looks cut, so unknown."""


@dataclass(frozen=True, slots=True)
class ProgramResult:
    program: str
    source: str
    """The command run for help, or the file it was read from."""
    help_chars: int
    error: str | None
    truncated: str | None
    flags: tuple[FlagResult, ...]

    @property
    def status(self) -> str:
        if self.error is not None:
            return "no-help"
        if any(f.found is False for f in self.flags):
            return "missing"
        if any(f.found is None for f in self.flags):
            return "truncated"
        return "ok"


def program_name(program: Program) -> str:
    return " ".join((program.default_binary, *program.command))


Wanted = tuple[tuple[str, tuple[str, ...]], ...]
"""(flag, roles that pass it) for one program."""


def wanted_flags(adapter: EngineAdapter) -> list[tuple[Program, Wanted]]:
    """Per program of the engine: each flag of the widest launch, with the roles that pass it."""
    per_program: dict[str, dict[str, set[str]]] = {p.default_binary: {} for p in adapter.programs}
    for rank, launch in enumerate(adapter.widest()):
        program = next(
            (p for p in adapter.programs
             if launch.argv[0] == p.default_binary
             and tuple(launch.argv[1 : 1 + len(p.command)]) == p.command),
            None,
        )  # fmt: skip
        if program is None:
            raise ValueError(f"{adapter.name}: {launch.argv[:2]} runs none of its programs")
        role = "leader" if rank == 0 else "worker"
        for flag in program_flags(launch.argv, program.command):
            per_program[program.default_binary].setdefault(flag, set()).add(role)
    return [
        (p, tuple((f, tuple(sorted(r))) for f, r in per_program[p.default_binary].items()))
        for p in adapter.programs
    ]


def flag_in_help(flag: str, help_text: str) -> bool:
    """`flag` appears as a whole word: not as the start of a longer flag (`--port-range`) nor
    the end of one (`--no-port`), nor followed by `.key` (`--config.key`)."""
    pattern = rf"(?<![\w-]){re.escape(flag)}(?![\w-]|\.\w)"
    return re.search(pattern, help_text) is not None


def truncation(program: Program, help_text: str) -> str | None:
    """Why `help_text` looks cut short of the program's complete help, or None."""
    if len(help_text) < program.min_help_chars:
        return (
            f"cut short: {len(help_text):,} characters, where the complete help of "
            f"{program_name(program)} has over {program.min_help_chars:,}"
        )
    at = 0
    for section in program.help_sections:
        found = help_text.find(section, at)
        if found < 0:
            return f"ends before its {section!r} section"
        at = found + len(section)
    if program.help_sections and not help_text[at:].strip():
        return f"ends right after {program.help_sections[-1]!r}"
    if not help_text.endswith("\n"):
        return "ends mid-line"
    return None


def check_program(
    program: Program,
    flags: Sequence[tuple[str, tuple[str, ...]]],
    help_text: str | None,
    source: str,
    error: str | None = None,
) -> ProgramResult:
    name = program_name(program)
    if help_text is None:
        results = tuple(FlagResult(f, roles, None) for f, roles in flags)
        return ProgramResult(name, source, 0, error or "no help text", None, results)
    cut = truncation(program, help_text)
    results = tuple(
        FlagResult(f, roles, True if flag_in_help(f, help_text) else (None if cut else False))
        for f, roles in flags
    )
    return ProgramResult(name, source, len(help_text), None, cut, results)


def run_help(binary: str, program: Program, timeout_s: float) -> tuple[str | None, str, str | None]:
    """(help text, command shown, error): the program's complete help, from the longer of its
    stdout and stderr (some print usage to stderr). A non-zero exit is an error only when what
    it printed does not look like a complete help (some programs exit 1 after their help)."""
    cmd = [binary, *program.help_args]
    shown = " ".join(cmd)
    try:
        done = subprocess.run(  # noqa: S603  (argv list, no shell)
            cmd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, shown, f"`{shown}` did not finish within {timeout_s:g}s"
    except OSError as e:
        return None, shown, f"cannot run `{shown}`: {e.strerror or e}"
    text = max(done.stdout, done.stderr, key=len)
    if not text.strip():
        return None, shown, f"`{shown}` printed nothing (exit {done.returncode})"
    if done.returncode != 0 and truncation(program, text) is not None:
        last = text.strip().splitlines()[-1].strip()
        return None, shown, f"`{shown}` failed (exit {done.returncode}): {last}"
    return text, shown, None


def find_binary(program: Program, explicit: str | None, beside: str | None) -> str | None:
    """`explicit`, else the program's usual binary next to `beside` (the leader's binary given
    as a path), else on PATH, else beside the running interpreter (this installation's own
    console scripts, such as `llmgw-twin` for the sim engine, in a venv not on PATH)."""
    if explicit:
        return explicit
    if beside and Path(beside).name != beside:
        sibling = Path(beside).parent / program.default_binary
        if sibling.is_file():
            return str(sibling)
    found = shutil.which(program.default_binary)
    if found is None:
        ours = Path(sys.executable).parent / program.default_binary
        if ours.is_file():
            return str(ours)
    return found


def help_for(
    program: Program,
    binary: str | None,
    help_file: str | None,
    beside: str | None,
    timeout_s: float,
    option: str = "--binary",
) -> tuple[str | None, str, str | None]:
    if help_file is not None:
        try:
            return Path(help_file).read_text(encoding="utf-8", errors="replace"), help_file, None
        except OSError as e:
            return None, help_file, f"cannot read {help_file}: {e.strerror or e}"
    found = find_binary(program, binary, beside)
    if found is None:
        where = "next to --binary nor on PATH" if beside else "on PATH"
        return None, program.default_binary, (
            f"{program.default_binary} is not {where}; pass its path with {option}"
        )  # fmt: skip
    return run_help(found, program, timeout_s)


def run_check(args: argparse.Namespace) -> tuple[EngineAdapter, list[ProgramResult]]:
    adapter = adapter_for(args.engine)
    results = []
    for i, (program, flags) in enumerate(wanted_flags(adapter)):
        leader = i == 0
        binary = args.binary if leader else args.worker_binary
        help_file = args.help_file if leader else args.worker_help_file
        beside = None if leader else args.binary
        option = "--binary" if leader else "--worker-binary"
        text, source, error = help_for(program, binary, help_file, beside, args.timeout, option)
        results.append(check_program(program, flags, text, source, error))
    return adapter, results


def exit_code(results: Sequence[ProgramResult]) -> int:
    statuses = {r.status for r in results}
    if "missing" in statuses:
        return EXIT_MISSING
    if statuses & {"no-help", "truncated"}:
        return EXIT_NO_HELP
    return EXIT_OK


def as_json(adapter: EngineAdapter, results: Sequence[ProgramResult]) -> dict[str, object]:
    return {
        "engine": adapter.name,
        "pinned_version": adapter.pinned_version,
        "exit": exit_code(results),
        "programs": [
            {
                "program": r.program,
                "help_source": r.source,
                "help_chars": r.help_chars,
                "status": r.status,
                "error": r.error,
                "truncated": r.truncated,
                "flags": [
                    {"flag": f.flag, "used_by": list(f.used_by), "found": f.found} for f in r.flags
                ],
            }
            for r in results
        ],
    }


MARK = {True: "yes", False: "MISSING", None: "?"}


def as_table(adapter: EngineAdapter, results: Sequence[ProgramResult]) -> str:
    lines = [f"engine-check {adapter.name} (adapter written against {adapter.pinned_version})"]
    for r in results:
        lines.append("")
        if r.error is not None:
            lines.append(f"{r.program}: no help: {r.error}")
            lines.append(f"  {len(r.flags)} flags not checked")
            continue
        lines.append(f"{r.program}: help from {r.source} ({r.help_chars:,} characters)")
        width = max([len("FLAG"), *(len(f.flag) for f in r.flags)])
        lines.append(f"  {'FLAG':<{width}}  {'USED BY':<14}  IN HELP")
        for f in r.flags:
            lines.append(f"  {f.flag:<{width}}  {', '.join(f.used_by):<14}  {MARK[f.found]}")
        missing = sum(f.found is False for f in r.flags)
        unknown = sum(f.found is None for f in r.flags)
        if r.truncated is not None:
            lines.append(f"  warning: this help text looks truncated ({r.truncated})")
            if unknown:
                lines.append(
                    f"  {unknown} flag{'s' * (unknown != 1)} not in it cannot be judged ('?'); "
                    "get the complete help and check again"
                )
        elif missing:
            lines.append(f"  {missing} of {len(r.flags)} flags missing from the help")
        else:
            lines.append(f"  all {len(r.flags)} flags present")
    verdict = {
        EXIT_OK: "ok: every flag the project passes is in the engine's help",
        EXIT_MISSING: "MISSING: a launch with these flags would fail",
        EXIT_NO_HELP: "unknown: the engine's complete help could not be read",
    }
    code = exit_code(results)
    lines += ["", f"result: {verdict[code]} (exit {code})"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", required=True, choices=engine_names())
    parser.add_argument(
        "--binary", help="the engine's (leader's) binary; default: its usual name on PATH"
    )
    parser.add_argument(
        "--worker-binary",
        help="for an engine whose workers run another program (llamacpp: ggml-rpc-server); "
        "default: next to --binary, else on PATH",
    )
    parser.add_argument("--help-file", help="check against this saved help text instead")
    parser.add_argument("--worker-help-file", help="saved help text of the workers' program")
    parser.add_argument("--json", action="store_true", help="one JSON report")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds to wait for a --help (default {DEFAULT_TIMEOUT_S:g})",
    )


def main(args: argparse.Namespace) -> int:
    adapter = adapter_for(args.engine)
    if len(adapter.programs) < 2 and (args.worker_binary or args.worker_help_file):
        print(f"error: {adapter.name}'s workers run the leader's program", file=sys.stderr)
        return EXIT_NO_HELP
    adapter, results = run_check(args)
    if args.json:
        print(json.dumps(as_json(adapter, results), sort_keys=True))
    else:
        print(as_table(adapter, results))
    return exit_code(results)
