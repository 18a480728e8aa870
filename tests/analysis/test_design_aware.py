"""Issue 19: a verdict a reviewer can defend. Criteria that know the sweep's design (not_applicable is never a
failure), a gradient gate that knows the student dtype, and completeness (planned points, logged steps,
duplicate steps, foreign runs) as evidence. Synthetic run folders (gkd_harness.bench.synthetic.write_run), no training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.signoff.criteria import evaluate
from gkd_harness.analysis.signoff.criteria_file import load_criteria
from gkd_harness.analysis.sweep.runs import load_sweep
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.contract import (
    NEG_LOSS_CALLS,
    NEG_LOSS_CALLS_TOTAL,
    SPOT_GRAD_REL_L2,
    SPOT_GRAD_REL_L2_DTYPE_FLOOR,
    SWEEP_MANIFEST_FILE,
)

STEPS = 8


def _ab(root: Path, group: str = "ab", seeds=(1, 2), **kw) -> Path:
    """The `-m loss=original,fp32 run.seed=1,2` design: paper form only, FP32 student, BF16 teacher."""
    for seed in seeds:
        for prec, loss in (("native", "original"), ("fp32", "fp32")):
            write_run(
                root / f"loss={loss},run.seed={seed}",
                beta=0.5,
                beta_form="paper",
                precision=prec,
                seed=seed,
                steps=STEPS,
                spot_every=2,
                group=group,
                **kw,
            )
    return root


def _status(sweep_dir: Path) -> dict:
    verdict, results = evaluate(load_sweep(sweep_dir), load_criteria())
    return {"verdict": verdict, **{r.name: r for r in results}}


def _rewrite(run: Path, fn) -> None:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = fn(rows)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_ab_sweep_without_a_continuous_point_passes_with_beta_forms_not_applicable(tmp_path):
    # Before issue 19: beta_forms_unchanged was not_measured (required) and the sweep failed.
    st = _status(_ab(tmp_path / "ab"))
    assert st["verdict"] == "pass"
    assert st["beta_forms_unchanged"].status == "not_applicable"
    assert "no continuous point" in st["beta_forms_unchanged"].measured
    assert st["beta_forms_unchanged"].applies.startswith("not applicable")
    assert st["precisions_unchanged_in_fp32"].status == "not_applicable"
    assert st["original_shows_defect"].status == "pass" and st["original_shows_defect"].applies.startswith("applies")


def test_fail_banner_names_each_failing_criterion_and_its_reason(tmp_path, capsys):
    sweep = _ab(tmp_path / "ab")
    _rewrite(
        sweep / "loss=fp32,run.seed=1",
        lambda rows: [dict(r, **{NEG_LOSS_CALLS: 2, NEG_LOSS_CALLS_TOTAL: 2}) if r["step"] == 3 else r for r in rows],
    )
    assert main([str(sweep), "--report", str(tmp_path / "r")]) == 1
    md = (tmp_path / "r" / "report.md").read_text()
    banner = md.split("**Contents**")[0]
    assert "- **no_negative_patched (fail)**:" in banner and "loss=fp32,run.seed=1" in banner
    assert "not_applicable" in md and "why it applies" in md
    v = json.loads((tmp_path / "r" / "verdict.json").read_text())
    assert v["failed_criteria"] == ["no_negative_patched"] and "beta_forms_unchanged" in v["not_applicable"]
    assert "FAIL no_negative_patched:" in capsys.readouterr().out


def _bf16_pair(root: Path, floor: bool) -> Path:
    """BF16 student and BF16 teacher at the loss (model=qwen3_8b_to_0_6b): fp32's gradient error is the BF16
    rounding of the gradient itself (2.7-3.1e-3); the original has negative calls and a 30% gradient error."""
    for prec in ("native", "fp32"):
        run = write_run(
            root / f"loss={prec}",
            beta=0.5,
            beta_form="paper",
            precision=prec,
            seed=1,
            steps=STEPS,
            spot_every=2,
            student_dtype="bfloat16",
            teacher_dtype="bfloat16",
            group="q",
        )

        def doctor(rows, prec=prec):
            for r in rows:
                if SPOT_GRAD_REL_L2 in r:
                    r[SPOT_GRAD_REL_L2] = 3.0e-3 if prec == "fp32" else 0.33
                    if floor:
                        r[SPOT_GRAD_REL_L2_DTYPE_FLOOR] = 2 * 1.6e-3  # 2x BF16 rounding of the FP64 gradient
                if prec == "native" and r["step"] == 2:
                    r[NEG_LOSS_CALLS], r[NEG_LOSS_CALLS_TOTAL] = 1, 1
            return rows

        _rewrite(run, doctor)
    return root


def test_bf16_bf16_fp32_passes_on_its_dtype_allowance_and_the_original_shows_the_defect(tmp_path):
    # Before: spot_tolerance failed (flat 1e-3) and original_shows_defect was not_measured (dtypes not "mixed").
    st = _status(_bf16_pair(tmp_path / "q", floor=True))
    assert st["spot_tolerance"].status == "pass", st["spot_tolerance"].details
    assert "dtype rounding up to 0.0032" in st["spot_tolerance"].measured
    assert st["original_shows_defect"].status == "pass"
    assert "bfloat16/bfloat16" in st["original_shows_defect"].applies


def test_gradient_beyond_the_dtype_allowance_still_fails(tmp_path):
    st = _status(_bf16_pair(tmp_path / "q", floor=False))  # no floor logged: the flat 1e-3 applies
    assert st["spot_tolerance"].status == "fail"
    assert any("> 0.001" in d for d in st["spot_tolerance"].details)


def test_fp32_fp32_original_without_defect_is_not_applicable(tmp_path):
    _ab(tmp_path / "ab", teacher_dtype="float32")
    st = _status(tmp_path / "ab")
    assert st["original_shows_defect"].status == "not_applicable"
    assert any("FP32/FP32 original, no defect expected" in d for d in st["original_shows_defect"].details)


def test_planned_point_without_a_run_folder_fails_by_name(tmp_path):
    # Before: the analysis never read what the sweep planned, so deleting points gave PASS.
    sweep = _ab(tmp_path / "ab")
    names = sorted(p.name for p in sweep.iterdir())
    (sweep / SWEEP_MANIFEST_FILE).write_text(json.dumps({"group": "ab", "points": names + ["loss=fp32,run.seed=3"]}))
    st = _status(sweep)
    assert st["verdict"] == "fail" and st["no_failed_runs"].status == "fail"
    assert "loss=fp32,run.seed=3" in st["no_failed_runs"].measured
    assert any(d.startswith("loss=fp32,run.seed=3: missing") for d in st["no_failed_runs"].details)


def test_a_sweep_whose_planned_points_all_lack_a_folder_fails_naming_them(tmp_path, capsys):
    """Every SLURM array task cancelled while pending: only the manifest is there. On main: exit 2, "no run
    folders", without a word of the planned points."""
    sweep = tmp_path / "cancelled"
    sweep.mkdir()
    names = ["loss=original,run.seed=1", "loss=fp32,run.seed=1"]
    (sweep / SWEEP_MANIFEST_FILE).write_text(json.dumps({"group": "ab", "points": names}))
    assert main([str(sweep), "--report", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    assert "FAIL no_failed_runs: 2 missing of 2 runs; planned but without a run folder: " + ", ".join(names) in out
    (sweep / SWEEP_MANIFEST_FILE).unlink()  # nothing planned, nothing there: unusable input, as before
    assert main([str(sweep), "--report", str(tmp_path / "r2")]) == 2
    assert "no run folders under" in capsys.readouterr().err


def test_planned_points_are_read_from_hydras_multirun_yaml(tmp_path):
    sweep = _ab(tmp_path / "ab")
    import shutil

    shutil.rmtree(sweep / "loss=original,run.seed=2")
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    params:\n      loss: original,fp32\n      run.seed: 1,2\n"
        "  overrides:\n    task: []\n  job:\n    config:\n      override_dirname:\n        kv_sep: '='\n"
        "        item_sep: ','\n        exclude_keys: []\n"
    )
    st = _status(sweep)
    assert st["no_failed_runs"].status == "fail"
    assert "loss=original,run.seed=2" in st["no_failed_runs"].measured


@pytest.mark.parametrize(
    "cut, named",
    [
        (lambda rows: [r for r in rows if r["step"] not in (3, 4, 5)], "steps 3-5 not logged"),
        (lambda rows: [r for r in rows if r["step"] <= 4], "steps 5-8 not logged"),
        (lambda rows: rows[:1], "steps 2-8 not logged"),
        (lambda rows: [r for r in rows if r["step"] % 2 == 0], "steps 1, 3, 5, 7 not logged"),
    ],
)
def test_missing_logged_steps_fail_naming_run_and_steps(tmp_path, cut, named):
    # Before: summary.json's last_step was trusted and each of these gave PASS.
    sweep = _ab(tmp_path / "ab")
    _rewrite(sweep / "loss=fp32,run.seed=2", cut)
    res = _status(sweep)["no_failed_runs"]
    assert res.status == "fail"
    assert any(d.startswith("loss=fp32,run.seed=2: incomplete") and named in d for d in res.details), res.details


def test_a_negative_in_any_copy_of_a_duplicated_step_counts_and_duplicates_are_reported(tmp_path):
    # Before: "later non-null wins" dropped the first copy's negative call: PASS.
    sweep = _ab(tmp_path / "ab")
    run = sweep / "loss=fp32,run.seed=1"

    def dup(rows):
        step4 = next(r for r in rows if r["step"] == 4)
        return [dict(step4, **{NEG_LOSS_CALLS: 1})] + rows

    _rewrite(run, dup)
    st = _status(sweep)
    # issue 45: two copies of one step with different values are a conflict, never resolved by order or by worst
    # copy: not_measured (a failure, required), naming the run and the step
    assert st["no_negative_patched"].status == "not_measured"
    assert (
        st["no_negative_patched"]
        .details[0]
        .startswith("loss=fp32,run.seed=1 step 4: gkd/neg_loss_calls recorded twice with different values")
    )
    assert any("duplicate logged steps" in d and "step 4 x2" in d for d in st["no_failed_runs"].details)


def test_foreign_group_and_copied_run_ids_are_refused_unless_allow_mixed(tmp_path, capsys):
    import shutil

    sweep = _ab(tmp_path / "ab")
    write_run(
        sweep / "loss=fp32,run.seed=9",
        beta=0.5,
        beta_form="paper",
        precision="fp32",
        seed=9,
        steps=STEPS,
        spot_every=2,
        group="other",
    )
    assert main([str(sweep), "--report", str(tmp_path / "r")]) == 2
    assert "more than one group: ab (4 runs), other (1 runs)" in capsys.readouterr().err
    assert main([str(sweep), "--report", str(tmp_path / "r"), "--allow-mixed"]) == 0
    shutil.rmtree(sweep / "loss=fp32,run.seed=9")
    shutil.copytree(sweep / "loss=fp32,run.seed=1", sweep / "copy")
    assert main([str(sweep), "--report", str(tmp_path / "r2")]) == 2
    assert "run id loss=fp32,run.seed=1 appears 2 times" in capsys.readouterr().err
