"""The flags each adapter emits, against the flags its pinned vLLM / SGLang release defines.

(a) always: every flag of the widest command is in the committed list read from the pinned
    wheel (`src/llmgw_twin/engines/flags/`), and is neither hidden nor deprecated there;
(b) the committed lists are what `scripts/extract_engine_flags.py` reads from the published
    wheels now (downloaded once into `.cache/engine-dists/`, or `$LLMGW_ENGINE_DIST_CACHE`);
    skipped only when the package registry cannot be reached.
The readers themselves are also run on a small hand-written wheel, so their rules are tested
even offline.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from llmgw_twin.engines.registry import adapter_for
from llmgw_twin.programs import engine_check as check

ROOT = Path(__file__).resolve().parent.parent
FLAGS_DIR = ROOT / "src" / "llmgw_twin" / "engines" / "flags"
SCRIPT = ROOT / "scripts" / "extract_engine_flags.py"
CACHE = Path(os.environ.get("LLMGW_ENGINE_DIST_CACHE") or ROOT / ".cache" / "engine-dists")
EXTRACTED = ("vllm", "sglang")
UNREACHABLE = 3


def flag_list(engine: str) -> dict[str, set[str]]:
    """The committed list for the adapter's pinned version: flag -> marks."""
    path = FLAGS_DIR / f"{engine}-{adapter_for(engine).pinned_version}.txt"
    lines = path.read_text(encoding="utf-8").splitlines()
    entries = [line.split() for line in lines if line and not line.startswith("#")]
    names = [e[0] for e in entries]
    assert names == sorted(set(names)), f"{path.name}: not sorted and unique"
    return {e[0]: set(e[1:]) for e in entries}


@pytest.mark.parametrize("engine", EXTRACTED)
def test_every_emitted_flag_is_defined_by_the_pinned_version(engine: str) -> None:
    defined = flag_list(engine)
    for _program, flags in check.wanted_flags(adapter_for(engine)):
        for flag, _roles in flags:
            assert flag in defined, f"{engine} does not define {flag}"
            assert not defined[flag], f"{engine} marks {flag} {defined[flag]}"


def test_the_lists_would_have_caught_the_known_breakages() -> None:
    """Flags vLLM dropped or rejected: a profile or adapter passing them fails this test."""
    vllm = flag_list("vllm")
    assert "--enable-reasoning" not in vllm
    assert "--task" not in vllm
    assert "--enable-log-requests" in vllm
    assert vllm["--no-enable-log-requests"] == {"hidden"}
    assert {"--nnodes", "-n", "--node-rank", "-r", "--headless"} <= set(vllm)
    sglang = flag_list("sglang")
    assert {"--nnodes", "--node-rank", "--dist-init-addr", "--tp-size"} <= set(sglang)
    assert sglang["--enable-dp-attention"] == {"deprecated"}


