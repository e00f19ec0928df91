"""`llmgw-twin ctl engine-check` on saved help texts and fake engine binaries: no engine needed."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from llmgw_twin import cli
from llmgw_twin.engines.base import Program
from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.programs import engine_check as check


def full_help(program: Program, flags: Iterable[str]) -> str:
    """A help text shaped like the program's complete one: its sections, in order, each with
    options, the given flags in the first, padded to more than its usual minimum length."""
    sections = program.help_sections or ("options:",)
    filler = program.min_help_chars // (60 * len(sections)) + 5
    lines = [f"usage: {check.program_name(program)} [options]", ""]
    for i, section in enumerate(sections):
        lines.append(section)
        if i == 0:
            lines += [f"  {flag} VALUE{' ' * 20}what {flag} sets" for flag in flags]
        lines += [
            f"  --setting-{i}-{k} N{' ' * 20}a setting this check ignores" for k in range(filler)
        ]
        lines.append("")
    text = "\n".join(lines) + "\n"
    assert check.truncation(program, text) is None
    return text


def wanted(engine: str, index: int = 0) -> list[str]:
    return [flag for flag, _roles in check.wanted_flags(adapter_for(engine))[index][1]]


def program(engine: str, index: int = 0) -> Program:
    return adapter_for(engine).programs[index]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    code = check.main(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def fake_binary(tmp_path: Path, name: str, body: str) -> str:
    """An executable Python script standing in for an engine binary."""
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport sys\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def test_a_flag_matches_on_a_word_boundary() -> None:
    assert check.flag_in_help("--port", "  --port PORT   port to listen on\n")
    assert check.flag_in_help("--port", "  --host HOST, --port=PORT\n")
    assert check.flag_in_help("--port", "see --port.")
    assert not check.flag_in_help("--port", "  --port-range LO-HI   ports to try\n")
    assert not check.flag_in_help("--port", "  --no-port   do not listen\n")
    assert not check.flag_in_help("--port", "  --grpc_port N\n")
    assert not check.flag_in_help("--config", "  --config.key VALUE\n")
    assert not check.flag_in_help("-tp", "  --max-tp N\n")


def test_port_range_does_not_satisfy_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--port-range" if f == "--port" else f for f in wanted("vllm")]
    help_file = write(tmp_path, "vllm-help.txt", full_help(program("vllm"), flags))

    code, out = run(capsys, "--engine", "vllm", "--help-file", help_file)
    assert code == 1
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  --")}
    assert rows["--port"].endswith("MISSING")
    assert "1 of" in out and "flags missing" in out

    code, out = run(capsys, "--engine", "vllm", "--help-file", help_file, "--json")
    report = json.loads(out)
    assert (code, report["exit"]) == (1, 1)
    found = {f["flag"]: f["found"] for f in report["programs"][0]["flags"]}
    assert found.pop("--port") is False
    assert set(found.values()) == {True}


def test_truncated_help_gives_a_warning_not_missing_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    complete = full_help(program("sglang"), wanted("sglang"))
    # cut mid-way through the listing of the flags the project passes
    cut = complete[: complete.index("--host VALUE") + 3]
    help_file = write(tmp_path, "sglang-help.txt", cut)

    code, out = run(capsys, "--engine", "sglang", "--help-file", help_file)
    assert code == 2
    assert "warning: this help text looks truncated (cut short" in out
    assert "MISSING" not in out
    assert "cannot be judged" in out

    code, out = run(capsys, "--engine", "sglang", "--help-file", help_file, "--json")
    flags = json.loads(out)["programs"][0]["flags"]
    assert {f["flag"]: f["found"] for f in flags}["--port"] is None
    assert not any(f["found"] is False for f in flags)


def test_help_ending_before_a_section_is_truncated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    complete = full_help(program("vllm"), wanted("vllm"))
    more = "  --another-setting N                    a setting this check ignores\n"
    cut = complete[: complete.index("VllmConfig:")] + more * 400
    # long enough, but the last group and the epilog never came
    assert len(cut) > program("vllm").min_help_chars
    code, out = run(capsys, "--engine", "vllm", "--help-file", write(tmp_path, "h", cut))
    assert "ends before its 'VllmConfig:' section" in out
    assert "MISSING" not in out
    assert code == 0  # every flag was found before the cut


def test_complete_help_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    help_file = write(tmp_path, "h", full_help(program("sglang"), wanted("sglang")))
    code, out = run(capsys, "--engine", "sglang", "--help-file", help_file)
    assert code == 0
    assert "result: ok" in out
    assert "warning" not in out


def test_binary_path_runs_its_help_and_finds_the_rpc_server_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a colleague's build is checked: `--binary build/bin/llama-server`; the RPC server,
    which prints its usage to stderr, is found next to it."""
    server_help = write(tmp_path, "server.txt", full_help(program("llamacpp"), wanted("llamacpp")))
    rpc_help = write(
        tmp_path, "rpc.txt", full_help(program("llamacpp", 1), ["-H", "--host", "-p", "--port"])
    )
    bin_dir = tmp_path / "build" / "bin"
    bin_dir.mkdir(parents=True)
    server = fake_binary(
        bin_dir,
        "llama-server",
        f"assert sys.argv[1:] == ['--help'], sys.argv\nprint(open({server_help!r}).read(), end='')",
    )
    fake_binary(
        bin_dir,
        "ggml-rpc-server",
        f"sys.stderr.write(open({rpc_help!r}).read())",
    )
    code, out = run(capsys, "--engine", "llamacpp", "--binary", server)
    assert code == 0, out
    assert f"llama-server: help from {server} --help" in out
    assert f"ggml-rpc-server: help from {bin_dir / 'ggml-rpc-server'} --help" in out


