"""The report-timing script runs end to end on a small synthetic sweep (no timing assertion: measured claims only)."""
from __future__ import annotations

import json

from bench.time_report import main


def test_time_report_runs(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "--seeds", "1", "--steps", "10", "--spot-every", "5"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):])
    assert result["runs"] == 40 and result["history_rows"] == 400 and result["verdict"] == "pass"
    assert set(result["in_process_s"]) == {"load", "report", "total", "total_cpu"}
    assert (tmp_path / "report" / "verdict.json").exists()
