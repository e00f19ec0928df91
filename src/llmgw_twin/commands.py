"""Every command of `llmgw-twin`, grouped as its `--help` lists them, and what the command line
makes of words it does not know.

Role: `cli.py` dispatches; this table says what there is. A command is a path of words
(`ctl gpu clear`) and the module (or `module:Class`) that has its `add_arguments(parser)` and
`main(args) -> int`, imported only when the command runs, so the twin's start-up does not pay
for a web framework. A path that is a prefix of commands (`ctl`, `ctl gpu`) is a namespace:
given alone or with `--help`, it lists what is under it. A word that names nothing is answered
with the nearest that does (difflib), exit 2. An alias (`ALIASES`) still runs but is listed
nowhere: one name per action. The shell completion script (`completion.py`) is made from this
same table.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

PROG = "llmgw-twin"
RUN = ("run",)
"""Built into `cli.py` (no module to import: the twin is the main job)."""


@dataclass(frozen=True, slots=True)
class Command:
    words: tuple[str, ...]
    target: str
    """`module` or `module:Class` with `add_arguments` and `main`; "" for `run`."""
    help: str
    group: str

    @property
    def name(self) -> str:
        return " ".join(self.words)


SIMULATE, TRY, SERVICES, OPERATE, CREDENTIALS, SHELL = (
    "Simulate",
    "Try it on one machine",
    "Run the services",
    "Operate (over the controller's admin API)",
    "Credentials and nodes",
    "Check and complete",
)
GROUPS = (SIMULATE, TRY, SERVICES, OPERATE, CREDENTIALS, SHELL)

_OPS = "llmgw_twin.service.ops"
_LIVE = "llmgw_twin.live"
COMMANDS: tuple[Command, ...] = (
    Command(
        RUN,
        "",
        "run scenario files in the twin (virtual time), or on real processes (--real)",
        SIMULATE,
    ),
    Command(
        ("fuzz",),
        "llmgw_twin.twin.fuzz.cli",
        "run generated scenarios with random faults over a block of seeds (docs/fuzzing.md)",
        SIMULATE,
    ),
    Command(
        ("sweep",),
        "llmgw_twin.twin.sweep.cli",
        "run one scenario over a grid of settings and seeds: detection, false losses, failed "
        "requests side by side (docs/sweep.md)",
        SIMULATE,
    ),
    Command(
        ("calibrate",),
        "llmgw_twin.programs.calibrate",
        "fit the engine model to a running engine (llama-server, vLLM, SGLang, the sim engine) "
        "and report how well it predicts a held-out load (docs/engine-model.md)",
        SIMULATE,
    ),
    Command(
        ("snapshot",),
        f"{_OPS}.snapshot",
        "write a live controller's fleet as a scenario file the twin starts from "
        "(docs/live-twin.md)",
        SIMULATE,
    ),
    Command(
        ("what-if",),
        f"{_LIVE}.whatif",
        "rehearse actions (drain, cordon, a node or fabric down, a scale) on a snapshot or a "
        "live controller's fleet, several seeds, and print what they would do",
        SIMULATE,
    ),
    Command(
        ("replay",),
        f"{_LIVE}.replay",
        "turn a controller's event log (a file or a live controller, a time window) into a "
        "scenario that reproduces the incident",
        SIMULATE,
    ),
    Command(
        ("topology", "import"),
        "llmgw_twin.twin.scenario.topo_import",
        "print a scenario's cluster section (fabric, leaves, spines, NVLink domains) from "
        "ibnetdiscover output or Topograph's node labels (docs/topology.md)",
        SIMULATE,
    ),
    Command(
        ("demo",),
        "llmgw_twin.realmode.demo",
        "a controller, four nodes on two fabrics and a deployment on this machine; "
        "prints what to try",
        TRY,
    ),
    Command(("controller",), "llmgw_twin.service.controller.main", "the controller", SERVICES),
    Command(("agent",), "llmgw_twin.service.agent.main", "a node agent", SERVICES),
    Command(
        ("router",),
        "llmgw_twin.service.router.main",
        "an OpenAI-compatible router that follows the controller's routing feed",
        SERVICES,
    ),
    Command(
        ("sidecar",),
        "llmgw_twin.service.agent.sidecar",
        "a shard's sidecar (the agent starts it)",
        SERVICES,
    ),
    Command(
        ("sim-engine",),
        "llmgw_twin.programs.sim_server",
        "the sim engine: one shard, no GPU",
        SERVICES,
    ),
    Command(
        ("ctl", "status"),
        f"{_OPS}.ctl_status:Status",
        "the fleet: fabrics (or every node), replicas per model, pending replicas and why",
        OPERATE,
    ),
    Command(
        ("ctl", "explain"),
        f"{_OPS}.ctl_fleet:Explain",
        "why a replica is where it is, or why it is pending and where it could go",
        OPERATE,
    ),
    Command(
        ("ctl", "cordon"),
        f"{_LIVE}.dryrun:Cordon",
        "take a node out of placement (what it runs keeps running; --dry-run: rehearse it)",
        OPERATE,
    ),
    Command(
        ("ctl", "uncordon"),
        f"{_OPS}.ctl_fleet:Uncordon",
        "put a cordoned node back into placement (ends a drain)",
        OPERATE,
    ),
    Command(
        ("ctl", "drain"),
        f"{_LIVE}.dryrun:Drain",
        "move every replica off a node, make-before-break, and keep it cordoned "
        "(--dry-run: rehearse it)",
        OPERATE,
    ),
    Command(
        ("ctl", "deployment", "set"),
        f"{_LIVE}.dryrun:SetDeployment",
        "scale a deployment or move it to another profile (--dry-run: rehearse it first)",
        OPERATE,
    ),
    Command(
        ("ctl", "deployment", "delete"),
        f"{_LIVE}.dryrun:DeleteDeployment",
        "delete a deployment: its replicas are retired",
        OPERATE,
    ),
    Command(
        ("ctl", "gpu", "clear"),
        f"{_OPS}.ctl:ClearGpu",
        "clear a GPU the controller holds failed (it was repaired or replaced)",
        OPERATE,
    ),
    Command(
        ("ctl", "clear-quarantine"),
        f"{_OPS}.ctl:ClearQuarantine",
        "lift a node's quarantine (for one profile, or all)",
        OPERATE,
    ),
    Command(
        ("ctl", "new-token"),
        f"{_OPS}.ctl:NewToken",
        "print a fresh admin token or API key and the hash its config lists",
        CREDENTIALS,
    ),
    Command(
        ("ctl", "onboard"),
        f"{_OPS}.ctl:Onboard",
        "issue or rotate a node's credential and write its agent's credential file",
        CREDENTIALS,
    ),
    Command(("ctl", "revoke"), f"{_OPS}.ctl:Revoke", "revoke a node's credential", CREDENTIALS),
    Command(
        ("onboard",),
        f"{_OPS}.onboard",
        "write a node's agent config, credential, fake sysfs root and systemd units",
        CREDENTIALS,
    ),
    Command(
        ("ctl", "engine-check"),
        "llmgw_twin.programs.engine_check",
        "check every flag the project can emit against an engine's --help",
        SHELL,
    ),
    Command(
        ("completion",),
        "llmgw_twin.completion",
        "print a shell completion script (bash or zsh)",
        SHELL,
    ),
)
ALIASES: dict[tuple[str, ...], tuple[str, ...]] = {("ctl", "clear-gpu"): ("ctl", "gpu", "clear")}
"""Old names that still run, listed nowhere: alias -> the command's one name."""
NAMESPACES: dict[tuple[str, ...], str] = {
    ("ctl",): "the operator's commands, each one bounded call to the controller's admin API "
    "(--controller, the admin token from --token-file or $LLMGW_TWIN_TOKEN)",
    ("ctl", "gpu"): "GPUs the controller holds failed",
    ("ctl", "deployment"): "deployments",
}
BY_WORDS = {c.words: c for c in COMMANDS}


