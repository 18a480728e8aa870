"""``gkd-analyze --wandb`` logs the sign-off as an artifact with lineage to the runs it judged (issue 47, item 8).

Before: the analysis run logged tables and images, but not report.html, the verdict or the certificate as an
artifact, nothing named the training runs it judged, and nothing recorded the analysis run's id or URL. Real
wandb in offline mode; the artifact's record is read back from the offline run file.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import entry_point


@pytest.mark.slow
def test_the_analysis_run_logs_the_signoff_artifact_and_names_the_judged_runs(smoke_sweep, tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    report = tmp_path / "report"
    p = subprocess.run(
        [entry_point("gkd-analyze"), str(smoke_sweep), "--out", str(report), "--wandb"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode in (0, 1), p.stderr[-3000:]
    record = json.loads((report / "wandb_run.json").read_text())
    offline = next((report / "wandb").glob(f"offline-run-*-{record['run_id']}"))
    # the training runs' own wandb ids, from their folders
    expected = sorted(d.name.rsplit("-", 1)[-1] for d in Path(smoke_sweep).glob("*/wandb/wandb/*run-*-*") if d.is_dir())
    assert sorted(record["judged_runs"]) == expected and len(expected) == 3
    assert record["artifact"].startswith("signoff-")
    data = next(offline.glob("*.wandb")).read_bytes()
    for name in (record["artifact"], "report.html", "verdict.json", "report.md", *expected):
        assert name.encode() in data, name
