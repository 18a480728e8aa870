"""Non-finite values are first-class: a NaN run fails the sign-off (criterion ``no_nonfinite``), a NaN spot
check counts as a failed check, and the loaders keep NaN/Inf as themselves.

The doctored run reproduces what ``gkd-train -m experiment=smoke run.learning_rate=inf run.max_steps=3``
logged on main: from step 2 on, ``train/grad_norm`` and the spot check are NaN, ``train/loss`` is 0.0 (HF's
filter), and ``gkd/nonfinite_calls_total`` rises.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.load import load_sweep

RUN = "b0.9_paper_fp32_T0.9_s0"  # β=0.9: no paper/continuous pair, so only the NaN can fail the sweep


def _nan_run(run: Path, from_step: int = 8) -> list:
    """Make ``run`` look like a patched run that went non-finite at ``from_step``; returns the steps touched."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    touched, calls = [], 0
    for rec in lines:
        if rec["step"] >= from_step:
            calls += 1
            touched.append(rec["step"])
            rec.update({"train/loss": 0.0, "train/grad_norm": float("nan"), "gkd/nonfinite_calls_total": calls})
            if "spot/loss_fp64" in rec:
                rec.update(
                    {
                        "spot/loss": float("nan"),
                        "spot/loss_fp64": float("nan"),
                        "spot/loss_abs_err": float("nan"),
                        "spot/grad_rel_l2": float("nan"),
                    }
                )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))  # Python writes NaN
    return touched


def _verdict(report: Path) -> dict:
    return json.loads((report / "verdict.json").read_text())


def _criterion(v: dict, name: str) -> dict:
    return next(c for c in v["criteria"] if c["name"] == name)


def test_loader_keeps_nan_and_lists_it(sweep_copy):
    steps = _nan_run(sweep_copy / RUN)
    sw = load_sweep(sweep_copy)
    h = sw.run_history(RUN)
    assert np.isnan(h.loc[steps, "train/grad_norm"]).all()
    assert (h.loc[steps, "train/loss"] == 0.0).all()  # what was logged, not replaced
    nf = sw.nonfinite[(sw.nonfinite["run"] == RUN) & (sw.nonfinite["metric"] == "train/grad_norm")]
    assert nf["step"].tolist() == steps and nf["value"].isna().all()
    assert set(sw.nonfinite["run"]) == {RUN}


def test_nan_patched_run_fails_naming_no_nonfinite(sweep_copy, tmp_path, capsys):
    """On main this sweep passed (exit 0): the NaN spot check was dropped and nothing read the counts."""
    steps = _nan_run(sweep_copy / RUN)
    rc = main([str(sweep_copy), "--report", str(tmp_path / "r")])
    out = capsys.readouterr().out
    v = _verdict(tmp_path / "r")
    assert rc == 1 and v["verdict"] == "fail"
    assert v["failed_criteria"] == ["no_nonfinite", "spot_tolerance"]
    nf = _criterion(v, "no_nonfinite")
    assert nf["measured"].startswith(f"{len(steps)} non-finite loss calls, {len(steps)} steps with a non-finite")
    assert f"{RUN}: {len(steps)} non-finite loss calls" in nf["details"]
    assert f"{RUN}: train/grad_norm is nan at step {', '.join(map(str, steps))}" in nf["details"]
    spot_steps = [s for s in steps if s % 3 == 0]  # the synthetic sweep spot-checks every 3 steps
    assert f"{RUN}: non-finite spot check at step {', '.join(map(str, spot_steps))}" in " ".join(nf["details"])
    st = _criterion(v, "spot_tolerance")
    assert f"{RUN} step {spot_steps[0]}: non-finite spot check (loss nan, FP64 nan): failed" in st["details"]
    assert "[        fail] Patched runs have no non-finite values" in out


def test_inf_grad_norm_alone_fails(sweep_copy, tmp_path):
    run = sweep_copy / "b1.0_continuous_fp32_T0.9_s0"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lines[4]["train/grad_norm"] = math.inf
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main([str(sweep_copy), "--report", str(tmp_path / "r")]) == 1
    v = _verdict(tmp_path / "r")
    assert v["failed_criteria"] == ["no_nonfinite"]
    assert f"{run.name}: train/grad_norm is inf at step 5" in _criterion(v, "no_nonfinite")["details"]


def test_nonfinite_in_an_original_run_is_not_a_patched_failure(sweep_copy, tmp_path):
    _nan_run(sweep_copy / "b0.5_paper_original_T0.9_s0")
    main([str(sweep_copy), "--report", str(tmp_path / "r")])
    assert _criterion(_verdict(tmp_path / "r"), "no_nonfinite")["status"] == "pass"
