"""Issue 45, pairing from the plan and conflicting records, on synthetic run folders
(gkd_harness.bench.synthetic.write_run) with the plan written by the launcher's own
:func:`gkd_harness.launch.sweep.write_manifest`. The expected verdict, and its reason, are written in each test.

* reproduction 6: a plan that sweeps ``run.learning_rate`` beside the loss is cross-paired (β forms compared lr 1e-4
  with lr 3e-3: FAIL; the outcome criterion: "2 original runs pair with fp32/paper");
* reproduction 8: a run cut at 5 steps ("no paper/continuous pair" though the pair exists); a β edited in
  summary.json (the β-form check dropped silently, config.yaml not named); a resume that replayed steps 5-6 with
  other values (blamed on the β forms);
* conflicting records: a step or an evaluation recorded twice with different values makes every criterion that
  reads it not_measured, naming run and step, whatever their order; identical copies collapse.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from gkd_harness.analysis.signoff.judge import judge
from gkd_harness.analysis.sweep.runs import load_sweep
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.contract import EVAL_JSD, METRICS_FILE, SUMMARY_FILE, TRAIN_GRAD_NORM, TRAIN_LOSS
from gkd_harness.launch.sweep import declared_point, write_manifest

LR = (1e-4, 3e-3)


def _plan(sweep: Path, jobs: dict, steps: int, every: int = 0) -> None:
    """The plan as the sweep callback writes it at launch: point name -> its overrides."""
    config = OmegaConf.create(
        {"run": {"seed": 1, "max_steps": steps, "logging_steps": 1}, "monitor": {"eval": {"every_n_steps": every}}}
    )
    declared = {n: declared_point(o, config) for n, o in jobs.items()}
    write_manifest(sweep, list(jobs), "g", "basic", declared, None)


def _rows(run: Path) -> list:
    return [json.loads(x) for x in (run / METRICS_FILE).read_text().splitlines()]


def _write_rows(run: Path, rows: list) -> None:
    (run / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _set_config(run: Path, **keys) -> None:
    s = json.loads((run / SUMMARY_FILE).read_text())
    s["config"].update(keys)
    (run / SUMMARY_FILE).write_text(json.dumps(s))


def _scale(run: Path, k: float) -> None:
    _write_rows(
        run, [dict(r, **{TRAIN_LOSS: r[TRAIN_LOSS] * k, TRAIN_GRAD_NORM: r[TRAIN_GRAD_NORM] * k}) for r in _rows(run)]
    )


def _results(sweep: Path) -> dict:
    j = judge(load_sweep(sweep))
    return {"verdict": j.verdict, **{r.name: r for r in j.results}}


def _forms(root: Path, steps: int = 6, *, precision: str = "fp32") -> Path:
    """paper and continuous at β=0.5 (one precision): the two streams are identical (the forms coincide)."""
    for form in ("paper", "continuous"):
        write_run(
            root / f"loss={form}", beta=0.5, beta_form=form, precision=precision, seed=1, steps=steps, spot_every=2
        )
    return root


# --------------------------------------------------------------------------------------------------- repro 6
def test_repro6_beta_forms_pair_within_one_learning_rate(tmp_path):
    """Was FAIL (lr 1e-4 compared with lr 3e-3, 4 pairs); now PASS on the 2 pairs of one learning rate."""
    sweep = tmp_path / "s"
    jobs = {}
    for form in ("paper", "continuous"):
        for lr in LR:
            name = f"loss={form},run.learning_rate={lr}"
            jobs[name] = [f"loss={form}", f"run.learning_rate={lr}"]
            run = write_run(sweep / name, beta=0.5, beta_form=form, precision="fp32", seed=1, steps=6, spot_every=2)
            _set_config(run, **{"run.learning_rate": lr})
            if lr == LR[1]:
                _scale(run, 1.3)  # another learning rate learns another curve
    _plan(sweep, jobs, 6)
    r = _results(sweep)
    forms = r["beta_forms_unchanged"]
    assert forms.status == "pass", forms.details
    assert forms.measured.startswith("2 pairs; largest divergence 0 relative"), forms.measured


def _outcome_run(sweep: Path, name: str, precision: str, seed: int, lr: float, jsd: dict) -> None:
    run = write_run(sweep / name, beta=0.5, beta_form="paper", precision=precision, seed=seed, steps=40, spot_every=10)
    _set_config(run, **{"run.learning_rate": lr, "monitor.eval.every_n_steps": 20})
    with open(run / METRICS_FILE, "a") as f:
        for step, v in sorted(jsd.items()):
            f.write(json.dumps({"step": step, EVAL_JSD: v}) + "\n")


def test_repro6_the_outcome_pairs_each_seed_within_one_learning_rate(tmp_path):
    """Was not_measured ("seed 1: 2 original runs pair with fp32/paper ..., not 1": FAIL); now each fp32 run pairs
    with the original of its seed and learning rate: PASS (fp32 0.05% better at each)."""
    sweep = tmp_path / "s"
    jobs = {}
    for lr in LR:
        for seed in (1, 2, 3):
            for precision, loss in (("native", "original"), ("fp32", "fp32")):
                name = f"loss={loss},run.learning_rate={lr},run.seed={seed}"
                jobs[name] = [f"loss={loss}", f"run.learning_rate={lr}", f"run.seed={seed}"]
                level = (0.1 if lr == LR[0] else 0.3) + 0.001 * seed
                level *= 0.9995 if precision == "fp32" else 1.0
                _outcome_run(sweep, name, precision, seed, lr, {20: 2 * level, 40: level})
    _plan(sweep, jobs, 40, every=20)
    pnw = _results(sweep)["patched_not_worse"]
    assert pnw.status == "pass", (pnw.measured, pnw.details)
    assert len(pnw.details) == 6 and all("(-0.050%)" in d for d in pnw.details), pnw.details


# --------------------------------------------------------------------------------------------------- repro 8
def test_repro8_a_run_cut_at_5_steps_is_paired_and_incomplete(tmp_path):
    """`-m loss=paper,continuous run.max_steps=10`, the continuous run configured for (and stopped at) 5 steps.
    Was: beta_forms_unchanged "not_applicable: no paper/continuous pair"; now the pair is compared on its 5 common
    steps and says so, and no_failed_runs FAILs naming the plan's 10 steps."""
    sweep = tmp_path / "s"
    write_run(sweep / "loss=paper", beta=0.5, beta_form="paper", precision="fp32", seed=1, steps=10, spot_every=2)
    cut = write_run(
        sweep / "loss=continuous", beta=0.5, beta_form="continuous", precision="fp32", seed=1, steps=5, spot_every=2
    )
    _write_rows(cut, _rows(sweep / "loss=paper")[:5])  # the same stream as its twin, up to where it stopped
    _plan(sweep, {f"loss={f}": [f"loss={f}", "run.max_steps=10"] for f in ("paper", "continuous")}, 10)
    r = _results(sweep)
    assert r["verdict"] == "fail"
    forms = r["beta_forms_unchanged"]
    assert forms.status == "pass" and forms.measured.startswith("1 pairs;"), forms.measured
    assert (
        "loss=paper vs loss=continuous: compared on 5 common steps of 10 planned (loss=continuous logged 5 of 10)"
        in forms.details
    )
    failed = r["no_failed_runs"]
    assert failed.status == "fail"
    assert any("the plan declares run.max_steps=10 for loss=continuous" in d for d in failed.details), failed.details


