"""gkd-replay on a sweep trained without captures: exit 2 with one line naming the folder and the setting that
writes captures (monitor.capture=true)."""

from __future__ import annotations

from gkd_harness.analysis.replay.cli import main


def test_sweep_without_captures_names_monitor_capture(synthetic_sweep_dir, capsys):
    assert main([str(synthetic_sweep_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(synthetic_sweep_dir) in err and "monitor.capture=true" in err, err
