"""The sweep's progress shows every running point (issue 33): under ``hydra/launcher=submitit_local`` all points run
at once, and the progress line showed only the first of them."""

from __future__ import annotations

import json

from gkd_harness.harness.launcher.progress import Running


def test_every_running_point_is_in_the_snapshot_and_the_line(tmp_path):
    from gkd_harness.launch.sweep import SweepStatusCallback

    cb = SweepStatusCallback(progress_interval_s=0)
    cb._group = "outcome"
    names = ["run.seed=1", "run.seed=2", "run.seed=3", "run.seed=4"]
    cb._points = [(n, tmp_path / n) for n in names]
    for i, name in enumerate(names):
        (tmp_path / name).mkdir()
        status = "completed" if i == 0 else "running"
        (tmp_path / name / "summary.json").write_text(json.dumps({"status": status, "config": {"run.max_steps": 200}}))
        (tmp_path / name / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": s}) + "\n" for s in range(1, 10 * i + 2))
        )
    snap = cb.snapshot()
    assert (snap.total, snap.done, snap.failed) == (4, 1, 0)
    assert snap.running == (
        Running("run.seed=2", 11, 200),
        Running("run.seed=3", 21, 200),
        Running("run.seed=4", 31, 200),
    )
    lines = cb.progress_line().splitlines()
    assert lines[0].startswith("[sweep outcome] 1/4 points done, 0 failed | 3 running | "), lines
    assert lines[1:] == ["    run.seed=2 step 11/200", "    run.seed=3 step 21/200", "    run.seed=4 step 31/200"]
