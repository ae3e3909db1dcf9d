"""The project's own lint and format checks, so CI (which runs exactly the README's test command) enforces them:
ruff over the Python code and snakefmt over the Snakefile and rules, both configured in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tool(name: str) -> str:
    """The tool installed beside this interpreter (the test extra installs both), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def test_ruff_is_clean():
    result = subprocess.run([tool("ruff"), "check", "--output-format", "concise", "."], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_snakefile_and_rules_are_snakefmt_formatted():
    result = subprocess.run([tool("snakefmt"), "--check", "Snakefile", "rules"], cwd=REPO, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