def test_the_committed_lists_match_the_published_wheels(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--cache", str(CACHE)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode == UNREACHABLE:
        pytest.skip(f"the package registry cannot be reached: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    for engine in EXTRACTED:
        name = f"{engine}-{adapter_for(engine).pinned_version}.txt"
        fresh = (tmp_path / name).read_text(encoding="utf-8")
        assert fresh == (FLAGS_DIR / name).read_text(encoding="utf-8"), (
            f"{name} is stale: rerun scripts/extract_engine_flags.py"
        )


# --- the readers' rules, on a hand-written wheel ----------------------------------------------


def readers() -> tuple[ModuleType, ModuleType]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return (
            importlib.import_module("engine_flags_ast"),
            importlib.import_module("engine_flags_readers"),
        )
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def wheel(tmp_path: Path, files: dict[str, str]) -> Path:
    path = tmp_path / "fake-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


VLLM_CONFIG = """
from typing import TYPE_CHECKING, Literal, Optional
from vllm.config.utils import config
if TYPE_CHECKING:
    from vllm.kinds import Kind
else:
    Kind = str
Mode = Literal["a", "b"]

@config
class Base:
    enforce_eager: bool = False

@config
class ParallelConfig(Base):
    nnodes: int = 1
    enable_thing: bool | None = None
    disable_other: Optional[bool] = None
    token: bool | str | None = None
    mode: Mode = "a"
    kind: Kind = "x"
"""
VLLM_ARGS = """
import argparse
from vllm.config import ParallelConfig
OLD = "--old is deprecated"

class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        kw = get_kwargs(ParallelConfig)
        group = parser.add_argument_group("ParallelConfig")
        group.add_argument("--nnodes", "-n", **kw["nnodes"])
        group.add_argument("--enforce-eager", **kw["enforce_eager"])
        group.add_argument("--enable-thing", **kw["enable_thing"])
        group.add_argument("--disable-other", **{**kw["disable_other"], "default": None})
        group.add_argument("--token", **kw["token"])
        group.add_argument("--mode", **kw["mode"])
        group.add_argument("--kind", **kw["kind"])
        group.add_argument("--old", action="store_true", help=OLD_DEPRECATION_MESSAGE)
        group.add_argument("--secret", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return parser

class AsyncEngineArgs(EngineArgs):
    @staticmethod
    def add_cli_args(parser):
        parser = EngineArgs.add_cli_args(parser)
        parser.add_argument("--enable-log", action=argparse.BooleanOptionalAction)
        return parser
"""
VLLM_CLI = """
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.config import config

@config
class FrontendArgs:
    port: int = 8000
    allow_credentials: bool = False
    middleware: list[str] = None

    @classmethod
    def _customize_cli_kwargs(cls, frontend_kwargs):
        frontend_kwargs["middleware"]["action"] = "append"
        frontend_kwargs["port"]["flags"] = ["-p"]
        return frontend_kwargs

    @classmethod
    def add_cli_args(cls, parser):
        frontend_kwargs = get_kwargs(cls)
        frontend_kwargs = cls._customize_cli_kwargs(frontend_kwargs)
        for key, value in frontend_kwargs.items():
            extra = value.pop("flags", [])
            parser.add_argument(*extra, f"--{key.replace('_', '-')}", **value)
        return parser

def make_arg_parser(parser):
    parser.add_argument("--headless", action="store_true")
    parser = FrontendArgs.add_cli_args(parser)
    parser = AsyncEngineArgs.add_cli_args(parser)
    return parser
"""


def test_vllm_reader_rules(tmp_path: Path) -> None:
    ast_mod, read = readers()
    path = wheel(
        tmp_path,
        {
            "vllm/__init__.py": "",
            "vllm/config/__init__.py": "from vllm.config.parallel import *\n"
            "from vllm.config.utils import config\n",
            "vllm/config/utils.py": "def config(cls):\n    return cls\n",
            "vllm/config/parallel.py": VLLM_CONFIG,
            "vllm/engine/__init__.py": "",
            "vllm/engine/arg_utils.py": VLLM_ARGS,
            "vllm/entrypoints/__init__.py": "",
            "vllm/entrypoints/common/__init__.py": "",
            "vllm/entrypoints/common/cli_args.py": VLLM_CLI,
        },
    )
    with ast_mod.Wheel(path) as source:
        lines = read.read_vllm(source).lines()
    assert lines == [
        "--allow-credentials",  # frontend bool field: --x and --no-x
        "--disable-log",  # --enable-x: --disable-x shown, --no-enable-x hidden
        "--disable-other",  # --disable-x: --enable-x shown, --no-disable-x hidden
        "--disable-thing",
        "--enable-log",
        "--enable-other",
        "--enable-thing",
        "--enforce-eager",  # inherited bool field
        "--headless",
        "--kind",  # an alias of str under `if TYPE_CHECKING: ... else:`
        "--middleware",  # a list, its action overridden: no --no-
        "--mode",
        "--nnodes",
        "--no-allow-credentials",
        "--no-disable-other hidden",
        "--no-enable-log hidden",
        "--no-enable-thing hidden",
        "--no-enforce-eager",
        "--old deprecated",
        "--port",
        "--secret hidden",
        "--token",  # bool | str | None takes an optional value: no --no-
        "-n",
        "-p",
    ]


SGLANG_FIELDS = """
import argparse
import msgspec
from typing import Optional
from sglang.srt.arg_groups.arg_utils import A, Arg

class Parallel(msgspec.Struct):
    _NS_PATH = "parallel"
    nnodes: A[int, "The number of nodes."] = 1
    tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
    hidden_one: A[Optional[str], Arg(help=argparse.SUPPRESS)] = None
    internal: A[int, Arg(help="x", no_cli=True)] = 0
    renamed: A[str, Arg(help="y", cli_name="--other-name")] = ""
    switch: A[bool, Arg(help="z", action=argparse.BooleanOptionalAction)] = True
    plain: int = 0
"""
SGLANG_ARGS = """
import argparse
from sglang.srt.arg_groups.fields.parallel import Parallel

class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--config", type=str)
        parser.add_argument("--old", action=DeprecatedStoreTrueAction, help="Deprecated.")

_INPUT_NAMESPACES = [Parallel]
"""


def test_sglang_reader_rules(tmp_path: Path) -> None:
    ast_mod, read = readers()
    path = wheel(
        tmp_path,
        {
            "sglang/__init__.py": "",
            "sglang/srt/__init__.py": "",
            "sglang/srt/arg_groups/__init__.py": "",
            "sglang/srt/arg_groups/arg_utils.py": "from typing import Annotated\nA = Annotated\n",
            "sglang/srt/arg_groups/fields/__init__.py": "",
            "sglang/srt/arg_groups/fields/parallel.py": SGLANG_FIELDS,
            "sglang/srt/server_args.py": SGLANG_ARGS,
        },
    )
    with ast_mod.Wheel(path) as source:
        lines = read.read_sglang(source).lines()
    assert lines == [
        "--config",
        "--hidden-one hidden",
        "--nnodes",
        "--no-switch",
        "--old deprecated",
        "--other-name",
        "--switch",
        "--tensor-parallel-size",
        "--tp-size",
    ]
