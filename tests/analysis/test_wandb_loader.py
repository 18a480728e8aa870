"""The wandb loader against real wandb offline runs (wandb 0.31, mode=offline): the run files are decoded
record by record and go through the same conversion as the public API's runs (``runs_from_wandb``).

What an offline run cannot give: the server-side ``wandb.Api().runs(path, filters=...)`` query itself; that
call is the only line of ``load_wandb_sweep`` not exercised here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gkd_harness.analysis.load import OfflineRun, UnusableInput, find_offline_runs, load_wandb_offline, load_wandb_sweep

_WRITER = textwrap.dedent("""
    import os, sys, wandb
    name, group, how = sys.argv[1], sys.argv[2], sys.argv[3]
    run = wandb.init(project="gkd-harness", group=group, job_type="train", name=name, mode="offline",
                     config={"loss": {"precision": "fp32", "beta_form": "paper"}, "gkd": {"beta": 0.5,
                             "temperature": 0.9, "topk": None}, "run": {"seed": 0, "max_steps": 6},
                             "dtypes_seen": {"student": "float32", "teacher": "bfloat16"}})
    for step in range(1, 7):
        row = {"train/loss": 0.01 / step, "train/grad_norm": 0.1 + step, "gkd/neg_loss_calls": 0,
               "gkd/neg_loss_calls_total": 0, "gkd/loss_calls_total": step, "step": step}
        if step % 2 == 0:
            row.update({"spot/loss": 0.01 / step, "spot/loss_fp64": 0.01 / step, "spot/grad_rel_l2": 1e-7 * step})
        run.log(row)
        if how == "raise" and step == 3:
            raise RuntimeError("boom")   # wandb's exit hook records exit code 1
        if how == "kill" and step == 3:
            os._exit(1)                  # hard kill: wandb may not have flushed anything
    run.finish()
""")


@pytest.fixture(scope="module")
def offline_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("wandb_offline")
    env = dict(os.environ, WANDB_DIR=str(root), WANDB_MODE="offline", WANDB_SILENT="true")
    for name, how in (("fp32-a", "ok"), ("fp32-raised", "raise"), ("fp32-killed", "kill")):
        subprocess.run(
            [sys.executable, "-c", _WRITER, name, "g1", how], env=env, timeout=300, check=False, capture_output=True
        )
    subprocess.run(
        [sys.executable, "-c", _WRITER, "other-group", "g2", "ok"],
        env=env,
        timeout=300,
        check=True,
        capture_output=True,
    )
    return root


def test_offline_run_decoded(offline_root):
    runs = {r.name: r for r in map(OfflineRun, find_offline_runs(offline_root))}
    assert {"fp32-a", "fp32-raised", "other-group"} <= set(runs) and len(runs) == 4
    r = runs["fp32-a"]
    assert (r.group, r.job_type, r.state) == ("g1", "train", "finished")
    assert r.config["loss"] == {"precision": "fp32", "beta_form": "paper"}
    hist = list(r.scan_history())
    assert [h["step"] for h in hist] == [1, 2, 3, 4, 5, 6]
    assert [h["train/loss"] for h in hist] == [0.01 / s for s in range(1, 7)]


def test_offline_sweep_tabulated_like_local(offline_root):
    sw = load_wandb_offline(offline_root, group="g1")
    runs = sw.runs.set_index("run")
    # the hard-killed run may or may not have been flushed by wandb; either way it is kept, never dropped
    killed = [r for r in runs.index if r not in ("fp32-a", "fp32-raised")]
    assert len(runs) == 3 and len(killed) == 1
    assert runs.loc["fp32-a", "loss.precision"] == "fp32" and runs.loc["fp32-a", "gkd.beta"] == 0.5
    assert runs.loc["fp32-a", "dtype.teacher"] == "bfloat16" and runs.loc["fp32-a", "mixed_dtypes"]
    assert runs.loc["fp32-a", "outcome"] == "completed"
    h = sw.run_history("fp32-a")
    assert h.index.tolist() == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(h["spot/grad_rel_l2"].dropna().to_numpy(), [2e-7, 4e-7, 6e-7], rtol=0, atol=0)
    # the run that raised is failed, with every step it logged (full history, nothing sampled)
    assert runs.loc["fp32-raised", "outcome"] == "failed"
    assert sw.run_history("fp32-raised").index.tolist() == [1, 2, 3]
    assert runs.loc[killed[0], "outcome"] in ("failed", "incomplete")


def test_public_api_path_with_offline_runs(offline_root):
    """load_wandb_sweep's conversion and group filter, fed the offline runs in place of the server's answer."""

    class OfflineApi:  # stands in for the server only; every run object is a real decoded offline run
        def runs(self, path, filters):
            assert path == "ent/gkd-harness"
            return [r for r in map(OfflineRun, find_offline_runs(offline_root)) if r.group == filters["group"]]

    sw = load_wandb_sweep("ent/gkd-harness", "g2", api=OfflineApi())
    assert sw.runs["run"].tolist() == ["other-group"] and sw.source == "wandb:ent/gkd-harness/g2"


def test_offline_errors_are_unusable(tmp_path, offline_root):
    with pytest.raises(UnusableInput, match="no wandb offline run files"):
        load_wandb_offline(tmp_path)
    only_g2 = tmp_path / "g2"
    (src,) = [p for p in find_offline_runs(offline_root) if OfflineRun(p).group == "g2"]
    shutil.copytree(src.parent, only_g2 / src.parent.name)
    with pytest.raises(UnusableInput, match="for group 'nope'"):
        load_wandb_offline(only_g2, group="nope")
    bad = tmp_path / "offline-run-x" / "run-x.wandb"
    bad.parent.mkdir()
    bad.write_bytes(b"not a wandb file")
    with pytest.raises(UnusableInput, match="bad header"):
        OfflineRun(bad)


def test_analysis_run_logged_offline(synthetic_sweep_dir, tmp_path, monkeypatch):
    """--wandb: an analysis run (job_type=analysis) in the sweep's group with the verdict, read back from disk."""
    from gkd_harness.analysis.cli import main

    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wb").mkdir()
    assert main([str(synthetic_sweep_dir), "--report", str(tmp_path / "r"), "--wandb"]) == 0
    (run,) = [OfflineRun(p) for p in find_offline_runs(tmp_path / "wb")]
    assert (run.job_type, run.group, run.state) == ("analysis", "synthetic", "finished")
    assert run.summary["verdict"] == "pass" and run.summary["criteria/no_negative_patched"] == "pass"
    assert any(k.startswith("tables/") for k in run.summary)
    # the training loaders skip analysis runs
    with pytest.raises(UnusableInput, match="no training runs"):
        load_wandb_offline(tmp_path / "wb")