def test_vllm_is_asked_for_its_whole_help(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vllm serve --help` prints only a summary of groups; the check needs `--help=all`."""
    help_file = write(tmp_path, "all.txt", full_help(program("vllm"), wanted("vllm")))
    body = (
        "if sys.argv[1:] == ['serve', '--help=all']:\n"
        f"    print(open({help_file!r}).read(), end='')\n"
        "else:\n"
        "    print('usage: vllm serve [model_tag] [options]\\nSearch by using --help=<group>')"
    )
    code, out = run(capsys, "--engine", "vllm", "--binary", fake_binary(tmp_path, "vllm", body))
    assert code == 0, out


def test_a_failing_binary_gives_no_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = "sys.stderr.write('ModuleNotFoundError: No module named torch\\n')\nsys.exit(1)"
    code, out = run(capsys, "--engine", "vllm", "--binary", fake_binary(tmp_path, "vllm", body))
    assert code == 2
    assert "failed (exit 1): ModuleNotFoundError: No module named torch" in out
    assert "MISSING" not in out


def test_a_missing_binary_gives_no_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--engine", "sglang", "--binary", str(tmp_path / "nowhere" / "sglang"))
    assert code == 2
    assert "cannot run" in out


def test_missing_beats_no_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A flag missing from the server's help fails the check even when the RPC server's help
    could not be had: that launch would fail either way."""
    flags = [f for f in wanted("llamacpp") if f != "--rpc"]
    help_file = write(tmp_path, "h", full_help(program("llamacpp"), flags))
    code, out = run(
        capsys,
        "--engine", "llamacpp",
        "--help-file", help_file,
        "--worker-binary", str(tmp_path / "no-rpc-server"),
    )  # fmt: skip
    assert code == 1
    assert "ggml-rpc-server: no help" in out


def test_worker_options_need_an_engine_with_a_worker_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = run(capsys, "--engine", "vllm", "--worker-help-file", str(tmp_path / "x"))
    assert code == 2


def test_reached_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    help_file = write(tmp_path, "h", full_help(program("sglang"), wanted("sglang")))
    code = cli.main(
        ["ctl", "engine-check", "--engine", "sglang", "--help-file", help_file, "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert (code, report["engine"], report["pinned_version"]) == (0, "sglang", "0.5.23")


def test_every_program_of_the_widest_launch_is_checked() -> None:
    per_program = check.wanted_flags(adapter_for("llamacpp"))
    assert [check.program_name(p) for p, _ in per_program] == ["llama-server", "ggml-rpc-server"]
    server, rpc = (dict(flags) for _, flags in per_program)
    assert server["--rpc"] == ("leader",)
    assert rpc == {"--host": ("worker",), "--port": ("worker",)}
    vllm = dict(check.wanted_flags(adapter_for("vllm"))[0][1])
    assert vllm["--headless"] == ("worker",)
    assert vllm["--nnodes"] == ("leader", "worker")


def test_the_sim_adapter_matches_the_sim_engine(capsys: pytest.CaptureFixture[str]) -> None:
    """The real thing: the runnable sim engine's own --help knows every flag its adapter passes."""
    binary = Path(sys.executable).parent / "llmgw-twin"
    code, out = run(capsys, "--engine", "sim", "--binary", str(binary))
    assert code == 0, out
