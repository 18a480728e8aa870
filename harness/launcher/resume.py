"""Checkpoint discovery for requeue -> ms-swift checkpoint resume (used by gkd-train, harness.launcher.plan).

With ``hydra.launcher.max_num_timeout > 0`` (submitit_slurm), submitit signals the job ``signal_delay_s`` before
its time limit and requeues the same point; the point's ``gkd-train`` job then runs again in the same run
folder. When the user asks for it, the rerun continues from the newest ms-swift checkpoint in that folder
instead of from step 0: :func:`resume_args` returns ``["--resume_from_checkpoint", <dir>]`` for the HF backend
(checkpoints need ``save_steps`` below the step count).
"""

from __future__ import annotations

import re
from pathlib import Path

_CKPT = re.compile(r"^checkpoint-(\d+)$")


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Newest ``checkpoint-<step>`` folder under ``<run_dir>/swift`` (any version subfolder), or None.

    A checkpoint counts only when it holds ``trainer_state.json`` (written last by the HF trainer), so a
    checkpoint cut short by the time limit is never resumed from.
    """
    root = Path(run_dir) / "swift"
    best: tuple[int, float, Path] | None = None
    if not root.is_dir():
        return None
    for path in root.rglob("checkpoint-*"):
        m = _CKPT.match(path.name)
        if not m or not path.is_dir() or not (path / "trainer_state.json").is_file():
            continue
        key = (int(m.group(1)), path.stat().st_mtime, path)
        if best is None or key[:2] > best[:2]:
            best = key
    return None if best is None else best[2]


def resume_args(resume: bool, run_dir: str | Path) -> list[str]:
    """ms-swift arguments that continue a requeued run, or ``[]`` (no resume asked, or nothing to resume)."""
    if not resume:
        return []
    ckpt = latest_checkpoint(run_dir)
    return [] if ckpt is None else ["--resume_from_checkpoint", str(ckpt)]
