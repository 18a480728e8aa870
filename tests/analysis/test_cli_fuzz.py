"""A seeded fuzz of gkd-analyze's flags and of malformed run folders (issue 48, item 1): every outcome is an exit
code of the contract (0, 1, 2) with argparse's usage or at most a few lines, no traceback, no "internal error",
no raw control character. It runs in a child process with a time bound: before the fix a FIFO ``summary.json``
or ``config.yaml`` hung gkd-analyze forever, and a deeply nested JSON file was an internal error (a
RecursionError)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _fuzz(n_flags: int, n_folders: int) -> dict:
    p = subprocess.run(
        [sys.executable, "-m", "tests.analysis.fuzz_analyze", str(n_flags), str(n_folders), "48"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_small_fuzz_of_flags_and_folders():
    result = _fuzz(16, 10)
    assert result["flags"]["other"] == [] and result["folders"]["other"] == [], result


@pytest.mark.slow
def test_the_whole_fuzz_of_flags_and_folders():
    """60 argument lists and 40 damaged sweep folders (before the fix the run hung on a FIFO run file)."""
    result = _fuzz(60, 40)
    assert result["flags"]["other"] == [] and result["folders"]["other"] == [], result
    assert result["flags"]["clean"] == 60 and result["folders"]["clean"] == 40
