"""Hydra sweeper plugins (issue 47, item 5): a sweeper that chooses its points as it goes (Optuna, Nevergrad).

Before: the sweep callback could not list the points of such a sweep, said so, and printed no progress and no final
table; a job returned ``last_step`` (Optuna would have optimised the step count) and a dry run None. Now the
callback lists the run folders the sweep makes, and a job returns ``run.optimized_metric``'s last value
(:mod:`gkd_harness.harness.launcher.objective`). The run with Hydra's Optuna sweeper itself is in
``test_sweep_optuna.py`` (collected where ``hydra-optuna-sweeper``, of the ``test`` extra, is installed).
"""

from __future__ import annotations

import io
import json
import math

import pytest
from omegaconf import OmegaConf

from gkd_harness.harness.config.schema import ConfigError
from gkd_harness.harness.launcher.objective import check_optimized_metric, optimized_value
from gkd_harness.launch.sweep import SweepStatusCallback, is_grid_sweeper

OPTUNA = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


def _config(sweep_dir, sweeper):
    return OmegaConf.create(
        {
            "hydra": {
                "sweep": {"dir": str(sweep_dir)},
                "sweeper": {"_target_": sweeper, "params": {"gkd.beta": "interval(0.1, 0.9)"}},
                "overrides": {"task": []},
                "launcher": {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"},
            },
            "tracking": {"wandb": {"group": "tuned"}},
            "run": {"dry_run": False},
        }
    )


def _point(sweep_dir, name, status, steps=3):
    folder = sweep_dir / name
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(
        json.dumps({"status": status, "config": {"run.max_steps": steps}, "last_step": steps, "wall_s": 1.0})
    )
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "eval/jsd": 0.5 / s}) + "\n" for s in (1, 2)))


def test_a_sweeper_plugin_gets_the_table_of_the_points_it_ran(tmp_path):
    out = io.StringIO()
    cb = SweepStatusCallback(progress_interval_s=0, stream=out)
    config = _config(tmp_path, OPTUNA)
    assert not is_grid_sweeper(config)
    cb.on_multirun_start(config)
    _point(tmp_path, "gkd.beta=0.31", "completed")
    _point(tmp_path, "gkd.beta=0.77", "failed")
    cb._report()
    text = out.getvalue()
    assert "points not known in advance" in text and "cannot list" not in text
    assert "summary, 2 points: 1 completed, 1 failed" in text, text
    assert "gkd.beta=0.31" in text and "gkd.beta=0.77" in text
    assert not (tmp_path / "sweep_manifest.json").exists()  # no plan of points nobody chose yet


def test_a_sweeper_plugins_failed_point_makes_the_sweep_exit_1(tmp_path):
    cb = SweepStatusCallback(progress_interval_s=0, stream=io.StringIO())
    config = _config(tmp_path, OPTUNA)
    cb.on_multirun_start(config)
    _point(tmp_path, "gkd.beta=0.5", "failed")
    with pytest.raises(SystemExit) as stop:
        cb.on_multirun_end(config)
    assert stop.value.code == 1


def test_a_job_returns_the_optimized_metric_not_the_step_count(tmp_path):
    _point(tmp_path, "p", "completed")
    assert optimized_value("eval/jsd", tmp_path / "p") == 0.25  # the last row's value (0.5 / 2)
    assert optimized_value(None, tmp_path / "p") is None  # the default: a grid sweep needs no value
    assert math.isnan(optimized_value("eval/jsd", tmp_path / "p", dry_run=True))  # nothing trained: no score


def test_a_run_without_the_metric_has_no_score(tmp_path):
    _point(tmp_path, "p", "completed")
    with pytest.raises(ConfigError, match=r"^run\.optimized_metric: 'train/loss' has no finite value"):
        optimized_value("train/loss", tmp_path / "p")


def test_an_unknown_metric_is_refused_naming_the_key():
    check_optimized_metric("eval/jsd")
    with pytest.raises(ConfigError) as err:
        check_optimized_metric("eval/jsdd")
    assert err.value.key == "run.optimized_metric"


def test_a_point_without_overrides_is_the_sweep_folder_not_its_subfolders(tmp_path):
    """A sweeper plugin's point with no overrides runs in the sweep folder itself: its wandb/ and swift/ are no
    points (before the table listed them as two missing points)."""
    out = io.StringIO()
    cb = SweepStatusCallback(progress_interval_s=0, stream=out)
    config = _config(tmp_path, OPTUNA)
    cb.on_multirun_start(config)
    _point(tmp_path, "sub", "completed")
    (tmp_path / "sub" / "wandb").mkdir()
    (tmp_path / "sub" / "swift" / "x").mkdir(parents=True)
    cb._sweep_dir = tmp_path / "sub"
    cb._report()
    assert "summary, 1 points: 1 completed, 0 failed" in out.getvalue(), out.getvalue()
