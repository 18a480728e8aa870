"""No leftovers: the run folder Hydra makes for every job before the job starts is removed again when the job
leaves nothing in it (a dry run, a config error, a refused point), together with the parents that are then empty,
up to the output root (kept). A folder holding any non-empty file or any subfolder is never touched.

Before: ``gkd-train -m experiment=beta_sweep run.dry_run=true`` left 24 empty point folders (a later gkd-analyze
on them exited 2), and a config error left a folder with an empty log file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

OUTPUT_ROOT_ENV = "GKD_OUTPUT_ROOT"


def output_root() -> Path:
    """Where run folders go (``$GKD_OUTPUT_ROOT``, default ``outputs``), resolved."""
    return Path(os.environ.get(OUTPUT_ROOT_ENV) or "outputs").resolve()


def holds_nothing(folder: Path) -> bool:
    """True when ``folder`` has no subfolder and no file with content (an empty log file counts as nothing)."""
    try:
        return all(p.is_file() and not p.is_symlink() and p.stat().st_size == 0 for p in folder.iterdir())
    except OSError:
        return False


def remove_if_empty(run_dir: Path, root: Optional[Path] = None) -> bool:
    """Removes ``run_dir`` when it :func:`holds_nothing`, then its empty parents below ``root``
    (:func:`output_root`); returns whether ``run_dir`` was removed."""
    run_dir = Path(run_dir).resolve()
    root = (root or output_root()).resolve()
    if not run_dir.is_dir() or run_dir == root or not holds_nothing(run_dir):
        return False
    for p in run_dir.iterdir():
        p.unlink()
    run_dir.rmdir()
    parent = run_dir.parent
    while parent != root and root in parent.parents:
        try:
            parent.rmdir()  # only succeeds when empty
        except OSError:
            break
        parent = parent.parent
    return True


def remove_dry_sweep_folder(sweep_dir: Path, files: tuple[str, ...], root: Optional[Path] = None) -> bool:
    """After a dry-run sweep: removes ``sweep_dir`` when it holds no point folder and no file but ``files`` (Hydra's
    multirun.yaml, the sweep manifest), and its empty parents below ``root``; returns whether it did."""
    sweep_dir = Path(sweep_dir).resolve()
    try:
        entries = list(sweep_dir.iterdir())
    except OSError:
        return False
    if any(p.is_dir() or p.name not in files for p in entries):
        return False
    for p in entries:
        p.unlink()
    return remove_if_empty(sweep_dir, root)


__all__ = ["remove_if_empty", "remove_dry_sweep_folder", "holds_nothing", "output_root"]