def test_repro8_b_a_beta_edited_in_summary_names_config_yaml(tmp_path):
    """summary.json says β=0.3 for the continuous run, its config.yaml 0.5. Was: PASS, the β-form check dropped as
    not applicable without a word; now the run is tampered (no_failed_runs FAILs naming both files) and every
    criterion that places runs by their config is not_measured, naming the key."""
    sweep = _forms(tmp_path / "s")
    _set_config(sweep / "loss=continuous", **{"gkd.beta": 0.3})
    r = _results(sweep)
    said = "loss=continuous: gkd.beta is 0.3 vs 0.5 (summary.json vs config.yaml)"
    assert r["verdict"] == "fail"
    assert r["beta_forms_unchanged"].status == "not_measured"
    assert r["beta_forms_unchanged"].details[0] == said
    assert r["no_failed_runs"].status == "fail" and any(said in d for d in r["no_failed_runs"].details)


def _replay(run: Path, steps: tuple, k: float) -> None:
    """A resume that logged ``steps`` again, each value of train/loss and grad_norm ``k`` times the first's."""
    rows = _rows(run)
    again = [
        dict(r, **{TRAIN_LOSS: r[TRAIN_LOSS] * k, TRAIN_GRAD_NORM: r[TRAIN_GRAD_NORM] * k})
        for r in rows
        if r["step"] in steps
    ]
    _write_rows(run, rows + again)


