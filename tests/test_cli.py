"""The command line: timeline, JSON report, exit codes 0/1/2, several files in one call."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.fake_fleet import running_fleet
from llmgw_twin import commands
from llmgw_twin.cli import main

ROOT = Path(__file__).resolve().parent.parent
NODE_LOSS = str(ROOT / "scenarios" / "node-loss.yaml")

FAILING = """\
name: too-hopeful
duration: 2m
cluster:
  fabrics:
    ib-a: [node01, node02]
profiles:
  p:
    engine: sim
    nodes: 2
    gpus_per_node: 4
    load_time: 20s
    model: /m
deployments:
  - {model: m, profile: p, replicas: 1}
expect:
  - event: replica.ready
    within: [start, 10s]
"""


def test_run_prints_a_timeline_and_a_passing_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", NODE_LOSS]) == 0
    out = capsys.readouterr().out
    assert "node.lost" in out and "node=node02" in out
    assert "$ llmgw-twin sim-engine --model /models/llama-70b" in out
    assert out.strip().splitlines()[-1].startswith("PASS node-loss: 4/4 expectations")


def test_json_report_has_the_documented_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", NODE_LOSS]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("scenario", "seed", "passed", "trace_sha256", "virtual_ms", "wall_ms", "events"):
        assert key in report
    assert report["scenario"] == "node-loss" and report["seed"] == 1 and report["passed"]
    assert report["virtual_ms"] == 360_000
    lost = [e for e in report["events"] if e["kind"] == "node.lost"]
    assert lost[0]["node"] == "node02" and 170_000 <= lost[0]["t_ms"] <= 181_000
    assert all(e["passed"] and e["message"] for e in report["expectations"])
    assert {i["name"] for i in report["invariants"]} == {
        "single_fabric",
        "gpu_exclusive",
        "ready_is_whole",
        "routes_to_ready",
        "no_orphans",
        "one_epoch_acts",
    }


def test_failed_expectation_exits_1_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "too-hopeful.yaml"
    path.write_text(FAILING)
    assert main(["run", str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  line 16" in out
    assert "none in [0.000s, 10.000s]; nearest at 22.000s" in out
    assert out.strip().splitlines()[-1].startswith("FAIL too-hopeful: 0/1 expectations")


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("name: x\nduration: 1m\ncluster: {fabrics: {f: [a]}\n", ":4:1:", "invalid YAML"),
        ("name: x\nduration: 1m\nbogus: 1\ncluster: {fabrics: {f: [a]}}\n", ":3:1:", "bogus"),
        ("name: x\nduration: 1 minute\ncluster: {fabrics: {f: [a]}}\n", ":2:11:", "duration"),
        (
            "name: x\nduration: 1m\ncluster: {fabrics: {f: [a]}}\nfaults:\n"
            "  - {at: 10s, kill_node: nope}\n",
            ":5:",
            "nope",
        ),
    ],
    ids=["bad-yaml", "unknown-key", "bad-duration", "unknown-node"],
)
def test_invalid_scenario_exits_2_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str, what: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}{where}" in err
    assert what in err
    assert "Traceback" not in err


def test_several_files_worst_exit_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [\n")
    failing = tmp_path / "failing.yaml"
    failing.write_text(FAILING)
    assert main(["run", "-q", NODE_LOSS, str(failing)]) == 1
    assert main(["run", "-q", NODE_LOSS, str(bad), str(failing)]) == 2
    out = capsys.readouterr().out
    assert out.count("PASS node-loss") == 2 and out.count("FAIL too-hopeful") == 2


def test_installed_console_script_runs_the_main_job() -> None:
    beside = Path(sys.executable).parent / "llmgw-twin"  # the venv's, else the one on PATH
    exe = str(beside) if beside.exists() else shutil.which("llmgw-twin")
    assert exe is not None, "llmgw-twin is not installed"
    done = subprocess.run(
        [exe, "run", "-q", NODE_LOSS], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("PASS node-loss")


# --- the command line's shape: help, namespaces, typos, aliases, output, completion ----------


def name_of(line: str) -> str:
    """The command a help line lists: the words before the first run of two spaces."""
    return re.split(r"\s{2,}", line.strip())[0]


def test_top_level_help_lists_every_command_grouped_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for group in commands.GROUPS:
        assert f"{group}:" in lines, group
    for c in commands.COMMANDS:
        rows = [line for line in lines if name_of(line) == c.name]
        assert len(rows) == 1, (c.name, out)
        assert rows[0].rstrip().endswith(c.help), rows[0]
    assert "clear-gpu" not in out, "an alias is listed nowhere"
    assert "invalid choice" not in out
    assert main(["--version"]) == 0
    assert re.fullmatch(r"llmgw-twin \S+\n", capsys.readouterr().out)
    assert main([]) == 2, "no command: the same list, and exit 2"
    assert capsys.readouterr().out == out


@pytest.mark.parametrize(
    ("argv", "under"),
    [(["ctl"], ("ctl",)), (["ctl", "--help"], ("ctl",)), (["ctl", "gpu"], ("ctl", "gpu"))],
)
def test_a_namespace_lists_its_subcommands(
    argv: list[str], under: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "invalid choice" not in out + err
    for c in commands.COMMANDS:
        if c.words[: len(under)] == under:
            sub = " ".join(c.words[len(under) :])
            assert any(name_of(line) == sub for line in out.splitlines()), sub
    assert f"llmgw-twin {' '.join(under)} COMMAND" in out


@pytest.mark.parametrize(
    ("argv", "nearest"),
    [
        (["controler"], "llmgw-twin controller"),
        (["ctl", "cordn", "node01"], "llmgw-twin ctl cordon"),
        (["ctl", "stauts"], "llmgw-twin ctl status"),
        (["ctl", "gpu", "claer", "node01", "1"], "llmgw-twin ctl gpu clear"),
    ],
)
def test_a_typo_is_answered_with_the_nearest_command_and_exit_2(
    argv: list[str], nearest: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"did you mean `{nearest}`?" in err, err
    assert "invalid choice" not in err


def test_an_unknown_word_with_nothing_near_still_says_where_the_list_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["xyzzy"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'xyzzy'" in err and "`llmgw-twin --help` lists them" in err
    assert "did you mean" not in err
    assert main(["--bogus"]) == 2
    assert "unknown option '--bogus'" in capsys.readouterr().err


def test_one_name_per_action_the_old_name_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert commands.find(["ctl", "clear-gpu", "n", "1"]) == (
        commands.BY_WORDS[("ctl", "gpu", "clear")],
        ["n", "1"],
    )
    assert main(["ctl", "clear-gpu", "--help"]) == 0
    assert "usage: llmgw-twin ctl gpu clear" in capsys.readouterr().out


def test_every_ctl_read_takes_output_json_yaml_table(capsys: pytest.CaptureFixture[str]) -> None:
    reads = [("ctl", "status"), ("ctl", "explain")]
    for words in reads:
        assert main([*words, "--help"]) == 0
        out = capsys.readouterr().out
        assert "-o {table,json,yaml}, --output {table,json,yaml}" in out, out


def test_help_into_a_closed_pipe_ends_quietly() -> None:
    """`llmgw-twin --help | head -1`, with `head` gone before the help is written (the pipe's
    reading end closed first, so every write fails): no BrokenPipeError traceback, no
    'Exception ignored', exit 141 as a shell reports a SIGPIPE."""
    for argv in (
        ["--help"],
        ["ctl", "--help"],
        ["ctl", "status", "--help"],
        ["completion", "bash"],
    ):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "llmgw_twin.cli", *argv],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            os.close(write_end)
        assert done.stderr == "", (argv, done.stderr)
        assert done.returncode in (0, 141), (argv, done.returncode)


def _complete(script: Path, *words: str) -> list[str]:
    """What the bash completion script offers after `llmgw-twin WORDS...` (the last word being
    the one under the cursor)."""
    quoted = " ".join(f"'{w}'" for w in ("llmgw-twin", *words))
    program = (
        f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; _llmgw_twin; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, timeout=30, check=True
    )
    return [w for w in done.stdout.splitlines() if w]


def test_completion_bash_completes_commands_subcommands_options_and_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "llmgw-twin.bash"
    script.write_text(capsys.readouterr().out)
    assert set(_complete(script, "")) == set(commands.children(()))
    assert _complete(script, "con") == ["controller"]
    assert _complete(script, "ctl", "gpu", "") == ["clear"]
    assert _complete(script, "ctl", "dr") == ["drain"]
    assert _complete(script, "ctl", "status", "-o", "") == ["table", "json", "yaml"]
    assert "--tolerance" in _complete(script, "run", "--t")
    assert "--wait" in _complete(script, "ctl", "drain", "node01", "--")
    assert "clear-gpu" not in _complete(script, "ctl", "")
    assert main(["completion", "zsh"]) == 0
    zsh = capsys.readouterr().out
    assert "bashcompinit" in zsh and "complete -o default -F _llmgw_twin llmgw-twin" in zsh


def test_ctl_refusals_name_where_the_admin_token_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No token: the hint names $LLMGW_TWIN_TOKEN and --token-file; a wrong one: where it was
    read and where the controller lists its admin tokens; a node's: that ctl needs an admin's.
    A read answers in the form -o asks for."""
    with running_fleet(tmp_path) as fleet:
        fleet.add_node("node01", "ib-a", 4)
        url = ["--controller", fleet.url]
        monkeypatch.delenv("LLMGW_TWIN_TOKEN", raising=False)
        assert main(["ctl", "status", *url]) == 1
        err = capsys.readouterr().err
        assert "refused (401)" in err and "no admin token was sent" in err
        assert "set $LLMGW_TWIN_TOKEN, or pass --token-file FILE" in err

        monkeypatch.setenv("LLMGW_TWIN_TOKEN", "lgw_not-a-token-of-this-controller")
        assert main(["ctl", "cordon", "node01", *url]) == 1
        err = capsys.readouterr().err
        assert "the token in $LLMGW_TWIN_TOKEN is not an admin token" in err
        assert "auth.admin_tokens" in err

        token_file = tmp_path / "node.token"
        token_file.write_text(fleet.agents.nodes["node01"][2])  # a node's credential
        assert main(["ctl", "status", "--token-file", str(token_file), *url]) == 1
        err = capsys.readouterr().err
        assert "refused (403)" in err
        assert f"the token in --token-file {token_file} is a credential of another kind" in err

        monkeypatch.setenv("LLMGW_TWIN_TOKEN", fleet.admin)
        assert main(["ctl", "status", "-o", "yaml", *url]) == 0
        as_yaml = yaml.safe_load(capsys.readouterr().out)
        assert main(["ctl", "status", "-o", "json", *url]) == 0
        as_json = json.loads(capsys.readouterr().out)
        assert [n["node"] for n in as_yaml["nodes"]] == [n["node"] for n in as_json["nodes"]]
        assert as_json["nodes"][0]["node"] == "node01"
        assert main(["ctl", "status", "--json", *url]) == 0  # the old spelling of -o json
        assert json.loads(capsys.readouterr().out)["nodes"][0]["node"] == "node01"
        assert main(["ctl", "status", *url]) == 0
        assert capsys.readouterr().out.startswith("1 nodes in 1 fabrics")
