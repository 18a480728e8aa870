"""Issue 48, item 11: a run whose ``wandb/`` folder vanished while it ran says so, in ``summary.json``'s ``warnings``
and on the console; before, it ended "completed" without a word and its wandb run was gone.

gkd-train's own main-node path with a real offline wandb run; only ms-swift's start is replaced, by a stand-in for
its writer rank that opens the wandb run as ms-swift does (``WANDB_*`` from the plan), logs, and reports.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from gkd_harness.harness.launcher import run as run_module
from gkd_harness.harness.launcher.compose import point_config
from gkd_harness.harness.store.run_folder import RunFolder


def _inputs(tmp_path: Path) -> list:
    model = tmp_path / "model"  # a local model folder (nothing loads it)
    model.mkdir()
    (model / "config.json").write_text("{}")
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (tmp_path / "train.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    return [f"model.student={model}", f"model.teacher={model}", f"run.dataset={tmp_path / 'train.jsonl'}"]


@pytest.mark.parametrize("deleted", [False, True], ids=["kept", "deleted_mid_run"])
def test_a_run_whose_wandb_folder_vanished_says_so(tmp_path, monkeypatch, caplog, deleted):
    import wandb

    run_dir = tmp_path / "run"
    cfg = point_config([*_inputs(tmp_path), f"run.output_dir={run_dir}", "tracking.wandb.mode=offline"])[0]

    def ms_swift(plan, log_path, **kw):
        env = plan.env
        for key in ("WANDB_MODE", "WANDB_DIR", "WANDB_SILENT"):
            monkeypatch.setenv(key, env[key])
        run = wandb.init(project="p", id=env["WANDB_RUN_ID"], dir=env["WANDB_DIR"])
        run.log({"train/loss": 1.0, "train/global_step": 1})
        if deleted:
            shutil.rmtree(run_dir / "wandb")  # someone cleans up "old" wandb folders
        run.log({"train/loss": 0.5, "train/global_step": 2})
        run.finish()
        wandb.teardown()
        RunFolder(run_dir).update_summary(world_size=1, loss_calls=2, steps_trained=2)

    monkeypatch.setattr(run_module, "execute", ms_swift)
    with caplog.at_level(logging.WARNING, logger="gkd_harness.train"):
        summary = run_module.train(cfg)
    assert summary["status"] == "completed"
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if not deleted:
        assert summary["warnings"] == [] and not lines
        return
    (warning,) = summary["warnings"]
    assert "is lost" in warning and str(run_dir / "wandb") in warning and "wandb sync" in warning
    assert any(warning in line for line in lines)
