"""Disk full, read-only: one line naming the path and the cause, with an honest exit code (issue 32, items 3 and 5).

Real file systems throughout: a tmpfs mounted read-only, or filled to ENOSPC (root only; skipped where a tmpfs
cannot be mounted). Exit 2 where the user must change a path (read-only, no permission), 1 where the run itself
failed (a full disk).

Before the fix: a read-only run folder exited 1 ("cannot write .lock (EROFS)"), a read-only output root and a disk
that filled during the run ended in a multi-line traceback (the intended line masked by an OSError raised when
swift.log was closed), and summary.json's last_step could lag metrics.jsonl's last line.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import entry_point


def _mount(path: Path, size: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.decode().strip() or 'not root'})")
    return path


@pytest.fixture
def mounts():
    made = []

    def mount(path: Path, size: str) -> Path:
        made.append(_mount(path, size))
        return path

    yield mount
    for path in reversed(made):
        subprocess.run(["umount", "-l", str(path)], check=False)


def _gkd_train(cwd: Path, root: Path, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "GKD_OUTPUT_ROOT": str(root),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [entry_point("gkd-train"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _one_line(p: subprocess.CompletedProcess) -> str:
    """The last stderr line, which must be gkd-train's own; no traceback anywhere."""
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("gkd-train: "), p.stderr[-3000:]
    return last


def test_a_read_only_run_folder_exits_2_naming_it(tmp_path, mounts):
    ro = mounts(tmp_path / "ro", "1m")
    (ro / "run").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    p = _gkd_train(tmp_path, tmp_path / "out", f"run.output_dir={ro / 'run'}", "run.max_steps=1")
    line = _one_line(p)
    assert p.returncode == 2, p.stderr[-3000:]
    assert line == (
        f"gkd-train: unusable run folder: cannot write .lock in run.output_dir {ro / 'run'}: "
        "Read-only file system (EROFS)"
    )


def test_a_read_only_output_root_exits_2_naming_the_folder(tmp_path, mounts):
    ro = mounts(tmp_path / "ro", "1m")
    subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
    p = _gkd_train(tmp_path, ro, "run.max_steps=1")
    line = _one_line(p)
    assert p.returncode == 2, p.stderr[-3000:]
    assert line.startswith(f"gkd-train: unusable path: cannot use {ro}/runs") and line.endswith(
        "Read-only file system (EROFS)"
    ), line


def test_a_full_disk_at_the_start_exits_1_in_one_line(tmp_path, mounts):
    fs = mounts(tmp_path / "fs", "64k")
    with open(fs / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    p = _gkd_train(tmp_path, fs, "run.max_steps=1")
    line = _one_line(p)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "No space left on device (ENOSPC)" in line and str(fs) in line, line


@pytest.mark.slow
def test_a_disk_that_fills_during_the_run_gives_one_line_and_an_honest_last_step(tmp_path, mounts):
    """A 160 KiB tmpfs as the output root: the tiny run's files fill it after a few dozen steps (measured: 29 of
    40 metrics lines, then swift.log could not grow)."""
    fs = mounts(tmp_path / "fs", "160k")
    p = _gkd_train(tmp_path, fs, "run.max_steps=40", "tracking=disabled")
    line = _one_line(p)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "No space left on device (ENOSPC)" in line, line
    [summary_path] = list(fs.rglob("summary.json"))
    summary = json.loads(summary_path.read_text())
    rows = [json.loads(x) for x in (summary_path.parent / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert summary["status"] == "failed" and "ENOSPC" in summary["error"]
    assert rows and summary["last_step"] == rows[-1]["step"] < 40
