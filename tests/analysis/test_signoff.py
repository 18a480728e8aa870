"""gkd-analyze on synthetic sweeps: exit codes, report files, each criterion failing for its own reason.

The doctored-real-sweep test lives in test_real_sweep.py; these cover the criteria logic cheaply.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.load import load_sweep
from gkd_harness.analysis.signoff.compare import forms_agreement


def _edit_metrics(run: Path, step: int, **values) -> None:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for rec in lines:
        if rec["step"] == step:
            rec.update(values)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def _verdict(report: Path) -> dict:
    return json.loads((report / "verdict.json").read_text())


def _criterion(v: dict, name: str) -> dict:
    return next(c for c in v["criteria"] if c["name"] == name)


def _status(v: dict) -> dict:
    return {c["name"]: c["status"] for c in v["criteria"]}


def test_passing_sweep_exit_0_and_report_files(synthetic_sweep_dir, tmp_path):
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "gkd_harness.analysis.cli", str(synthetic_sweep_dir), "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    v = _verdict(report)
    assert v["verdict"] == "pass" and v["exit_code"] == 0 and v["failed_criteria"] == []
    assert _status(v) == {
        "no_negative_patched": "pass",
        "no_nonfinite": "pass",
        "spot_tolerance": "pass",
        "original_shows_defect": "pass",
        "beta_forms_unchanged": "pass",
        "precisions_unchanged_in_fp32": "not_applicable",
        "no_failed_runs": "pass",
        "patched_not_worse": "not_applicable",  # no held-out evaluation configured in synthetic runs
        "candidate_certified": "not_applicable",
    }
    for name in (
        "report.md",
        "report.html",
        "loss_curves.png",
        "grad_norm_curves.png",
        "negatives.png",
        "spot_errors.png",
        "beta_curve.png",
    ):
        assert (report / name).stat().st_size > 0, name
    html = (report / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5
    # self-contained: every resource inline (data: URIs), no stylesheet or script fetched; links are in-page anchors
    # or the run folders of the provenance section (relative paths, no URL scheme)
    assert not re.search(r"src=['\"](?!data:)", html) and "<link" not in html
    hrefs = re.findall(r"href=['\"]([^'\"]*)", html)
    assert hrefs and all(h.startswith("#") or "://" not in h for h in hrefs), hrefs
    md = (report / "report.md").read_text().replace("\\|", "|")  # table cells escape "|"
    for c in v["criteria"]:  # every criterion with its threshold and measured value, in both renderings
        assert c["title"] in md and c["measured"].split(";")[0] in md
    # the FP64 β-curve shows the paper form's jump: D(0.999)/D(1) ~ 0.001, continuous ~ 1
    jumps = {j["form"]: j["D(high)/D(1)"] for j in v["beta_curve"]["fp64_endpoint_jumps"]}
    assert jumps["paper"] < 0.002 and jumps["continuous"] > 0.98


def test_negative_patched_loss_fails_naming_criterion(sweep_copy, tmp_path, capsys):
    run = sweep_copy / "b0.9_paper_fp32_T0.9_s0"
    _edit_metrics(run, 7, **{"gkd/neg_loss_calls": 1})
    rc = main([str(sweep_copy), "--report", str(tmp_path / "r")])
    v = _verdict(tmp_path / "r")
    assert rc == 1 and v["failed_criteria"] == ["no_negative_patched"]
    crit = next(c for c in v["criteria"] if c["name"] == "no_negative_patched")
    assert crit["measured"].startswith("1 negative of") and run.name in crit["details"][0]
    assert "[        fail] Patched loss has no negative loss calls" in capsys.readouterr().out


def test_spot_error_beyond_tolerance_fails(sweep_copy, tmp_path):
    run = sweep_copy / "b0.5_continuous_fp32_T0.9_s0"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    fp64 = next(r for r in lines if r["step"] == 6)["spot/loss_fp64"]
    err = 1e-4 * abs(fp64) + 2e-6 + 1e-7  # just over the bound
    _edit_metrics(run, 6, **{"spot/loss": fp64 + err, "spot/loss_abs_err": err})
    assert main([str(sweep_copy), "--report", str(tmp_path / "r")]) == 1
    v = _verdict(tmp_path / "r")
    assert v["failed_criteria"] == ["spot_tolerance"]
    assert any(f"{run.name} step 6" in d for d in _criterion(v, "spot_tolerance")["details"])


def test_gradient_error_beyond_tolerance_fails(sweep_copy, tmp_path):
    _edit_metrics(sweep_copy / "b1.0_paper_fp32_T0.9_s0", 9, **{"spot/grad_rel_l2": 1.5e-3})
    assert main([str(sweep_copy), "--report", str(tmp_path / "r")]) == 1
    assert _verdict(tmp_path / "r")["failed_criteria"] == ["spot_tolerance"]


def test_forms_divergence_at_half_fails_and_is_located(sweep_copy, tmp_path):
    run = sweep_copy / "b0.5_continuous_original_T0.9_s0"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    old = next(r for r in lines if r["step"] == 5)["train/loss"]
    _edit_metrics(run, 5, **{"train/loss": old * (1 + 1e-5)})
    agreement = forms_agreement(load_sweep(sweep_copy))  # β ∈ {0, 0.5, 1}
    row = agreement[(agreement["run_b"] == run.name) & (agreement["metric"] == "train/loss")].iloc[0]
    assert row["at_step"] == 5 and row["max_rel_diff"] == pytest.approx(1e-5 / (1 + 1e-5), rel=1e-6)
    others = agreement[agreement["run_b"] != run.name]
    assert (others["max_abs_diff"] == 0).all()
    assert main([str(sweep_copy), "--report", str(tmp_path / "r")]) == 1
    assert _verdict(tmp_path / "r")["failed_criteria"] == ["beta_forms_unchanged"]


def test_original_without_defect_evidence_fails(sweep_copy, tmp_path):
    for run in sweep_copy.glob("*_original_*"):
        shutil.rmtree(run)
    assert main([str(sweep_copy), "--report", str(tmp_path / "r")]) == 1
    v = _verdict(tmp_path / "r")
    assert v["failed_criteria"] == ["original_shows_defect"]
    assert next(c for c in v["criteria"] if c["name"] == "original_shows_defect")["status"] == "not_measured"


def test_failed_run_fails_the_sweep(sweep_copy, tmp_path):
    s = sweep_copy / "b0.9_continuous_fp32_T0.9_s0" / "summary.json"
    s.write_text(json.dumps(dict(json.loads(s.read_text()), status="failed", error="RuntimeError: boom")))
    assert main([str(sweep_copy), "--report", str(tmp_path / "r")]) == 1
    v = _verdict(tmp_path / "r")
    assert v["failed_criteria"] == ["no_failed_runs"]
    assert "RuntimeError: boom" in _criterion(v, "no_failed_runs")["details"][0]


def test_criteria_file_overrides_and_validation(sweep_copy, tmp_path, capsys):
    _edit_metrics(sweep_copy / "b0.9_paper_fp32_T0.9_s0", 7, **{"gkd/neg_loss_calls": 1})
    crit = tmp_path / "c.yaml"
    crit.write_text("no_negative_patched:\n  max_negative_calls: 1\n")
    assert main([str(sweep_copy), "--report", str(tmp_path / "r"), "--criteria", str(crit)]) == 0
    crit.write_text("no_negative_patched:\n  max_negatives: 1\n")
    assert main([str(sweep_copy), "--report", str(tmp_path / "r2"), "--criteria", str(crit)]) == 2
    assert "'no_negative_patched.max_negatives'" in capsys.readouterr().err
    crit.write_text("spot_tolerance:\n  loss_rtol: -1\n")
    assert main([str(sweep_copy), "--report", str(tmp_path / "r3"), "--criteria", str(crit)]) == 2
    assert "'spot_tolerance.loss_rtol'" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists() and not (tmp_path / "r3").exists()


def test_unusable_input_exit_2(tmp_path, sweep_copy, capsys):
    assert main([str(tmp_path / "missing"), "--report", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (sweep_copy / "b0.5_paper_fp32_T0.9_s0" / "summary.json").write_text("{")
    assert main([str(sweep_copy), "--report", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "unusable input" in err and "b0.5_paper_fp32_T0.9_s0/summary.json: not valid JSON" in err
