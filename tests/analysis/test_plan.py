"""Issue 38: the verdict comes from the plan written at launch (``sweep_manifest.json``): runs outside it are
refused, each criterion pairs same seed / same step over every planned seed, and gkd-analyze, gkd-dashboard and
``--verify`` give one verdict. Run folders are synthetic (:func:`gkd_harness.bench.synthetic.write_run`) with the
plan written by the launcher's own :func:`gkd_harness.launch.sweep.write_manifest`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.dashboard.cli import main as dashboard_main
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.contract import EVAL_JSD, METRICS_FILE, SUMMARY_FILE
from gkd_harness.launch.sweep import declared_point, launch_line, write_manifest

STEPS, EVERY = 40, 20
LOSS = {"native": "original", "fp32": "fp32"}


def _name(precision: str, seed: int) -> str:
    return f"loss={LOSS[precision]},run.seed={seed}"


def _plan(sweep: Path, points: list, group: str = "outcome", steps: int = STEPS, every: int = EVERY, signoff=None):
    """Write the plan as the sweep callback does at launch: each point's declared seed, steps and evaluation."""
    config = OmegaConf.create(
        {"run": {"seed": 42, "max_steps": steps, "logging_steps": 1}, "monitor": {"eval": {"every_n_steps": every}}}
    )
    jobs = {n: [f"loss={n.split(',')[0].split('=')[1]}", n.split(",")[1]] for n in points}
    declared = {n: declared_point(jobs[n], config) for n in points}
    return write_manifest(sweep, points, group, "basic", declared, signoff)[1]


def _run(
    sweep: Path,
    precision: str,
    seed: int,
    *,
    jsd: dict | None = None,
    steps: int = STEPS,
    every=EVERY,
    name: str | None = None,
    **kw,
) -> Path:
    """One run folder; ``jsd``: held-out eval/jsd by step (the evaluation records)."""
    folder = write_run(
        sweep / (name or _name(precision, seed)),
        beta=0.5,
        beta_form="paper",
        precision=precision,
        seed=seed,
        steps=steps,
        spot_every=10,
        group=kw.pop("group", "outcome"),
        **kw,
    )
    s = json.loads((folder / SUMMARY_FILE).read_text())
    s["config"]["monitor.eval.every_n_steps"] = every
    (folder / SUMMARY_FILE).write_text(json.dumps(s))
    with open(folder / METRICS_FILE, "a") as f:
        for step, v in sorted((jsd or {}).items()):
            f.write(json.dumps({"step": step, EVAL_JSD: v}) + "\n")
    return folder


def _outcome(sweep: Path, seeds=(1, 2, 3), harm: float = 0.0, drop: dict | None = None) -> Path:
    """Original and fp32 over ``seeds``, evaluated at steps 20 and 40; fp32 ``harm`` worse at step 40; ``drop``:
    (precision, seed) -> the evaluation steps that run lacks."""
    drop = drop or {}
    _plan(sweep, [_name(p, s) for s in seeds for p in ("native", "fp32")])
    for s in seeds:
        base = {20: 0.2 + 0.001 * s, 40: 0.1 + 0.001 * s}
        for p in ("native", "fp32"):
            vals = {k: (v * (1 + harm) if p == "fp32" and k == 40 else v) for k, v in base.items()}
            _run(sweep, p, s, jsd={k: v for k, v in vals.items() if k not in drop.get((p, s), ())})
    return sweep


def _analyze(sweep: Path, report: Path, *extra) -> tuple:
    return main([str(sweep), "--report", str(report), *extra]), json.loads((report / "verdict.json").read_text()) if (
        report / "verdict.json"
    ).exists() else None


def _judged(sweep: Path, criteria: Path | None = None, allow_mixed: bool = False) -> dict:
    """What gkd-analyze judges, without writing the report (the same function: judge)."""
    from gkd_harness.analysis.signoff.judge import judge, load_runs
    from gkd_harness.analysis.signoff.verdict import judgement

    j = judge(load_runs("local", str(sweep), None), criteria, allow_mixed)
    out = judgement(j)
    out["runs"] = j.sweep.runs[["run", "outcome", "problems"]].to_dict("records")
    return out


def _criterion(verdict: dict, name: str) -> dict:
    return next(c for c in verdict["criteria"] if c["name"] == name)


# ---------------------------------------------------------------------------------------------------------------
# outcome evidence that is paired: same seed, same step, every planned seed
# ---------------------------------------------------------------------------------------------------------------


