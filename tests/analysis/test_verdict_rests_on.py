"""Issue 45, what the verdict rests on: a criteria file that changes a threshold or a switch stands on the verdict's
first line (the report's banner, the console's verdict line, verdict.json), with the verdict the shipped criteria
give; the headline is computed from the criteria and never contradicts a failing one; ``build_report`` renders the
judge's verdict and computes none.

Reproductions 2 and 9 of the issue, on synthetic run folders (gkd_harness.bench.synthetic.write_run), with the
expected verdict and lines written in each test.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from gkd_harness.analysis.cli import main
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.contract import (
    SPOT_LOSS,
    SPOT_LOSS_ABS_ERR,
    SPOT_LOSS_FP64,
    SPOT_LOSS_REL_ERR,
    TRAIN_LOSS,
)

STEPS = 10


def _sweep(root: Path, *, running: str | None = None) -> Path:
    """native and fp32 x paper and continuous at β=0.5, 10 steps, a spot check every 2 (``running``: that run
    stopped at step 5 with status running: incomplete)."""
    for prec in ("native", "fp32"):
        for form in ("paper", "continuous"):
            name = f"{prec}-{form}"
            write_run(
                root / name,
                beta=0.5,
                beta_form=form,
                precision=prec,
                seed=1,
                steps=STEPS,
                spot_every=2,
                status="running" if name == running else "completed",
            )
    points = sorted(p.name for p in root.iterdir())
    (root / "sweep_manifest.json").write_text(json.dumps({"points": points}))  # the plan: names only
    return root


def _edit(run: Path, edit) -> None:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(edit(dict(r))) + "\n" for r in rows))


def _loss_off(r: dict, rel: float) -> dict:
    r[TRAIN_LOSS] *= 1 + rel
    return r


def _spot_off(r: dict, rel: float) -> dict:
    if SPOT_LOSS_FP64 in r:
        fp64 = r[SPOT_LOSS_FP64]
        r.update({SPOT_LOSS: fp64 * (1 + rel), SPOT_LOSS_ABS_ERR: abs(fp64 * rel), SPOT_LOSS_REL_ERR: abs(rel)})
    return r


def _analyze(sweep: Path, out: Path, capsys, criteria: str | None = None) -> tuple:
    """-> (exit code, the console's verdict line, the report's banner line, verdict.json)."""
    out.mkdir(parents=True, exist_ok=True)
    args = [str(sweep), "--report", str(out / "r")]
    if criteria is not None:
        (out / "c.yaml").write_text(criteria)
        args += ["--criteria", str(out / "c.yaml")]
    capsys.readouterr()
    rc = main(args)
    console = capsys.readouterr().out
    line = next(x for x in console.splitlines() if x.startswith("verdict: "))
    md = (out / "r" / "report.md").read_text()
    banner = next(x for x in md.splitlines() if x.startswith("> **Verdict")).replace("\\", "")  # any escaping
    return rc, line, banner, json.loads((out / "r" / "verdict.json").read_text())


def _status(v: dict, name: str) -> str:
    return next(c for c in v["criteria"] if c["name"] == name)["status"]


# --------------------------------------------------------------------------------------------------- repro 2
def test_repro2_a_beta_list_without_the_mismatching_beta_is_on_the_first_line(tmp_path, capsys):
    """The continuous form is 1e-3 off paper at β=0.5: FAIL with the shipped criteria; `betas: [0.0, 1.0]` makes
    it PASS, and the banner, the console and verdict.json say that the file did it."""
    sweep = _sweep(tmp_path / "s")
    _edit(sweep / "fp32-continuous", lambda r: _loss_off(r, 1e-3))
    rc, _, _, v = _analyze(sweep, tmp_path / "shipped", capsys)
    assert rc == 1 and v["failed_criteria"] == ["beta_forms_unchanged"] and v["rests_on"] == ""
    rc, line, banner, v = _analyze(sweep, tmp_path / "file", capsys, "beta_forms_unchanged:\n  betas: [0.0, 1.0]\n")
    said = (
        "criteria file c.yaml changes beta_forms_unchanged.betas [0, 0.5, 1] → [0, 1]; "
        "without the criteria file the verdict is FAIL (beta_forms_unchanged)"
    )
    assert rc == 0 and v["verdict"] == "pass"
    assert v["rests_on"] == said
    assert banner.startswith(f"> **Verdict: PASS** — Not the shipped criteria: {said}. ")
    assert line.startswith(f"verdict: PASS (4 runs; not the shipped criteria: {said}) -> ")
    assert v["criteria_changes"] == [
        {
            "key": "beta_forms_unchanged.betas",
            "shipped": [0.0, 0.5, 1.0],
            "value": [0.0, 1.0],
            "by": "c.yaml",
        }
    ]
    assert v["verdict_without_criteria_file"] == {"verdict": "fail", "failed": ["beta_forms_unchanged"]}
    # --verify recomputes it, the criteria file given by another path
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "c.yaml").write_text((tmp_path / "file" / "c.yaml").read_text())
    capsys.readouterr()
    assert main(["--verify", str(tmp_path / "file" / "r"), "--criteria", str(tmp_path / "again" / "c.yaml")]) == 0
    assert "matches: verdict PASS" in capsys.readouterr().out


def test_repro2_b_a_wide_spot_tolerance_is_on_the_first_line(tmp_path, capsys):
    """fp32's spot loss 50% off FP64: `loss_rtol: 1.0` passes it ("6 passed, 0 failed"), and says so first."""
    sweep = _sweep(tmp_path / "s")
    for run in ("fp32-paper", "fp32-continuous"):
        _edit(sweep / run, lambda r: _spot_off(r, 0.5))
    rc, line, banner, v = _analyze(sweep, tmp_path / "file", capsys, "spot_tolerance:\n  loss_rtol: 1.0\n")
    said = (
        "criteria file c.yaml changes spot_tolerance.loss_rtol 0.0001 → 1; "
        "without the criteria file the verdict is FAIL (spot_tolerance)"
    )
    assert rc == 0 and _status(v, "spot_tolerance") == "pass"
    assert banner.startswith(f"> **Verdict: PASS** — Not the shipped criteria: {said}. ")
    assert f"not the shipped criteria: {said})" in line and v["rests_on"] == said


