#!/usr/bin/env bash
# The install check: the wheel and the sdist a release would ship, installed the three ways a
# user installs them, each working from a directory outside the checkout (docs/install.md).
#
#   bash scripts/check-dist.sh            (the project venv must exist: make run, or make test)
#
# 1. builds the sdist, and the wheel from that sdist (`python -m build`, isolated: it fetches
#    the setuptools pyproject.toml pins from the package index), from a copy of the checkout's
#    files (tracked, and untracked ones git does not ignore), so nothing is written into it;
# 2. checks the wheel is pure (py3-none-any), holds every module and the package data
#    (py.typed, engines/flags/*.txt) and the console script, and the sdist holds all of that;
# 3. in fresh venvs installs (a) the wheel, (b) the sdist, each with constraints.txt as
#    constraints and dependencies from wheels only (no compiler), and (c) the wheel with pipx
#    (pinned, in a venv of its own; PIPX_HOME and PIPX_BIN_DIR in the temporary directory;
#    with constraints.txt too, so that a new release of an indirect dependency cannot turn CI
#    red: the pins are what the project is tested with);
# 4. for each, from a directory outside the checkout: `llmgw-twin --version` must print the
#    built version, `llmgw-twin run scenarios/node-loss.yaml` must pass, and (a, b) the
#    installed package must be the one imported and find every engine's flag list.
#
# Needs the network only to the package index. Every step is bounded (timeout); the temporary
# directory goes on exit, whatever the outcome. Exit status 0 when every check passed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
PIPX_VERSION=1.18.4
BUILD_TIMEOUT=${BUILD_TIMEOUT:-600}
INSTALL_TIMEOUT=${INSTALL_TIMEOUT:-600}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
SCENARIO=$ROOT/scenarios/node-loss.yaml

if [ ! -x "$PY" ]; then
    echo "error: $PY is missing: create the project venv first (make run)" >&2
    exit 2
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/llmgw-check-dist.XXXXXX")
cleanup() { rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$TMP/logs" "$TMP/elsewhere"
unset PYTHONPATH VIRTUAL_ENV PIP_REQUIRE_VIRTUALENV
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

say() { printf '[check-dist %4ss] %s\n' "$SECONDS" "$*"; }
fail() {
    printf '[check-dist %4ss] FAIL: %s\n' "$SECONDS" "$*" >&2
    exit 1
}
# logged NAME TIMEOUT CMD...: run CMD bounded, its output in a log shown only if it fails
logged() {
    local name=$1 limit=$2
    shift 2
    local log=$TMP/logs/$name.log rc=0
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        tail -n 40 "$log" >&2
        if [ "$rc" = 124 ]; then fail "$name ran past ${limit}s"; fi
        fail "$name exited $rc"
    fi
}

VERSION=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$ROOT/pyproject.toml")
say "llmgw-twin $VERSION, building with $("$PY" -V 2>&1) from $ROOT"

# --- 1. build -------------------------------------------------------------------------------
SRC=$TMP/src
mkdir -p "$SRC"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard) |
        (cd "$ROOT" && xargs -0 -r sh -c 'for f; do [ -f "$f" ] && printf "%s\0" "$f"; done' sh) |
        (cd "$ROOT" && tar --null -T - -cf -) | tar -xf - -C "$SRC"
else
    (cd "$ROOT" && tar --exclude=./.venv --exclude=./.git -cf - .) | tar -xf - -C "$SRC"
fi
say "building the sdist, then the wheel from it (python -m build, isolated)"
logged build "$BUILD_TIMEOUT" "$PY" -m build --outdir "$TMP/dist" "$SRC"
WHEEL=$TMP/dist/llmgw_twin-$VERSION-py3-none-any.whl
SDIST=$TMP/dist/llmgw_twin-$VERSION.tar.gz
[ -f "$WHEEL" ] || fail "no pure wheel built: $(ls "$TMP/dist")"
[ -f "$SDIST" ] || fail "no sdist built: $(ls "$TMP/dist")"
say "built $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB), $(basename "$SDIST") ($(du -k "$SDIST" | cut -f1) KiB)"

# --- 2. what the archives hold ----------------------------------------------------------------
"$PY" - "$SRC" "$WHEEL" "$SDIST" "$VERSION" <<'PYEOF' || fail "the archives are incomplete"
import sys, tarfile, zipfile
from pathlib import Path

src, wheel, sdist, version = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
pkg = src / "src" / "llmgw_twin"
need = {f"llmgw_twin/{p.relative_to(pkg).as_posix()}" for p in pkg.rglob("*.py")}
need |= {"llmgw_twin/py.typed"}
need |= {f"llmgw_twin/engines/flags/{p.name}" for p in (pkg / "engines" / "flags").glob("*.txt")}
problems = []
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    info = f"llmgw_twin-{version}.dist-info"
    problems += [f"wheel lacks {n}" for n in sorted(need - names)]
    tops = {n.split("/", 1)[0] for n in names} - {"llmgw_twin", info}
    problems += [f"wheel holds an unexpected top level {t!r}" for t in sorted(tops)]
    meta = z.read(f"{info}/WHEEL").decode()
    if "Root-Is-Purelib: true" not in meta or "Tag: py3-none-any" not in meta:
        problems.append(f"wheel is not pure py3-none-any:\n{meta}")
    eps = z.read(f"{info}/entry_points.txt").decode()
    if "llmgw-twin = llmgw_twin.cli:main" not in eps:
        problems.append(f"wheel has no llmgw-twin console script:\n{eps}")
