"""Moving code between modules changes no report, binary or numeric result: a fixed set of
``--json`` runs (every family, the graph, torch and JAX front ends, fusion off, mixed seams, a
translated binary; binaries by digest, assembly as text) is compared field by field with the
recorded ones, host wall-clock readings removed (tests/golden/reports.py)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_reports_match_the_recorded_ones():
    # a fresh process: no compile-cache or counter state from other tests in this worker
    proc = subprocess.run([sys.executable, "-m", "tests.golden.reports", "check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 difference(s) over 29 runs" in proc.stdout
