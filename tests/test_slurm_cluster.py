"""README's CPU pipeline through `--profile profiles/slurm` on a real one-node SLURM cluster (opt-in).

Needs root, apt-get and snakemake-executor-plugin-slurm; it installs slurm-wlm + munge and starts the
daemons, so it runs only when asked: OPPERF_SLURM_TEST=1 python -m pytest -q tests/test_slurm_cluster.py
(about 8 minutes on 2 cores: a local reference run, then the SLURM run).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "slurm" / "run_pipeline_on_localhost_slurm.sh"

pytestmark = pytest.mark.skipif(os.environ.get("OPPERF_SLURM_TEST") != "1",
                                reason="real SLURM cluster test: set OPPERF_SLURM_TEST=1 (root, apt-get)")


def test_readme_pipeline_through_profiles_slurm_equals_a_local_run(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], env=env, capture_output=True, text=True,
                            timeout=3600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "OK: every job ran through SLURM and the databases equal the local run's" in output
