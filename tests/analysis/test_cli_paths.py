"""gkd-analyze --report on a folder it cannot write (issue 32, item 5): one line naming the path and the cause,
exit 2. Before the fix a read-only file system read "gkd-analyze: internal error: OSError: ...". A real read-only
tmpfs (root only; skipped where one cannot be mounted)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_a_report_folder_on_a_read_only_file_system_is_one_line_naming_it(synthetic_sweep_dir, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.decode().strip() or 'not root'})")
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gkd_harness.analysis.cli",
                str(synthetic_sweep_dir),
                "--report",
                str(ro / "report"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "internal error" not in lines[0], proc.stderr
    assert lines[0].startswith(f"gkd-analyze: unusable path: cannot use {ro}") and lines[0].endswith(
        "Read-only file system (EROFS)"
    ), lines[0]