def test_repro2_a_missing_final_evaluation_is_not_paired_with_an_earlier_one(tmp_path, capsys):
    """fp32 8% worse at step 40 in every seed, the original's step-40 evaluation missing: was PASS ("0.963x", fp32
    at 40 against the original at 20), every run completed."""
    sweep = _outcome(tmp_path / "outcome", harm=0.08, drop={("native", s): (40,) for s in (1, 2, 3)})
    rc, v = _analyze(sweep, tmp_path / "r")
    assert rc == 1 and v["verdict"] == "fail"
    pnw = _criterion(v, "patched_not_worse")
    assert (
        pnw["status"] == "not_measured" and "at its final planned step 40 (its last is at step 20)" in pnw["measured"]
    )
    assert "0.963" not in json.dumps(v)
    runs = {r["run"]: r for r in v["runs"]}
    assert runs[_name("native", 1)]["outcome"] == "incomplete"
    assert "no held-out evaluation at its final planned step 40" in runs[_name("native", 1)]["problems"]
    assert _criterion(v, "no_failed_runs")["status"] == "fail"


def test_repro3_one_seeds_evaluations_missing_fails_naming_the_seed(tmp_path, capsys):
    sweep = _outcome(tmp_path / "all", drop={("native", 3): (20, 40), ("fp32", 3): (20, 40)})
    v = _judged(sweep)
    pnw = _criterion(v, "patched_not_worse")
    assert v["exit_code"] == 1 and pnw["status"] == "not_measured" and "seed 3" in pnw["measured"], pnw
    assert "2 seeds" not in pnw["measured"]


def test_repro3_only_one_seeds_final_evaluation_missing_gives_no_figure(tmp_path, capsys):
    """Was FAIL with +11.9% (step 20 against step 40)."""
    sweep = _outcome(tmp_path / "final", drop={("fp32", 2): (40,)})
    v = _judged(sweep)
    pnw = _criterion(v, "patched_not_worse")
    assert v["exit_code"] == 1 and pnw["status"] == "not_measured"
    gap = "seed 2: fp32/paper (loss=fp32,run.seed=2) has no eval/jsd at its final planned step 40 (its last is at step 20)"
    assert pnw["details"] == [gap]
    assert "%" not in pnw["measured"].split("gap(s)")[0]


def test_the_outcome_preset_margin_is_in_the_plan_and_the_verdict_line(tmp_path, capsys):
    """The experiment preset declares the margin (hydra.callbacks.sweep_status.plan, written into the plan); the
    verdict line prints it; a 2% harm fails with it, a 0.05% difference passes."""
    preset = OmegaConf.load(Path(__file__).parents[2] / "gkd_harness/configs/experiment/outcome.yaml")
    declared = OmegaConf.to_container(preset.hydra.callbacks.sweep_status.plan)
    assert declared == {"patched_not_worse": {"margin": 0.01}}
    ok = _outcome(tmp_path / "ok", harm=0.0005)
    _plan(ok, [_name(p, s) for s in (1, 2, 3) for p in ("native", "fp32")], signoff=declared)
    capsys.readouterr()
    assert main([str(ok), "--report", str(tmp_path / "r1")]) == 0
    assert "non-inferiority margin 1.00% (the plan)" in capsys.readouterr().out
    bad = _outcome(tmp_path / "bad", harm=0.02)
    _plan(bad, [_name(p, s) for s in (1, 2, 3) for p in ("native", "fp32")], signoff=declared)
    v = _judged(bad)
    assert v["exit_code"] == 1 and _criterion(v, "patched_not_worse")["status"] == "fail"
    assert v["plan"]["signoff"] == declared and v["plan"]["launches"] == [1, 2]


# ---------------------------------------------------------------------------------------------------------------
# runs outside the plan
# ---------------------------------------------------------------------------------------------------------------


def test_repro6_a_copied_run_under_another_seed_is_listed_and_refused(tmp_path, capsys):
    sweep = _outcome(tmp_path / "s", seeds=(1, 2))
    import shutil

    shutil.copytree(sweep / _name("fp32", 2), sweep / _name("fp32", 7))
    rc, _ = _analyze(sweep, tmp_path / "r")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "1 run(s) outside the plan" in err[0] and "run.seed=7" in err[0]
    assert not (tmp_path / "r").exists()
    v = _judged(sweep, allow_mixed=True)
    assert any("outside the plan" in m for m in v["mixed"])


def test_repro6_another_sweeps_run_with_another_dataset_and_learning_rate_is_refused(tmp_path, capsys):
    sweep = _outcome(tmp_path / "s", seeds=(1, 2))
    folder = sweep / _name("fp32", 2)
    s = json.loads((folder / SUMMARY_FILE).read_text())
    s["config"].update({"run.learning_rate": 0.1, "run.dataset": "other.jsonl"})
    (folder / SUMMARY_FILE).write_text(json.dumps(s))
    for p in ("native", "fp32"):  # the others record theirs
        for seed in (1, 2):
            f = sweep / _name(p, seed)
            if f != folder:
                d = json.loads((f / SUMMARY_FILE).read_text())
                d["config"].update({"run.learning_rate": 0.001, "run.dataset": "data.jsonl"})
                (f / SUMMARY_FILE).write_text(json.dumps(d))
    rc, _ = _analyze(sweep, tmp_path / "r")
    err = capsys.readouterr().err
    assert rc == 2 and "runs differ in run.dataset, which the plan does not sweep" in err
    assert "run.learning_rate" in err