with tarfile.open(sdist) as t:
    base = f"llmgw_twin-{version}"
    held = {m.name.removeprefix(base + "/") for m in t.getmembers()}
    want = {"pyproject.toml", "README.md"} | {f"src/{n}" for n in need}
    problems += [f"sdist lacks {n}" for n in sorted(want - held)]
for p in problems:
    print("  " + p, file=sys.stderr)
if problems:
    sys.exit(1)
flags = sorted(n.rsplit("/", 1)[1] for n in need if n.endswith(".txt"))
print(f"  {len(need)} files needed, all in the wheel and the sdist; flag lists: {', '.join(flags)}")
PYEOF
say "the wheel is pure and holds every module, py.typed, the flag lists and the console script"

# --- 3, 4. install and run ------------------------------------------------------------------
# smoke BIN_DIR LABEL: the two commands, from a directory outside the checkout
smoke() {
    local bin=$1 label=$2 out
    out=$(cd "$TMP/elsewhere" && timeout "$RUN_TIMEOUT" "$bin/llmgw-twin" --version) ||
        fail "$label: llmgw-twin --version exited $?"
    [ "$out" = "llmgw-twin $VERSION" ] || fail "$label: --version printed '$out', not 'llmgw-twin $VERSION'"
    out=$(cd "$TMP/elsewhere" && timeout "$RUN_TIMEOUT" "$bin/llmgw-twin" run -q "$SCENARIO") ||
        fail "$label: llmgw-twin run $SCENARIO exited $?: $out"
    case $out in
        PASS\ node-loss:*) ;;
        *) fail "$label: llmgw-twin run printed: $out" ;;
    esac
    say "$label: $out"
}
# installed VENV LABEL: the package imported is the venv's, and it finds its package data
installed() {
    local venv=$1 label=$2
    (cd "$TMP/elsewhere" && timeout "$RUN_TIMEOUT" "$venv/bin/python" - "$venv" <<'PYEOF') ||
import sys
from pathlib import Path

import llmgw_twin
from llmgw_twin.engines.registry import adapter_for, engine_names
from llmgw_twin.service.agent.policy import flag_list_name, known_flags

here = Path(llmgw_twin.__file__).resolve()
if not here.is_relative_to(Path(sys.argv[1]).resolve()):
    sys.exit(f"llmgw_twin imported from {here}, not from the venv")
missing = [
    flag_list_name(a, p)
    for a in map(adapter_for, engine_names())
    for p in a.programs
    if known_flags(flag_list_name(a, p)) is None
]
if missing:
    sys.exit(f"flag lists not found in the installed package: {missing}")
PYEOF
        fail "$label: the installed package is not whole"
}

say "(a) the wheel in a fresh venv, with constraints.txt"
"$PY" -m venv "$TMP/venv-wheel"
logged install-wheel "$INSTALL_TIMEOUT" "$TMP/venv-wheel/bin/python" -m pip install \
    --only-binary=:all: -c "$ROOT/constraints.txt" "$WHEEL"
installed "$TMP/venv-wheel" "(a) wheel"
smoke "$TMP/venv-wheel/bin" "(a) wheel"

say "(b) the sdist in a fresh venv, with constraints.txt (pip builds it, isolated)"
"$PY" -m venv "$TMP/venv-sdist"
logged install-sdist "$INSTALL_TIMEOUT" "$TMP/venv-sdist/bin/python" -m pip install \
    --only-binary=:all: --no-binary=llmgw-twin -c "$ROOT/constraints.txt" "$SDIST"
installed "$TMP/venv-sdist" "(b) sdist"
smoke "$TMP/venv-sdist/bin" "(b) sdist"

say "(c) pipx $PIPX_VERSION install of the wheel"
"$PY" -m venv "$TMP/venv-pipx"
logged install-pipx "$INSTALL_TIMEOUT" "$TMP/venv-pipx/bin/python" -m pip install \
    --only-binary=:all: "pipx==$PIPX_VERSION"
export PIPX_HOME=$TMP/pipx-home PIPX_BIN_DIR=$TMP/pipx-bin PIPX_MAN_DIR=$TMP/pipx-man
logged pipx-install "$INSTALL_TIMEOUT" "$TMP/venv-pipx/bin/pipx" install \
    --pip-args="--only-binary=:all: -c $ROOT/constraints.txt" "$WHEEL"
smoke "$PIPX_BIN_DIR" "(c) pipx"

say "PASS: wheel, sdist and pipx installs of llmgw-twin $VERSION work (${SECONDS}s)"