def find(args: list[str]) -> tuple[Command, list[str]] | None:
    """The command `args` start with (an alias runs its command) and the rest of the words."""
    for n in (3, 2, 1):
        words = tuple(args[:n])
        if len(words) < n:
            continue
        words = ALIASES.get(words, words)
        if words in BY_WORDS:
            return BY_WORDS[words], args[n:]
    return None


def children(prefix: tuple[str, ...]) -> list[str]:
    """The next words under `prefix`, in the table's order (aliases not among them)."""
    out: list[str] = []
    for c in COMMANDS:
        if c.words[: len(prefix)] == prefix and len(c.words) > len(prefix):
            word = c.words[len(prefix)]
            if word not in out:
                out.append(word)
    return out


def is_namespace(prefix: tuple[str, ...]) -> bool:
    return bool(prefix) and bool(children(prefix)) and prefix not in BY_WORDS


def suggest(prefix: tuple[str, ...], word: str) -> str | None:
    """The known word nearest `word` under `prefix` (aliases included), or None."""
    known = children(prefix) + [a[len(prefix)] for a in ALIASES if a[: len(prefix)] == prefix]
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    if close:
        return close[0]
    # a word typed whole but too short for difflib's ratio (`stat` for `status`)
    starts = [k for k in known if k.startswith(word) or word.startswith(k)]
    return starts[0] if len(starts) == 1 else None


