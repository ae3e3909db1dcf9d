"""Shared fixtures: the real Ascend fixture, the repository root, and PATH so workflow jobs find this Python."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Workflow jobs run `python scripts/...`: make that the interpreter running the tests.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

ASCEND_FIXTURE = REPO / "resources" / "profiles" / "A3_vllm0.18.0_torch2.9.0_cann8.5" / "kernel_details.csv"


@pytest.fixture
def ascend_fixture() -> Path:
    return ASCEND_FIXTURE


@pytest.fixture
def repo() -> Path:
    return REPO
