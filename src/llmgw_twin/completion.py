"""`llmgw-twin completion bash|zsh`: a shell completion script, made from the command table.

Role: the script completes command words (`ctl` then `status`, `gpu` then `clear`), each
command's options (read from its own argparse parser, so they are always the ones it takes),
and the choices of an option that has them (`-o table|json|yaml`); anything else falls back to
file names. It is plain bash; zsh runs it through `bashcompinit`. Nothing outside the project is
needed (no argcomplete): the script holds the whole tree, so completing runs no Python.

    source <(llmgw-twin completion bash)     # in ~/.bashrc; or write it, once, to
                                             # ~/.local/share/bash-completion/completions/llmgw-twin
    source <(llmgw-twin completion zsh)      # in ~/.zshrc
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import shlex
from typing import Any

from llmgw_twin import commands


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")


def _parser_of(command: commands.Command) -> argparse.ArgumentParser | None:
    if command.words == commands.RUN:
        from llmgw_twin.cli import _run_parser  # the layer above: imported only when asked

        return _run_parser()
    module_name, _, attr = command.target.partition(":")
    try:
        module: Any = importlib.import_module(module_name)
    except ImportError:  # an optional dependency missing: its words still complete
        return None
    if attr:
        module = getattr(module, attr)
    parser = argparse.ArgumentParser(prog=command.name)
    with contextlib.suppress(Exception):
        module.add_arguments(parser)
    return parser


def _options(parser: argparse.ArgumentParser | None) -> tuple[list[str], dict[str, list[str]]]:
    """The parser's visible option strings, and the choices of those that have them."""
    if parser is None:
        return [], {}
    opts: list[str] = []
    choices: dict[str, list[str]] = {}
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        opts += action.option_strings
        if action.option_strings and action.choices is not None:
            for o in action.option_strings:
                choices[o] = [str(c) for c in action.choices]
    return opts, choices


def _case(entries: dict[str, list[str]]) -> str:
    lines = [
        f"        {shlex.quote(k)}) echo {shlex.quote(' '.join(v))} ;;" for k, v in entries.items()
    ]
    return "\n".join(lines)


def bash_script() -> str:
    words: dict[str, list[str]] = {"": commands.children(())}
    for prefix in sorted({c.words[:n] for c in commands.COMMANDS for n in range(1, len(c.words))}):
        words[" ".join(prefix)] = commands.children(prefix)
    options: dict[str, list[str]] = {}
    values: dict[str, list[str]] = {}
    for c in commands.COMMANDS:
        opts, choices = _options(_parser_of(c))
        options[c.name] = opts
        for o, cs in choices.items():
            values[f"{c.name} {o}"] = cs
    fn = "_llmgw_twin"
    return f"""# llmgw-twin's completion (bash; zsh through bashcompinit): llmgw-twin completion -h
{fn}_words() {{
    case "$1" in
{_case(words)}
    esac
}}
{fn}_options() {{
    case "$1" in
{_case(options)}
    esac
}}
{fn}_values() {{
    case "$1" in
{_case(values)}
    esac
}}
{fn}() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} path="" i w
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${{COMP_WORDS[i]}}
        case " $({fn}_words "$path") " in
            *" $w "*) path=${{path:+$path }}$w ;;
        esac
    done
    local choices
    choices=$({fn}_values "$path $prev")
    if [[ -n $choices ]]; then
        COMPREPLY=($(compgen -W "$choices" -- "$cur"))
    elif [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$({fn}_options "$path")" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "$({fn}_words "$path")" -- "$cur"))
    fi
}}
complete -o default -F {fn} llmgw-twin
"""


def zsh_script() -> str:
    return (
        "# llmgw-twin completion for zsh: the bash script, through bashcompinit\n"
        "autoload -U +X compinit && compinit\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash_script()
    )


def main(args: argparse.Namespace) -> int:
    print(bash_script() if args.shell == "bash" else zsh_script(), end="")
    return 0