def test_repro2_c_allow_incomplete_is_on_the_first_line_and_the_beta_forms_say_how_many_steps(tmp_path, capsys):
    """A run stopped at 5 of 10 steps: `allow_incomplete: true` passes no_failed_runs; the banner says the file
    did it, and beta_forms_unchanged says it compared 5 of the 10 planned steps of that pair."""
    sweep = _sweep(tmp_path / "s", running="fp32-continuous")
    rc, line, banner, v = _analyze(sweep, tmp_path / "file", capsys, "no_failed_runs:\n  allow_incomplete: true\n")
    said = (
        "criteria file c.yaml changes no_failed_runs.allow_incomplete false → true; "
        "without the criteria file the verdict is FAIL (no_failed_runs)"
    )
    assert (
        rc == 0
        and v["rests_on"] == said
        and banner.startswith(f"> **Verdict: PASS** — Not the shipped criteria: {said}. ")
    )
    forms = next(c for c in v["criteria"] if c["name"] == "beta_forms_unchanged")
    assert forms["status"] == "pass"
    assert "; 1 pair compared on fewer steps than planned" in forms["measured"], forms["measured"]
    assert (
        "fp32-paper vs fp32-continuous: compared on 5 common steps of 10 planned (fp32-continuous logged 5 of 10)"
        in forms["details"]
    )


def test_a_plan_declared_value_is_named_with_the_plan(tmp_path, capsys):
    """The experiment's plan declares a margin: the first line names the plan, and no "without the criteria file"
    verdict (there is no file)."""
    sweep = _sweep(tmp_path / "s")
    points = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    manifest = {"points": points, "signoff": {"patched_not_worse": {"margin": 0.02}}}
    (sweep / "sweep_manifest.json").write_text(json.dumps(manifest))
    rc, line, banner, v = _analyze(sweep, tmp_path / "o", capsys)
    said = "the plan (sweep_manifest.json) changes patched_not_worse.margin 0.01 → 0.02"
    assert rc == 0 and v["rests_on"] == said and v["verdict_without_criteria_file"] is None
    assert f"not the shipped criteria: {said})" in line


def test_without_a_plan_the_banner_says_completeness_is_not_checked(tmp_path, capsys):
    sweep = _sweep(tmp_path / "s")
    (sweep / "sweep_manifest.json").unlink()
    rc, _, banner, v = _analyze(sweep, tmp_path / "o", capsys)
    assert rc == 0 and v["plan"] is None
    assert banner.replace("\\", "").startswith(  # whatever Markdown escaping the name gets
        "> **Verdict: PASS** — No plan (no sweep_manifest.json or multirun.yaml): completeness not checked. "
    ), banner
    failed = next(c for c in v["criteria"] if c["name"] == "no_failed_runs")
    assert "plan: none, so completeness is not checked against planned points" in failed["applies"]


# --------------------------------------------------------------------------------------------------- repro 9
def test_repro9_the_headline_never_contradicts_a_failing_criterion(tmp_path, capsys):
    """fp32's spot loss 50% off FP64, shipped criteria: spot_tolerance fails; the headline said "Fix: patched
    (fp32) 0/.. negative loss calls, gradient within 2.3e-06 of FP64"."""
    sweep = _sweep(tmp_path / "s")
    for run in ("fp32-paper", "fp32-continuous"):
        _edit(sweep / run, lambda r: _spot_off(r, 0.5))
    rc, _, _, v = _analyze(sweep, tmp_path / "o", capsys)
    assert rc == 1 and "spot_tolerance" in v["failed_criteria"]
    head = v["headline"]
    assert head.startswith("Defect: original (native) ")
    fix = head[head.index("Fix: ") :]
    assert fix.startswith("Fix: NOT shown: spot_tolerance fail (fp32-")
    assert "|loss-FP64|=" in fix and "within" not in fix, fix
    md = (tmp_path / "o" / "r" / "report.md").read_text()
    assert "Fix: NOT shown: spot" in md.split("## ", 1)[0] and "gradient within" not in md.split("## ", 1)[0]


# --------------------------------------------------------------------------------------------------- one verdict path
def test_build_report_renders_the_judges_verdict_and_computes_none():
    from gkd_harness.analysis.signoff import report

    params = list(inspect.signature(report.build_report).parameters)
    assert params[0] == "judged" and "cfg" not in params and "evidence" not in params
    source = inspect.getsource(report)
    assert "evaluate_evidence" not in source and "build_evidence" not in source