_ATTEMPT = textwrap.dedent("""
    import math, os, sys, wandb
    name, group, how, run_id, first, last, offset = sys.argv[1:8]
    first, last, offset = int(first), int(last), float(offset)
    run = wandb.init(project="gkd-harness", group=group, job_type="train", name=name, mode="offline",
                     id=run_id, resume="allow", config={"loss": {"precision": "fp32", "beta_form": "paper"},
                     "gkd": {"beta": 0.5}, "run": {"seed": 0, "max_steps": 6}})
    for step in range(first, last + 1):
        run.log({"train/loss": offset + 0.01 / step, "train/grad_norm": math.nan if step == 5 else 0.1 + step,
                 "gkd/nonfinite_calls_total": 0, "step": step})
    if how == "raise":
        raise RuntimeError("killed")     # exit code 1: this attempt is 'failed'
    if how == "kill":
        os._exit(1)                      # hard kill: wandb may have flushed nothing
    run.finish()
""")


@pytest.fixture(scope="module")
def resumed_root(tmp_path_factory):
    """byid/: a run killed at step 4 and resumed from step 3 under the same wandb id (+ an unrelated run);
    sweep/point/: a run folder whose first attempt (own id) was hard-killed and whose second ran 1..6."""
    root = tmp_path_factory.mktemp("wandb_resumed")
    point = root / "sweep" / "point"
    point.mkdir(parents=True)
    (point / "summary.json").write_text('{"status": "completed"}')  # marks a harness run folder
    jobs = [
        (root / "byid", ("fp32-resumed", "g", "raise", "resume1", "1", "4", "0")),
        (root / "byid", ("fp32-resumed", "g", "ok", "resume1", "3", "6", "1")),
        (root / "byid", ("other", "g", "ok", "other1", "1", "6", "0")),
        (point, ("point", "g", "kill", "p-attempt1", "1", "3", "0")),
        (point, ("point", "g", "ok", "p-attempt2", "1", "6", "2")),
    ]
    for wandb_dir, argv in jobs:
        wandb_dir.mkdir(exist_ok=True)
        env = dict(os.environ, WANDB_DIR=str(wandb_dir), WANDB_MODE="offline", WANDB_SILENT="true")
        subprocess.run([sys.executable, "-c", _ATTEMPT, *argv], env=env, timeout=300, check=False, capture_output=True)
    return root


def test_resumed_run_with_same_id_is_one_run(resumed_root):
    """On main this loaded as two runs (one failed), so no_failed_runs failed a run that completed."""
    assert len(find_offline_runs(resumed_root / "byid")) == 3
    sw = load_wandb_offline(resumed_root / "byid", group="g")
    runs = sw.runs.set_index("run")
    assert sorted(runs.index) == ["fp32-resumed", "other"]
    assert runs.loc["fp32-resumed", "outcome"] == "completed" and runs.loc["fp32-resumed", "status"] == "completed"
    assert "2 wandb attempts merged" in runs.loc["fp32-resumed", "problems"]
    h = sw.run_history("fp32-resumed")
    assert h.index.tolist() == [1, 2, 3, 4, 5, 6]
    # steps 1-2 from the first attempt, 3-6 from the resumed one (later attempt wins per step)
    assert h["train/loss"].tolist() == [0.01, 0.005] + [1 + 0.01 / s for s in (3, 4, 5, 6)]
    # a logged NaN stays NaN and is listed; it is not 0, not dropped
    assert np.isnan(h.loc[5, "train/grad_norm"]) and h.loc[6, "train/grad_norm"] == 6.1
    assert sorted(sw.nonfinite[["run", "step", "metric"]].values.tolist()) == [
        ["fp32-resumed", 5, "train/grad_norm"],
        ["other", 5, "train/grad_norm"],
    ]


def test_attempts_in_one_run_folder_are_one_run(resumed_root):
    sw = load_wandb_offline(resumed_root / "sweep")
    assert sw.runs["run"].tolist() == ["point"]
    r = sw.runs.iloc[0]
    assert r["outcome"] == "completed" and r["path"] == str(resumed_root / "sweep" / "point")
    assert sw.run_history("point")["train/loss"].tolist() == [2 + 0.01 / s for s in range(1, 7)]
