"""gkd-analyze's contract: one meaning per exit code (0 PASS, 1 FAIL, 2 unusable input or internal error), no
traceback on any sweep the harness produced, a report folder written completely or not at all, plain --help
with the exit codes, and --version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gkd_harness.analysis.cli import main
from gkd_harness.harness.store.provenance import harness_version


def _analyze(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gkd_harness.analysis.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def _config_failed_points(sweep: Path) -> tuple:
    """The two shapes a point that failed at config validation leaves: summary.json with status failed and no
    loss/gkd config, or only Hydra's .hydra/ with job_return.json FAILED (gkd_harness.launch.sweep's callback)."""
    a = sweep / "gkd.beta=1.5,loss=fp32"
    a.mkdir()
    (a / "summary.json").write_text(
        json.dumps(
            {
                "status": "failed",
                "error": "ConfigError: gkd.beta must lie in [0, 1], got 1.5",
                "run_name": a.name,
                "group": "synthetic",
                "config": {"run": {"max_steps": 3}},
                "last_step": 0,
            }
        )
    )
    b = sweep / "gkd.beta=2.5,loss=fp32"
    (b / ".hydra").mkdir(parents=True)
    (b / ".hydra" / "job_return.json").write_text(json.dumps({"status": "FAILED", "error": "ConfigError: gkd.beta"}))
    return a.name, b.name


def test_config_failed_points_are_reported_not_a_traceback(sweep_copy, tmp_path):
    """On main: TypeError traceback in analysis/signoff/plots.py, exit 1, a half-written report folder."""
    names = _config_failed_points(sweep_copy)
    report = tmp_path / "report"
    proc = _analyze(sweep_copy, "--report", report)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr == ""
    v = json.loads((report / "verdict.json").read_text())
    assert v["verdict"] == "fail" and v["failed_criteria"] == ["no_failed_runs"]
    outcome = {r["run"]: r["outcome"] for r in v["runs"]}
    assert all(outcome[n] == "failed" for n in names) and len(outcome) == 18
    details = next(c for c in v["criteria"] if c["name"] == "no_failed_runs")["details"]
    assert any(d.startswith(f"{names[0]}: failed — ConfigError: gkd.beta must lie in [0, 1]") for d in details)
    for f in ("report.md", "report.html", "loss_curves.png", "beta_curve.png"):
        assert (report / f).stat().st_size > 0


def test_internal_error_is_exit_2_one_line_and_leaves_no_report(synthetic_sweep_dir, tmp_path, monkeypatch, capsys):
    """On main: the exception escaped (exit 1, the FAIL code) and the report folder was left half-written."""
    import gkd_harness.analysis.signoff.plots

    def broken(*a, **k):
        raise RuntimeError("plot exploded")

    monkeypatch.setattr(gkd_harness.analysis.signoff.plots, "plot_beta_curve", broken)
    report = tmp_path / "report"
    assert main([str(synthetic_sweep_dir), "--report", str(report)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "gkd-analyze: internal error: RuntimeError: plot exploded (--verbose shows the traceback)"
    ]
    assert not report.exists() and list(tmp_path.iterdir()) == []  # nothing written, no temporary folder left
    assert main([str(synthetic_sweep_dir), "--report", str(report), "--verbose"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_report_folder_replaced_only_when_complete(synthetic_sweep_dir, tmp_path, monkeypatch):
    report = tmp_path / "report"
    assert main([str(synthetic_sweep_dir), "--report", str(report)]) == 0
    (report / "beta_curve.png").write_bytes(b"old")  # a file the report wrote (a foreign one refuses the folder)
    before = (report / "verdict.json").read_text()
    import gkd_harness.analysis.signoff.plots

    real = gkd_harness.analysis.signoff.plots.plot_beta_curve
    monkeypatch.setattr(gkd_harness.analysis.signoff.plots, "plot_beta_curve", lambda *a, **k: 1 / 0)
    assert main([str(synthetic_sweep_dir), "--report", str(report)]) == 2
    assert (report / "verdict.json").read_text() == before  # old one intact
    assert (report / "beta_curve.png").read_bytes() == b"old"
    monkeypatch.setattr(gkd_harness.analysis.signoff.plots, "plot_beta_curve", real)
    assert main([str(synthetic_sweep_dir), "--report", str(report)]) == 0
    assert (report / "beta_curve.png").read_bytes() != b"old"  # replaced as a whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_report_into_a_folder_that_is_not_a_report_is_refused(synthetic_sweep_dir, tmp_path, capsys):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    assert main([str(synthetic_sweep_dir), "--report", str(mine)]) == 2
    assert "holds what gkd-analyze did not write (thesis.tex)" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]


def test_help_in_plain_words_lists_exit_codes(capsys):
    assert main(["--help"]) == 0  # returned, not raised (docs/python-api.md: main returns the exit code)
    text = capsys.readouterr().out
    assert "`" not in text and "``" not in text
    for line in ("0  verdict PASS", "1  verdict FAIL", "2  unusable input"):
        assert line in text


def test_version_prints_the_harness_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gkd-analyze {harness_version()} (gkd-harness)"


def test_usage_error_is_exit_2(capsys):
    assert main(["somewhere"]) == 2  # --report missing
    assert main(["--no-such-flag"]) == 2  # argparse's usage error: returned, not raised
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_sweep_where_every_point_failed_at_config_gets_a_fail_verdict(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    names = _config_failed_points(sweep)
    assert main([str(sweep), "--report", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err == ""
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert v["runs_by_outcome"] == {"failed": 2} and sorted(r["run"] for r in v["runs"]) == sorted(names)
    assert "no_failed_runs" in v["failed_criteria"]
