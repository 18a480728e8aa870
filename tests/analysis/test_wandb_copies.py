"""Copies of one wandb run id in the wandb-offline loader are copies, not resumed attempts: each stays its own
run (``copy_of``) and ``gkd-analyze --source wandb-offline`` refuses them unless ``--allow-mixed``, as it does
for copied run folders. One real wandb offline run (wandb in mode=offline) in gkd-train's layout
(``WANDB_DIR=<run folder>/wandb``, so the file lies in ``<run folder>/wandb/wandb/offline-run-*/``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gkd_harness.analysis.cli import main
from gkd_harness.analysis.load import find_offline_runs, load_wandb_offline
from gkd_harness.analysis.sweep.records import mixed_sweep_problems

_WRITER = textwrap.dedent("""
    import sys, wandb
    run = wandb.init(project="gkd-harness", group="g", job_type="train", name=sys.argv[1], mode="offline",
                     config={"loss": {"precision": "fp32", "beta_form": "paper"}, "gkd": {"beta": 0.5,
                             "temperature": 0.9, "topk": None}, "run": {"seed": 0, "max_steps": 4},
                             "dtypes_seen": {"student": "float32", "teacher": "bfloat16"}})
    for step in range(1, 5):
        run.log({"train/loss": 0.01 / step, "train/grad_norm": 0.1 + step, "gkd/neg_loss_calls": 0,
                 "gkd/neg_loss_calls_total": 0, "gkd/loss_calls_total": step, "step": step,
                 "spot/loss": 0.01 / step, "spot/loss_fp64": 0.01 / step, "spot/grad_rel_l2": 1e-7})
    run.finish()
""")


@pytest.fixture(scope="module")
def one_run(tmp_path_factory) -> Path:
    """``sweep/point/``: a run folder (summary.json) with one real wandb offline run under ``wandb/wandb/``."""
    point = tmp_path_factory.mktemp("wandb_copies") / "sweep" / "point"
    (point / "wandb").mkdir(parents=True)
    (point / "summary.json").write_text(json.dumps({"status": "completed", "run_name": "point"}))
    env = dict(os.environ, WANDB_DIR=str(point / "wandb"), WANDB_MODE="offline", WANDB_SILENT="true")
    subprocess.run([sys.executable, "-c", _WRITER, "point"], env=env, timeout=300, check=True, capture_output=True)
    (wandb_file,) = find_offline_runs(point)
    assert wandb_file.parent.parent == point / "wandb" / "wandb"
    return point.parent


def _copy(one_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "sweep"
    shutil.copytree(one_run, dst, symlinks=True)  # as cp -r does
    return dst


def test_one_run_in_gkd_train_layout_is_its_run_folder(one_run, tmp_path):
    sw = load_wandb_offline(one_run)
    assert sw.runs["run"].tolist() == ["point"]
    assert sw.runs.loc[0, "path"] == str(one_run / "point")  # where its captures are (on main: the .wandb file)
    assert mixed_sweep_problems(sw) == []
    # a copy that follows links turns wandb's latest-run link into a folder: still one run, no copy
    shutil.copytree(one_run, tmp_path / "followed", symlinks=False)
    assert (tmp_path / "followed" / "point" / "wandb" / "wandb" / "latest-run").is_dir()
    sw = load_wandb_offline(tmp_path / "followed")
    assert sw.runs["run"].tolist() == ["point"] and mixed_sweep_problems(sw) == []


def test_run_folder_copied_is_two_runs_and_refused(one_run, tmp_path, capsys):
    sweep = _copy(one_run, tmp_path)
    shutil.copytree(sweep / "point", sweep / "point-copy")
    sw = load_wandb_offline(sweep)
    runs = sw.runs.set_index("run")
    # on main: one run, "2 wandb attempts merged (later attempt wins per step)"
    assert sorted(runs.index) == ["point", "point#1"] and runs.loc["point#1", "copy_of"] == "point"
    assert sorted(runs["path"]) == [str(sweep / "point"), str(sweep / "point-copy")]
    assert all("2 copies" in p and "attempts merged" not in p for p in runs["problems"])
    (problem,) = mixed_sweep_problems(sw)
    assert "point appears 2 times" in problem
    report = tmp_path / "report"
    assert main([str(sweep), "--source", "wandb-offline", "--report", str(report)]) == 2
    err = capsys.readouterr().err
    assert "is not one comparison" in err and "appears 2 times" in err and "--allow-mixed" in err
    assert not report.exists()
    assert main([str(sweep), "--source", "wandb-offline", "--report", str(report), "--allow-mixed"]) in (0, 1)
    v = json.loads((report / "verdict.json").read_text())
    assert v["n_runs"] == 2


def test_offline_run_folder_copied_beside_itself_is_a_copy(one_run, tmp_path):
    """A second file of the same attempt (same run id, same start time) in the same wandb folder."""
    sweep = _copy(one_run, tmp_path)
    (src,) = find_offline_runs(sweep)
    shutil.copytree(src.parent, src.parent.with_name(src.parent.name + "-copy"))
    sw = load_wandb_offline(sweep)
    assert sorted(sw.runs["run"]) == ["point", "point#1"]
    assert len(mixed_sweep_problems(sw)) == 1
