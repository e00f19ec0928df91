"""The package boundaries of docs/architecture.md, checked by import-linter on every test run.

`lint-imports` reads the contracts from pyproject.toml: one `layers` contract over every package
(exhaustive, so a new package must be placed in a layer), one inside the service (by process)
and one inside the twin (by job), and forbidden-module contracts for the core, the adapters and
the twin. The second test plants a violation in a copy of the tree and
checks that the contracts catch it, so a contract that silently stopped matching would show.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path, src: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_every_contract_is_kept() -> None:
    result = _lint(ROOT, ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_planted_violation_is_caught(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("*.egg-info"))
    pkg = tmp_path / "src" / "llmgw_twin"

    def plant(path: str, line: str) -> None:
        (pkg / path).write_text((pkg / path).read_text() + f"\n{line}  # noqa\n")

    plant("control/health.py", "import time")
    plant("twin/world/network.py", "import llmgw_twin.service.common.wire")
    plant("service/common/wire.py", "import llmgw_twin.service.controller.app")
    plant("service/agent/shards.py", "import llmgw_twin.service.router.forwarding")
    plant("twin/scenario/model.py", "import llmgw_twin.twin.world.sim")
    (tmp_path / "src" / "llmgw_twin" / "extra").mkdir()
    (tmp_path / "src" / "llmgw_twin" / "extra" / "__init__.py").write_text("")
    result = _lint(tmp_path, tmp_path / "src")
    assert result.returncode != 0
    out = result.stdout
    assert "core does no I/O" in out and "BROKEN" in out
    assert "llmgw_twin.control.health -> time" in out
    assert "llmgw_twin.twin.world.network -> llmgw_twin.service.common.wire" in out
    assert "llmgw_twin.service.common.wire -> llmgw_twin.service.controller.app" in out
    assert "llmgw_twin.service.agent.shards -> llmgw_twin.service.router.forwarding" in out
    assert "llmgw_twin.twin.scenario.model -> llmgw_twin.twin.world.sim" in out
    assert "llmgw_twin.extra" in out  # exhaustive: an unplaced package is an error