def test_repro8_c_a_replayed_resume_is_not_blamed_on_the_beta_forms(tmp_path):
    """Steps 5 and 6 replayed with values 1.5x the first. Was: beta_forms_unchanged FAIL ("beyond tolerance");
    now not_measured, naming the run and both steps."""
    sweep = _forms(tmp_path / "s")
    _replay(sweep / "loss=continuous", (5, 6), 1.5)
    forms = _results(sweep)["beta_forms_unchanged"]
    assert forms.status == "not_measured", forms.measured
    assert forms.measured.startswith("4 conflicting record(s), not judged by order: loss=continuous step 5: ")
    assert {d.split(":")[0] for d in forms.details[:4]} == {"loss=continuous step 5", "loss=continuous step 6"}


# --------------------------------------------------------------------------------------------------- conflicts
def test_a_conflicting_step_is_not_measured_whatever_the_order(tmp_path):
    """Continuous step 4 logged twice, one copy's loss 1.5x: was PASS with the bad copy first ("largest divergence
    0", the later copy won) and FAIL with it second. Now not_measured both ways, with the same words."""
    seen = []
    for first in (True, False):
        sweep = _forms(tmp_path / f"s{first}")
        run = sweep / "loss=continuous"
        rows = _rows(run)
        good = next(r for r in rows if r["step"] == 4)
        bad = dict(good, **{TRAIN_LOSS: good[TRAIN_LOSS] * 1.5})
        at = rows.index(good)
        rows[at : at + 1] = [bad, good] if first else [good, bad]
        _write_rows(run, rows)
        forms = _results(sweep)["beta_forms_unchanged"]
        assert forms.status == "not_measured", forms.measured
        seen.append(forms.measured)
    assert seen[0] == seen[1]
    assert seen[0].startswith("1 conflicting record(s), not judged by order: loss=continuous step 4: train/loss")


def test_identical_copies_collapse_and_pass(tmp_path):
    sweep = _forms(tmp_path / "s")
    run = sweep / "loss=continuous"
    rows = _rows(run)
    _write_rows(run, rows + [r for r in rows if r["step"] in (3, 4)])
    r = _results(sweep)
    assert r["beta_forms_unchanged"].status == "pass"
    assert r["verdict"] == "fail" or r["verdict"] == "pass"  # the other criteria judge the rest as before
    assert not judge(load_sweep(sweep)).ev.conflicts


def test_a_conflicting_spot_check_makes_spot_tolerance_not_measured(tmp_path):
    sweep = _forms(tmp_path / "s")
    run = sweep / "loss=paper"
    rows = _rows(run)
    spot = next(r for r in rows if "spot/loss" in r)
    _write_rows(run, rows + [dict(spot, **{"spot/loss": spot["spot/loss"] * 1.5})])
    r = _results(sweep)
    assert r["spot_tolerance"].status == "not_measured"
    assert r["spot_tolerance"].details[0].startswith(f"loss=paper step {spot['step']}: spot/loss recorded twice")
    assert r["beta_forms_unchanged"].status == "pass"  # it reads train/loss and grad_norm, not the spot check


def test_a_final_evaluation_recorded_twice_makes_the_outcome_not_measured(tmp_path):
    """An outcome seed's final evaluation logged twice (5% worse, then as measured): was PASS or FAIL by order;
    now not_measured naming the run and the evaluation's step."""
    sweep = tmp_path / "s"
    jobs = {}
    for seed in (1, 2, 3):
        for precision, loss in (("native", "original"), ("fp32", "fp32")):
            name = f"loss={loss},run.seed={seed}"
            jobs[name] = [f"loss={loss}", f"run.seed={seed}"]
            _outcome_run(sweep, name, precision, seed, LR[0], {20: 0.2, 40: 0.1})
    run = sweep / "loss=fp32,run.seed=2"
    with open(run / METRICS_FILE, "a") as f:
        f.write(json.dumps({"step": 40, EVAL_JSD: 0.105}) + "\n")
    _plan(sweep, jobs, 40, every=20)
    pnw = _results(sweep)["patched_not_worse"]
    assert pnw.status == "not_measured"
    assert (
        pnw.details[0]
        == "loss=fp32,run.seed=2 evaluation 40: eval/jsd recorded twice with different values (0.1 vs 0.105)"
    )
