"""What the run-folder tests share: a flat config, a process that holds a lock, real small and full file systems."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gkd_harness.harness.config.flat import flatten

REPO = Path(__file__).resolve().parents[3]
FLAT = flatten(
    {
        "loss": {"precision": "fp32", "beta_form": "paper"},
        "gkd": {"beta": 0.5},
        "model": {"student": "embedded", "teacher": "embedded"},
        "run": {"dataset": None, "max_steps": 3, "output_dir": "/somewhere"},
    }
)


def start_holder(run_dir: Path) -> subprocess.Popen:
    """A separate process that takes the folder's lock, says "locked", then sleeps until killed."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from gkd_harness.harness.store.lock import RunLock
        lock = RunLock({str(run_dir)!r}, heartbeat_s=0)
        lock.acquire()
        print("locked", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.decode().strip() or 'not root'})")


def fill(fs: Path) -> Path:
    """Fill the file system until ENOSPC; returns the filler file."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    with pytest.raises(OSError):
        (fs / "probe").write_bytes(b"x" * 4096)
    return filler


def leftover_tmp(folder: Path) -> list:
    return sorted(p.name for p in folder.rglob("*.tmp"))
