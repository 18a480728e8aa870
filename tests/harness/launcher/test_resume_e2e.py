"""``run.resume=true`` on a folder without a usable checkpoint, through the real ``gkd-train`` and ms-swift.

Before the layout issue the folder decided "resume" without looking for a checkpoint and ``gkd-train`` then
passed no resume flag and archived nothing: ``metrics.jsonl`` held steps ``[1, 2, 3, 1, 2, 3]``, the cumulative
counters restarted inside one file and nothing went to ``previous_attempts/``. The decision now has one home
(``gkd_harness.harness.launcher.resume.decide_attempt``): no checkpoint means archive the attempt and restart, with a note.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from gkd_harness.harness.contract import ARCHIVE_DIR, HYDRA_DIR, LOSS_CALLS_TOTAL, METRICS_FILE, SUMMARY_FILE
from gkd_harness.harness.launcher.resume import latest_checkpoint
from gkd_harness.harness.store.metrics_io import read_metrics
from tests.conftest import entry_point

pytestmark = pytest.mark.slow


def test_resume_without_a_checkpoint_archives_the_attempt_and_restarts(smoke_sweep, tmp_path):
    src = next(p for p in sorted(smoke_sweep.iterdir()) if "loss=fp32" in p.name)
    run = tmp_path / "run"
    shutil.copytree(src, run)
    summary = json.loads((run / SUMMARY_FILE).read_text())
    summary["status"] = "failed"
    (run / SUMMARY_FILE).write_text(json.dumps(summary))
    before = [r["step"] for r in read_metrics(run / METRICS_FILE)]
    assert before == [1, 2, 3] and latest_checkpoint(run) is None

    overrides = yaml.safe_load((run / HYDRA_DIR / "overrides.yaml").read_text())
    env = dict(os.environ, GKD_OUTPUT_ROOT=str(tmp_path / "outputs"), HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    proc = subprocess.run(
        [entry_point("gkd-train"), *overrides, f"run.output_dir={run}", "run.resume=true"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no usable checkpoint" in proc.stdout + proc.stderr

    rows = read_metrics(run / METRICS_FILE)
    assert [r["step"] for r in rows] == [1, 2, 3]  # each step once (was [1, 2, 3, 1, 2, 3])
    totals = [r[LOSS_CALLS_TOTAL] for r in rows if LOSS_CALLS_TOTAL in r]
    assert totals == sorted(totals) and totals[0] > 0  # the counter never restarts inside the file
    assert json.loads((run / SUMMARY_FILE).read_text())["status"] == "completed"
    archived = sorted((run / ARCHIVE_DIR).iterdir())
    assert len(archived) == 1
    assert [r["step"] for r in read_metrics(archived[0] / METRICS_FILE)] == [1, 2, 3]
    assert json.loads((archived[0] / SUMMARY_FILE).read_text())["status"] == "failed"