def _rows(commands: list[tuple[str, str]], width: int) -> list[str]:
    """One line per command: its name, then what it does."""
    return [f"  {name.ljust(width)}  {text}" for name, text in commands]


def _grouped(prefix: tuple[str, ...]) -> list[str]:
    """The commands under `prefix` by group, one line each, their texts in one column."""
    under = [c for c in COMMANDS if c.words[: len(prefix)] == prefix and c.words != prefix]
    width = max(len(" ".join(c.words[len(prefix) :])) for c in under)
    width = max(width, len("-h, --help"))
    lines: list[str] = []
    for group in GROUPS:
        rows = [(" ".join(c.words[len(prefix) :]), c.help) for c in under if c.group == group]
        if rows:
            lines += ["", f"{group}:", *_rows(rows, width)]
    return lines


def top_help(version: str) -> str:
    lines = [
        f"usage: {PROG} COMMAND [ARGS...]",
        "",
        f"A control plane for LLM replicas on GPU fabrics, and its twin (llmgw-twin {version}).",
        *_grouped(()),
        "",
        "options:",
        *_rows(
            [("-h, --help", "this list"), ("--version", "the version, and exit")],
            max(len(c.name) for c in COMMANDS),
        ),
        "",
        f"`{PROG} COMMAND --help` shows a command's options; `{PROG} completion bash` (or zsh) "
        "prints a completion script for your shell.",
    ]
    return "\n".join(lines)


def namespace_help(prefix: tuple[str, ...]) -> str:
    name = " ".join(prefix)
    lines = [f"usage: {PROG} {name} COMMAND [ARGS...]", "", f"{name}: {NAMESPACES[prefix]}"]
    lines += _grouped(prefix)
    lines += ["", f"`{PROG} {name} COMMAND --help` shows a command's options."]
    return "\n".join(lines)


def unknown(args: list[str]) -> tuple[str, ...] | str:
    """Why `args` name no command: the namespace they stop at (to list), or the error line,
    with the nearest known word when there is one."""
    prefix: tuple[str, ...] = ()
    for word in args:
        if word.startswith("-"):
            break
        if word not in children(prefix) and (*prefix, word) not in ALIASES:
            where = f"{PROG} {' '.join(prefix)}".rstrip()
            near = suggest(prefix, word)
            hint = f"; did you mean `{where} {near}`?" if near else ""
            listing = f"`{where} --help` lists them"
            return f"{where}: unknown command {word!r}{hint} ({listing})"
        prefix = (*prefix, word)
    return prefix