def test_repro8_a_relaunch_with_fewer_points_says_what_it_drops_and_the_sweep_passes(tmp_path, capsys):
    sweep = tmp_path / "s"
    first = _plan(sweep, [_name(p, s) for s in (1, 2, 3) for p in ("native", "fp32")])
    assert launch_line(first) is None
    second = _plan(sweep, [_name(p, s) for s in (1, 2) for p in ("native", "fp32")])
    line = launch_line(second)
    assert line is not None and line.startswith("launch 2 of this sweep's plan, adds 0 point(s), drops 2 planned")
    assert "loss=original,run.seed=3" in line
    for s in (1, 2):
        for p in ("native", "fp32"):
            _run(sweep, p, s, jsd={20: 0.2, 40: 0.1})
    v = _judged(sweep)
    assert v["exit_code"] == 0, v["failed_reasons"]
    manifest = json.loads((sweep / "sweep_manifest.json").read_text())
    assert [x["id"] for x in manifest["launches"]] == [1, 2] and len(manifest["points"]) == 4


def test_a_relaunch_keeps_the_points_that_ran_earlier(tmp_path):
    sweep = tmp_path / "s"
    _plan(sweep, [_name("native", 1), _name("fp32", 1)])
    _run(sweep, "native", 1, jsd={20: 0.2, 40: 0.1})
    entry = _plan(sweep, [_name("fp32", 1)])
    assert entry["keeps"] == [_name("native", 1)] and entry["drops"] == []
    assert json.loads((sweep / "sweep_manifest.json").read_text())["points"] == [_name("native", 1), _name("fp32", 1)]


# ---------------------------------------------------------------------------------------------------------------
# one verdict: gkd-analyze and gkd-dashboard
# ---------------------------------------------------------------------------------------------------------------


def _complete(root: Path) -> Path:
    return _outcome(root)


def _partial(root: Path) -> Path:  # two planned points never started
    sweep = _outcome(root, seeds=(1, 2))
    _plan(sweep, [_name(p, s) for s in (1, 2, 3) for p in ("native", "fp32")])
    return sweep


def _relaunched(root: Path) -> Path:  # launch 2 drops seed 3, which never ran
    sweep = root
    _plan(sweep, [_name(p, s) for s in (1, 2, 3) for p in ("native", "fp32")])
    _plan(sweep, [_name(p, s) for s in (1, 2) for p in ("native", "fp32")])
    for s in (1, 2):
        for p in ("native", "fp32"):
            _run(sweep, p, s, jsd={20: 0.2 + 0.001 * s, 40: 0.1 + 0.001 * s})
    return sweep


def _extended(root: Path) -> Path:  # launch 2 adds seed 3 and runs it
    sweep = _outcome(root, seeds=(1, 2))
    _plan(sweep, [_name(p, s) for s in (1, 2, 3) for p in ("native", "fp32")])
    for p in ("native", "fp32"):
        _run(sweep, p, 3, jsd={20: 0.203, 40: 0.103})
    return sweep


@pytest.mark.parametrize(
    "build, expected",
    [(_complete, "pass"), (_partial, "fail"), (_relaunched, "pass"), (_extended, "pass")],
)
def test_repro7_gkd_dashboard_and_gkd_analyze_give_the_same_verdict(tmp_path, capsys, build, expected):
    """gkd-dashboard read the folders, not the plan: "verdict PASS (4 runs)" where gkd-analyze said FAIL."""
    sweep = build(tmp_path / "outcome")
    rc, v = _analyze(sweep, tmp_path / "r")
    assert v["verdict"] == expected and rc == (0 if expected == "pass" else 1), capsys.readouterr()
    out = tmp_path / "spec.json"
    assert dashboard_main([str(sweep), "--out", str(out)]) == 0
    spec = json.loads(out.read_text())
    assert spec["verdict"]["verdict"] == v["verdict"]
    assert [c["status"] for c in spec["verdict"]["criteria"]] == [c["status"] for c in v["criteria"]]
    assert f"verdict {expected.upper()} ({v['n_runs']} runs judged" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# smaller cases
# ---------------------------------------------------------------------------------------------------------------


def test_repro10_a_four_step_run_in_an_eight_step_points_folder_is_incomplete(tmp_path, capsys):
    sweep = tmp_path / "s"
    _plan(sweep, [_name("native", 1), _name("fp32", 1)], steps=8, every=0)
    _run(sweep, "native", 1, steps=8, every=0)
    _run(sweep, "fp32", 1, steps=4, every=0)
    v = _judged(sweep, allow_mixed=True)
    runs = {r["run"]: r for r in v["runs"]}
    assert v["exit_code"] == 1 and runs[_name("fp32", 1)]["outcome"] == "incomplete"
    assert "the plan declares run.max_steps=8" in runs[_name("fp32", 1)]["problems"]


