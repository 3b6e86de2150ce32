"""The codebase checks its own style: ruff's lint and format and mypy, as configured in
pyproject.toml, pass on the tree (the README's test command runs them through pytest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
TREE = ["planner", "tests", "scripts"]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "argv", [["ruff", "check", *TREE], ["ruff", "format", "--check", *TREE]], ids=["ruff-lint", "ruff-format"]
)
def test_ruff(argv):
    result = _run(*argv)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_on_the_core():
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
