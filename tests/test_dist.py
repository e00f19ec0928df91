"""What the wheel and the sdist need, checked cheaply from the checkout (docs/install.md).

The whole check (build, install three ways, run) is `scripts/check-dist.sh`, too slow for here;
these catch the mistakes that would make it fail: a data file no package-data pattern ships, a
pattern that ships nothing, a console script or plugin entry point that does not resolve, a
version that is not the distribution's.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import llmgw_twin

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "llmgw_twin"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PATTERNS: list[str] = PYPROJECT["tool"]["setuptools"]["package-data"]["llmgw_twin"]


def _data_files() -> list[str]:
    """Every file in the package that is not Python source or a byte-code cache."""
    return sorted(
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    )


def test_every_data_file_in_the_package_is_shipped_by_a_package_data_pattern() -> None:
    # the code reads these at run time (the flag lists through importlib.resources): one that
    # no pattern names is left out of the sdist and the wheel, and an installed agent lacks it
    data = _data_files()
    assert "py.typed" in data and any(f.startswith("engines/flags/") for f in data)
    unshipped = [f for f in data if not any(fnmatch(f, pat) for pat in PATTERNS)]
    assert unshipped == [], f"add these to [tool.setuptools.package-data]: {unshipped}"


def test_every_package_data_pattern_ships_something() -> None:
    data = _data_files()
    stale = [pat for pat in PATTERNS if not any(fnmatch(f, pat) for f in data)]
    assert stale == [], f"package-data patterns matching no file: {stale}"


def test_the_entry_points_resolve_to_what_pyproject_names() -> None:
    points = {**PYPROJECT["project"]["scripts"]}
    points.update(PYPROJECT["project"]["entry-points"]["pytest11"])
    assert points["llmgw-twin"] == "llmgw_twin.cli:main"
    for name, target in points.items():
        module_name, _, attr = target.partition(":")
        module = importlib.import_module(module_name)
        assert attr == "" or callable(getattr(module, attr)), f"{name} = {target}"


def test_the_version_is_the_installed_distributions_and_pyprojects() -> None:
    version = PYPROJECT["project"]["version"]
    assert importlib.metadata.version("llmgw-twin") == version, "reinstall: pip install -e ."
    assert llmgw_twin.__version__ == version
    beside = Path(sys.executable).parent / "llmgw-twin"
    done = subprocess.run(
        [str(beside), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"llmgw-twin {version}"), done.stderr


def test_a_source_tree_that_was_never_installed_says_its_version_is_unknown(
    tmp_path: Path,
) -> None:
    # the package alone, beside no metadata (src/ holds an egg-info once installed editable),
    # and -S: no site-packages, so no distribution of that name anywhere on the path
    (tmp_path / "llmgw_twin").mkdir()
    shutil.copy(PACKAGE / "__init__.py", tmp_path / "llmgw_twin" / "__init__.py")
    code = "import llmgw_twin; print(llmgw_twin.__file__); print(llmgw_twin.__version__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    where, version = done.stdout.split()
    assert Path(where).is_relative_to(tmp_path)
    assert version == "0+unknown"


def test_the_check_script_parses() -> None:
    done = subprocess.run(
        ["bash", "-n", str(ROOT / "scripts" / "check-dist.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