def test_repro10_a_symlinked_run_folder_is_named_not_skipped(tmp_path, capsys):
    sweep = _outcome(tmp_path / "s", seeds=(1, 2))
    elsewhere = tmp_path / "elsewhere"
    (sweep / _name("fp32", 2)).rename(elsewhere)
    (sweep / _name("fp32", 2)).symlink_to(elsewhere)
    rc, _ = _analyze(sweep, tmp_path / "r")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is a symbolic link" in err[0] and "run.seed=2" in err[0]


def test_repro10_runs_without_provenance_are_refused(tmp_path, capsys):
    sweep = _outcome(tmp_path / "s", seeds=(1, 2))
    f = sweep / _name("fp32", 1) / SUMMARY_FILE
    s = json.loads(f.read_text())
    del s["provenance"]
    f.write_text(json.dumps(s))
    rc, _ = _analyze(sweep, tmp_path / "r")
    assert rc == 2 and "1 run(s) without provenance" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["device", "fifo", "too_big"])
def test_repro10_a_metrics_file_that_is_not_a_bounded_regular_file_is_one_line(tmp_path, capsys, monkeypatch, kind):
    sweep = _outcome(tmp_path / "s", seeds=(1, 2))
    metrics = sweep / _name("fp32", 1) / METRICS_FILE
    if kind == "device":
        metrics.unlink()
        metrics.symlink_to("/dev/zero")
    elif kind == "fifo":
        metrics.unlink()
        os.mkfifo(metrics)
    else:
        monkeypatch.setenv("GKD_ANALYZE_MAX_METRICS_BYTES", "1000")
    rc, _ = _analyze(sweep, tmp_path / "r")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(metrics) in err[0]
    assert ("over the reader's limit of 1,000" if kind == "too_big" else "not a regular file") in err[0]


def test_repro10_no_nan_in_a_failed_runs_message(tmp_path, capsys):
    sweep = _outcome(tmp_path / "s", seeds=(1, 2), drop={("native", 1): (40,)})
    v = _judged(sweep)
    details = _criterion(v, "no_failed_runs")["details"]
    assert v["exit_code"] == 1 and details and not any("nan" in d for d in details), details


def test_repro11_verify_checks_report_html(tmp_path, capsys):
    sweep = _outcome(tmp_path / "s", seeds=(1, 2), drop={("native", 1): (40,)})
    report = tmp_path / "r"
    assert main([str(sweep), "--report", str(report)]) == 1
    assert main(["--verify", str(report)]) == 0
    html = report / "report.html"
    html.write_text(
        html.read_text()
        .replace("class='banner fail'", "class='banner pass'")
        .replace("<span id='verdict'>FAIL</span>", "<span id='verdict'>PASS</span>")
    )
    capsys.readouterr()
    assert main(["--verify", str(report)]) == 1
    assert "DIFFERS: report.html: its banner says PASS, the runs give FAIL" in capsys.readouterr().out


def test_verify_reports_a_plot_changed_since_the_report(tmp_path, capsys):
    sweep = _outcome(tmp_path / "s", seeds=(1, 2))  # (PASS needs no report here: a plot is a plot)
    report = tmp_path / "r"
    main([str(sweep), "--report", str(report)])
    png = sorted(report.glob("*.png"))[0]
    png.write_bytes(png.read_bytes() + b"x")
    capsys.readouterr()
    assert main(["--verify", str(report)]) == 1
    assert f"{png.name} changed since the report" in capsys.readouterr().out


def test_issue40_a_missing_sweep_folder_is_one_line_before_heavy_imports(tmp_path):
    code = (
        "import sys; from gkd_harness.analysis.cli import main; rc = main(['/no/such/folder']); "
        "print(rc, 'pandas' in sys.modules, 'torch' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "False", "False"], proc
    assert proc.stderr.strip() == "gkd-analyze: unusable input: sweep folder /no/such/folder does not exist"


def test_summary_json_says_what_was_hashed():
    """Issue 38 item 9: identity by what changes results; summary.json's provenance says what each hash covers."""
    from gkd_harness.harness.store.provenance import _HARNESS_DIR, provenance, sha256_path

    prov = provenance("fp32")
    assert prov["rank_sha256"] == sha256_path(_HARNESS_DIR / "rank")
    assert prov["loss_sha256"] == sha256_path(_HARNESS_DIR / "loss")
    assert set(prov["hashed"]) == {"loss_sha256", "rank_sha256", "not_hashed"}
    assert "harness_commit" in prov["hashed"]["not_hashed"]
