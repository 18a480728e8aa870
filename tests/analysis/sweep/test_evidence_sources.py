"""Issue 45: one evidence record from every source. Each reproduction is judged twice, on the run folders and on
the wandb offline files of the same sweep, with the verdict written down before the run.

The run folders are synthetic (:func:`gkd_harness.bench.synthetic.write_run`) with the plan written by the
launcher's own :func:`gkd_harness.launch.sweep.write_manifest`. The wandb offline files are real ones (wandb
0.31, mode=offline): a child process opens one wandb run per run folder where gkd-train puts it
(``<run>/wandb/``), adds the harness config through the rank's own
:func:`gkd_harness.harness.rank.wandb_run.attach_to_wandb_run` (which carries the plan and the data's sha256),
and logs the run folder's metrics rows as the rank does (``train/global_step``). A case edits the run folders
first, then writes the wandb files, so both sources hold the same evidence.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gkd_harness.analysis.signoff.judge import judge, load_runs
from gkd_harness.analysis.sweep.records import UnusableInput
from gkd_harness.bench.synthetic import write_run
from gkd_harness.harness.contract import EVAL_JSD, METRICS_FILE, SUMMARY_FILE, SWEEP_MANIFEST_FILE, TRAIN_LOSS
from gkd_harness.launch.sweep import declared_point, write_manifest

SOURCES = ("local", "wandb-offline")
STEPS, EVERY = 40, 20
LOSS = {"native": "original", "fp32": "fp32"}

#: Replays each run folder of a sweep as a wandb offline run, the way the rank does inside ms-swift.
_WRITER = textwrap.dedent(
    """
    import inspect, json, sys
    from pathlib import Path
    import wandb
    from gkd_harness.harness.rank import wandb_run

    def nest(flat):
        out = {}
        for k, v in flat.items():
            node = out
            *head, last = k.split(".")
            for h in head:
                node = node.setdefault(h, {})
            node[last] = v
        return out

    root = Path(sys.argv[1])
    for folder in sorted(p.parent for p in root.rglob("summary.json")):
        summary = json.loads((folder / "summary.json").read_text())
        run = wandb.init(project="gkd-harness", group=summary["group"], job_type="train", name=folder.name,
                         dir=str(folder / "wandb"), mode="offline")
        config = {**nest(summary["config"]), "experiment": summary.get("experiment"),
                  "versions": summary["versions"]}
        if "run_dir" in inspect.signature(wandb_run.attach_to_wandb_run).parameters:
            wandb_run.attach_to_wandb_run(config, run_dir=str(folder))
        else:  # the code before issue 45: the wandb run carried the config alone
            wandb_run.attach_to_wandb_run(config)
        wandb_run.update_wandb_config({"dtypes_seen": summary["dtypes_seen"]})
        for line in (folder / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            step = row.pop("step")
            run.log({**row, "train/global_step": step})
        run.finish(exit_code=0 if summary["status"] == "completed" else 1)
    """
)


def _write_wandb_files(sweep: Path) -> None:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    subprocess.run([sys.executable, "-c", _WRITER, str(sweep)], env=env, timeout=600, check=True, capture_output=True)


def _name(precision: str, seed: int) -> str:
    return f"loss={LOSS[precision]},run.seed={seed}"


def _plan(sweep: Path, jobs: dict, group: str, steps: int = STEPS, every: int = EVERY) -> None:
    """The plan as the sweep callback writes it at launch: point -> its overrides."""
    config = OmegaConf.create(
        {"run": {"seed": 42, "max_steps": steps, "logging_steps": 1}, "monitor": {"eval": {"every_n_steps": every}}}
    )
    write_manifest(sweep, list(jobs), group, "basic", {n: declared_point(o, config) for n, o in jobs.items()})


def _declare(folder: Path, every: int, **summary) -> None:
    s = json.loads((folder / SUMMARY_FILE).read_text())
    s["config"]["monitor.eval.every_n_steps"] = every
    s["config"]["run.logging_steps"] = 1
    s["config"]["run.dataset"] = "data/train.jsonl"
    s["data_sha256"] = {"run.dataset": "d" * 64}
    s.update(summary)
    (folder / SUMMARY_FILE).write_text(json.dumps(s))


def _outcome_sweep(root: Path, seeds=(1, 2)) -> Path:
    """Original and fp32 over ``seeds``, held-out evaluation at steps 20 and 40, fp32 no worse."""
    sweep = root / "outcome"
    _plan(sweep, {_name(p, s): [f"loss={LOSS[p]}", f"run.seed={s}"] for s in seeds for p in LOSS}, "outcome")
    for s in seeds:
        for p in LOSS:
            folder = write_run(
                sweep / _name(p, s),
                beta=0.5,
                beta_form="paper",
                precision=p,
                seed=s,
                steps=STEPS,
                spot_every=10,
                group="outcome",
            )
            _declare(folder, EVERY)
            with open(folder / METRICS_FILE, "a") as f:
                for step, v in ((20, 0.2 + 0.001 * s), (40, 0.1 + 0.001 * s)):
                    f.write(json.dumps({"step": step, EVAL_JSD: v}) + "\n")
    return sweep


def _beta_sweep(root: Path) -> Path:
    """Original and fp32 at β=0.5, paper and continuous form (equal there): the β forms unchanged."""
    sweep = root / "beta"
    points = {f"loss={LOSS[p]},loss.beta_form={f}": (p, f) for p in LOSS for f in ("paper", "continuous")}
    _plan(sweep, {n: n.split(",") for n in points}, "beta", steps=10, every=0)
    for name, (p, f) in points.items():
        folder = write_run(
            sweep / name, beta=0.5, beta_form=f, precision=p, seed=0, steps=10, spot_every=5, group="beta"
        )
        _declare(folder, 0)
    return sweep


def test_the_base_sweeps_pass_from_every_source(bases, tmp_path):
    for which in bases:
        sweep = _case(bases, tmp_path, which)
        for source in SOURCES:
            verdict, status, _ = _judged(sweep, source)
            assert verdict == "pass", (which, source, status)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bases")
    return {"outcome": _outcome_sweep(root), "beta": _beta_sweep(root)}


def _case(bases: dict, tmp_path: Path, which: str, edit=None) -> Path:
    """A copy of a base sweep, edited, then given its wandb offline files."""
    sweep = tmp_path / which
    shutil.copytree(bases[which], sweep)
    if edit is not None:
        edit(sweep)
    _write_wandb_files(sweep)
    return sweep


def _judged(sweep: Path, source: str):
    """-> (verdict, {criterion: status}, the judged sweep)."""
    j = judge(load_runs(source, str(sweep), None))
    return j.verdict, {r.name: r.status for r in j.results}, j.sweep


def _rows(folder: Path) -> list:
    return [json.loads(x) for x in (folder / METRICS_FILE).read_text().splitlines()]


def _write_rows(folder: Path, rows: list) -> None:
    (folder / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))


# ---------------------------------------------------------------------------------------------------------------
# the baseline: both sources give the same evidence and verdict
# ---------------------------------------------------------------------------------------------------------------
def test_both_sources_yield_the_plan_and_the_held_out_evaluation(bases, tmp_path):
    sweep = _case(bases, tmp_path, "outcome")
    got = {s: _judged(sweep, s) for s in SOURCES}
    for source, (verdict, status, judged) in got.items():
        assert verdict == "pass", (source, status)
        # before: from wandb offline files "not_applicable: the plan configures no held-out evaluation"
        assert status["patched_not_worse"] == "pass", (source, status)
        assert judged.plan is not None and len(judged.plan.points) == 4, source
        assert sorted(judged.runs["point"]) == sorted(json.loads((sweep / SWEEP_MANIFEST_FILE).read_text())["points"])
    assert got["local"][1] == got["wandb-offline"][1]


def test_the_offline_source_carries_the_plan_without_the_sweep_folder(bases, tmp_path):
    """The wandb files alone (copied out of the sweep folder, no manifest beside them) still bring the plan: each
    wandb run carries a copy of it and its point."""
    sweep = _case(bases, tmp_path, "outcome")
    alone = tmp_path / "alone"
    for f in sweep.rglob("offline-run-*"):
        shutil.copytree(f, alone / f.relative_to(sweep))
    shutil.rmtree(alone / _name("fp32", 2))  # a planned point whose wandb run is gone
    verdict, status, judged = _judged(alone, "wandb-offline")
    assert judged.plan is not None and "carried by the runs" in judged.plan.where
    r = judged.runs.set_index("point")
    assert r.loc[_name("fp32", 2), "outcome"] == "missing" and verdict == "fail"
    assert status["no_failed_runs"] == "fail"


# ---------------------------------------------------------------------------------------------------------------
# reproduction 1: a seed or a planned point deleted: local FAIL, wandb PASS before
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gone", [("fp32", 2), ("native", 1)], ids=["fp32-seed", "original-point"])
def test_repro1_a_deleted_point_fails_from_every_source(bases, tmp_path, gone):
    sweep = _case(bases, tmp_path, "outcome", lambda s: shutil.rmtree(s / _name(*gone)))
    for source in SOURCES:
        verdict, status, judged = _judged(sweep, source)
        assert verdict == "fail", (source, status)
        assert status["no_failed_runs"] == "fail", (source, status)
        assert status["patched_not_worse"] in ("fail", "not_measured"), (source, status)
        assert judged.runs.set_index("point").loc[_name(*gone), "outcome"] == "missing", source


# ---------------------------------------------------------------------------------------------------------------
# reproduction 3: a step logged twice with different values: no order wins
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("first", [True, False], ids=["bad-copy-first", "bad-copy-second"])
def test_repro3_a_training_step_logged_twice_with_different_values_is_a_conflict(bases, tmp_path, first):
    run = "loss=fp32,loss.beta_form=continuous"

    def edit(sweep):
        rows = _rows(sweep / run)
        i = next(i for i, r in enumerate(rows) if r["step"] == 4)
        bad = dict(rows[i], **{TRAIN_LOSS: rows[i][TRAIN_LOSS] * 1.5})
        rows[i : i + 1] = [bad, rows[i]] if first else [rows[i], bad]
        _write_rows(sweep / run, rows)

    sweep = _case(bases, tmp_path, "beta", edit)
    for source in SOURCES:
        verdict, status, judged = _judged(sweep, source)
        # before: first copy x1.5 gave PASS ("largest divergence 0"), the other order FAIL
        assert verdict == "fail", (source, status)
        assert status["no_failed_runs"] == "fail", (source, status)
        c = judged.conflicts
        assert [(x.run, x.step, x.evaluation, x.key) for x in c] == [(run, 4, False, TRAIN_LOSS)], source
        assert "step 4: train/loss recorded twice with different values" in c[0].line()
        assert judged.runs.set_index("point").loc[run, "outcome"] == "tampered", source


@pytest.mark.parametrize("first", [True, False], ids=["worse-copy-first", "worse-copy-second"])
def test_repro3_a_final_evaluation_logged_twice_with_different_values_is_a_conflict(bases, tmp_path, first):
    run = _name("fp32", 1)

    def edit(sweep):
        rows = _rows(sweep / run)
        i = next(i for i, r in enumerate(rows) if r["step"] == STEPS and EVAL_JSD in r)
        worse = dict(rows[i], **{EVAL_JSD: rows[i][EVAL_JSD] * 1.05})
        rows[i : i + 1] = [worse, rows[i]] if first else [rows[i], worse]
        _write_rows(sweep / run, rows)

    sweep = _case(bases, tmp_path, "outcome", edit)
    for source in SOURCES:
        verdict, status, judged = _judged(sweep, source)
        # before: 5% worse first gave PASS, second FAIL (+8.8%)
        assert verdict == "fail", (source, status)
        c = judged.conflicts
        assert [(x.run, x.step, x.evaluation, x.key) for x in c] == [(run, STEPS, True, EVAL_JSD)], source


def test_identical_copies_of_a_step_collapse_with_a_note(bases, tmp_path):
    run = "loss=fp32,loss.beta_form=continuous"

    def edit(sweep):
        rows = _rows(sweep / run)
        _write_rows(sweep / run, rows[:4] + [rows[3]] + rows[4:])

    sweep = _case(bases, tmp_path, "beta", edit)
    for source in SOURCES:
        verdict, status, judged = _judged(sweep, source)
        assert verdict == "pass" and not len(judged.conflicts), (source, status)
        problems = judged.runs.set_index("point").loc[run, "problems"]
        assert "step 4 x2 (identical copies, collapsed)" in problems, source


# ---------------------------------------------------------------------------------------------------------------
# reproductions 5 and 7: what can change a result is part of a run's identity
# ---------------------------------------------------------------------------------------------------------------
def _summary_edit(point: str, **fields):
    def edit(sweep):
        path = sweep / point / SUMMARY_FILE
        s = json.loads(path.read_text())
        for k, v in fields.items():
            s[k] = {**s.get(k, {}), **v} if isinstance(v, dict) else v
        path.write_text(json.dumps(s))

    return edit


def test_repro5_a_run_of_another_torch_is_refused_from_every_source(bases, tmp_path):
    sweep = _case(bases, tmp_path, "outcome", _summary_edit(_name("fp32", 2), versions={"torch": "2.5.1+cu124"}))
    for source in SOURCES:
        # before: PASS (only ms-swift was judged)
        with pytest.raises(UnusableInput, match=r"two torch versions: 2\.13\.0 \(3 runs.*2\.5\.1\+cu124 \(1 runs"):
            _judged(sweep, source)


def test_repro7_a_dataset_edited_in_place_is_refused_naming_the_file(bases, tmp_path):
    sweep = _case(
        bases,
        tmp_path,
        "beta",
        _summary_edit("loss=fp32,loss.beta_form=continuous", data_sha256={"run.dataset": "e" * 64}),
    )
    for source in SOURCES:
        # before: FAIL blaming the β forms (or PASS on these equal streams): the path alone was recorded
        with pytest.raises(UnusableInput, match=r"run\.dataset=data/train\.jsonl has two contents .*sha256 dddddddd"):
            _judged(sweep, source)


# ---------------------------------------------------------------------------------------------------------------
# reproduction 4: no plan at all and a point deleted: PASS on the runs found, no note, before
# ---------------------------------------------------------------------------------------------------------------
def test_repro4_a_sweep_without_a_plan_is_refused_unless_no_plan_accepts_it(bases, tmp_path):
    from gkd_harness.analysis.sweep.plan import NO_PLAN, require_plan

    def edit(sweep):
        (sweep / SWEEP_MANIFEST_FILE).unlink()
        shutil.rmtree(sweep / _name("fp32", 2))

    sweep = _case(bases, tmp_path, "outcome", edit)
    for copy in sweep.rglob(f"files/{SWEEP_MANIFEST_FILE}"):  # wandb runs of a launch that wrote no plan
        copy.unlink()
    for source in SOURCES:
        loaded = load_runs(source, str(sweep), None)
        with pytest.raises(UnusableInput, match=r"no plan .*--no-plan judges the runs found"):
            require_plan(loaded)
        accepted = require_plan(loaded, no_plan=True)
        assert accepted.plan is None and NO_PLAN in accepted.lacks and len(accepted.runs) == 3, source
    with_plan = load_runs("local", str(bases["outcome"]), None)
    assert require_plan(with_plan) is with_plan and NO_PLAN not in with_plan.lacks
